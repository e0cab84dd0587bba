// bench_attacks: the daemon's own memory under the memory attacks of issue 19.
//
// Each attack runs against a fresh depotd (--memory 256MiB, one simulated 1 GiB GPU), as a
// client that speaks the protocol by hand would mount it, and the daemon's private resident
// memory (RssAnon, sampled every millisecond from /proc) is reported at its peak, as growth
// over the idle daemon's:
//
//   huge_frames      100 connections each announce a 16 MiB frame and send 8 bytes of it
//   half_sent        100 connections each send 12 MiB of a 15 MiB frame
//   unread_replies   one connection pipelines list requests (10,000 objects, 200-byte names)
//                    and never reads a reply
//   waiting_gets     one connection sends --waits gets (default 100), each naming 100,000
//                    ids that do not exist, waiting 60 s
//   long_names       100,000 empty objects with 4 KiB names
//   gpu_metadata     60 one-byte objects on the GPU with 15 MiB of metadata each
//
// `refused` counts the requests the daemon turned down (LimitExceeded). The bound the daemon
// promises is its metadata budget (--metadata-budget, 1 GiB by default) plus what its
// buffers take; the "before" figures in bench/README.md come from running this program
// against the daemon of an earlier build:
//
//   DEPOT_BENCH_DAEMON=/path/to/old/depotd build/bin/bench_attacks --protocol=2
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/ipc/framing.h"
#include "depot/ipc/protocol.h"
#include "depot/object_id.h"

namespace {

using namespace std::chrono_literals;
namespace ipc = depot::ipc;
namespace wire = depot::wire;

uint32_t g_protocol = ipc::kProtocolVersion;
int g_waits = 100;
// Peak growth by attack, MiB, for the summary.
std::map<std::string, std::pair<double, uint64_t>> g_results;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_attacks: %s\n", why.c_str());
  std::exit(1);
}

// The daemon's private resident memory (RssAnon), in bytes.
uint64_t RssAnon(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("RssAnon:")) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

// Samples RssAnon every millisecond until destroyed; peak() is the largest seen.
class PeakSampler {
 public:
  explicit PeakSampler(pid_t pid) : pid_(pid), thread_([this] { Run(); }) {}
  ~PeakSampler() {
    stop_ = true;
    thread_.join();
  }
  uint64_t peak() const { return peak_.load(); }

 private:
  void Run() {
    while (!stop_) {
      const uint64_t now = RssAnon(pid_);
      if (now > peak_.load()) peak_ = now;
      std::this_thread::sleep_for(1ms);
    }
  }
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

// A connection spoken by hand.
class Raw {
 public:
  explicit Raw(const std::string& path) : reader_(1u << 30) {
    auto fd = ipc::ConnectUnix(path);
    if (!fd.ok()) Die(fd.status().ToString());
    fd_ = std::move(*fd);
  }

  int fd() const { return fd_.get(); }

  void Send(uint64_t id, const std::function<void(wire::Request::Builder)>& fill) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(id);
    fill(request);
    auto frame = ipc::EncodeFrame(message);
    if (!frame.ok()) Die(frame.status().ToString());
    if (auto st = ipc::WriteFrameFully(fd_.get(), *frame); !st.ok()) Die(st.ToString());
  }

  // Sends without waiting: false if the socket is full (nothing sent).
  bool TrySend(uint64_t id, const std::function<void(wire::Request::Builder)>& fill) {
    pollfd p{fd_.get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    Send(id, fill);
    return true;
  }

  // The next reply's error code (waits up to 30 s).
  wire::ErrorCode Receive() {
    auto code = ReceiveWithin(30s);
    if (!code) Die("no reply from the daemon in 30 s");
    return *code;
  }

  // The next reply's error code, or nullopt if none comes within `timeout`.
  std::optional<wire::ErrorCode> ReceiveWithin(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto next = reader_.Next();
      if (!next.ok()) Die("bad frame from the daemon: " + next.status().ToString());
      if (next->has_value()) {
        capnp::FlatArrayMessageReader message((*next)->payload);
        return message.getRoot<wire::Reply>().getError();
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      bool would_block = false;
      auto n = reader_.ReadSome(fd_.get(), &would_block);
      if (!n.ok() || (*n == 0 && !would_block)) Die("the daemon hung up");
    }
  }

  void Hello() {
    Send(1, [](wire::Request::Builder r) {
      auto hello = r.initHello();
      hello.setProtocolVersion(g_protocol);
      hello.setClientName("bench_attacks");
    });
    if (Receive() != wire::ErrorCode::OK) Die("hello refused (wrong --protocol?)");
  }

 private:
  ipc::UniqueFd fd_;
  ipc::FrameReader reader_;
};

void SetId(wire::Id::Builder out, const depot::ObjectId& id) {
  out.setLo(id.lo());
  out.setHi(id.hi());
}

// Sends `count` requests made by `fill(i)`, at most `window` unanswered; returns how many
// were refused with LimitExceeded.
uint64_t Pipeline(Raw& raw, size_t count, size_t window,
                  const std::function<void(size_t, wire::Request::Builder)>& fill) {
  uint64_t refused = 0;
  size_t answered = 0;
  for (size_t i = 0; i < count; ++i) {
    raw.Send(i + 2, [&](wire::Request::Builder r) { fill(i, r); });
    if (i + 1 - answered >= window) {
      refused += raw.Receive() == wire::ErrorCode::LIMIT_EXCEEDED;
      ++answered;
    }
  }
  for (; answered < count; ++answered) refused += raw.Receive() == wire::ErrorCode::LIMIT_EXCEEDED;
  return refused;
}

enum class Attack {
  kHugeFrames,
  kHalfSent,
  kUnreadReplies,
  kWaitingGets,
  kLongNames,
  kGpuMetadata
};

void BM_Attack(benchmark::State& state, const std::string& name, Attack attack) {
  for (auto _ : state) {
    depot::bench::Daemon daemon(
        {"--memory", "256MiB", "--simulate-gpus", "1:1GiB", "--bandwidth-probe", "0"});
    const std::string& socket = daemon.socket_path();
    const uint64_t idle = RssAnon(daemon.pid());
    uint64_t refused = 0;
    uint64_t peak = 0;
    {
      PeakSampler sampler(daemon.pid());
      std::vector<std::unique_ptr<Raw>> conns;
      switch (attack) {
        case Attack::kHugeFrames: {
          for (int i = 0; i < 100; ++i) {
            conns.push_back(std::make_unique<Raw>(socket));
            const ipc::FrameHeader header{16u << 20, 0};
            char bytes[sizeof(header) + 8] = {};
            std::memcpy(bytes, &header, sizeof(header));
            if (::send(conns.back()->fd(), bytes, sizeof(bytes), MSG_NOSIGNAL) < 0) {
              Die("send: " + std::string(std::strerror(errno)));
            }
          }
          std::this_thread::sleep_for(1s);  // the daemon reads what came
          break;
        }
        case Attack::kHalfSent: {
          const std::vector<char> piece(1 << 20, 'x');
          for (int i = 0; i < 100; ++i) {
            conns.push_back(std::make_unique<Raw>(socket));
            const ipc::FrameHeader header{15u << 20, 0};
            bool open = ::send(conns.back()->fd(), &header, sizeof(header), MSG_NOSIGNAL) > 0;
            for (int mib = 0; open && mib < 12; ++mib) {
              open = ::send(conns.back()->fd(), piece.data(), piece.size(), MSG_NOSIGNAL) ==
                     static_cast<ssize_t>(piece.size());
            }
            refused += !open;
          }
          std::this_thread::sleep_for(1s);  // the daemon reads what came
          break;
        }
        case Attack::kUnreadReplies: {
          auto writer = std::make_unique<Raw>(socket);
          writer->Hello();
          const std::string name_tail(200, 'n');
          Pipeline(*writer, 10'000, 256, [&](size_t i, wire::Request::Builder r) {
            auto c = r.initCreate();
            SetId(c.initId(), depot::ObjectId::FromName("attack/list/" + std::to_string(i)));
            c.setName(name_tail + std::to_string(i));
            c.setDataSize(0);
            c.setSeal(true);
            c.setRelease(true);
          });
          auto& raw = *conns.emplace_back(std::make_unique<Raw>(socket));
          raw.Hello();
          // List requests until the socket stays full for a second: the daemon stopped
          // reading this client.
          auto last_sent = std::chrono::steady_clock::now();
          for (uint64_t id = 2; std::chrono::steady_clock::now() - last_sent < 1s;) {
            if (raw.TrySend(id, [](wire::Request::Builder r) { r.initList().setLimit(10'000); })) {
              ++id;
              last_sent = std::chrono::steady_clock::now();
            } else {
              std::this_thread::sleep_for(1ms);
            }
          }
          break;
        }
        case Attack::kWaitingGets: {
          auto& raw = *conns.emplace_back(std::make_unique<Raw>(socket));
          raw.Hello();
          for (int w = 0; w < g_waits; ++w) {
            raw.Send(static_cast<uint64_t>(w) + 2, [&](wire::Request::Builder r) {
              auto get = r.initGet();
              auto ids = get.initIds(100'000);
              for (unsigned i = 0; i < ids.size(); ++i) {
                SetId(ids[i], depot::ObjectId::FromName("attack/missing/" + std::to_string(w) +
                                                        "/" + std::to_string(i)));
              }
              get.setTimeoutMs(60'000);
            });
          }
          // Those refused are answered at once; the others wait. Give the daemon time to
          // take in the last of them.
          while (auto code = raw.ReceiveWithin(1s))
            refused += *code == wire::ErrorCode::LIMIT_EXCEEDED;
          break;
        }
        case Attack::kLongNames: {
          auto& raw = *conns.emplace_back(std::make_unique<Raw>(socket));
          raw.Hello();
          const std::string long_name(4096 - 16, 'x');
          refused = Pipeline(raw, 100'000, 256, [&](size_t i, wire::Request::Builder r) {
            auto c = r.initCreate();
            SetId(c.initId(), depot::ObjectId::FromName("attack/name/" + std::to_string(i)));
            c.setName(long_name + std::to_string(100'000 + i));
            c.setDataSize(0);
            c.setSeal(true);
            c.setRelease(true);
          });
          break;
        }
        case Attack::kGpuMetadata: {
          auto& raw = *conns.emplace_back(std::make_unique<Raw>(socket));
          raw.Hello();
          const std::vector<capnp::byte> metadata(15u << 20, 0x6d);
          for (int i = 0; i < 60; ++i) {
            const auto id = depot::ObjectId::FromName("attack/gpu/" + std::to_string(i));
            raw.Send(2, [&](wire::Request::Builder r) {
              auto c = r.initCreate();
              SetId(c.initId(), id);
              c.setDataSize(1);
              c.setDevice(0);
              c.setMetadata(capnp::Data::Reader(metadata.data(), metadata.size()));
            });
            const auto code = raw.Receive();
            if (code == wire::ErrorCode::LIMIT_EXCEEDED) {
              ++refused;
              continue;
            }
            if (code != wire::ErrorCode::OK) Die("a GPU create failed");
            raw.Send(3, [&](wire::Request::Builder r) { SetId(r.initSeal(), id); });
            if (raw.Receive() != wire::ErrorCode::OK) Die("a GPU seal failed");
          }
          break;
        }
      }
      std::this_thread::sleep_for(20ms);  // one more sample after the attack
      peak = sampler.peak();
    }
    const double growth_mib = peak > idle ? static_cast<double>(peak - idle) / (1 << 20) : 0;
    state.counters["peak_growth_MiB"] = growth_mib;
    state.counters["refused"] = static_cast<double>(refused);
    g_results[name] = {growth_mib, refused};
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first: --protocol=N (the daemon's hello version), --waits=N.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--protocol=")) {
      g_protocol = static_cast<uint32_t>(std::stoul(arg.substr(11)));
    } else if (arg.starts_with("--waits=")) {
      g_waits = std::stoi(arg.substr(8));
    } else {
      rest.push_back(argv[i]);
    }
  }
  argc = static_cast<int>(rest.size());
  benchmark::Initialize(&argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(argc, rest.data())) return 1;

  const std::pair<const char*, Attack> attacks[] = {
      {"huge_frames", Attack::kHugeFrames},       {"half_sent", Attack::kHalfSent},
      {"unread_replies", Attack::kUnreadReplies}, {"waiting_gets", Attack::kWaitingGets},
      {"long_names", Attack::kLongNames},         {"gpu_metadata", Attack::kGpuMetadata},
  };
  for (const auto& [name, attack] : attacks) {
    benchmark::RegisterBenchmark(
        name, [name = std::string(name),
               attack = attack](benchmark::State& state) { BM_Attack(state, name, attack); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\nThe daemon's peak private memory (RssAnon) over its idle size, by attack:\n");
  for (const auto& [name, attack] : attacks) {
    if (!g_results.contains(name)) continue;  // filtered out
    const auto& [mib, refused] = g_results[name];
    std::printf("  %-16s %9.1f MiB   %llu requests refused\n", name, mib,
                static_cast<unsigned long long>(refused));
  }
  std::printf("Bound: the metadata budget (1 GiB by default) plus the daemon's buffers.\n");
  return 0;
}
