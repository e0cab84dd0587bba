#include "store/connection.h"

#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "depot/ipc/units.h"

namespace depot::store {

namespace {
// Stop handling the requests of a client whose replies pile up unread beyond this. A reply
// may take it past the bound once (list replies are capped in size).
constexpr size_t kMaxQueuedReplyBytes = 4u << 20;
// What a read buffer may take without counting against the client's limits.
constexpr uint64_t kFreeReadBuffer = 1u << 20;
// Reads per wake-up, and frames handled, before other clients get a turn.
constexpr int kReadsPerTurn = 16;
constexpr int kFramesPerTurn = 16;

wire::ChunkHandle ToWire(ipc::ChunkHandle handle) {
  switch (handle) {
    case ipc::ChunkHandle::kPosixFd:
      return wire::ChunkHandle::POSIX_FD;
    case ipc::ChunkHandle::kLegacyIpc:
      return wire::ChunkHandle::LEGACY_IPC;
    case ipc::ChunkHandle::kMemfd:
      return wire::ChunkHandle::MEMFD;
  }
  return wire::ChunkHandle::MEMFD;
}
}  // namespace

Connection::Connection(boost::asio::io_context& loop,
                       boost::asio::local::stream_protocol::socket socket, uint32_t max_frame_bytes,
                       const Arena& arena, std::span<gpu::DevicePool* const> gpus, uint32_t writers,
                       Handler& handler)
    : loop_(loop),
      socket_(std::move(socket)),
      arena_(arena),
      gpus_(gpus),
      writers_(writers),
      handler_(handler),
      reader_(max_frame_bytes) {}

void Connection::Start() {
  socket_.non_blocking(true);
  WaitReadable();
}

void Connection::Close(const std::string& reason) { Shut(reason, /*protocol_error=*/false); }

void Connection::Violation(const std::string& what) {
  Shut("protocol violation: " + what, /*protocol_error=*/true);
}

void Connection::Shut(const std::string& reason, bool protocol_error) {
  if (closed_) return;
  closed_ = true;
  // What the read buffer counted goes back with the connection.
  (void)handler_.Charge(-static_cast<int64_t>(buffer_charge_));
  buffer_charge_ = 0;
  boost::system::error_code ignored;
  socket_.close(ignored);
  out_.clear();
  handler_.OnClosed(reason, protocol_error);
}

Status Connection::ChargeReadBuffer() {
  // The first kFreeReadBuffer of the buffer are every client's; beyond that, a large frame
  // being read counts against the client's limits until it is handled.
  const uint64_t want =
      reader_.capacity() > kFreeReadBuffer ? reader_.capacity() - kFreeReadBuffer : 0;
  if (want == buffer_charge_) return Status::OK();
  const int64_t delta = static_cast<int64_t>(want) - static_cast<int64_t>(buffer_charge_);
  DEPOT_RETURN_NOT_OK(handler_.Charge(delta));
  buffer_charge_ = want;
  return Status::OK();
}

void Connection::WaitReadable() {
  if (closed_ || reading_) return;
  reading_ = true;
  socket_.async_wait(boost::asio::socket_base::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->reading_ = false;
                       if (self->closed_) return;
                       if (ec) return self->Close("socket error: " + ec.message());
                       self->OnReadable();
                     });
}

void Connection::OnReadable() {
  for (int turn = 0; turn < kReadsPerTurn; ++turn) {
    bool would_block = false;
    auto n = reader_.ReadSome(socket_.native_handle(), &would_block);
    if (!n.ok()) return Close(n.status().message());
    if (Status st = ChargeReadBuffer(); !st.ok()) {
      return Close("its request of " + ipc::FormatSize(reader_.buffered_bytes()) +
                   " so far cannot be buffered: " + st.message());
    }
    if (reader_.pending_fds() != 0) {
      return Violation("the client sent file descriptors, which clients never do");
    }
    if (would_block) break;
    if (*n == 0) {
      return Close(reader_.buffered_bytes() == 0 ? "client disconnected"
                                                 : "client disconnected in the middle of a frame");
    }
    if (!HandleBufferedFrames()) return;
  }
  WaitReadable();
}

bool Connection::HandleBufferedFrames() {
  for (int handled = 0;; ++handled) {
    if (handler_.Saturated()) return false;  // the handler resumes
    if (handled == kFramesPerTurn) {
      // A client that pipelines many requests gets them handled a few at a time, taking
      // turns with the other clients.
      Resume();
      return false;
    }
    if (out_bytes_ > kMaxQueuedReplyBytes) {
      // The client is not reading its replies: handle nothing more of it, buffered or not,
      // until they drain (Flush resumes).
      paused_ = true;
      return false;
    }
    auto frame = reader_.Next();
    if (!frame.ok()) {
      Violation(frame.status().message());
      return false;
    }
    if (!frame->has_value()) {
      // Every frame read is handled: a large buffer goes back now, not at the next read.
      reader_.Compact();
      if (Status st = ChargeReadBuffer(); !st.ok()) {  // it shrinks: cannot fail
        Close("accounting its read buffer: " + st.message());
        return false;
      }
      return true;
    }
    handler_.OnFrame((**frame).payload);
    if (closed_) return false;
  }
}

void Connection::Resume() {
  paused_ = false;
  // From the loop, not from inside whatever reply drained the queue: that may be another
  // client's request, in the middle of changing the store.
  boost::asio::post(loop_, [self = shared_from_this()] {
    if (!self->closed_ && !self->paused_ && !self->handler_.Saturated() &&
        self->HandleBufferedFrames()) {
      self->WaitReadable();
    }
  });
}

void Connection::Send(capnp::MessageBuilder& message, wire::Reply::Builder reply,
                      const ReplyAttachments& attach) {
  if (closed_) return;
  std::vector<int> fds;
  // The reply keeps the segments' files open: it may wait in out_ while the arena lets them
  // go (a segment given a new file, a dedicated segment freed), and a number closed meanwhile
  // would name whatever file is opened next by the time it is sent.
  std::vector<std::shared_ptr<const void>> keep;
  AttachSegments(reply, attach, fds, keep);
  if (attach.chunk_device >= 0) AttachChunks(reply, attach, fds);
  fds.insert(fds.end(), attach.extra_fds.begin(), attach.extra_fds.end());
  auto frame = ipc::EncodeFrame(message, std::move(fds));
  if (!frame.ok()) return Close("cannot encode a reply: " + frame.status().message());
  frame->keep = std::move(keep);
  out_bytes_ += frame->bytes.size() * sizeof(capnp::word);
  out_.push_back(std::move(*frame));
  if (!writing_) Flush();
}

namespace {

// Whether `index` is marked in `sent`; marks it.
bool MarkSent(std::vector<bool>& sent, uint32_t index) {
  if (sent.size() <= index) sent.resize(index + 1, false);
  if (sent[index]) return true;
  sent[index] = true;
  return false;
}

}  // namespace

void Connection::AttachSegments(wire::Reply::Builder reply, const ReplyAttachments& attach,
                                std::vector<int>& fds,
                                std::vector<std::shared_ptr<const void>>& keep) {
  std::vector<uint32_t> fresh;
  for (const uint32_t segment : attach.segments) {
    if (Arena::IsDedicated(segment)) {
      // Sent with every reply, once in each.
      if (std::find(fresh.begin(), fresh.end(), segment) == fresh.end()) fresh.push_back(segment);
      continue;
    }
    // Sent once per generation: a segment given a new file is sent again.
    if (segments_sent_.size() <= segment) segments_sent_.resize(segment + 1, 0);
    if (const uint32_t now = arena_.generation(segment) + 1; segments_sent_[segment] != now) {
      segments_sent_[segment] = now;
      fresh.push_back(segment);
    }
  }
  const auto writable = static_cast<uint32_t>(attach.writable_segment);
  bool new_writable = false;
  if (attach.writable_segment >= 0) {
    if (arena_.writers(writable) != writers_) {
      // Cannot happen: the store places a client's objects in its class's segments. Were it
      // to, the writer would reach another class's objects: it is sent nothing writable, and
      // its create fails when it finds no writable view.
      spdlog::error("not sending segment {} (of class {}) writable to a client of class {}",
                    writable, arena_.writers(writable), writers_);
    } else if (Arena::IsDedicated(writable)) {
      new_writable = true;
    } else {
      // As segments_sent_: the generation sent plus 1, 0 (new entry) for none.
      const uint32_t now = arena_.generation(writable) + 1;
      uint32_t& sent = writable_sent_[writable];
      new_writable = sent != now;
      sent = now;
    }
  }
  if (fresh.empty() && !new_writable) return;
  const auto readable = static_cast<unsigned>(fresh.size());
  auto segs = reply.initNewSegments(readable + (new_writable ? 1 : 0));
  const auto describe = [&](uint32_t segment, bool rw, wire::Segment::Builder out) {
    out.setIndex(segment);
    out.setSize(arena_.segment_bytes(segment));
    out.setWritable(rw);
    out.setDedicated(Arena::IsDedicated(segment));
    out.setGeneration(arena_.generation(segment));
    keep.push_back(arena_.file(segment, rw));
    fds.push_back(rw ? arena_.fd(segment) : arena_.read_fd(segment));
  };
  for (unsigned i = 0; i < readable; ++i) describe(fresh[i], false, segs[i]);
  if (new_writable) describe(writable, true, segs[readable]);
}

void Connection::AttachChunks(wire::Reply::Builder reply, const ReplyAttachments& attach,
                              std::vector<int>& fds) {
  const int32_t device = attach.chunk_device;
  if (chunks_sent_.size() <= static_cast<size_t>(device)) chunks_sent_.resize(device + 1);
  const gpu::DevicePool& pool = *gpus_[device];
  std::vector<uint32_t> fresh;
  for (const uint32_t c : attach.chunks) {
    if (!MarkSent(chunks_sent_[device], c)) fresh.push_back(c);
  }
  const auto readable = static_cast<unsigned>(fresh.size());
  // Chunks go read-only where the backend can share them so (simulated devices); a writer
  // gets the chunk it creates in writable besides. CUDA chunks have one, read-write, form.
  const auto writable = static_cast<uint32_t>(attach.writable_chunk);
  const bool new_writable = attach.writable_chunk >= 0 && pool.chunk(writable).read_fd &&
                            !writable_chunks_sent_.contains({device, writable});
  if (readable == 0 && !new_writable) return;
  auto chunks = reply.initNewChunks(readable + (new_writable ? 1 : 0));
  const auto describe = [&](uint32_t c, bool rw, wire::Chunk::Builder out) {
    const gpu::Chunk& chunk = pool.chunk(c);
    out.setDevice(static_cast<uint32_t>(device));
    out.setIndex(c);
    out.setSize(chunk.size);
    out.setHandle(ToWire(chunk.handle));
    if (chunk.handle == ipc::ChunkHandle::kLegacyIpc) {
      out.setIpcHandle(capnp::Data::Reader(
          reinterpret_cast<const capnp::byte*>(chunk.ipc_handle.data()), chunk.ipc_handle.size()));
      out.setWritable(true);
    } else {
      const bool read_only = !rw && chunk.read_fd;
      fds.push_back(read_only ? chunk.read_fd.get() : chunk.fd.get());
      out.setWritable(!read_only);
    }
  };
  for (unsigned i = 0; i < readable; ++i) describe(fresh[i], false, chunks[i]);
  if (new_writable) {
    describe(writable, true, chunks[readable]);
    writable_chunks_sent_.insert({device, writable});
  }
}

void Connection::Flush() {
  while (!out_.empty()) {
    auto done = ipc::WriteFrame(socket_.native_handle(), out_.front());
    if (!done.ok()) return Close("cannot write to the client: " + done.status().message());
    if (!*done) {
      writing_ = true;
      socket_.async_wait(boost::asio::socket_base::wait_write,
                         [self = shared_from_this()](const boost::system::error_code& ec) {
                           self->writing_ = false;
                           if (self->closed_) return;
                           if (ec) return self->Close("socket error: " + ec.message());
                           self->Flush();
                         });
      return;
    }
    out_bytes_ -= out_.front().bytes.size() * sizeof(capnp::word);
    out_.pop_front();
  }
  if (paused_) Resume();
}

}  // namespace depot::store
