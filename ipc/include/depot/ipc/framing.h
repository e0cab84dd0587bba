// Frames on a Unix stream socket, with file descriptors passed by SCM_RIGHTS.
//
// A frame is a FrameHeader followed by `payload_bytes` of Cap'n Proto flat-array message.
// The descriptors a frame carries are sent with its first byte; the receiver queues every
// descriptor it gets and hands a frame exactly `fd_count` of them, in order.
#pragma once

#include <capnp/message.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "depot/status.h"

namespace depot::ipc {

struct FrameHeader {
  uint32_t payload_bytes;  // a multiple of 8
  uint32_t fd_count;
};
static_assert(sizeof(FrameHeader) == 8);

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Most descriptors one frame carries. Linux attaches at most 253 (SCM_MAX_FD) to one
// sendmsg, so a frame with more goes out in several writes of at most that many each (the
// first ones a byte long); the reader gathers them until the frame is complete. A reply
// naming objects in more than 253 GPU chunks its client has not imported needs that.
inline constexpr size_t kMaxFdsPerFrame = 4096;

// A frame ready to send: header and payload in one buffer, plus the descriptors to attach.
// The descriptors are borrowed; what `keep` holds (shared owners of some of them) lives as
// long as the frame, for one that may wait to be sent while their files are let go elsewhere.
struct OutFrame {
  std::vector<capnp::word> bytes;  // FrameHeader, then the payload
  std::vector<int> fds;
  std::vector<std::shared_ptr<const void>> keep;
  size_t sent = 0;      // bytes of `bytes` already written
  size_t fds_sent = 0;  // of `fds` already attached to a write
};

// Serialises `message` into a frame. Fails with LimitExceeded if it exceeds `max_bytes`.
Result<OutFrame> EncodeFrame(capnp::MessageBuilder& message, std::vector<int> fds = {},
                             uint32_t max_bytes = UINT32_MAX);

// Writes as much of `frame` as the socket takes, attaching its descriptors to the first
// write. Returns true when the whole frame is written, false when the socket would block
// (call again when writable); an error Status if the peer is gone or the call fails.
Result<bool> WriteFrame(int socket, OutFrame& frame);
// Writes the whole frame, waiting while the socket is full (blocking use).
Status WriteFrameFully(int socket, OutFrame& frame);

// Accumulates bytes and descriptors read from a socket and cuts them into frames.
class FrameReader {
 public:
  explicit FrameReader(uint32_t max_frame_bytes);

  // One recvmsg into the buffer. Returns the number of bytes read, 0 at end of stream (or
  // when a non-blocking socket, or a read with `dont_wait`, finds nothing: then
  // `*would_block` is set), an IoError on failure. Received descriptors are queued, and
  // owned, by the reader.
  Result<size_t> ReadSome(int socket, bool* would_block, bool dont_wait = false);

  struct Frame {
    kj::ArrayPtr<const capnp::word> payload;  // valid until the next ReadSome/Next call
    std::vector<UniqueFd> fds;
  };
  // The next complete frame, nullopt if more bytes are needed. Fails with LimitExceeded on
  // a frame larger than the limit and InvalidArgument on a malformed header or on a frame
  // whose descriptors did not arrive with it.
  Result<std::optional<Frame>> Next();

  // Descriptors received and not yet handed out with a frame.
  size_t pending_fds() const { return fds_.size(); }
  // Gives a large buffer back once every byte in it has been handed out (ReadSome does the
  // same before it reads).
  void Compact();
  // Bytes buffered and not yet handed out.
  size_t buffered_bytes() const { return end_ - begin_; }
  // The buffer's size: it grows with what arrives (to hold a whole frame) and shrinks back
  // once a large frame is handled.
  size_t capacity() const { return buf_.size() * sizeof(capnp::word); }

 private:
  uint32_t max_frame_bytes_;
  std::vector<capnp::word> buf_;
  size_t begin_ = 0;  // in bytes
  size_t end_ = 0;
  std::deque<UniqueFd> fds_;
};

// Connects to the daemon's socket at `path` (blocking, close-on-exec).
Result<UniqueFd> ConnectUnix(const std::string& path);

// Checks, before a client sends anything, that the process listening at `path` (connected
// as `socket`) may be trusted with this process's data: it runs as this process's uid, as
// root, or as the uid DEPOT_DAEMON_UID names. Anyone can create a socket at a path that
// another user's client will try (/tmp/depot-<uid>.sock when $XDG_RUNTIME_DIR is not set).
// Fails with ConnectionFailed naming the uid and pid found, and what to do.
Status CheckDaemonCredentials(int socket, const std::string& path);

}  // namespace depot::ipc
