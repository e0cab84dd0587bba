#include "depot/ipc/framing.h"

#include <capnp/serialize.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace depot::ipc {

namespace {
// Linux refuses more than SCM_MAX_FD (253) descriptors in one sendmsg, and a recvmsg on a
// stream socket stops at each message that carries some.
constexpr size_t kMaxFdsPerWrite = 253;
// Room for the descriptors one recvmsg can bring.
constexpr size_t kControlBytes = CMSG_SPACE(kMaxFdsPerWrite * sizeof(int));
constexpr size_t kInitialBuffer = 64 * 1024;
// An empty buffer larger than this shrinks back to kInitialBuffer.
constexpr size_t kShrinkAbove = 1024 * 1024;
}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<OutFrame> EncodeFrame(capnp::MessageBuilder& message, std::vector<int> fds,
                             uint32_t max_bytes) {
  if (fds.size() > kMaxFdsPerFrame) {
    return Status::LimitExceeded("a frame can carry at most " + std::to_string(kMaxFdsPerFrame) +
                                 " file descriptors, not " + std::to_string(fds.size()));
  }
  size_t words = capnp::computeSerializedSizeInWords(message);
  if (words * sizeof(capnp::word) > max_bytes) {
    return Status::LimitExceeded("message of " + std::to_string(words * sizeof(capnp::word)) +
                                 " bytes exceeds the frame limit of " + std::to_string(max_bytes) +
                                 " bytes");
  }
  OutFrame frame;
  frame.bytes.resize(words + 1);
  FrameHeader header{static_cast<uint32_t>(words * sizeof(capnp::word)),
                     static_cast<uint32_t>(fds.size())};
  std::memcpy(static_cast<void*>(frame.bytes.data()), &header, sizeof(header));
  kj::ArrayOutputStream out(kj::arrayPtr(reinterpret_cast<kj::byte*>(frame.bytes.data() + 1),
                                         words * sizeof(capnp::word)));
  capnp::writeMessage(out, message);
  frame.fds = std::move(fds);
  return frame;
}

Result<bool> WriteFrame(int socket, OutFrame& frame) {
  const size_t total = frame.bytes.size() * sizeof(capnp::word);
  while (frame.sent < total) {
    // The next batch of descriptors goes with this write; while more batches follow, the
    // write is one byte, so that each batch travels with bytes of its own frame (a frame
    // has far more bytes than batches: each descriptor is named in its payload).
    const size_t batch = std::min(kMaxFdsPerWrite, frame.fds.size() - frame.fds_sent);
    const bool more = frame.fds_sent + batch < frame.fds.size();
    iovec iov{reinterpret_cast<char*>(frame.bytes.data()) + frame.sent,
              more ? size_t{1} : total - frame.sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[kControlBytes];
    if (batch != 0) {
      const size_t len = batch * sizeof(int);
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(len);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(len);
      std::memcpy(CMSG_DATA(cmsg), frame.fds.data() + frame.fds_sent, len);
    }
    ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EPIPE || errno == ECONNRESET) {
        return Status::Disconnected("the peer closed the connection");
      }
      return Status::FromErrno("sendmsg", errno);
    }
    frame.sent += static_cast<size_t>(n);
    frame.fds_sent += batch;
  }
  return true;
}

Status WriteFrameFully(int socket, OutFrame& frame) {
  for (;;) {
    DEPOT_ASSIGN_OR_RETURN(bool done, WriteFrame(socket, frame));
    if (done) return Status::OK();
    pollfd p{socket, POLLOUT, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return Status::FromErrno("poll", errno);
  }
}

FrameReader::FrameReader(uint32_t max_frame_bytes)
    : max_frame_bytes_(max_frame_bytes), buf_(kInitialBuffer / sizeof(capnp::word)) {}

void FrameReader::Compact() {
  if (begin_ != end_) return;
  begin_ = end_ = 0;
  // A large frame is gone: give its memory back rather than keep it for the connection's
  // lifetime.
  if (buf_.size() * sizeof(capnp::word) > kShrinkAbove) {
    buf_.resize(kInitialBuffer / sizeof(capnp::word));
    buf_.shrink_to_fit();
  }
}

Result<size_t> FrameReader::ReadSome(int socket, bool* would_block, bool dont_wait) {
  *would_block = false;
  Compact();
  size_t capacity = buf_.size() * sizeof(capnp::word);
  if (capacity - end_ < kInitialBuffer / 4 && begin_ > 0) {
    // Move the partial frame to the front; begin_ stays a multiple of 8, so frames stay
    // word-aligned.
    auto* base = reinterpret_cast<char*>(buf_.data());
    std::memmove(base, base + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (capacity - end_ < kInitialBuffer / 4) {
    // Grow with what arrived, never to what a header merely announces: the buffer stays
    // within twice the bytes the peer really sent (plus a little), so announcing a large
    // frame and sending nothing costs the daemon nothing.
    buf_.resize(buf_.size() * 2);
    capacity = buf_.size() * sizeof(capnp::word);
  }

  iovec iov{reinterpret_cast<char*>(buf_.data()) + end_, capacity - end_};
  alignas(cmsghdr) char control[kControlBytes];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      *would_block = true;
      return size_t{0};
    }
    if (errno == ECONNRESET) return size_t{0};
    return Status::FromErrno("recvmsg", errno);
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.emplace_back(fd);
      }
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return Status::InvalidArgument("the peer sent more file descriptors than a frame may carry");
  }
  end_ += static_cast<size_t>(n);
  return static_cast<size_t>(n);
}

Result<std::optional<FrameReader::Frame>> FrameReader::Next() {
  const size_t avail = end_ - begin_;
  if (avail < sizeof(FrameHeader)) return std::optional<Frame>();
  auto* base = reinterpret_cast<const char*>(buf_.data());
  FrameHeader header;
  std::memcpy(&header, base + begin_, sizeof(header));
  if (header.payload_bytes > max_frame_bytes_) {
    return Status::LimitExceeded("frame of " + std::to_string(header.payload_bytes) +
                                 " bytes exceeds the limit of " + std::to_string(max_frame_bytes_) +
                                 " bytes");
  }
  if (header.payload_bytes == 0 || header.payload_bytes % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("malformed frame header (payload size " +
                                   std::to_string(header.payload_bytes) + ")");
  }
  if (header.fd_count > kMaxFdsPerFrame) {
    return Status::InvalidArgument("malformed frame header (" + std::to_string(header.fd_count) +
                                   " descriptors)");
  }
  const size_t frame_bytes = sizeof(FrameHeader) + header.payload_bytes;
  if (avail < frame_bytes) return std::optional<Frame>();  // ReadSome grows as bytes arrive
  if (fds_.size() < header.fd_count) {
    return Status::InvalidArgument("frame announces " + std::to_string(header.fd_count) +
                                   " file descriptors but " + std::to_string(fds_.size()) +
                                   " arrived");
  }
  Frame frame;
  frame.payload = kj::arrayPtr(buf_.data() + (begin_ + sizeof(FrameHeader)) / sizeof(capnp::word),
                               header.payload_bytes / sizeof(capnp::word));
  frame.fds.reserve(header.fd_count);
  for (uint32_t i = 0; i < header.fd_count; ++i) {
    frame.fds.push_back(std::move(fds_.front()));
    fds_.pop_front();
  }
  begin_ += frame_bytes;
  return std::optional<Frame>(std::move(frame));
}

Result<UniqueFd> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is empty or longer than " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::FromErrno("socket", errno);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) {
    const int err = errno;
    switch (err) {
      case ENOENT:
      case ECONNREFUSED:
        return Status::ConnectionFailed("no depot daemon is listening at " + path +
                                        " (start one with `depotd --socket " + path +
                                        "`, or point DEPOT_SOCKET at a running one)");
      case EACCES:
      case EPERM:
        return Status::ConnectionFailed("permission denied connecting to " + path +
                                        " (the daemon's socket is mode 0600 by default; start it "
                                        "with --socket-mode to share it)");
      case ENOTDIR:
        return Status::ConnectionFailed("cannot reach " + path +
                                        ": a component of the path is not a directory");
      default:
        return Status::ConnectionFailed("cannot connect to " + path + ": " + std::strerror(err));
    }
  }
  return fd;
}

Status CheckDaemonCredentials(int socket, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno("SO_PEERCRED on " + path, errno);
  }
  const uid_t me = ::getuid();
  if (cred.uid == me || cred.uid == 0) return Status::OK();
  const char* named = std::getenv("DEPOT_DAEMON_UID");
  if (named != nullptr && *named != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long uid = std::strtoul(named, &end, 10);
    if (errno != 0 || *end != '\0' || uid > UINT32_MAX) {
      return Status::InvalidArgument("DEPOT_DAEMON_UID='" + std::string(named) +
                                     "' is not a uid (a number)");
    }
    if (cred.uid == static_cast<uid_t>(uid)) return Status::OK();
  }
  return Status::ConnectionFailed(
      "refusing to use " + path + ": the process listening there (pid " + std::to_string(cred.pid) +
      ") runs as uid " + std::to_string(cred.uid) + ", not as you (uid " + std::to_string(me) +
      ") or root, so it could read or change what you store; if it is the depot daemon you "
      "mean to use, set DEPOT_DAEMON_UID=" +
      std::to_string(cred.uid));
}

}  // namespace depot::ipc
