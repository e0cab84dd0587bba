// A seeded fuzzer of well-formed requests with extreme values, against a real depotd. Every
// request a client can send is built from the schema (ipc/protocol.capnp) and every number in
// it drawn from where arithmetic on it breaks: 0, 1, powers of two and their neighbours up to
// 2^64, 2^64 minus the sizes of objects present, the daemon's limits and one past them, NaN,
// infinities and negatives; sizes that are summed are paired so that the sum wraps
// (Create.dataSize and its metadata). Frames are framed by hand (raw_session.h), so nothing
// the client library checks stands in the way.
//
// A guard client of the same uid put objects before the fuzzing, checksummed or not, with
// holes between them that the fuzzer's small objects fill, and holds them. After each step,
// its objects' bytes and their headers in the shared table must be unchanged, and no other
// slot may claim their ids; every few steps and at the end, the daemon must be alive, answer
// a status, and serve the guard's objects to a fresh client byte-exact, their checksums
// verified. Once the fuzzer has gone, nothing it held may stay held.
//
// DEPOT_REQUEST_FUZZ_SEED picks the seed (default: a fixed one) and DEPOT_REQUEST_FUZZ_STEPS
// the number of steps (default: seconds in CI, sanitizer builds included; raise it for longer
// runs by hand). The requests follow from the seed, but for what the fuzzer learns from
// replies (sizes, task numbers), which timing may change: a failure therefore prints the
// requests since the last full check, ids included.
#include <sys/mman.h>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/object_header.h"
#include "depot/ipc/protocol.h"
#include "raw_session.h"
#include "store_checks.h"
#include "test_support.h"

namespace depot::testing {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

// The daemon of this test: small segments, so that the guard's objects and the holes between
// them fill most of the first one, and a small header table and batch limit, so that the
// values just past them are cheap to send.
constexpr uint64_t kArenaBytes = 16 << 20;
constexpr uint64_t kSegmentBytes = 1 << 20;
constexpr uint64_t kGpuBytes = 16 << 20;
const std::vector<std::string> kDaemonFlags = {
    "--memory",    "16MiB", "--segment-size", "1MiB", "--simulate-gpus", "2:16MiB",
    "--max-batch", "1000",  "--max-objects",  "4096", "--log-level",     "warn"};

// Limits the daemon documents (store/session.cc, scheduler/task.h, ipc/protocol.h), for the
// values around them. The fuzzer does not rely on them: were one to change, it would only
// probe a little beside it.
constexpr uint64_t kMaxNameBytes = 4096;
constexpr uint64_t kMaxFunctionName = 256;
constexpr uint64_t kMaxLabel = 256;
constexpr uint64_t kMaxInlineArgs = 64 * 1024;
constexpr uint64_t kMaxInputs = 4096;
constexpr uint64_t kMaxOutputs = 64;
constexpr uint64_t kMaxRetries = 100;
constexpr uint64_t kMaxWorkerFunctions = 1024;
constexpr uint64_t kMaxWorkerResources = 64;
constexpr uint64_t kMaxListPage = 10'000;
constexpr uint64_t kMaxFailureMessage = 4096;
constexpr int64_t kForeverMs = 30ll * 24 * 3600 * 1000;
constexpr double kMinResourceAmount = 1.0 / 1024;

constexpr uint64_t Pow2(int n) { return uint64_t{1} << n; }

// Numbers, lengths and sizes from where arithmetic on them breaks, drawn from one seeded
// generator: a fixed edge most of the time, sometimes a small random value, 2^N minus a size
// present, or a value around a limit of the field (one below, at, one past).
class Extremes {
 public:
  explicit Extremes(uint64_t seed) : rng_(seed) {}

  uint64_t Pick(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool OneIn(uint64_t n) { return Pick(n) == 0; }
  uint64_t Word() { return rng_(); }

  // Remembers the size of something present (an object's data, metadata, both) for
  // NearSize.
  void Saw(uint64_t size) {
    if (size == 0 || size > kSegmentBytes * 4) return;
    if (seen_.size() < 64) return seen_.push_back(size);
    seen_[Pick(seen_.size())] = size;
  }

  // A size near one present: of an object the fuzzer heard of, of its 64-byte block, one
  // off either; or a small one. Never 0.
  uint64_t NearSize() {
    static constexpr uint64_t kSmall[] = {1, 2, 8, 63, 64, 65, 4095, 4096, 4097};
    if (seen_.empty() || OneIn(3)) {
      return OneIn(2) ? kSmall[Pick(std::size(kSmall))] : 1 + Pick(1 << 16);
    }
    const uint64_t s = seen_[Pick(seen_.size())];
    const uint64_t block = (s + 63) / 64 * 64;
    const uint64_t around[] = {s - 1, s, s + 1, block, block + 64};
    return std::max<uint64_t>(1, around[Pick(std::size(around))]);
  }

  uint64_t U64(std::initializer_list<uint64_t> limits = {}) {
    static constexpr uint64_t kEdges[] = {0,        1,
                                          2,        63,
                                          64,       4095,
                                          4096,     Pow2(31) - 1,
                                          Pow2(31), Pow2(32) - 1,
                                          Pow2(32), Pow2(63) - 1,
                                          Pow2(63), ~uint64_t{0}};
    switch (Pick(8)) {
      case 0:
        return Pick(1 << 16);
      case 1:
        return 0 - NearSize();  // 2^64 - a size present
      case 2:
        if (limits.size() != 0) return Around(limits);
        [[fallthrough]];
      default:
        return kEdges[Pick(std::size(kEdges))];
    }
  }

  uint32_t U32(std::initializer_list<uint64_t> limits = {}) {
    static constexpr uint32_t kEdges[] = {0,    1,    2,           63,          64,
                                          4095, 4096, 0x7fff'ffff, 0x8000'0000, 0xffff'ffff};
    switch (Pick(8)) {
      case 0:
        return static_cast<uint32_t>(Pick(1 << 16));
      case 1:
        return static_cast<uint32_t>(0 - NearSize());  // 2^32 - a size present
      case 2:
        if (limits.size() != 0) return static_cast<uint32_t>(Around(limits));
        [[fallthrough]];
      default:
        return kEdges[Pick(std::size(kEdges))];
    }
  }

  int64_t I64(std::initializer_list<uint64_t> limits = {}) {
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    static constexpr int64_t kEdges[] = {kMin,     kMin + 1,   -4096,    -2,       -1,   0,
                                         1,        2,          63,       64,       4096, INT32_MAX,
                                         Pow2(31), UINT32_MAX, Pow2(32), kMax - 1, kMax};
    switch (Pick(8)) {
      case 0:
        return static_cast<int64_t>(Pick(64));
      case 1:
        return -static_cast<int64_t>(NearSize());
      case 2:
        if (limits.size() != 0) return static_cast<int64_t>(Around(limits));
        [[fallthrough]];
      default:
        return kEdges[Pick(std::size(kEdges))];
    }
  }

  int32_t I32(std::initializer_list<uint64_t> limits = {}) {
    static constexpr int32_t kEdges[] = {
        INT32_MIN, INT32_MIN + 1, -65, -64, -63, -3, -2, -1, 0, 1, 2, 31, 32, 62, 63, 64,
        65,        INT32_MAX};
    switch (Pick(8)) {
      case 0:
        return static_cast<int32_t>(Pick(8)) - 4;
      case 1:
        if (limits.size() != 0) return static_cast<int32_t>(Around(limits));
        [[fallthrough]];
      default:
        return kEdges[Pick(std::size(kEdges))];
    }
  }

  double F64(std::initializer_list<double> limits = {}) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    constexpr double kTiny = std::numeric_limits<double>::denorm_min();
    // 1/1024, the least resource amount but 0, and the double just below it.
    static constexpr double kEdges[] = {0.0,
                                        -0.0,
                                        1.0,
                                        -1.0,
                                        0.5,
                                        1 + DBL_EPSILON,
                                        0x1p31,
                                        0x1p32,
                                        0x1p53,
                                        0x1p53 + 2,
                                        0x1p63,
                                        0x1p64,
                                        DBL_MAX,
                                        -DBL_MAX,
                                        DBL_MIN,
                                        kTiny,
                                        -kTiny,
                                        kNaN,
                                        -kNaN,
                                        kInf,
                                        -kInf,
                                        0x1p-10,
                                        0x1.fffffffffffffp-11};
    switch (Pick(8)) {
      case 0:
        return static_cast<double>(Pick(64)) / 8;
      case 1:
        if (limits.size() != 0) {
          const double limit = *(limits.begin() + Pick(limits.size()));
          const double around[] = {std::nextafter(limit, -kInf), limit,
                                   std::nextafter(limit, kInf)};
          return around[Pick(3)];
        }
        [[fallthrough]];
      default:
        return kEdges[Pick(std::size(kEdges))];
    }
  }

  // A length (of a list, a text, a blob): mostly small, sometimes a power-of-two edge, or
  // around `limit` (one below, at, one past).
  size_t Length(uint64_t limit) {
    static constexpr size_t kEdges[] = {0, 1, 2, 63, 64, 4095, 4096};
    switch (Pick(8)) {
      case 0:
        return kEdges[Pick(std::size(kEdges))];
      case 1:
        if (limit != 0) return static_cast<size_t>(limit - 1 + Pick(3));
        [[fallthrough]];
      default:
        return Pick(4);
    }
  }

 private:
  // One below, at or one past one of `limits`.
  uint64_t Around(std::initializer_list<uint64_t> limits) {
    return *(limits.begin() + Pick(limits.size())) - 1 + Pick(3);
  }

  std::mt19937_64 rng_;
  std::vector<uint64_t> seen_;
};

// A client sending well-formed requests, one per step, on one session (that said hello with
// a group, and may register as a worker), reading every reply as it comes. Each request
// starts from plausible values, so that it gets past the first check and the fuzzer reaches
// objects, tasks and workers; then none, a few or most of its fields are made extreme. It
// learns from the replies what to use next: sizes of objects, its tasks' outputs, the tasks
// assigned to it.
class RequestFuzzer {
 public:
  RequestFuzzer(const std::string& socket, uint64_t seed)
      : socket_(socket), x_(seed), group_(16, '\0') {
    for (char& c : group_) c = static_cast<char>(x_.Word());
  }

  // One random request, and whatever replies have come.
  void Step(uint64_t step) {
    step_ = step;
    if (!session_ || session_->closed() || broken_) Connect();
    if (!session_) return;
    static constexpr uint64_t kWildness[] = {0, 6, 2};  // none, a few, most fields extreme
    wildness_ = kWildness[x_.Pick(std::size(kWildness))];
    switch (x_.Pick(40)) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 4:
      case 5:
        Create();
        break;
      case 6:
      case 7:
        OneId("seal", [](auto r) { return r.initSeal(); });
        break;
      case 8:
        OneId("abort", [](auto r) { return r.initAbort(); });
        break;
      case 9:
      case 10:
      case 11:
        Get();
        break;
      case 12:
      case 13:
        Release();
        break;
      case 14:
        Ids("delete", [](auto r, unsigned n) { return r.initDelete(n); });
        break;
      case 15:
        Ids("contains", [](auto r, unsigned n) { return r.initContains(n); });
        break;
      case 16:
        Ids("locate", [](auto r, unsigned n) { return r.initLocate(n); });
        break;
      case 17:
        List();
        break;
      case 18:
        Verify();
        break;
      case 19:
        Evict();
        break;
      case 20:
        Prefetch();
        break;
      case 21:
        Handoff();
        break;
      case 22:
      case 23:
        RegisterWorker();
        break;
      case 24:
      case 25:
      case 26:
        Submit();
        break;
      case 27:
      case 28:
      case 29:
        Complete();
        break;
      case 30:
        Ids("cancel", [](auto r, unsigned n) { return r.initCancel(n); });
        break;
      case 31:
        OneId("objectInfo", [](auto r) { return r.initObjectInfo(); });
        break;
      case 32:
        Payloadless();
        break;
      case 33:
        if (x_.OneIn(4)) ProbeHello();
        break;
      case 34:
        if (x_.OneIn(64)) Reconnect();
        break;
      case 35:
        Wait();
        break;
      case 36:
        CancelWait();
        break;
      case 37:
        Ids("deleteAfterTasks", [](auto r, unsigned n) { return r.initDeleteAfterTasks(n); });
        break;
      default:
        break;  // only the replies
    }
    Receive();
  }

  // Reads the replies that are there.
  void Receive() {
    if (!session_) return;
    while (auto reply = session_->Receive(std::chrono::milliseconds(0))) Learn(*reply);
    // Well-formed requests, their replies read: no reason to hang up on this client.
    if (session_->closed()) HungUp("the daemon closed the fuzzer's session");
  }

  void Disconnect() { session_.reset(); }

  // Whether the daemon closed the fuzzer's session (after one of the requests of Recent()).
  bool hung_up() const { return hung_up_; }
  const std::string& hangup() const { return hangup_; }
  // The requests since ForgetRecent(), one a line.
  std::string Recent() const {
    std::string out;
    for (const auto& r : recent_) out += "  " + r + "\n";
    return out;
  }
  void ForgetRecent() { recent_.clear(); }

  // What the fuzzer saw, so that the test knows it went past the first checks.
  struct Counts {
    uint64_t sent = 0;
    uint64_t ok = 0;
    uint64_t errors = 0;
    uint64_t created = 0;    // creates answered with a location
    uint64_t assigned = 0;   // tasks the daemon gave it to run
    uint64_t wraps = 0;      // creates whose dataSize + metadata wraps past 2^64
    uint64_t too_large = 0;  // requests left out: over the daemon's frame limit
  };
  const Counts& counts() const { return counts_; }

 private:
  // A request being built, and what it says for the log.
  struct Outgoing {
    Outgoing(uint64_t id, const char* kind) {
      r.setId(id);
      what << kind;
    }
    capnp::MallocMessageBuilder message;
    wire::Request::Builder r = message.initRoot<wire::Request>();
    std::ostringstream what;
  };
  // `value`, logged as the field `name` of `o`.
  template <typename T>
  static T Said(Outgoing& o, const char* name, T value) {
    o.what << ' ' << name << '=' << value;
    return value;
  }

  void HungUp(const std::string& how) {
    if (hung_up_) return;
    hung_up_ = true;
    hangup_ = "after step " + std::to_string(step_) + ", " + how +
              (last_error_.empty() ? "" : " (its last error reply: " + last_error_ + ")") + "\n";
  }

  uint64_t Rid() const { return step_ + 2; }
  // Whether this field of this request takes an extreme value.
  bool Wild() { return wildness_ != 0 && x_.OneIn(wildness_); }

  void Connect() {
    session_.reset();
    broken_ = false;
    auto s = std::make_unique<RawSession>(socket_);
    if (s->fd() < 0) return;
    Outgoing o(1, "hello");
    auto hello = o.r.initHello();
    hello.setProtocolVersion(ipc::kProtocolVersion);
    hello.setClientName(Text(Said(o, "clientName", x_.Length(4096)), 'c'));
    hello.setGroup(Bytes(group_));
    auto frame = ipc::EncodeFrame(o.message);
    if (!frame.ok() || !ipc::WriteFrameFully(s->fd(), *frame).ok()) return;
    auto reply = s->Receive();
    if (!reply || !reply->get().isHello()) {
      // A hello of the current version, with a group key of 16 bytes: nothing to refuse.
      Note(o.what.str());
      HungUp(reply ? "the daemon refused the fuzzer's hello: " +
                         std::string(reply->get().getMessage().cStr())
                   : "the daemon did not answer the fuzzer's hello");
      return;
    }
    auto h = reply->get().getHello();
    max_batch_ = h.getMaxBatch();
    max_frame_ = h.getMaxFrameBytes();
    header_slots_ = h.getHeaderSlots();
    uuids_.clear();
    for (auto d : h.getDevices()) uuids_.emplace_back(d.getUuid().begin(), d.getUuid().end());
    assigned_.clear();
    session_ = std::move(s);
    Note(o.what.str());
  }

  void Reconnect() {
    Note("disconnect");
    session_.reset();
    Connect();
  }

  void Note(std::string what) {
    recent_.push_back("step " + std::to_string(step_) + ": " + std::move(what));
  }

  // Sends a request unless it is larger than a frame may be (then it is not well formed).
  void Send(Outgoing& o) {
    auto frame = ipc::EncodeFrame(o.message, {}, max_frame_);
    if (!frame.ok()) {
      ++counts_.too_large;
      return;
    }
    Note(o.what.str());
    ++counts_.sent;
    if (!ipc::WriteFrameFully(session_->fd(), *frame).ok()) broken_ = true;
  }

  void Learn(RawReply& reply) {
    auto r = reply.get();
    if (r.getError() == wire::ErrorCode::OK) {
      ++counts_.ok;
    } else {
      ++counts_.errors;
      last_error_ = r.getMessage().cStr();
    }
    switch (r.which()) {
      case wire::Reply::CREATE: {
        auto loc = r.getCreate();
        ++counts_.created;
        x_.Saw(loc.getDataSize());
        x_.Saw(loc.getMetadataSize());
        x_.Saw(loc.getDataSize() + loc.getMetadataSize());
        break;
      }
      case wire::Reply::LIST: {
        auto objects = r.getList().getObjects();
        for (unsigned i = 0; i < std::min(objects.size(), 16u); ++i) {
          x_.Saw(objects[i].getDataSize());
          x_.Saw(objects[i].getDataSize() + objects[i].getMetadataSize());
        }
        break;
      }
      case wire::Reply::SUBMIT:
        for (auto task : r.getSubmit()) {
          for (auto id : task.getIds()) Remember(outputs_, ipc::FromWire(id));
        }
        break;
      case wire::Reply::ASSIGN:
        for (auto a : r.getAssign()) {
          ++counts_.assigned;
          Remember(assigned_, Assigned{a.getTask(), a.getOutputs().size()});
        }
        break;
      default:
        break;
    }
  }

  template <typename T>
  void Remember(std::vector<T>& ring, T value) {
    if (ring.size() < 64) return ring.push_back(std::move(value));
    ring[x_.Pick(ring.size())] = std::move(value);
  }

  // Ids from a small set, so that requests meet the objects and tasks the fuzzer made;
  // outputs of its tasks; rarely the nil id. Logged by a short name (f<n>, out:<hex>, nil)
  // to `log`, if any.
  ObjectId SomeId(std::ostream* log) {
    std::ostringstream ignored;
    std::ostream& out = log != nullptr ? *log : ignored;
    if (x_.OneIn(64)) {
      out << " nil";
      return ObjectId();
    }
    if (!outputs_.empty() && x_.OneIn(4)) {
      const ObjectId& id = outputs_[x_.Pick(outputs_.size())];
      out << " out:" << id.Hex().substr(0, 8);
      return id;
    }
    const uint64_t n = x_.Pick(48);
    out << " f" << n;
    return ObjectId::FromName("request-fuzz/" + std::to_string(n));
  }
  // Fills a list of ids, logging the first few.
  void FillIds(Outgoing& o, capnp::List<wire::Id>::Builder list) {
    o.what << " [";
    for (unsigned i = 0; i < list.size(); ++i) {
      ipc::ToWire(SomeId(i < 8 ? &o.what : nullptr), list[i]);
    }
    o.what << (list.size() > 8 ? " ...]" : " ]");
  }
  // How many ids a list has: a few, or, when wild, around the batch limit.
  unsigned Count(Outgoing& o) {
    return Said(o, "ids", static_cast<unsigned>(Wild() ? x_.Length(max_batch_) : 1 + x_.Pick(4)));
  }
  // Host memory or a GPU served; any number at all when wild.
  int32_t Device(Outgoing& o) {
    const int32_t gpus = static_cast<int32_t>(uuids_.size());
    return Said(o, "device",
                Wild()        ? x_.I32({uuids_.size()})
                : x_.OneIn(2) ? -1
                              : static_cast<int32_t>(x_.Pick(gpus + 1)) - 1);
  }
  static std::string Text(size_t size, char c) { return std::string(size, c); }
  static capnp::Data::Reader Bytes(const std::string& s) {
    return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
  }

  void Create() {
    Outgoing o(Rid(), "create");
    auto create = o.r.initCreate();
    ipc::ToWire(SomeId(&o.what), create.initId());
    uint64_t data_size = 0;
    size_t metadata = Wild() ? x_.Length(4096) : x_.Pick(64);
    switch (x_.Pick(12)) {
      case 0: {  // the sum wraps: metadata of k + m bytes after data of 2^64 - k
        const uint64_t k = x_.NearSize();
        data_size = 0 - k;
        metadata = static_cast<size_t>(k) + x_.Length(4096);
        ++counts_.wraps;
        break;
      }
      case 1:
      case 2:
      case 3:
      case 4:
        data_size = x_.U64({kSegmentBytes, kArenaBytes, kGpuBytes});
        break;
      default:
        data_size = x_.OneIn(2) ? x_.Pick(4096) : x_.NearSize();
    }
    create.setDataSize(Said(o, "dataSize", data_size));
    const std::string meta(Said(o, "metadata", metadata), 'm');
    create.setMetadata(Bytes(meta));
    create.setDevice(Device(o));
    // A put carries all its bytes; when wild, one too few or too many.
    std::string data;
    if (data_size <= 2 * kSegmentBytes && x_.OneIn(2)) {
      data.assign(static_cast<size_t>(data_size), 'd');
      if (Wild()) data.resize(data.size() + 1 - std::min<size_t>(data.size(), x_.Pick(3)));
    }
    create.setData(Bytes(data));
    Said(o, "data", data.size());
    const bool seal = Said(o, "seal", data.empty() ? Wild() : !x_.OneIn(8));
    create.setSeal(seal);
    create.setRelease(Said(o, "release", seal ? x_.OneIn(2) : Wild()));
    create.setChecksum(Said(o, "checksum", x_.OneIn(3)));
    create.setPin(Said(o, "pin", x_.OneIn(16)));
    create.setNoSpill(Said(o, "noSpill", x_.OneIn(4)));
    create.setName(Text(Said(o, "name", Wild() ? x_.Length(kMaxNameBytes) : x_.Pick(16)), 'n'));
    Send(o);
  }

  template <typename Init>
  void OneId(const char* kind, Init init) {
    Outgoing o(Rid(), kind);
    ipc::ToWire(SomeId(&o.what), init(o.r));
    Send(o);
  }

  template <typename Init>
  void Ids(const char* kind, Init init) {
    Outgoing o(Rid(), kind);
    FillIds(o, init(o.r, Count(o)));
    Send(o);
  }

  void Get() {
    Outgoing o(Rid(), "get");
    auto get = o.r.initGet();
    FillIds(o, get.initIds(Count(o)));
    get.setTimeoutMs(Said(o, "timeoutMs",
                          Wild()        ? x_.I64({kForeverMs})
                          : x_.OneIn(4) ? static_cast<int64_t>(x_.Pick(5))
                                        : int64_t{0}));
    get.setDevice(Device(o));
    get.setClaim(Said(o, "claim", x_.OneIn(4)));
    Send(o);
  }

  void Wait() {
    Outgoing o(Rid(), "wait");
    auto wait = o.r.initWait();
    const unsigned n = Count(o);
    FillIds(o, wait.initIds(n));
    wait.setCount(Said(o, "count", Wild() ? x_.U32({n, n + 1}) : uint32_t(x_.Pick(n + 1))));
    wait.setTimeoutMs(Said(o, "timeoutMs",
                           Wild()        ? x_.I64({kForeverMs})
                           : x_.OneIn(4) ? static_cast<int64_t>(x_.Pick(5))
                                         : int64_t{0}));
    Send(o);
  }

  // Cancels one of the last requests (a get or wait that may still wait), or any id.
  void CancelWait() {
    Outgoing o(Rid(), "cancelWait");
    const uint64_t recent = Rid() - 1 - x_.Pick(std::min<uint64_t>(Rid() - 1, 8));
    o.r.setCancelWait(Said(o, "request", Wild() ? x_.U64({Rid()}) : recent));
    Send(o);
  }

  void Release() {
    // Id 0 (no reply) or not; one group per tier, some of leased reads.
    Outgoing o(x_.OneIn(2) ? 0 : Rid(), "release");
    auto groups = o.r.initRelease(
        Said(o, "groups", static_cast<unsigned>(Wild() ? x_.Length(max_batch_) : 1 + x_.Pick(2))));
    for (unsigned g = 0; g < groups.size(); ++g) {
      groups[g].setDevice(x_.OneIn(4) ? Said(o, "device", ipc::kLeasedReads) : Device(o));
      FillIds(o, groups[g].initIds(Count(o)));
    }
    Send(o);
  }

  void List() {
    Outgoing o(Rid(), "list");
    auto list = o.r.initList();
    list.setStartSlot(Said(o, "startSlot", Wild() ? x_.U32({header_slots_}) : uint32_t{0}));
    list.setLimit(Said(o, "limit", Wild() ? x_.U32({kMaxListPage}) : 1 + uint32_t(x_.Pick(64))));
    const bool largest = x_.OneIn(2);
    list.setLargest(Said(o, "largest",
                         !largest ? 0
                         : Wild() ? x_.U32({kMaxListPage})
                                  : 1 + uint32_t(x_.Pick(16))));
    Send(o);
  }

  void Verify() {
    Outgoing o(Rid(), "verify");
    auto verify = o.r.initVerify();
    const bool all = Said(o, "all", x_.OneIn(2));
    verify.setAll(all);
    FillIds(o, verify.initIds(all && !Wild() ? Said(o, "ids", 0u) : Count(o)));
    verify.setStartSlot(Said(o, "startSlot", Wild() ? x_.U32({header_slots_}) : uint32_t{0}));
    Send(o);
  }

  void Evict() {
    Outgoing o(Rid(), "evict");
    auto evict = o.r.initEvict();
    evict.setBytes(Said(o, "bytes", Wild() ? x_.U64({kArenaBytes}) : x_.Pick(1 << 20)));
    evict.setAllUnreferenced(Said(o, "allUnreferenced", x_.OneIn(8)));
    Send(o);
  }

  void Prefetch() {
    Outgoing o(Rid(), "prefetch");
    auto prefetch = o.r.initPrefetch();
    FillIds(o, prefetch.initIds(Count(o)));
    prefetch.setDevice(Device(o));
    prefetch.setTimeoutMs(Said(o, "timeoutMs", Wild() ? x_.I64() : int64_t{0}));
    Send(o);
  }

  void Handoff() {
    Outgoing o(Rid(), "handoff");
    auto handoff = o.r.initHandoff();
    FillIds(o, handoff.initIds(Count(o)));
    handoff.setDevice(Device(o));
    handoff.setTtlMs(Said(o, "ttlMs", Wild() ? x_.U32() : uint32_t(x_.Pick(2) * x_.Pick(100))));
    handoff.setSeal(Said(o, "seal", x_.OneIn(4)));
    Send(o);
  }

  // A function the worker and the tasks share, or a name of a length around the limit.
  std::string FunctionName() {
    if (!Wild()) return x_.OneIn(2) ? "f" : "g";
    return Text(x_.Length(kMaxFunctionName), 'f');
  }

  // Custom resources, names sometimes repeated (their amounts add up).
  void FillResources(Outgoing& o, capnp::List<wire::Resource>::Builder list) {
    for (auto r : list) {
      const std::string name =
          Wild() ? Text(x_.Length(kMaxFunctionName), 'r') : "r" + std::to_string(x_.Pick(3));
      r.setName(name);
      o.what << ' ' << name.substr(0, 8) << "(" << name.size() << " bytes)";
      r.setAmount(Said(o, "amount", Wild() ? x_.F64({1.0, kMinResourceAmount}) : 1.0 + x_.Pick(4)));
    }
  }

  void RegisterWorker() {
    Outgoing o(Rid(), "registerWorker");
    auto w = o.r.initRegisterWorker();
    w.setName(Text(Said(o, "name", Wild() ? x_.Length(kMaxFunctionName) : x_.Pick(8)), 'w'));
    w.setCpus(Said(o, "cpus", Wild() ? x_.F64({1.0, kMinResourceAmount}) : 4.0));
    const bool wild_gpus = Wild();
    auto gpus = w.initGpus(
        Said(o, "gpus",
             static_cast<unsigned>(wild_gpus ? x_.Length(kMaxWorkerResources) : uuids_.size())));
    for (unsigned i = 0; i < gpus.size(); ++i) {
      // A GPU served, or a uuid of any length.
      const std::string uuid = !uuids_.empty() && !(wild_gpus && x_.OneIn(2))
                                   ? uuids_[(i + x_.Pick(2)) % uuids_.size()]
                                   : Text(x_.Length(16), static_cast<char>(x_.Word()));
      gpus.set(i, Bytes(uuid));
    }
    FillResources(o, w.initResources(static_cast<unsigned>(Wild() ? x_.Length(kMaxWorkerResources)
                                                                  : x_.Pick(2))));
    auto functions = w.initFunctions(
        Said(o, "functions", static_cast<unsigned>(Wild() ? x_.Length(kMaxWorkerFunctions) : 2)));
    for (unsigned i = 0; i < functions.size(); ++i) {
      functions.set(i, i < 2 ? std::string(i == 0 ? "f" : "g") : FunctionName());
    }
    auto gpu_functions = w.initGpuFunctions(Said(
        o, "gpuFunctions", static_cast<unsigned>(Wild() ? x_.Length(kMaxWorkerFunctions) : 1)));
    for (unsigned i = 0; i < gpu_functions.size(); ++i) {
      gpu_functions.set(i, i == 0 ? std::string("g") : FunctionName());
    }
    Send(o);
  }

  void Submit() {
    Outgoing o(Rid(), "submit");
    auto tasks = o.r.initSubmit(
        Said(o, "tasks", static_cast<unsigned>(Wild() ? x_.Length(max_batch_) : 1 + x_.Pick(2))));
    for (unsigned i = 0; i < tasks.size(); ++i) {
      auto t = tasks[i];
      if (i >= 4) {  // a large batch, of small tasks to stay within a frame
        t.setFunction("f");
        continue;
      }
      o.what << " [";
      const std::string function = FunctionName();
      t.setFunction(function);
      o.what << "function(" << function.size() << " bytes)";
      const auto inputs =
          Said(o, "inputs", static_cast<unsigned>(Wild() ? x_.Length(kMaxInputs) : x_.Pick(2)));
      FillIds(o, t.initInputs(inputs));
      t.setArgs(
          Bytes(Text(Said(o, "args", Wild() ? x_.Length(kMaxInlineArgs) : x_.Pick(32)), 'a')));
      if (x_.OneIn(4)) {  // outputs named by the caller
        auto outputs = t.initOutputs(Said(
            o, "outputs", static_cast<unsigned>(Wild() ? x_.Length(kMaxOutputs) : 1 + x_.Pick(2))));
        for (auto id : outputs) {
          ipc::ToWire(ObjectId::FromName("request-fuzz/out/" + std::to_string(x_.Pick(256))), id);
        }
      }
      t.setNumOutputs(
          Said(o, "numOutputs", Wild() ? x_.U32({kMaxOutputs}) : 1 + uint32_t(x_.Pick(2))));
      t.setCpu(Said(o, "cpu", Wild() ? x_.F64({1.0, kMinResourceAmount}) : 1.0));
      t.setGpu(Said(o, "gpu", Wild() ? x_.F64({1.0, kMinResourceAmount}) : x_.Pick(2) * 0.5));
      t.setAffinity(static_cast<wire::Affinity>(Said(o, "affinity", x_.Pick(Wild() ? 8 : 3))));
      t.setPriority(Said(o, "priority", Wild() ? x_.I32() : int32_t(x_.Pick(3))));
      t.setRetries(Said(o, "retries", Wild() ? x_.U32({kMaxRetries}) : uint32_t{1}));
      t.setOutputBytes(
          Said(o, "outputBytes", Wild() ? x_.U64({kArenaBytes, kGpuBytes}) : uint64_t{0}));
      if (x_.OneIn(4)) {  // a memory bound shared by the tasks naming its id
        t.setBoundId(Said(o, "boundId", Wild() ? x_.U64({1, 2}) : uint64_t(1 + x_.Pick(2))));
        t.setBoundBytes(
            Said(o, "boundBytes", Wild() ? x_.U64({kArenaBytes, 1}) : uint64_t{kArenaBytes}));
        t.setBoundWaits(Said(o, "boundWaits", x_.OneIn(2)));
      }
      t.setVariant(static_cast<wire::Variant>(Said(o, "variant", x_.Pick(Wild() ? 8 : 3))));
      // Any bytes, shown (escaped) by depotctl, never read otherwise.
      const std::string label = Text(Said(o, "label", Wild() ? x_.Length(kMaxLabel) : x_.Pick(16)),
                                     static_cast<char>(x_.Pick(256)));
      t.setLabel(capnp::Text::Reader(label.data(), label.size()));
      if (x_.OneIn(4)) {
        FillResources(o, t.initResources(static_cast<unsigned>(
                             Wild() ? x_.Length(kMaxWorkerResources) : 1 + x_.Pick(2))));
      }
      const bool wild_hosts = Wild();
      auto hosts = t.initHostInputs(
          Said(o, "hostInputs", static_cast<unsigned>(x_.Pick(inputs + (wild_hosts ? 2 : 1)))));
      for (unsigned k = 0; k < hosts.size(); ++k) {
        hosts.set(k, Said(o, "at", wild_hosts ? x_.U32({inputs}) : uint32_t(x_.Pick(inputs))));
      }
      o.what << "]";
    }
    Send(o);
  }

  void Complete() {
    // Id 0 (no reply) or not.
    Outgoing o(x_.OneIn(4) ? 0 : Rid(), "complete");
    auto completions = o.r.initComplete(
        Said(o, "completions", static_cast<unsigned>(Wild() ? x_.Length(max_batch_) : 1)));
    for (unsigned i = 0; i < completions.size(); ++i) {
      auto c = completions[i];
      // A task it was assigned, or any number.
      uint64_t task = x_.U64();
      uint64_t outputs = 1;
      if (!assigned_.empty() && !Wild()) {
        const Assigned& a = assigned_[x_.Pick(assigned_.size())];
        task = a.task;
        outputs = a.outputs;
      }
      c.setTask(task);
      if (i >= 4) continue;  // a large batch, of small completions to stay within a frame
      o.what << " [task=" << task;
      c.setOk(Said(o, "ok", !x_.OneIn(4)));
      c.setMessage(Text(Said(o, "message", Wild() ? x_.Length(kMaxFailureMessage) : 0), 'e'));
      auto values = c.initOutputs(
          Said(o, "outputs", static_cast<unsigned>(Wild() ? x_.Length(kMaxOutputs) : outputs)));
      for (unsigned k = 0; k < values.size(); ++k) {
        values[k].setIndex(Said(o, "index", Wild() ? x_.U32({outputs}) : k));
        // Data and metadata around what a completion may carry, together and each.
        const size_t data =
            Said(o, "data", Wild() ? x_.Length(ipc::kMaxInlineOutputBytes) : x_.Pick(128));
        const size_t room =
            ipc::kMaxInlineOutputBytes - std::min<size_t>(data, ipc::kMaxInlineOutputBytes);
        const size_t metadata = Said(o, "metadata", Wild() ? x_.Length(room) : x_.Pick(2));
        values[k].setData(Bytes(Text(data, 'o')));
        values[k].setMetadata(Bytes(Text(metadata, 'm')));
      }
      o.what << "]";
    }
    Send(o);
  }

  // Requests without a payload: the admin views, drain, and the retired forms of release.
  void Payloadless() {
    switch (x_.Pick(8)) {
      case 0: {
        Outgoing o(Rid(), "status");
        o.r.setStatus();
        return Send(o);
      }
      case 1: {
        Outgoing o(Rid(), "clients");
        o.r.setClients();
        return Send(o);
      }
      case 2: {
        Outgoing o(Rid(), "workers");
        o.r.setWorkers();
        return Send(o);
      }
      case 3: {
        Outgoing o(Rid(), "tasks");
        o.r.setTasks();
        return Send(o);
      }
      case 4: {
        Outgoing o(Rid(), "metrics");
        o.r.setMetrics();
        return Send(o);
      }
      case 5: {
        Outgoing o(Rid(), "drainWorker");
        o.r.setDrainWorker();
        return Send(o);
      }
      case 6: {
        Outgoing o(Rid(), "retiredRelease");
        o.r.setRetiredRelease();
        return Send(o);
      }
      default: {
        Outgoing o(Rid(), "retiredReleaseRefs");
        o.r.setRetiredReleaseRefs();
        return Send(o);
      }
    }
  }

  // A session of its own, whose hello is fuzzed: a protocol version, a client name of any
  // length, a group key of any length (this fuzzer's, sometimes).
  void ProbeHello() {
    RawSession probe(socket_);
    if (probe.fd() < 0) return;
    Outgoing o(1, "hello on a session of its own:");
    auto hello = o.r.initHello();
    hello.setProtocolVersion(
        Said(o, "protocolVersion",
             x_.OneIn(2) ? ipc::kProtocolVersion : x_.U32({ipc::kProtocolVersion})));
    hello.setClientName(Text(Said(o, "clientName", x_.Length(4096)), 'p'));
    const std::string group =
        x_.OneIn(2) ? group_ : Text(x_.Length(16), static_cast<char>(x_.Word()));
    hello.setGroup(Bytes(group));
    Said(o, "group", group.size());
    Note(o.what.str());
    auto frame = ipc::EncodeFrame(o.message);
    if (!frame.ok() || !ipc::WriteFrameFully(probe.fd(), *frame).ok()) return;
    (void)probe.Receive();
  }

  struct Assigned {
    uint64_t task = 0;
    uint64_t outputs = 0;
  };

  const std::string socket_;
  Extremes x_;
  std::string group_;
  std::unique_ptr<RawSession> session_;
  bool broken_ = false;  // a write failed: the daemon has closed the session
  uint64_t step_ = 0;
  uint64_t wildness_ = 0;  // this request's fields are extreme one time in this many (0: none)
  // From hello.
  uint32_t max_batch_ = 1;
  uint32_t max_frame_ = 1 << 20;
  uint32_t header_slots_ = 1;
  std::vector<std::string> uuids_;
  // From replies.
  std::vector<ObjectId> outputs_;
  std::vector<Assigned> assigned_;
  std::vector<std::string> recent_;
  Counts counts_;
  std::string last_error_;
  bool hung_up_ = false;
  std::string hangup_;
};

// What the shared header table says of an object: what a reader relies on.
struct HeaderFields {
  ipc::ObjectState state = ipc::ObjectState::kFree;
  uint64_t id_lo = 0;
  uint64_t id_hi = 0;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  uint64_t offset = 0;
  uint32_t segment = 0;
  uint32_t flags = 0;  // those that do not change while the object is held
  uint64_t checksum = 0;

  bool operator==(const HeaderFields&) const = default;

  static HeaderFields Of(const ipc::ObjectHeader& h) {
    constexpr uint32_t kStable =
        ipc::kFlagPinned | ipc::kFlagHasChecksum | ipc::kFlagDeletePending | ipc::kFlagNoSpill;
    return {.state = ipc::UnpackState(h.state_refs.load(std::memory_order_acquire)),
            .id_lo = h.id_lo,
            .id_hi = h.id_hi,
            .data_size = h.data_size,
            .metadata_size = h.metadata_size,
            .offset = h.offset,
            .segment = h.segment,
            .flags = h.flags.load(std::memory_order_relaxed) & kStable,
            .checksum = h.checksum};
  }

  std::string ToString() const {
    std::ostringstream out;
    out << "state " << static_cast<int>(state) << ", id " << ObjectId::FromWords(id_lo, id_hi).Hex()
        << ", sizes " << data_size << " + " << metadata_size << ", segment " << segment
        << " offset " << offset << ", flags " << flags << ", checksum " << checksum;
    return out.str();
  }
};

// The guard's objects, in the order it puts them, each followed by a hole of `hole` bytes
// (a spacer object put, then deleted). Most fill their 64-byte blocks exactly, so that a
// write past any of their ends shows. They take the first half of the first segment (none
// reaches 256 KiB, from where objects are page-aligned): the fuzzer's small objects land in
// the holes between them and in the rest of the segment after them.
struct GuardSpec {
  uint64_t data;
  uint64_t metadata;
  bool checksum;
  uint64_t hole;
};
constexpr GuardSpec kGuardLayout[] = {
    {64, 0, true, 64},       {1, 0, false, 64},         {100, 28, true, 128},
    {4095, 1, false, 64},    {4096, 0, true, 4096},     {63, 0, false, 64},
    {4097, 63, true, 256},   {10000, 240, false, 64},   {65536, 0, true, 8192},
    {1000, 24, false, 64},   {100000, 96, true, 65536}, {128, 0, false, 64},
    {200000, 0, false, 128}, {4032, 64, true, 64},      {4097, 0, false, 4096},
    {640, 0, true, 0},
};

class RequestFuzzTest : public ::testing::Test {
 protected:
  struct GuardObject {
    ObjectId id;
    std::vector<std::byte> data;
    std::vector<std::byte> metadata;
    bool checksum = false;
    Buffer held;
    HeaderFields header;
  };

  void SetUp() override {
    daemon_.emplace(kDaemonFlags);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(guard_, Client::Connect(daemon_->socket_path()));
    std::vector<ObjectId> spacers;
    for (size_t i = 0; i < std::size(kGuardLayout); ++i) {
      const GuardSpec& spec = kGuardLayout[i];
      GuardObject& g = objects_.emplace_back();
      g.id = ObjectId::FromName("guard/" + std::to_string(i));
      g.data = SeededBytes(spec.data, 2 * i + 1);
      g.metadata = SeededBytes(spec.metadata, 2 * i + 2);
      g.checksum = spec.checksum;
      CreateOptions options;
      options.metadata = g.metadata;
      options.checksum = g.checksum;
      ASSERT_OK(guard_->Put(g.id, g.data, options));
      if (spec.hole == 0) continue;
      spacers.push_back(ObjectId::FromName("guard/spacer/" + std::to_string(i)));
      ASSERT_OK(guard_->Put(spacers.back(), SeededBytes(spec.hole, 0)));
    }
    ASSERT_OK(guard_->Delete(spacers));
    for (GuardObject& g : objects_) {
      ASSERT_OK_AND_ASSIGN(g.held, guard_->Get(g.id));
      ids_.push_back(g.id);
    }
    // The shared header table, as any client maps it from its hello.
    RawSession observer(daemon_->socket_path());
    auto hello = observer.Call(1, [](auto r) { FillHello(r); });
    ASSERT_TRUE(hello && hello->get().isHello() && !hello->fds.empty());
    slots_ = hello->get().getHello().getHeaderSlots();
    header_bytes_ = size_t{slots_} * sizeof(ipc::ObjectHeader);
    void* table = ::mmap(nullptr, header_bytes_, PROT_READ, MAP_SHARED, hello->fds[0].get(), 0);
    ASSERT_NE(table, MAP_FAILED);
    headers_ = static_cast<const ipc::ObjectHeader*>(table);
    for (GuardObject& g : objects_) {
      const uint32_t slot = g.held.location().slot;
      ASSERT_LT(slot, slots_);
      g.header = HeaderFields::Of(headers_[slot]);
      ASSERT_EQ(g.header.state, ipc::ObjectState::kSealed);
      ASSERT_EQ(ObjectId::FromWords(g.header.id_lo, g.header.id_hi), g.id);
    }
  }

  void TearDown() override {
    if (headers_ != nullptr) ::munmap(const_cast<ipc::ObjectHeader*>(headers_), header_bytes_);
  }

  // What is wrong with the guard's objects as it sees them, without a request: their bytes
  // through the handles it holds, their headers, and slots claiming their ids. Empty if
  // nothing.
  std::string GuardDamage() const {
    std::string wrong;
    for (const GuardObject& g : objects_) {
      const std::string name = g.id.Hex() + " (" + std::to_string(g.data.size()) + " + " +
                               std::to_string(g.metadata.size()) + " bytes)";
      if (!SameBytes(g.held.data(), g.data) || !SameBytes(g.held.metadata(), g.metadata)) {
        wrong += "the guard's object " + name + " changed under its handle: " + FirstDifference(g) +
                 "\n";
      }
      const HeaderFields now = HeaderFields::Of(headers_[g.held.location().slot]);
      if (now != g.header) {
        wrong += "the header of the guard's object " + name + " changed: was {" +
                 g.header.ToString() + "}, is {" + now.ToString() + "}\n";
      }
    }
    for (uint32_t s = 0; s < slots_; ++s) {
      const HeaderFields h = HeaderFields::Of(headers_[s]);
      if (h.state == ipc::ObjectState::kFree) continue;
      for (const GuardObject& g : objects_) {
        if (h.id_lo == g.id.lo() && h.id_hi == g.id.hi() && s != g.held.location().slot) {
          wrong += "slot " + std::to_string(s) + " claims the guard's id: {" + h.ToString() + "}\n";
        }
      }
    }
    return wrong;
  }

  static std::string FirstDifference(const GuardObject& g) {
    const auto bytes = g.held.data();
    const auto metadata = g.held.metadata();
    for (size_t i = 0; i < std::min(bytes.size(), g.data.size()); ++i) {
      if (bytes[i] != g.data[i]) return "data byte " + std::to_string(i) + " differs";
    }
    for (size_t i = 0; i < std::min(metadata.size(), g.metadata.size()); ++i) {
      if (metadata[i] != g.metadata[i]) return "metadata byte " + std::to_string(i) + " differs";
    }
    return "sizes " + std::to_string(bytes.size()) + " + " + std::to_string(metadata.size());
  }

  // Whether the daemon process is still running (not exited, not a zombie): empty if so.
  std::string DaemonGone() const {
    std::ifstream in("/proc/" + std::to_string(daemon_->pid()) + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) return "the daemon has gone\n";
    const char state = stat[paren + 2];
    return state == 'Z' || state == 'X' ? "the daemon has exited\n" : "";
  }

  // Waits up to 2 s for a daemon that stopped answering to exit, so that a failure says
  // that it died rather than that it did not answer.
  void LetItDie() const {
    for (int i = 0; i < 200 && DaemonGone().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // GuardDamage, and what a fresh client sees: the daemon answers, serves the guard's
  // objects byte-exact, and their checksums verify.
  std::string Damage() {
    std::string wrong = DaemonGone() + GuardDamage();
    if (!wrong.empty()) return wrong;
    auto fresh = Client::Connect(daemon_->socket_path());
    if (!fresh.ok()) {
      LetItDie();
      return DaemonGone() + "a fresh client cannot connect: " + fresh.status().ToString() + "\n";
    }
    if (auto status = fresh->GetStatus(); !status.ok()) {
      return "no status: " + status.status().ToString() + "\n";
    }
    auto got = fresh->Get(ids_);
    if (!got.ok()) return "the guard's objects cannot be got: " + got.status().ToString() + "\n";
    for (size_t i = 0; i < objects_.size(); ++i) {
      const Buffer& b = (*got)[i];
      if (!b || !SameBytes(b.data(), objects_[i].data) ||
          !SameBytes(b.metadata(), objects_[i].metadata)) {
        wrong += "a fresh get of the guard's object " + objects_[i].id.Hex() +
                 " does not give its bytes\n";
      }
    }
    auto verified = fresh->Verify(ids_);
    if (!verified.ok()) return "verify fails: " + verified.status().ToString() + "\n";
    for (size_t i = 0; i < verified->size(); ++i) {
      const VerifyState expected =
          objects_[i].checksum ? VerifyState::kOk : VerifyState::kNoChecksum;
      if ((*verified)[i].state != expected) {
        wrong += "verify of the guard's object " + objects_[i].id.Hex() + ": state " +
                 std::to_string(static_cast<int>((*verified)[i].state)) + "\n";
      }
    }
    return wrong;
  }

  bool IsGuards(const ObjectId& id) const {
    return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
  }

  std::optional<TestDaemon> daemon_;
  std::optional<Client> guard_;
  std::vector<GuardObject> objects_;
  std::vector<ObjectId> ids_;
  const ipc::ObjectHeader* headers_ = nullptr;
  size_t header_bytes_ = 0;
  uint32_t slots_ = 0;
};

TEST_F(RequestFuzzTest, ExtremeValuesInWellFormedRequestsLeaveOthersUntouched) {
  const uint64_t seed = EnvOr("DEPOT_REQUEST_FUZZ_SEED", 34);
  const uint64_t steps = EnvOr("DEPOT_REQUEST_FUZZ_STEPS", 4000);
  const std::string replay = "DEPOT_REQUEST_FUZZ_SEED=" + std::to_string(seed) +
                             " DEPOT_REQUEST_FUZZ_STEPS=" + std::to_string(steps);
  SCOPED_TRACE(replay);
  constexpr uint64_t kCheckEvery = 50;
  RequestFuzzer fuzzer(daemon_->socket_path(), seed);
  for (uint64_t step = 0; step < steps; ++step) {
    fuzzer.Step(step);
    // The guard's view is checked after every step, the daemon's answers every few and as
    // soon as it hangs up on the fuzzer.
    const bool full = step % kCheckEvery == kCheckEvery - 1 || fuzzer.hung_up();
    if (fuzzer.hung_up()) LetItDie();
    const std::string wrong = full ? Damage() : GuardDamage();
    if (!wrong.empty() || fuzzer.hung_up()) {
      FAIL() << "at step " << step << " (" << replay << "):\n"
             << wrong << fuzzer.hangup() << "\nthe fuzzer's requests since the last full check:\n"
             << fuzzer.Recent();
    }
    if (full) fuzzer.ForgetRecent();
  }
  fuzzer.Receive();
  const RequestFuzzer::Counts counts = fuzzer.counts();
  std::cout << "request fuzz: " << counts.sent << " requests sent (" << counts.too_large
            << " over the frame limit left out), " << counts.ok << " ok and " << counts.errors
            << " error replies, " << counts.created << " creates, " << counts.wraps
            << " with wrapping sizes, " << counts.assigned << " tasks assigned\n";
  EXPECT_GT(counts.created, 0u) << "the fuzzer never created anything";
  EXPECT_GT(counts.errors, 0u) << "nothing the fuzzer sent was refused";
  fuzzer.Disconnect();

  // Everything it held is given back: nothing is referenced but the guard's objects, once
  // each, nothing is being created, and the workers and tasks it had are gone.
  ASSERT_OK_AND_ASSIGN(Client observer, Client::Connect(daemon_->socket_path()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    ASSERT_OK_AND_ASSIGN(auto objects, observer.List());
    ASSERT_OK_AND_ASSIGN(auto workers, observer.Workers());
    std::string held;
    for (const auto& o : objects) {
      const uint32_t expected = IsGuards(o.id) ? 1 : 0;
      if (o.ref_count != expected || o.state != ObjectState::kSealed) {
        held += " " + o.id.Hex() + " (" + std::to_string(o.ref_count) + " references" +
                (o.state == ObjectState::kSealed ? ")" : ", being created)");
      }
    }
    if (!workers.empty()) held += " " + std::to_string(workers.size()) + " workers";
    if (held.empty()) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the fuzzer's holds outlived it:" << held;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_OK_AND_ASSIGN(auto tasks, observer.Tasks());
  for (const auto& t : tasks) {
    EXPECT_TRUE(t.state == TaskState::kDone || t.state == TaskState::kFailed ||
                t.state == TaskState::kCancelled)
        << "task " << t.task << " of the fuzzer is still " << TaskStateName(t.state);
  }
  const std::string wrong = Damage();
  EXPECT_EQ(wrong, "") << "after the fuzzer has gone (" << replay << ")";
  ASSERT_OK(observer.Put(ObjectId::FromName("request-fuzz/after"), AsBytes("still serving")));
  ASSERT_OK_AND_ASSIGN(Buffer after, observer.Get(ObjectId::FromName("request-fuzz/after")));
  EXPECT_TRUE(SameBytes(after.data(), AsBytes("still serving")));
  ExpectObjectsOnHostMatchTheList(observer);
}

}  // namespace
}  // namespace depot::testing
