// One client's transport: frames in and out of its Unix socket, the descriptors of shared
// memory that go with replies, and back-pressure. It knows nothing of requests: each
// complete frame goes to its Handler (the Session), which answers through Send.
//
// Back-pressure: a client that pipelines requests has a few handled per turn of the loop,
// taking turns with the others; a client that does not read its replies has nothing more
// handled until they drain; a handler may say it is saturated (too many jobs) and Resume
// later. The read buffer past what every client may take counts against the client's
// limits (Handler::Charge).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <capnp/message.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/status.h"
#include "protocol.capnp.h"
#include "store/arena.h"
#include "store/gpu/pool.h"

namespace depot::store {

// What a reply carries besides its message: of the arena `segments` it names (repeats
// allowed), those the client lacks, read-only: a shared segment it has not been sent, and a
// dedicated segment always; `writable_segment` (-1: none) writable, unless it is a shared
// one sent so before; likewise of the `chunks` of GPU `chunk_device`'s pool (-1: none) those
// not sent before, and its `writable_chunk`; and descriptors of the reply's own, after those.
struct ReplyAttachments {
  std::span<const uint32_t> segments;
  int64_t writable_segment = -1;
  int32_t chunk_device = -1;
  std::span<const uint32_t> chunks;
  int64_t writable_chunk = -1;
  std::span<const int> extra_fds;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // One complete request frame; the connection may have closed when it returns.
    virtual void OnFrame(kj::ArrayPtr<const capnp::word> payload) = 0;
    // True while the handler takes no more frames (Resume goes on).
    virtual bool Saturated() const = 0;
    // Counts `bytes` more (negative: fewer) of daemon memory for this client's requests.
    virtual Status Charge(int64_t bytes) = 0;
    // The connection has closed, for `reason`; called once.
    virtual void OnClosed(const std::string& reason, bool protocol_error) = 0;
  };

  // The descriptors replies attach come from `arena` and `gpus`, which outlive it. The client
  // is of the class `writers` (Arena, Writers): it is sent no other class's segment writable.
  Connection(boost::asio::io_context& loop, boost::asio::local::stream_protocol::socket socket,
             uint32_t max_frame_bytes, const Arena& arena, std::span<gpu::DevicePool* const> gpus,
             uint32_t writers, Handler& handler);

  // Starts reading.
  void Start();
  // Closes the socket and drops unsent replies; the handler hears of it once. Idempotent.
  void Close(const std::string& reason);
  // Closes the connection of a client that broke the protocol.
  void Violation(const std::string& what);
  // Sends a reply with the descriptors `attach` names.
  void Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
            const ReplyAttachments& attach = {});
  // Handles the frames read so far, then reads on: after the handler was saturated.
  void Resume();

  int native_handle() { return socket_.native_handle(); }
  bool closed() const { return closed_; }

 private:
  void Shut(const std::string& reason, bool protocol_error);
  void WaitReadable();
  void OnReadable();
  // Counts the read buffer's growth past kFreeReadBuffer (or its shrinking).
  Status ChargeReadBuffer();
  // Hands the complete frames read so far to the handler; false when the connection has
  // closed or must wait (replies to drain, the handler saturated, its turn over).
  bool HandleBufferedFrames();
  void Flush();
  void AttachSegments(wire::Reply::Builder reply, const ReplyAttachments& attach,
                      std::vector<int>& fds, std::vector<std::shared_ptr<const void>>& keep);
  void AttachChunks(wire::Reply::Builder reply, const ReplyAttachments& attach,
                    std::vector<int>& fds);

  boost::asio::io_context& loop_;
  boost::asio::local::stream_protocol::socket socket_;
  const Arena& arena_;
  std::span<gpu::DevicePool* const> gpus_;
  const uint32_t writers_;
  Handler& handler_;
  ipc::FrameReader reader_;
  std::deque<ipc::OutFrame> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool reading_ = false;
  bool paused_ = false;  // not reading until queued replies drain
  bool closed_ = false;
  uint64_t buffer_charge_ = 0;  // of the read buffer, counted by Handler::Charge
  // What the client has been sent: some shared segments read-only (indexed by segment) and
  // some writable (by segment), each as 0 for none, else the generation sent plus 1; and
  // likewise some chunks of each GPU's pool.
  std::vector<uint32_t> segments_sent_;
  std::unordered_map<uint32_t, uint32_t> writable_sent_;
  std::vector<std::vector<bool>> chunks_sent_;                   // by GPU, by chunk
  std::set<std::pair<int32_t, uint32_t>> writable_chunks_sent_;  // (GPU, chunk)
};

}  // namespace depot::store
