// SocketEcho: the baseline every request to depotd is compared with, a raw round trip over
// a Unix stream socket to an echo thread in the same program, with blocking reads.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <thread>
#include <vector>

#include "latency.h"

namespace depot::bench {

class SocketEcho {
 public:
  // A socketpair whose far end a thread echoes in messages of `message_bytes`.
  explicit SocketEcho(size_t message_bytes);
  SocketEcho(const SocketEcho&) = delete;
  SocketEcho& operator=(const SocketEcho&) = delete;
  ~SocketEcho();

  // Sends one message and reads the echo back in full. Returns false if the socket failed.
  bool RoundTrip();

 private:
  const size_t bytes_;
  int near_ = -1;
  int far_ = -1;
  std::vector<std::byte> out_;
  std::vector<std::byte> in_;
  std::thread echo_;
};

// Times one round trip of `message_bytes` per benchmark iteration, the baseline run of every
// benchmark program; the caller reports the latencies.
Latencies MeasureRoundTrips(benchmark::State& state, size_t message_bytes);

}  // namespace depot::bench
