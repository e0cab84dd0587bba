// Cap'n Proto 0.9 with GCC 13 or later: the build force-includes this header (CMakeLists.txt).
//
// kj 0.9 leaves out operator==(const char*, StringPtr) and its kin in C++20, relying on
// C++20's reversed candidates (kj/string.h, `#if !__cpp_impl_three_way_comparison`). GCC 13
// implements P2468R2: a reversed operator== is no candidate where the class also declares the
// matching operator!=, as kj's do, so capnp/blob.h's comparisons of a C string with a kj
// string no longer compile ("no match for 'operator=='"). This declares what kj 0.9 declares
// before C++20; kj 0.10 and later declare them itself, and nothing is added there.
#pragma once

// Every C++ file gets it; those built without Cap'n Proto on their include path get nothing.
#if __has_include(<capnp/common.h>)
#include <capnp/common.h>
#include <kj/string.h>

#if __cpp_impl_three_way_comparison && CAPNP_VERSION_MAJOR == 0 && CAPNP_VERSION_MINOR < 10
namespace kj {
// Compared as StringPtrs, by the member operator: `b == a` would be this one reversed.
inline bool operator==(const char* a, const StringPtr& b) { return b == StringPtr(a); }
inline bool operator!=(const char* a, const StringPtr& b) { return !(b == StringPtr(a)); }
inline bool operator==(const char* a, const String& b) { return StringPtr(b) == StringPtr(a); }
inline bool operator!=(const char* a, const String& b) { return !(StringPtr(b) == StringPtr(a)); }
}  // namespace kj
#endif
#endif
