#include "connection.h"

#include <errno.h>  // program_invocation_short_name
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

namespace depot::internal {

namespace {

// The largest reply frame this client accepts. Replies are not bounded by the daemon's
// --max-frame (which bounds requests): a get of maxBatch ids answers about 48 bytes per id.
// This bound only keeps a corrupt stream from making the client allocate without limit.
constexpr uint32_t kMaxReplyBytes = 256u << 20;

const char kClosedMessage[] =
    "the daemon closed the connection (it exited, was restarted, or dropped this client: see "
    "its log); connect again";

capnp::ReaderOptions ReaderOptionsFor(size_t words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      ipc::TraversalLimitWords(static_cast<uint32_t>(words * sizeof(capnp::word)));
  return options;
}

}  // namespace

wire::Reply::Reader Reply::get() {
  if (!message_) {
    message_.emplace(kj::ArrayPtr<const capnp::word>(words_.data(), words_.size()),
                     ReaderOptionsFor(words_.size()));
  }
  return message_->getRoot<wire::Reply>();
}

Result<std::shared_ptr<Connection>> Connection::Open(const std::string& socket_path,
                                                     const ConnectOptions& options) {
  DEPOT_ASSIGN_OR_RETURN(ipc::UniqueFd socket, ipc::ConnectUnix(socket_path));
  auto conn = std::make_shared<Connection>(std::move(socket), socket_path, options.spin);
  DEPOT_RETURN_NOT_OK(conn->Handshake(options));
  return conn;
}

Connection::Connection(ipc::UniqueFd socket, std::string socket_path,
                       std::chrono::microseconds spin)
    : socket_(std::move(socket)),
      socket_path_(std::move(socket_path)),
      spin_(spin),
      reader_(kMaxReplyBytes) {}

Status Connection::Handshake(const ConnectOptions& options) {
  RequestMessage request;
  auto hello = request.root().initHello();
  hello.setProtocolVersion(ipc::kProtocolVersion);
  hello.setClientName(options.client_name.empty() ? program_invocation_short_name
                                                  : options.client_name.c_str());
  Reply reply;
  Status st = Call(request, &reply);
  if (st.Is(StatusCode::kProtocolMismatch)) return st;
  if (!st.ok()) {
    // Connect's contract: a daemon that hangs up during the handshake was not reached.
    const StatusCode code =
        st.Is(StatusCode::kDisconnected) ? StatusCode::kConnectionFailed : st.code();
    return Status(code,
                  "handshake with the daemon at " + socket_path_ + " failed: " + st.message());
  }
  return Decode([&]() -> Status {
    wire::Reply::Reader r = reply.get();
    if (!r.isHello()) return Status::Internal("the daemon answered hello with another reply");
    auto h = r.getHello();
    if (h.getProtocolVersion() != ipc::kProtocolVersion) {
      return Status::ProtocolMismatch(
          "the daemon at " + socket_path_ + " speaks protocol version " +
          std::to_string(h.getProtocolVersion()) + " and this client version " +
          std::to_string(ipc::kProtocolVersion) + "; use a client and daemon of the same release");
    }
    if (reply.fds().empty()) {
      return Status::Internal("the daemon's hello reply carried no header table descriptor");
    }
    header_slots_ = h.getHeaderSlots();
    DEPOT_ASSIGN_OR_RETURN(
        header_table_,
        Mapping::Map(reply.fds()[0].get(), size_t{header_slots_} * sizeof(ipc::ObjectHeader),
                     PROT_READ, 0, "the shared header table"));
    epoch_ = h.getEpoch();
    session_id_ = h.getSessionId();
    if (h.getMaxBatch() != 0) max_batch_ = h.getMaxBatch();
    if (h.getMaxFrameBytes() != 0) max_frame_bytes_ = h.getMaxFrameBytes();
    return Status::OK();
  });
}

const ipc::ObjectHeader* Connection::header(uint32_t slot) const {
  if (slot >= header_slots_) return nullptr;
  return reinterpret_cast<const ipc::ObjectHeader*>(header_table_.data()) + slot;
}

Status Connection::Call(RequestMessage& request, Reply* reply) {
  Waiter me{next_id_.fetch_add(1, std::memory_order_relaxed), reply};
  request.root().setId(me.id);
  DEPOT_ASSIGN_OR_RETURN(ipc::OutFrame frame,
                         ipc::EncodeFrame(request.message(), {}, max_frame_bytes_));
  {
    // Registered before sending: the reply may be read by another thread at once.
    std::lock_guard lock(mu_);
    if (!broken_.ok()) return broken_;
    waiters_.push_back(&me);
  }
  // A failed send breaks the connection, which fails `me`: the loop below returns that.
  Send(frame);

  std::unique_lock lock(mu_);
  while (!me.done) {
    if (reading_) {
      me.cv.wait(lock);
      continue;
    }
    reading_ = true;
    lock.unlock();
    ReadUntilDone(me);
    lock.lock();
    reading_ = false;
    // Hand the reader role on; whoever finds reading_ false next takes it.
    if (!waiters_.empty()) waiters_.front()->cv.notify_one();
  }
  lock.unlock();
  if (!me.status.ok()) return me.status;
  return Decode([&] { return ipc::StatusFromReply(reply->get()); });
}

void Connection::Release(std::span<const ObjectId> ids) {
  if (ids.empty() || broken()) return;
  RequestMessage request;
  auto root = request.root();
  root.setId(0);  // no reply wanted
  auto list = root.initRelease(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  auto frame = ipc::EncodeFrame(request.message(), {}, max_frame_bytes_);
  // Callers release at most maxBatch ids, which always fit a frame; a failed send has
  // broken the connection, and the daemon then releases everything itself.
  if (frame.ok()) Send(*frame);
}

void Connection::Send(ipc::OutFrame& frame) {
  Status st;
  {
    std::lock_guard lock(send_mu_);
    st = ipc::WriteFrameFully(socket_.get(), frame);
  }
  if (st.ok()) return;
  Break(st.Is(StatusCode::kDisconnected)
            ? Status::Disconnected(kClosedMessage)
            : Status::Disconnected("lost the connection to the daemon: " + st.message()));
}

void Connection::ReadUntilDone(Waiter& me) {
  bool mine = false;
  for (;;) {
    // Everything already buffered is filed before returning, so that replies which arrived
    // together with ours need no further read.
    for (;;) {
      auto next = reader_.Next();
      if (!next.ok()) {
        Break(Status::Disconnected("the daemon sent a bad frame: " + next.status().message()));
        return;
      }
      if (!next->has_value()) break;
      auto filed = Dispatch(std::move(**next), me);
      if (!filed.ok()) {
        Break(Status::Disconnected("the daemon broke the protocol: " + filed.status().message()));
        return;
      }
      mine = mine || *filed;
    }
    if (mine) return;
    if (Status st = Fill(); !st.ok()) {
      Break(std::move(st));
      return;
    }
  }
}

Result<bool> Connection::Dispatch(ipc::FrameReader::Frame frame, Waiter& me) {
  uint64_t id = 0;
  try {
    capnp::FlatArrayMessageReader message(frame.payload, ReaderOptionsFor(frame.payload.size()));
    auto reply = message.getRoot<wire::Reply>();
    id = reply.getId();
    // Segments are mapped here, on arrival, so that they are mapped before any reply that
    // refers to them is read, whichever thread reads that one.
    auto segments = reply.getNewSegments();
    if (segments.size() > frame.fds.size()) {
      return Status::Internal("a reply announces " + std::to_string(segments.size()) +
                              " new segments but carries " + std::to_string(frame.fds.size()) +
                              " descriptors");
    }
    // The segments' descriptors come first, in order; any after them are the reply's own
    // (hello's header table).
    for (unsigned i = 0; i < segments.size(); ++i) {
      segments_.Add(segments[i].getIndex(), segments[i].getSize(), std::move(frame.fds[i]));
    }
    frame.fds.erase(frame.fds.begin(), frame.fds.begin() + segments.size());
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("malformed reply: ") + e.getDescription().cStr());
  }
  // The daemon answers no request with id 0 (releases); tolerate a stray reply rather than
  // break the session over it.
  if (id == 0) return false;

  // Copied out: the payload lives in the reader's buffer, which the next read reuses.
  std::vector<capnp::word> words(frame.payload.begin(), frame.payload.end());
  std::lock_guard lock(mu_);
  auto it = std::find_if(waiters_.begin(), waiters_.end(), [&](Waiter* w) { return w->id == id; });
  if (it == waiters_.end()) {
    return Status::Internal("a reply to request " + std::to_string(id) + ", which awaits no reply");
  }
  Waiter* w = *it;
  waiters_.erase(it);
  w->reply->words_ = std::move(words);
  w->reply->fds_ = std::move(frame.fds);
  w->done = true;
  // Notified under the lock: once it sees `done` the waiter may return and destroy its cv.
  if (w != &me) w->cv.notify_one();
  return w == &me;
}

Status Connection::Fill() {
  if (spin_.count() > 0) {
    // Polling for a short while saves the scheduler wake-up of a blocking recvmsg when the
    // reply is about to arrive, as it usually is.
    const auto deadline = std::chrono::steady_clock::now() + spin_;
    pollfd p{socket_.get(), POLLIN, 0};
    while (::poll(&p, 1, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
    }
  }
  bool would_block = false;
  auto n = reader_.ReadSome(socket_.get(), &would_block);
  if (!n.ok()) {
    return Status::Disconnected("lost the connection to the daemon: " + n.status().message());
  }
  if (*n == 0 && !would_block) return Status::Disconnected(kClosedMessage);
  return Status::OK();
}

void Connection::Break(Status why) {
  std::lock_guard lock(mu_);
  if (broken_.ok()) {
    broken_ = std::move(why);
    is_broken_.store(true, std::memory_order_release);
    // Not closed: other threads may still be inside send or recv on this descriptor.
    ::shutdown(socket_.get(), SHUT_RDWR);
  }
  for (Waiter* w : waiters_) {
    w->done = true;
    w->status = broken_;
    w->cv.notify_one();
  }
  waiters_.clear();
}

}  // namespace depot::internal
