// Connection: one Client's socket to the daemon, and everything the Client shares with the
// Buffers it handed out (segment mappings, the table of held objects).
//
// Requests are pipelined: any number of threads may wait for replies at once. There is no
// reader thread (a hand-off between threads costs several microseconds per request);
// instead, leader/follower: a caller sends its request, and if no other thread is reading
// the socket it becomes the reader, files the replies it reads for the other callers and
// wakes them, and on receiving its own reply hands the reader role to a waiting caller.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "depot/client.h"
#include "depot/ipc/framing.h"
#include "depot/ipc/object_header.h"
#include "depot/ipc/protocol.h"
#include "holding.h"
#include "mapping.h"
#include "segments.h"

namespace depot::internal {

// A reply read from the socket, owned by the caller that asked for it.
class Reply {
 public:
  Reply() = default;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  // The message. Valid while this Reply lives. Cap'n Proto throws kj::Exception from
  // accessors of a malformed message: read it inside Decode().
  wire::Reply::Reader get();
  // The descriptors the reply carried besides those of its new segments (hello's table).
  std::vector<ipc::UniqueFd>& fds() { return fds_; }

 private:
  friend class Connection;
  std::vector<capnp::word> words_;
  std::vector<ipc::UniqueFd> fds_;
  std::optional<capnp::FlatArrayMessageReader> message_;
};

// A request being built. Its first segment lies inside this object, so a small request
// allocates nothing until it is framed.
class RequestMessage {
 public:
  RequestMessage() = default;
  RequestMessage(const RequestMessage&) = delete;
  RequestMessage& operator=(const RequestMessage&) = delete;

  wire::Request::Builder root() { return message_.getRoot<wire::Request>(); }
  capnp::MessageBuilder& message() { return message_; }

 private:
  static constexpr size_t kFirstSegmentWords = 64;
  capnp::word first_segment_[kFirstSegmentWords]{};  // zeroed, as MallocMessageBuilder needs
  capnp::MallocMessageBuilder message_{kj::arrayPtr(first_segment_, kFirstSegmentWords)};
};

// Runs `decode` (which reads a Reply and returns a Status or Result), turning an exception
// Cap'n Proto throws on a malformed reply into an Internal error: exceptions never cross
// the client's API.
template <typename F>
auto Decode(F&& decode) -> decltype(decode()) {
  try {
    return decode();
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("malformed reply from the daemon: ") +
                            e.getDescription().cStr());
  }
}

class Connection {
 public:
  // Connects to the daemon at `socket_path` and performs the handshake. Fails with
  // ConnectionFailed if no daemon listens there and ProtocolMismatch (the daemon's message)
  // if it speaks another protocol version.
  static Result<std::shared_ptr<Connection>> Open(const std::string& socket_path,
                                                  const ConnectOptions& options);

  Connection(ipc::UniqueFd socket, std::string socket_path, std::chrono::microseconds spin);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `request` (its id is set here) and waits for the reply. Returns
  // the reply's error as a Status (OK: read the result from `*reply`); Disconnected if the
  // connection breaks first or broke earlier; LimitExceeded if the request exceeds the
  // daemon's frame limit. Thread-safe.
  Status Call(RequestMessage& request, Reply* reply);

  // Gives references back, one per id, asking for no reply. Does nothing once the
  // connection is broken (the daemon has released everything then). Thread-safe.
  void Release(std::span<const ObjectId> ids);

  // Whether the connection broke: the daemon has then released every reference it held.
  bool broken() const { return is_broken_.load(std::memory_order_acquire); }

  // The header of `slot` in the shared header table; null if the slot is out of range.
  const ipc::ObjectHeader* header(uint32_t slot) const;

  Segments& segments() { return segments_; }
  HoldingTable& holdings() { return holdings_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t session_id() const { return session_id_; }
  uint32_t max_batch() const { return max_batch_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  // A caller waiting for its reply. Lives on the caller's stack; guarded by mu_.
  struct Waiter {
    uint64_t id;
    Reply* reply;
    bool done = false;
    Status status;  // set, with done, when the connection breaks first
    std::condition_variable cv;
  };

  Status Handshake(const ConnectOptions& options);
  // Writes a whole frame; breaks the connection on failure.
  void Send(ipc::OutFrame& frame);
  // As the reader: reads and files replies until `me`'s has arrived or the connection breaks.
  void ReadUntilDone(Waiter& me);
  // Files one frame's reply for its waiter, after mapping the segments it announces.
  // Returns whether it was `me`'s; an error means the daemon broke the protocol.
  Result<bool> Dispatch(ipc::FrameReader::Frame frame, Waiter& me);
  // Waits for the socket to be readable (first polling for spin_) and reads what is there.
  Status Fill();
  // Fails every waiter, and every later call, with `why`; shuts the socket down.
  void Break(Status why);

  ipc::UniqueFd socket_;
  const std::string socket_path_;
  const std::chrono::microseconds spin_;
  std::atomic<uint64_t> next_id_{1};

  // From the handshake.
  uint64_t epoch_ = 0;
  uint64_t session_id_ = 0;
  uint32_t max_batch_ = ipc::kDefaultMaxBatch;
  uint32_t max_frame_bytes_ = ipc::kDefaultMaxFrameBytes;
  uint32_t header_slots_ = 0;
  Mapping header_table_;  // read-only

  std::mutex send_mu_;  // one frame at a time on the socket

  std::mutex mu_;
  bool reading_ = false;          // some caller is the reader
  std::vector<Waiter*> waiters_;  // callers whose reply has not arrived
  Status broken_;                 // why the connection is unusable; OK while it works
  std::atomic<bool> is_broken_{false};

  ipc::FrameReader reader_;  // used only by the thread that is the reader

  Segments segments_;
  HoldingTable holdings_;
};

}  // namespace depot::internal
