// A seeded fuzzer against a real depotd: a client that writes random words into every mapping
// it can get (the segments it may write, its lease table, private copies of the header table)
// while it sends random requests (valid, half-valid and garbage) in random order. The daemon
// must never crash, and once the fuzzer is gone it must hold nothing for it and still serve
// others.
//
// The run is fixed by its seed and length, so a failure replays: DEPOT_FUZZ_SEED picks the
// seed (default: a fixed one) and DEPOT_FUZZ_STEPS the number of steps (default: a few
// thousand, seconds in CI; raise it for longer runs by hand).
#include <sys/mman.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/object_header.h"
#include "raw_session.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

// A mapping the fuzzer made, unmapped when it goes.
struct Mapped {
  Mapped(void* base, size_t size) : base(static_cast<uint64_t*>(base)), size(size) {}
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  ~Mapped() { ::munmap(base, size); }
  uint64_t* base;
  size_t size;
};

class Fuzzer {
 public:
  Fuzzer(const std::string& socket, uint64_t seed) : socket_(socket), rng_(seed) {}

  // One random step.
  void Step(uint64_t step) {
    if (!session_ || session_->closed()) Connect();
    if (!session_) return;
    const uint64_t rid = step + 2;
    switch (Pick(16)) {
      case 0:
        return Send(rid, CreateOf(SomeId(), Pick(3) == 0 ? Pick(1 << 20) : Pick(4096),
                                  std::string(Pick(64), 'm')));
      case 1:
        return Send(rid, [&](wire::Request::Builder r) {  // a put, sometimes lying about its size
          const std::string data(Pick(512), 'd');
          CreateOf(SomeId(), Pick(4) == 0 ? Pick(1024) : data.size())(r);
          auto create = r.getCreate();
          create.setData(
              capnp::Data::Reader(reinterpret_cast<const kj::byte*>(data.data()), data.size()));
          create.setSeal(true);
          create.setRelease(Pick(2) == 0);
          create.setChecksum(Pick(2) == 0);
          create.setPin(Pick(8) == 0);
          if (Pick(8) == 0) create.setName(std::string(Pick(8192), 'n'));
          if (Pick(8) == 0) create.setDevice(static_cast<int32_t>(Pick(4)) - 2);
        });
      case 2:
        return Send(rid, SealOf(SomeId()));
      case 3:
        return Send(rid, [&](wire::Request::Builder r) { ipc::ToWire(SomeId(), r.initAbort()); });
      case 4:
        return Send(rid, [&](wire::Request::Builder r) {
          std::vector<ObjectId> ids(Pick(8) + 1);
          for (auto& id : ids) id = SomeId();
          const int64_t timeouts[] = {0, 0, 1, 10, -1};
          GetOf(ids, timeouts[Pick(5)])(r);
          if (Pick(4) == 0) r.getGet().setDevice(static_cast<int32_t>(Pick(4)) - 2);
        });
      case 5:
        if (Pick(2) == 0) return Send(rid, ListOf(IdList::kLocate, SomeIds()));
        return Send(rid, [&](wire::Request::Builder r) {  // a prefetch, to any tier or none
          auto prefetch = r.initPrefetch();
          auto ids = prefetch.initIds(static_cast<unsigned>(Pick(8)));
          for (auto id : ids) ipc::ToWire(SomeId(), id);
          prefetch.setDevice(static_cast<int32_t>(Pick(5)) - 2);
        });
      case 6:
      case 7:
        return Send(Pick(2) == 0 ? 0 : rid, ListOf(IdList::kRelease, SomeIds()));
      case 8:
        return Send(Pick(2) == 0 ? 0 : rid, [&](wire::Request::Builder r) {
          // Groups on any tier, served or not, some empty, a tier sometimes twice.
          auto tiers = r.initRelease(static_cast<unsigned>(Pick(4) + 1));
          for (auto tier : tiers) {
            tier.setDevice(Pick(2) == 0 ? static_cast<int32_t>(Pick(4)) - 1
                                        : static_cast<int32_t>(rng_()));
            auto ids = tier.initIds(static_cast<unsigned>(Pick(5)));
            for (auto id : ids) ipc::ToWire(SomeId(), id);
          }
        });
      case 9:
        return Send(rid, ListOf(Pick(2) == 0 ? IdList::kDelete : IdList::kContains, SomeIds()));
      case 10:
        return Send(rid, [&](wire::Request::Builder r) {
          auto list = r.initList();
          list.setStartSlot(static_cast<uint32_t>(rng_()));
          list.setLimit(static_cast<uint32_t>(rng_()));
          if (Pick(2) == 0) list.setLargest(static_cast<uint32_t>(rng_()));
          // Prefixes up to twice the longest name, some matching the fuzzer's own names.
          if (Pick(2) == 0) list.setPrefix(std::string(Pick(8192), Pick(2) == 0 ? 'n' : '\xff'));
        });
      case 11:
        return Send(rid, [&](wire::Request::Builder r) {
          switch (Pick(5)) {
            case 0:
              return r.setStatus();
            case 1:
              return r.setClients();
            case 2:
              return ipc::ToWire(SomeId(), r.initObjectInfo());
            case 3: {
              auto ids = SomeIds();
              auto verify = r.initVerify();
              auto list = verify.initIds(static_cast<unsigned>(ids.size()));
              for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
              // Sometimes every object from some slot on, or (an error) both ids and all.
              verify.setAll(Pick(4) == 0);
              verify.setStartSlot(Pick(4) == 0 ? Pick(1u << 31) : Pick(64));
              return;
            }
            default: {
              auto evict = r.initEvict();
              evict.setBytes(Pick(1 << 20));
              evict.setAllUnreferenced(Pick(16) == 0);
            }
          }
        });
      case 12:
      case 13:
        return ScribbleOnMappings();
      case 14:
        return Receive();
      default:
        if (Pick(32) == 0) {  // garbage: the daemon closes the session
          std::vector<uint64_t> words(Pick(16) + 1);
          for (auto& w : words) w = rng_();
          if (Pick(2) == 0) words[0] = (rng_() & 0xffff'fff8) | (uint64_t{Pick(4)} << 32);
          session_->SendBytes(words.data(), words.size() * sizeof(uint64_t));
        }
        return Receive();
    }
  }

  // Reads what replies are there, mapping the descriptors they bring.
  void Receive() {
    if (!session_) return;
    while (auto reply = session_->Receive(std::chrono::milliseconds(0))) Adopt(*reply);
  }

  size_t mappings() const { return mappings_.size(); }

  void Disconnect() {
    session_.reset();
    mappings_.clear();
  }

 private:
  uint64_t Pick(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // Ids from a small set, so that requests meet objects the fuzzer made; sometimes nil.
  ObjectId SomeId() {
    if (Pick(64) == 0) return ObjectId();
    return ObjectId::FromName("fuzz/" + std::to_string(Pick(48)));
  }
  std::vector<ObjectId> SomeIds() {
    std::vector<ObjectId> ids(Pick(6) + 1);
    for (auto& id : ids) id = SomeId();
    return ids;
  }

  void Connect() {
    session_ = std::make_unique<RawSession>(socket_);
    if (!session_->Send(1, [](auto r) { FillHello(r); }).ok()) return session_.reset();
    auto hello = session_->Receive();
    if (!hello) return session_.reset();
    Adopt(*hello);
  }

  void Send(uint64_t rid, const std::function<void(wire::Request::Builder)>& fill) {
    // A send fails when the daemon has closed the session (after garbage); Step reconnects.
    (void)session_->Send(rid, fill);
    if (Pick(4) == 0) Receive();
  }

  // Maps every descriptor a reply brings, as writably as the kernel allows.
  void Adopt(RawReply& reply) {
    for (auto& fd : reply.fds) {
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || st.st_size <= 0) continue;
      const auto size = static_cast<size_t>(st.st_size);
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED) {
        // Read-only to others (the header table, readers' segments): a private copy is as
        // far as a client gets, and the daemon never reads it.
        p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
      }
      if (p != MAP_FAILED) mappings_.push_back(std::make_unique<Mapped>(p, size));
    }
  }

  void ScribbleOnMappings() {
    if (mappings_.empty()) return;
    Mapped& m = *mappings_[Pick(mappings_.size())];
    const size_t words = m.size / sizeof(uint64_t);
    const uint64_t values[] = {0, ~uint64_t{0}, 0x4000'0000, uint64_t{1} << 40, rng_()};
    for (uint64_t i = 0, n = Pick(64) + 1; i < n; ++i) m.base[Pick(words)] = values[Pick(5)];
  }

  const std::string socket_;
  std::mt19937_64 rng_;
  std::unique_ptr<RawSession> session_;
  std::vector<std::unique_ptr<Mapped>> mappings_;
};

TEST(FuzzTest, RandomRequestsAndScribbledMappingsNeverCrashTheDaemon) {
  const uint64_t seed = EnvOr("DEPOT_FUZZ_SEED", 19);
  const uint64_t steps = EnvOr("DEPOT_FUZZ_STEPS", 4000);
  SCOPED_TRACE("DEPOT_FUZZ_SEED=" + std::to_string(seed) +
               " DEPOT_FUZZ_STEPS=" + std::to_string(steps));
  TestDaemon daemon({"--simulate-gpus", "2:64MiB", "--memory", "32MiB", "--segment-size", "8MiB",
                     "--log-level", "warn"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  // A bystander of another uid's trust domain would be a stronger check; within one uid the
  // fuzzer may write what it creates next to, so only the daemon's survival and its state
  // are checked here, and another client's service.
  ASSERT_OK_AND_ASSIGN(Client bystander, Client::Connect(daemon.socket_path()));
  Fuzzer fuzzer(daemon.socket_path(), seed);
  for (uint64_t step = 0; step < steps; ++step) {
    fuzzer.Step(step);
    if (step % 500 == 499) {
      SCOPED_TRACE("after step " + std::to_string(step));
      ASSERT_OK(bystander.GetStatus());
    }
  }
  EXPECT_GT(fuzzer.mappings(), 0u) << "the fuzzer never mapped anything";
  fuzzer.Receive();
  fuzzer.Disconnect();
  // Everything it held is given back: nothing is referenced but by the bystander (nothing).
  for (int tries = 0;; ++tries) {
    ASSERT_OK_AND_ASSIGN(auto objects, bystander.List());
    bool held = false;
    for (const auto& o : objects) held |= o.ref_count != 0;
    if (!held) break;
    ASSERT_LT(tries, 1000) << "the fuzzer's references outlived it";
    std::this_thread::yield();
  }
  ASSERT_OK(bystander.Put(ObjectId::FromName("fuzz/after"), AsBytes("still serving")));
  ASSERT_OK_AND_ASSIGN(Buffer after, bystander.Get(ObjectId::FromName("fuzz/after")));
  EXPECT_TRUE(SameBytes(after.data(), AsBytes("still serving")));
  ExpectObjectsOnHostMatchTheList(bystander);
}

}  // namespace
}  // namespace depot::testing
