#include "connection.h"

#include <errno.h>   // program_invocation_short_name
#include <limits.h>  // IOV_MAX
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <system_error>
#include <utility>

#include "chunk_cache.h"
#include "depot/ipc/checked.h"
#include "parts.h"

namespace depot::internal {

// Incremented in the child by a pthread_atfork handler (OpenForkGateInChild), which runs in
// the child's only thread before fork() returns there: relaxed accesses suffice.
std::atomic<uint64_t> fork_generation{0};

namespace {

// The largest reply frame this client accepts. Replies are not bounded by the daemon's
// --max-frame (which bounds requests): a get of maxBatch ids answers about 48 bytes per id.
// This bound only keeps a corrupt stream from making the client allocate without limit.
constexpr uint32_t kMaxReplyBytes = 256u << 20;

const char kClosedMessage[] =
    "the daemon closed the connection (it exited, was restarted, or dropped this client: see "
    "its log); connect again";

const char kForkedMessage[] =
    "this Client was connected by the parent process, before fork(); a child process must "
    "connect a Client of its own";

// Releases queued before the one that fills the queue sends them at once (fewer if the
// daemon's maxBatch is lower). 1,024 ids make a frame of about 16 KiB: a client dropping
// handles by the thousand sends one message per thousand, and the thread that happens to
// fill the queue pauses for one write only.
constexpr size_t kReleaseBatch = 1024;

// How long the flusher lets releases gather after the first one is queued before it sends
// them (unless a request, or a full queue, takes them first). Longer means fewer release
// messages (system calls here, wake-ups of the daemon) from a client that drops handles
// without making requests; shorter means the daemon gets references back sooner. A held
// reference blocks eviction of the object and defers its delete for every client, so the
// delay must stay far below anything a person or a memory-pressure decision notices:
// 1 ms bounds a steadily dropping client at ~1,000 release messages a second. The price of
// a shorter delay: while a client keeps dropping handles, its flusher wakes once per round
// even when requests carry all the releases; at 200 µs (5,000 wake-ups a second) 16 such
// client processes on 2 cores spent about a third of a core on it and lost a quarter of
// their get throughput.
constexpr auto kReleaseGatherDelay = std::chrono::milliseconds(1);

// The flusher sleeps until the next release after this many gathering rounds in which no
// handle was dropped: an idle client's flusher costs nothing, and one that releases steadily
// wakes once per round and needs no notify.
constexpr int kFlusherQuietRounds = 2;

// The flusher's timer slack (see FlushLoop).
constexpr unsigned long kFlusherTimerSlackNs = 5'000;

// Size of an id in a release frame (in its tier's List(Id)), of a tier's group (its
// TierRefs and the list's tag), and a bound on the rest of the frame.
constexpr size_t kReleaseIdBytes = 2 * sizeof(capnp::word);
constexpr size_t kReleaseGroupBytes = 3 * sizeof(capnp::word);
constexpr size_t kReleaseFrameOverhead = 32 * sizeof(capnp::word);

// Adaptive spinning (Fill). A poll that misses (no reply within the window) burns the
// whole window of CPU, which on a busy machine is taken from the daemon; one that hits saves
// a wake-up, a few µs. So polling pays only while misses are rare: each miss adds
// kSpinMissCost to a debt and each hit pays one back, and polling stops when the debt
// reaches kSpinDebtLimit (three misses in a row, or more than about one wait in five
// missing). It is then tried on one wait in kSpinRetryEvery; a hit there resumes polling,
// just below the limit, so that only a run of hits keeps it on.
constexpr uint32_t kSpinMissCost = 4;
constexpr uint32_t kSpinDebtLimit = 3 * kSpinMissCost;
constexpr uint32_t kSpinRetryEvery = 64;

// Where a flusher thread may allocate: its start and exit, and encoding or failing a send.
// fork() waits until no flusher is inside (Close, in a pthread_atfork prepare handler) and
// keeps new ones out until it returns (Open, in both processes). A child inherits the
// memory of the parent's threads but only the thread that forked, so a lock another thread
// held at the fork stays held in the child for ever; glibc's malloc guards its own with fork
// handlers, but other allocators do not (AddressSanitizer's in GCC 12, for one): a child
// forked while a flusher allocated hung at its first allocation of that size.
//
// Entering never waits for a fork that is waiting to close the gate (only for one that has
// closed it), so a thread inside may let another in, and join it: see ~Connection. Not
// the application's threads: what they do at a fork is the application's business, as with
// any allocation; only the flusher is a thread of the library's own.
class ForkGate {
 public:
  void Enter() {
    std::lock_guard lock(mu_);
    ++inside_;
  }
  void Leave() {
    std::lock_guard lock(mu_);
    if (--inside_ == 0) empty_.notify_all();
  }
  // Waits until no one is inside, and keeps mu_ locked (so no one enters) until Open.
  void Close() {
    std::unique_lock lock(mu_);
    empty_.wait(lock, [this] { return inside_ == 0; });
    lock.release();
  }
  void Open() { mu_.unlock(); }

 private:
  std::mutex mu_;
  std::condition_variable empty_;
  int inside_ = 0;  // guarded by mu_
};

// Never destroyed: flushers may outlive static destruction order at exit.
ForkGate& TheForkGate() {
  static auto* gate = new ForkGate;
  return *gate;
}

// Holds the gate for a scope; Leave() and Enter() step out and back in within it.
class InsideForkGate {
 public:
  InsideForkGate() { TheForkGate().Enter(); }
  ~InsideForkGate() {
    if (inside_) TheForkGate().Leave();
  }
  InsideForkGate(const InsideForkGate&) = delete;
  InsideForkGate& operator=(const InsideForkGate&) = delete;
  void Leave() {
    TheForkGate().Leave();
    inside_ = false;
  }
  void Enter() {
    TheForkGate().Enter();
    inside_ = true;
  }

 private:
  bool inside_ = true;
};

void CloseForkGate() { TheForkGate().Close(); }
void OpenForkGate() { TheForkGate().Open(); }
void OpenForkGateInChild() {
  // The child's only thread: every connection it inherited now answers kForkedMessage.
  fork_generation.fetch_add(1, std::memory_order_relaxed);
  TheForkGate().Open();
}

// The current fork generation; the fork handlers are registered with the first connection.
uint64_t ForkGeneration() {
  static const bool registered = [] {
    ::pthread_atfork(&CloseForkGate, &OpenForkGate, &OpenForkGateInChild);
    return true;
  }();
  static_cast<void>(registered);
  return fork_generation.load(std::memory_order_relaxed);
}

// Writes all of `iov`, waiting while the socket is full. Returns 0, or the errno of the
// failure (of sendmsg or poll, told apart by `*in_poll`). Allocates nothing: a flusher
// calls it outside the fork gate.
int WriteAll(int socket, std::span<iovec> iov, bool* in_poll) {
  size_t i = 0;
  while (i < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[i];
    msg.msg_iovlen = std::min<size_t>(iov.size() - i, IOV_MAX);
    ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{socket, POLLOUT, 0};
        if (::poll(&p, 1, -1) < 0 && errno != EINTR) {
          *in_poll = true;
          return errno;
        }
        continue;
      }
      *in_poll = false;
      return errno;
    }
    auto left = static_cast<size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return 0;
}

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
  if (options.handoff_grace.count() < 0 || options.handoff_grace.count() > UINT32_MAX) {
    return Status::InvalidArgument("a handoff grace is between 0 and " +
                                   std::to_string(UINT32_MAX) + " ms, not " +
                                   std::to_string(options.handoff_grace.count()));
  }
  DEPOT_ASSIGN_OR_RETURN(ipc::UniqueFd socket, ipc::ConnectUnix(socket_path));
  DEPOT_RETURN_NOT_OK(ipc::CheckDaemonCredentials(socket.get(), socket_path));
  auto conn = std::make_shared<Connection>(std::move(socket), socket_path, options.spin);
  DEPOT_ASSIGN_OR_RETURN(conn->copy_threads_, CopyThreads(options.copy_threads));
  conn->handoff_grace_ms_ = static_cast<uint32_t>(options.handoff_grace.count());
  DEPOT_RETURN_NOT_OK(conn->Handshake(options));
  return conn;
}

Connection::Connection(ipc::UniqueFd socket, std::string socket_path,
                       std::chrono::microseconds spin)
    : socket_(std::move(socket)),
      socket_path_(std::move(socket_path)),
      spin_(spin),
      fork_generation_(ForkGeneration()),
      release_batch_(kReleaseBatch),
      reader_(kMaxReplyBytes) {}

Connection::~Connection() {
  if (!flusher_) return;
  if (forked()) {
    // The flusher thread was not copied into this process, and the condition variable
    // still counts it as a waiter: destroying it would wait for ever. Leave both alone.
    static_cast<void>(flusher_.release());
    return;
  }
  // Inside the fork gate from before the flusher is told to stop until it is joined: its
  // exit frees its runtime's caches.
  InsideForkGate inside;
  {
    std::lock_guard lock(release_mu_);
    stop_flusher_ = true;
  }
  flusher_->cv.notify_all();
  // A flusher blocked writing to a daemon that reads nothing fails at once. No application
  // thread uses the socket now (this was its last reference), and closing it next has the
  // same effect on the daemon: it releases everything this connection held.
  ::shutdown(socket_.get(), SHUT_RDWR);
  if (flusher_->thread.joinable()) {
    // The flusher holds no reference to the connection, so the last one is never dropped
    // on its thread; detach rather than join itself should that ever change.
    if (flusher_->thread.get_id() == std::this_thread::get_id()) {
      flusher_->thread.detach();
    } else {
      flusher_->thread.join();
    }
  }
}

Status Connection::Handshake(const ConnectOptions& options) {
  RequestMessage request;
  auto hello = request.root().initHello();
  hello.setProtocolVersion(ipc::kProtocolVersion);
  hello.setClientName(options.client_name.empty() ? program_invocation_short_name
                                                  : options.client_name.c_str());
  if (!options.group.empty()) {
    hello.setGroup(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(options.group.data()),
                                       options.group.size()));
  }
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
    if (h.getLeaseEntries() != 0) {
      if (reply.fds().size() < 2) {
        return Status::Internal("the daemon's hello reply carried no lease table descriptor");
      }
      DEPOT_RETURN_NOT_OK(
          leases_.Map(reply.fds()[1].get(), h.getLeaseEntries(), h.getLeaseMaxBytes()));
    }
    epoch_ = h.getEpoch();
    session_id_ = h.getSessionId();
    if (h.getMaxBatch() != 0) max_batch_ = h.getMaxBatch();
    if (h.getMaxFrameBytes() != 0) max_frame_bytes_ = h.getMaxFrameBytes();
    for (auto gpu : h.getDevices()) {
      DaemonGpu& g = gpus_.emplace_back();
      auto uuid = gpu.getUuid();
      if (uuid.size() != 0) {  // an empty Data's begin() may be null
        std::memcpy(g.uuid.data(), uuid.begin(), std::min<size_t>(uuid.size(), g.uuid.size()));
      }
      g.name = gpu.getName().cStr();
      g.simulated = gpu.getSimulated();
    }
    // No Holding exists yet, so nothing reads this concurrently.
    release_batch_ = std::min(kReleaseBatch, ReleaseIdsPerFrame());
    return Status::OK();
  });
}

void Connection::DropLease(const ObjectId& id, uint32_t slot) {
  leases_.Drop(slot);
  Release(id, ipc::kLeasedReads);
}

const ipc::ObjectHeader* Connection::header(uint32_t slot) const {
  if (slot >= header_slots_) return nullptr;
  return reinterpret_cast<const ipc::ObjectHeader*>(header_table_.data()) + slot;
}

Status Connection::SendAwaited(RequestMessage& request, Waiter& me) {
  if (forked()) return Status::Disconnected(kForkedMessage);
  me.id = next_id_.fetch_add(1, std::memory_order_relaxed);
  request.root().setId(me.id);
  DEPOT_ASSIGN_OR_RETURN(ipc::OutFrame frame,
                         ipc::EncodeFrame(request.message(), {}, max_frame_bytes_));
  {
    // Registered before sending: the reply may be read by another thread at once.
    std::lock_guard lock(mu_);
    if (!broken_.ok()) return broken_;
    waiters_.push_back(&me);
  }
  // A failed send breaks the connection, which completes `me` with why.
  Send({&frame, 1});
  return Status::OK();
}

Status Connection::Call(RequestMessage& request, Reply* reply) {
  // CallMany of one, without its allocations: the common case.
  Waiter me{0, reply};
  DEPOT_RETURN_NOT_OK(SendAwaited(request, me));
  Await(me);
  if (!me.status.ok()) return me.status;
  return Decode([&] { return ipc::StatusFromReply(reply->get()); });
}

Result<std::unique_ptr<Connection::Pending>> Connection::Start(RequestMessage& request,
                                                               bool notify) {
  auto pending = std::make_unique<Pending>();
  pending->waiter_.notify = notify;
  DEPOT_RETURN_NOT_OK(SendAwaited(request, pending->waiter_));
  return pending;
}

Status Connection::SendDiscarding(RequestMessage& request) {
  auto pending = std::make_unique<Pending>();
  Waiter* me = &pending->waiter_;
  me->discard = true;
  {
    // Kept before it is sent: its reply may be read, and it dropped, by another thread at
    // once (Complete).
    std::lock_guard lock(mu_);
    discarded_.emplace(me, std::move(pending));
  }
  Status sent = SendAwaited(request, *me);
  if (!sent.ok()) {
    // Refused before it was registered: nothing will complete it.
    std::lock_guard lock(mu_);
    discarded_.erase(me);
  }
  return sent;
}

std::optional<Status> Connection::AwaitUntil(
    Pending& pending, std::optional<std::chrono::steady_clock::time_point> deadline) {
  // In a forked child the socket is the parent's: its replies are not the child's to read.
  if (forked()) return Status::Disconnected(kForkedMessage);
  Waiter& me = pending.waiter_;
  if (!Await(me, deadline)) return std::nullopt;
  if (!me.status.ok()) return me.status;
  return Decode([&] { return ipc::StatusFromReply(pending.reply_.get()); });
}

bool Connection::Done(const Pending& pending) {
  // A forked child takes no lock another thread of the parent may have held at the fork.
  if (forked()) return true;
  std::lock_guard lock(mu_);
  return pending.waiter_.done;
}

void Connection::Pump() {
  if (forked()) return;
  {
    std::lock_guard lock(mu_);
    if (reading_ || !broken_.ok()) return;
    reading_ = true;
  }
  // Reads until the socket has nothing more now; FileBuffered and ReadSome break the
  // connection on a bad frame or a closed socket.
  bool mine = false;
  while (FileBuffered(nullptr, &mine)) {
    bool would_block = false;
    auto n = reader_.ReadSome(socket_.get(), &would_block, /*dont_wait=*/true);
    if (!n.ok()) {
      Break(Status::Disconnected("lost the connection to the daemon: " + n.status().message()));
      break;
    }
    if (would_block) break;
    if (*n == 0) {
      Break(Status::Disconnected(kClosedMessage));
      break;
    }
  }
  std::lock_guard lock(mu_);
  reading_ = false;
  HandOnReading(nullptr);
}

Result<int> Connection::completion_fd() {
  if (forked()) return Status::Disconnected(kForkedMessage);
  std::lock_guard lock(mu_);
  if (!completion_fd_) {
    ipc::UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!fd) return Status::FromErrno("eventfd", errno);
    completion_fd_ = std::move(fd);
    if (!completed_.empty()) ::eventfd_write(completion_fd_.get(), 1);
  }
  return completion_fd_.get();
}

std::vector<uint64_t> Connection::TakeCompleted() {
  if (forked()) return {};
  std::lock_guard lock(mu_);
  if (completion_fd_) {
    eventfd_t count;
    ::eventfd_read(completion_fd_.get(), &count);  // EAGAIN when nothing was announced
  }
  return std::exchange(completed_, {});
}

void Connection::Complete(Waiter* w) {
  w->done = true;
  if (w->notify) {
    completed_.push_back(w->id);
    if (completion_fd_) ::eventfd_write(completion_fd_.get(), 1);
  }
  // Notified under the lock: once it sees `done` the waiter may return and destroy its cv.
  w->cv.notify_one();
  if (w->discard) discarded_.erase(w);  // nobody reads it: it goes, with its reply
}

void Connection::HandOnReading(const Waiter* except) {
  // Most often the only thread waiting is the one handing on (CallMany's caller, which
  // awaits its waiters one by one): nothing to look for.
  if (awaiting_ <= (except != nullptr && except->awaited ? 1u : 0u)) return;
  for (Waiter* w : waiters_) {
    if (w->awaited && w != except) {
      w->cv.notify_one();
      return;
    }
  }
}

Status CheckBatch(size_t count, const Connection& conn, const char* what) {
  if (count <= conn.max_batch()) return Status::OK();
  return Status::LimitExceeded(std::string(what) + " of " + std::to_string(count) +
                               " ids exceeds the daemon's batch limit of " +
                               std::to_string(conn.max_batch()) + " ids; split it");
}

Status UnexpectedReply(const char* request) {
  return Status::Internal(std::string("the daemon's reply to ") + request +
                          " does not match the request");
}

Status Connection::Post(RequestMessage& request) {
  if (forked()) return Status::Disconnected(kForkedMessage);
  request.root().setId(0);
  DEPOT_ASSIGN_OR_RETURN(ipc::OutFrame frame,
                         ipc::EncodeFrame(request.message(), {}, max_frame_bytes_));
  {
    std::lock_guard lock(mu_);
    if (!broken_.ok()) return broken_;
  }
  Send({&frame, 1});
  std::lock_guard lock(mu_);
  return broken_;
}

Result<bool> Connection::TakePush(Reply* push) {
  if (forked()) return Status::Disconnected(kForkedMessage);
  std::lock_guard lock(mu_);
  if (pushes_.empty()) {
    if (!broken_.ok()) return broken_;
    return false;
  }
  push->words_ = std::move(pushes_.front().first);
  push->fds_ = std::move(pushes_.front().second);
  push->message_.reset();
  pushes_.pop_front();
  return true;
}

Status Connection::AwaitPush(Reply* push) {
  if (forked()) return Status::Disconnected(kForkedMessage);
  Waiter me{0, push};
  {
    std::lock_guard lock(mu_);
    if (!pushes_.empty()) {
      push->words_ = std::move(pushes_.front().first);
      push->fds_ = std::move(pushes_.front().second);
      push->message_.reset();
      pushes_.pop_front();
      return Status::OK();
    }
    if (!broken_.ok()) return broken_;
    waiters_.push_back(&me);
  }
  Await(me);
  return me.status;
}

std::vector<Status> Connection::CallMany(std::span<RequestMessage* const> requests,
                                         Reply* replies) {
  std::vector<Status> statuses(requests.size());
  if (forked()) {
    std::fill(statuses.begin(), statuses.end(), Status::Disconnected(kForkedMessage));
    return statuses;
  }
  std::unique_ptr<Waiter[]> waiters(new Waiter[requests.size()]);
  std::vector<ipc::OutFrame> frames;
  frames.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Waiter& w = waiters[i];
    w.id = next_id_.fetch_add(1, std::memory_order_relaxed);
    w.reply = &replies[i];
    requests[i]->root().setId(w.id);
    Result<ipc::OutFrame> frame = ipc::EncodeFrame(requests[i]->message(), {}, max_frame_bytes_);
    if (!frame.ok()) {
      w.status = frame.status();
      w.done = true;  // never sent
      continue;
    }
    frames.push_back(std::move(*frame));
  }
  if (!frames.empty()) {
    {
      // Registered before sending: a reply may be read by another thread at once.
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < requests.size(); ++i) {
        if (waiters[i].done) continue;
        if (!broken_.ok()) {
          waiters[i].status = broken_;
          waiters[i].done = true;
        } else {
          waiters_.push_back(&waiters[i]);
        }
      }
    }
    // A failed send breaks the connection, which fails the waiters: Await returns that.
    Send(frames);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    Waiter& w = waiters[i];
    Await(w);
    statuses[i] = w.status.ok() ? Decode([&] { return ipc::StatusFromReply(w.reply->get()); })
                                : std::move(w.status);
  }
  return statuses;
}

bool Connection::Await(Waiter& me, std::optional<std::chrono::steady_clock::time_point> deadline) {
  std::unique_lock lock(mu_);
  me.awaited = true;
  ++awaiting_;
  while (!me.done) {
    if (deadline && std::chrono::steady_clock::now() >= *deadline) break;
    if (reading_) {
      deadline ? (void)me.cv.wait_until(lock, *deadline) : me.cv.wait(lock);
      continue;
    }
    reading_ = true;
    lock.unlock();
    ReadUntilDone(me, deadline);
    lock.lock();
    reading_ = false;
    // Hand the reader role on; whoever finds reading_ false next takes it.
    HandOnReading(&me);
  }
  me.awaited = false;
  --awaiting_;
  // Leaving at the deadline, perhaps just handed the reader role by a reader that woke
  // only this thread: hand it on, or another thread waiting could sleep on with its reply
  // unread.
  if (!me.done && !reading_) HandOnReading(&me);
  return me.done;
}

size_t Connection::ReleaseIdsPerFrame() const {
  const size_t overhead = kReleaseFrameOverhead + (gpus_.size() + 1) * kReleaseGroupBytes;
  const size_t fit =
      max_frame_bytes_ > overhead ? (max_frame_bytes_ - overhead) / kReleaseIdBytes : 1;
  return std::max<size_t>(1, std::min<size_t>(max_batch_, fit));
}

void Connection::Release(const ObjectId& id, int32_t device) {
  if (forked() || broken()) return;
  bool notify = false;
  bool send_now = false;
  {
    std::lock_guard lock(release_mu_);
    releases_.push_back({id, device});
    released_ = true;
    if (!flusher_) StartFlusher();  // it finds the queue filled and starts gathering
    if (releases_.size() >= release_batch_ || no_flusher_) {
      send_now = true;
    } else if (flusher_idle_ && releases_.size() == 1) {
      // Only the first release wakes the flusher: the others find it gathering.
      flusher_idle_ = false;
      notify = true;
    }
  }
  if (notify) flusher_->cv.notify_one();
  if (send_now) Send({});
}

void Connection::StartFlusher() {
  flusher_ = std::make_unique<Flusher>();
  // The thread inherits the signal mask of its creator: it is created with every signal
  // blocked, so that signals meant for the application never land on it.
  sigset_t all, old;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    // `this`, not a shared_ptr: the flusher must not keep the connection alive, and the
    // destructor joins it before anything it uses goes.
    // Until its code runs, a new thread may be in its runtime's start-up (allocating its
    // caches): inside the fork gate until then.
    InsideForkGate inside;
    flusher_->thread = std::thread([this, flusher = flusher_.get()] {
      flusher->started.store(true);
      flusher->started.notify_one();
      FlushLoop();
    });
    flusher_->started.wait(false);
  } catch (const std::system_error&) {
    no_flusher_ = true;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Connection::FlushLoop() {
  ::pthread_setname_np(::pthread_self(), "depot-release");
  // Timed waits of a normal thread may overrun by the default timer slack, 50 µs: a quarter
  // of the gathering delay. This thread sleeps rarely enough for precise timers to be cheap.
  ::prctl(PR_SET_TIMERSLACK, kFlusherTimerSlackNs);
  std::unique_lock lock(release_mu_);
  int quiet_rounds = 0;  // gathering rounds in a row in which nothing was released
  while (!stop_flusher_) {
    if (releases_.empty() && quiet_rounds >= kFlusherQuietRounds) {
      flusher_idle_ = true;
      flusher_->cv.wait(lock);
      flusher_idle_ = false;
      if (stop_flusher_) break;
      quiet_rounds = 0;
    }
    // Let more releases gather; a request sent meanwhile takes them all. A round runs to its
    // end even when a request has taken the queue, and rounds go on while releases keep
    // coming (as they do in a get+release loop, where requests carry them): stopping
    // would cost a notify, and this thread two wake-ups, per round instead of one.
    released_ = false;
    flusher_->cv.wait_for(lock, kReleaseGatherDelay, [this] { return stop_flusher_; });
    if (stop_flusher_) break;
    quiet_rounds = released_ ? 0 : quiet_rounds + 1;
    if (releases_.empty()) continue;
    lock.unlock();
    Send({}, /*from_flusher=*/true);
    lock.lock();
  }
}

void Connection::Send(std::span<ipc::OutFrame> requests, bool from_flusher) {
  std::lock_guard lock(send_mu_);
  // The flusher encodes and frees frames, and fails, inside the fork gate; it enters only
  // once it has the send lock, which a writer blocked on the daemon may hold for any time.
  std::optional<InsideForkGate> inside;
  if (from_flusher) inside.emplace();
  // Taken under send_mu_: whoever takes a release writes it before any later request.
  sending_.clear();
  {
    std::lock_guard release_lock(release_mu_);
    sending_.swap(releases_);
  }
  // Once broken, queued releases are dropped: the daemon has released everything. (A
  // request's caller was failed by Break, and learns it from its Waiter.)
  if (broken() || (sending_.empty() && requests.empty())) return;
  out_frames_.clear();
  EncodeReleases();
  // Releases first, then the requests: one system call for all of it.
  iovec iov_small[2];
  std::vector<iovec> iov_large;
  const size_t count = out_frames_.size() + requests.size();
  std::span<iovec> iov(iov_small, count);
  if (count > std::size(iov_small)) {
    iov_large.resize(count);
    iov = iov_large;
  }
  size_t k = 0;
  for (ipc::OutFrame& f : out_frames_) {
    iov[k++] = iovec{f.bytes.data(), f.bytes.size() * sizeof(capnp::word)};
  }
  for (ipc::OutFrame& f : requests) {
    iov[k++] = iovec{f.bytes.data(), f.bytes.size() * sizeof(capnp::word)};
  }
  // The write may wait on the daemon for any time: not inside the fork gate.
  if (inside) inside->Leave();
  bool in_poll = false;
  const int error = WriteAll(socket_.get(), iov, &in_poll);
  if (inside) inside->Enter();
  if (error == 0) return;
  Break(
      error == EPIPE || error == ECONNRESET
          ? Status::Disconnected(kClosedMessage)
          : Status::Disconnected("lost the connection to the daemon: " +
                                 Status::FromErrno(in_poll ? "poll" : "sendmsg", error).message()));
}

void Connection::EncodeReleases() {
  // Host references first, then each GPU's, so that a frame has one group per tier. The
  // queue's order is kept within a tier; between tiers it does not matter to the daemon.
  const auto by_tier = [](const Ref& a, const Ref& b) { return a.device < b.device; };
  if (!std::is_sorted(sending_.begin(), sending_.end(), by_tier)) {
    std::stable_sort(sending_.begin(), sending_.end(), by_tier);
  }
  const size_t per_frame = ReleaseIdsPerFrame();
  for (size_t first = 0; first < sending_.size(); first += per_frame) {
    const std::span<const Ref> refs(sending_.data() + first,
                                    std::min(per_frame, sending_.size() - first));
    unsigned groups = 0;
    for (size_t k = 0; k < refs.size(); ++k) {
      if (k == 0 || refs[k].device != refs[k - 1].device) ++groups;
    }
    RequestMessage release;
    auto root = release.root();
    root.setId(0);  // no reply wanted
    auto tiers = root.initRelease(groups);
    size_t begin = 0;
    for (unsigned g = 0; g < groups; ++g) {
      size_t end = begin + 1;
      while (end < refs.size() && refs[end].device == refs[begin].device) ++end;
      tiers[g].setDevice(refs[begin].device);
      auto ids = tiers[g].initIds(static_cast<unsigned>(end - begin));
      for (size_t k = begin; k < end; ++k) ipc::ToWire(refs[k].id, ids[k - begin]);
      begin = end;
    }
    // Sized to fit the frame limit, so this does not fail.
    if (auto frame = ipc::EncodeFrame(release.message(), {}, max_frame_bytes_); frame.ok()) {
      out_frames_.push_back(std::move(*frame));
    }
  }
}

void Connection::ReadUntilDone(Waiter& me,
                               std::optional<std::chrono::steady_clock::time_point> deadline) {
  for (;;) {
    // Everything already buffered is filed before returning, so that replies which arrived
    // together with ours need no further read.
    bool mine = false;
    if (!FileBuffered(&me, &mine) || mine) return;
    bool timed_out = false;
    if (Status st = Fill(deadline, &timed_out); !st.ok()) {
      Break(std::move(st));
      return;
    }
    if (timed_out) return;
  }
}

bool Connection::FileBuffered(const Waiter* me, bool* mine) {
  for (;;) {
    auto next = reader_.Next();
    if (!next.ok()) {
      Break(Status::Disconnected("the daemon sent a bad frame: " + next.status().message()));
      return false;
    }
    if (!next->has_value()) return true;
    auto filed = Dispatch(std::move(**next), me);
    if (!filed.ok()) {
      Break(Status::Disconnected("the daemon broke the protocol: " + filed.status().message()));
      return false;
    }
    *mine = *mine || *filed;
  }
}

Result<bool> Connection::Dispatch(ipc::FrameReader::Frame frame, const Waiter* me) {
  uint64_t id = 0;
  std::vector<std::shared_ptr<const Mapping>> mappings;
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
      DEPOT_ASSIGN_OR_RETURN(auto mapping,
                             segments_.Add(segments[i].getIndex(), segments[i].getSize(),
                                           segments[i].getWritable(), segments[i].getDedicated(),
                                           segments[i].getGeneration(), std::move(frame.fds[i])));
      // A dedicated segment stays mapped while the reply waits to be read.
      if (mapping) mappings.push_back(std::move(mapping));
    }
    frame.fds.erase(frame.fds.begin(), frame.fds.begin() + segments.size());
    if (reply.hasNewChunks()) DEPOT_RETURN_NOT_OK(ImportChunks(reply.getNewChunks(), frame.fds));
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("malformed reply: ") + e.getDescription().cStr());
  }
  // Copied out: the payload lives in the reader's buffer, which the next read reuses.
  std::vector<capnp::word> words(frame.payload.begin(), frame.payload.end());
  std::unique_lock lock(mu_);
  if (id == 0) {
    // Pushed by the daemon, unasked (the daemon answers no request with id 0): to the
    // thread waiting in AwaitPush, or kept until one does.
    auto it = std::find_if(waiters_.begin(), waiters_.end(), [](Waiter* w) { return w->id == 0; });
    if (it == waiters_.end()) {
      pushes_.emplace_back(std::move(words), std::move(frame.fds));
      const std::function<void()> hook = push_hook_;
      lock.unlock();
      if (hook) hook();
      return false;
    }
    Waiter* w = *it;
    waiters_.erase(it);
    w->reply->words_ = std::move(words);
    w->reply->fds_ = std::move(frame.fds);
    w->reply->message_.reset();
    Complete(w);
    return w == me;
  }
  auto it = std::find_if(waiters_.begin(), waiters_.end(), [&](Waiter* w) { return w->id == id; });
  if (it == waiters_.end()) {
    return Status::Internal("a reply to request " + std::to_string(id) + ", which awaits no reply");
  }
  Waiter* w = *it;
  waiters_.erase(it);
  w->reply->words_ = std::move(words);
  w->reply->fds_ = std::move(frame.fds);
  w->reply->mappings_ = std::move(mappings);
  Complete(w);
  return w == me;
}

bool Connection::ShouldSpin() {
  if (spin_.count() <= 0) return false;
  if (spin_debt_ < kSpinDebtLimit) return true;
  // Polling stopped paying (the daemon answers slowly, or the machine is busy and polling
  // takes the CPU the daemon needs): try again now and then, to notice when it pays again.
  if (++spin_skips_ < kSpinRetryEvery) return false;
  spin_skips_ = 0;
  return true;
}

Status Connection::Fill(std::optional<std::chrono::steady_clock::time_point> deadline,
                        bool* timed_out) {
  using Clock = std::chrono::steady_clock;
  pollfd p{socket_.get(), POLLIN, 0};
  int ready = 0;
  if (ShouldSpin()) {
    // Polling for a short while saves the scheduler wake-up of a blocking recvmsg when the
    // reply is about to arrive, as it usually is.
    const auto spin_deadline =
        std::min(Clock::now() + spin_, deadline.value_or(Clock::time_point::max()));
    while ((ready = ::poll(&p, 1, 0)) == 0 && Clock::now() < spin_deadline) {
    }
    if (ready == 0) {
      spin_debt_ = std::min(spin_debt_ + kSpinMissCost, kSpinDebtLimit);
    } else if (spin_debt_ > 0) {
      spin_debt_ = std::min(spin_debt_, kSpinDebtLimit - 1) - 1;
    }
  }
  if (ready <= 0 && deadline) {
    // Waits for the socket until the deadline, in whole milliseconds rounded up.
    do {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX)));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) {
      *timed_out = true;
      return Status::OK();
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
    w->status = broken_;
    Complete(w);
  }
  waiters_.clear();
}

}  // namespace depot::internal

namespace depot::internal {

Result<DeviceImporter*> Connection::Importer() {
  std::lock_guard lock(device_mu_);
  if (importer_) return importer_.get();
  if (!importer_error_.ok()) return importer_error_;
  if (!gpus_.empty() && gpus_.front().simulated) {
    std::vector<ipc::DeviceUuid> uuids;
    for (const DaemonGpu& g : gpus_) uuids.push_back(g.uuid);
    importer_ = MakeSimulatedImporter(std::move(uuids));
    return importer_.get();
  }
  auto cuda = LoadCudaImporter();
  if (!cuda.ok()) {
    importer_error_ = cuda.status();
    return importer_error_;
  }
  importer_ = std::move(cuda).value();
  return importer_.get();
}

Result<int32_t> Connection::DaemonDevice(int ordinal) {
  if (gpus_.empty()) {
    return Status::InvalidArgument("the daemon at " + socket_path_ +
                                   " serves no GPUs (start it on a host with GPUs, or with "
                                   "--simulate-gpus)");
  }
  DEPOT_ASSIGN_OR_RETURN(DeviceImporter * importer, Importer());
  const auto visible = importer->VisibleDevices();
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= visible.size()) {
    return Status::InvalidArgument("there is no GPU " + std::to_string(ordinal) +
                                   " in this process (it sees " + std::to_string(visible.size()) +
                                   ")");
  }
  for (size_t d = 0; d < gpus_.size(); ++d) {
    if (gpus_[d].uuid == visible[ordinal]) return static_cast<int32_t>(d);
  }
  return Status::InvalidArgument("the daemon does not serve GPU " + std::to_string(ordinal) + " (" +
                                 ipc::FormatUuid(visible[ordinal]) + ")");
}

int Connection::LocalOrdinal(int32_t device) {
  auto importer = Importer();
  if (!importer.ok() || device < 0 || static_cast<size_t>(device) >= gpus_.size()) return -1;
  const auto visible = (*importer)->VisibleDevices();
  for (size_t k = 0; k < visible.size(); ++k) {
    if (visible[k] == gpus_[device].uuid) return static_cast<int>(k);
  }
  return -1;
}

Status Connection::ImportChunks(capnp::List<wire::Chunk>::Reader chunks,
                                std::vector<ipc::UniqueFd>& fds) {
  size_t next_fd = 0;
  for (auto c : chunks) {
    ChunkToImport in;
    in.size = c.getSize();
    switch (c.getHandle()) {
      case wire::ChunkHandle::POSIX_FD:
        in.handle = ipc::ChunkHandle::kPosixFd;
        break;
      case wire::ChunkHandle::LEGACY_IPC:
        in.handle = ipc::ChunkHandle::kLegacyIpc;
        break;
      case wire::ChunkHandle::MEMFD:
        in.handle = ipc::ChunkHandle::kMemfd;
        break;
      default:
        return Status::Internal("a GPU chunk of an unknown handle kind");
    }
    if (in.handle == ipc::ChunkHandle::kLegacyIpc) {
      auto h = c.getIpcHandle();
      in.ipc_handle = std::as_bytes(std::span(h.begin(), h.size()));
    } else {
      if (next_fd >= fds.size()) return Status::Internal("a GPU chunk came without its descriptor");
      in.fd = std::move(fds[next_fd++]);
    }
    if (c.getDevice() >= gpus_.size()) return Status::Internal("a chunk of an unknown GPU");
    in.device = gpus_[c.getDevice()].uuid;
    in.writable = c.getWritable();
    ImportedEntry entry;
    const ChunkKey key{epoch_, static_cast<int32_t>(c.getDevice()), c.getIndex(), in.writable};
    // If another connection of this process mapped the chunk, its descriptor here goes unused.
    auto chunk = ImportChunkOnce(key, [&]() -> Result<std::unique_ptr<ImportedChunk>> {
      DEPOT_ASSIGN_OR_RETURN(DeviceImporter * importer, Importer());
      return importer->Import(std::move(in));
    });
    if (chunk.ok()) {
      entry.chunk = std::move(chunk).value();
    } else {
      entry.error = chunk.status();
    }
    std::lock_guard lock(device_mu_);
    chunks_.try_emplace({static_cast<int32_t>(c.getDevice()), c.getIndex(), key.writable},
                        std::move(entry));
  }
  fds.erase(fds.begin(), fds.begin() + static_cast<ptrdiff_t>(next_fd));
  return Status::OK();
}

Result<uint64_t> Connection::ResolveChunk(int32_t device, uint32_t chunk, uint64_t offset,
                                          uint64_t size, bool writable) {
  std::lock_guard lock(device_mu_);
  // A reader uses the read-only mapping, or the only one there is (CUDA chunks come
  // read-write only); a writer needs the read-write one.
  auto it = writable ? chunks_.end() : chunks_.find({device, chunk, false});
  if (it == chunks_.end()) it = chunks_.find({device, chunk, true});
  if (it == chunks_.end()) {
    return Status::Internal("the daemon referred to chunk " + std::to_string(chunk) + " of GPU " +
                            std::to_string(device) + ", which it never sent to this client" +
                            (writable ? " writable" : ""));
  }
  if (!it->second.error.ok()) return it->second.error;
  if (!ipc::RangeWithin(offset, size, it->second.chunk->size())) {
    return Status::Internal("the daemon placed a GPU object outside its chunk");
  }
  return it->second.chunk->address() + offset;
}

}  // namespace depot::internal
