#include "socket_echo.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace depot::bench {

namespace {

bool WriteAll(int fd, const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

SocketEcho::SocketEcho(size_t message_bytes)
    : bytes_(message_bytes), out_(message_bytes, std::byte{0x5a}), in_(message_bytes) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  near_ = fds[0];
  far_ = fds[1];
  echo_ = std::thread([this] {
    std::vector<std::byte> buf(bytes_);
    while (ReadAll(far_, buf.data(), bytes_) && WriteAll(far_, buf.data(), bytes_)) {
    }
  });
}

SocketEcho::~SocketEcho() {
  if (near_ >= 0) ::shutdown(near_, SHUT_RDWR);  // the echo thread's read returns 0
  if (echo_.joinable()) echo_.join();
  if (near_ >= 0) ::close(near_);
  if (far_ >= 0) ::close(far_);
}

bool SocketEcho::RoundTrip() {
  return near_ >= 0 && WriteAll(near_, out_.data(), bytes_) && ReadAll(near_, in_.data(), bytes_);
}

Latencies MeasureRoundTrips(benchmark::State& state, size_t message_bytes) {
  SocketEcho echo(message_bytes);
  Latencies run;
  run.Reserve(state.max_iterations);
  run.Start();
  for (auto _ : state) {
    if (!echo.RoundTrip()) {
      state.SkipWithError("socket round trip failed");
      break;
    }
    run.Lap();
  }
  state.SetItemsProcessed(state.iterations());
  return run;
}

}  // namespace depot::bench
