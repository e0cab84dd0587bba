#include "store/server.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>

#include "depot/ipc/framing.h"
#include "depot/ipc/units.h"
#include "store/session.h"

namespace depot::store {

namespace {

// /proc/<pid>/comm without its newline; empty if it cannot be read (the process is gone, or
// the daemon is out of descriptors). Plain system calls: this runs for every connection.
std::string CommandOf(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/comm";
  ipc::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return "";
  char buf[64];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return "";
  std::string command(buf, static_cast<size_t>(n));
  while (!command.empty() && command.back() == '\n') command.pop_back();
  return command;
}

// Who is connected on `fd` and what it may do; a peer whose credentials cannot be read may
// do nothing.
Peer ReadPeer(int fd, const ServerOptions& options) {
  Peer peer;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.command = CommandOf(cred.pid);
    if (IsTrustedUid(cred.uid)) {
      peer.access = Access::kFull;
    } else if (std::ranges::find(options.share_write_uids, cred.uid) !=
               options.share_write_uids.end()) {
      peer.access = Access::kWrite;
    } else if (std::ranges::find(options.share_uids, cred.uid) != options.share_uids.end()) {
      peer.access = Access::kRead;
    }
    if (peer.access != Access::kFull && peer.access != Access::kWrite &&
        (!options.share_gids.empty() || !options.share_write_gids.empty())) {
      // The primary group and the supplementary ones (SO_PEERGROUPS, as of connect time;
      // ERANGE says how many there are when the first guess is short).
      std::vector<gid_t> groups(32);
      socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      int rc = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes);
      if (rc != 0 && errno == ERANGE) {
        groups.resize(bytes / sizeof(gid_t));
        rc = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes);
      }
      groups.resize(rc == 0 ? bytes / sizeof(gid_t) : 0);
      groups.push_back(cred.gid);
      for (gid_t gid : groups) {
        if (std::ranges::find(options.share_write_gids, gid) != options.share_write_gids.end()) {
          peer.access = Access::kWrite;
        } else if (std::ranges::find(options.share_gids, gid) != options.share_gids.end() &&
                   peer.access == Access::kNone) {
          peer.access = Access::kRead;
        }
      }
    }
  }
  if (peer.command.empty()) peer.command = "?";
  return peer;
}

uint64_t RandomEpoch() {
  uint64_t epoch = 0;
  while (epoch == 0) {
    if (::getrandom(&epoch, sizeof(epoch), 0) != sizeof(epoch)) epoch = ipc::MonotonicNanos();
  }
  return epoch;
}

}  // namespace

Server::Server(boost::asio::io_context& loop, ObjectStore& store, ServerOptions options)
    : loop_(loop),
      store_(store),
      options_(std::move(options)),
      metrics_(options_.metrics),
      slices_(loop),
      acceptor_(loop),
      accept_retry_(loop, "depotd"),
      data_(store),
      admin_(store, *this),
      tasks_(loop, static_cast<Pushes&>(*this), store, options_.scheduler),
      epoch_(RandomEpoch()),
      start_ns_(ipc::MonotonicNanos()) {
  data_.WaitForRoomOfOutputs(&tasks_);
}

Server::~Server() { Shutdown(); }

Status Server::ClaimSocketPath(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (st.st_uid != ::geteuid()) {
      // Someone else made it: a squatter waiting for this daemon's clients, or another
      // user's daemon. Either way it is not ours to take over.
      return Status::AlreadyExists(path + " exists and belongs to uid " +
                                   std::to_string(st.st_uid) + ", not to this daemon's uid " +
                                   std::to_string(::geteuid()) +
                                   "; remove it (as that user or root) or choose another --socket");
    }
    if (!S_ISSOCK(st.st_mode)) {
      return Status::InvalidArgument(
          path + " exists and is not a socket; remove it or choose another --socket");
    }
    if (ipc::ConnectUnix(path).ok()) {
      return Status::AlreadyExists("another depotd is already listening at " + path);
    }
    ::unlink(path.c_str());  // left behind by a daemon that died
  }
  return Status::OK();
}

Status Server::Listen() {
  const std::string& path = options_.socket_path;
  DEPOT_RETURN_NOT_OK(ClaimSocketPath(path));
  boost::system::error_code ec;
  acceptor_.open(boost::asio::local::stream_protocol(), ec);
  if (!ec) {
    // The socket file appears with the mode the umask allows; keep it private until chmod.
    const mode_t old = ::umask(0177);
    acceptor_.bind(boost::asio::local::stream_protocol::endpoint(path), ec);
    ::umask(old);
  }
  if (ec) return Status::IoError("cannot create the socket " + path + ": " + ec.message());
  listening_ = true;
  // The group first: while the file is still 0600, nobody of the group can connect early.
  if (options_.socket_group &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), *options_.socket_group) != 0) {
    return Status::FromErrno(
        "chown " + path + " to group " + std::to_string(*options_.socket_group), errno);
  }
  if (::chmod(path.c_str(), options_.socket_mode) != 0) {
    return Status::FromErrno("chmod " + path, errno);
  }
  acceptor_.listen(SOMAXCONN, ec);
  if (ec) return Status::IoError("cannot listen on " + path + ": " + ec.message());
  Accept();
  return Status::OK();
}

void Server::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec,
                                boost::asio::local::stream_protocol::socket socket) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      return accept_retry_.Failed(ec, std::to_string(sessions_.size()) + " sessions open", [this] {
        if (acceptor_.is_open()) Accept();
      });
    } else {
      const ClientId id = NextId();
      Peer peer = ReadPeer(socket.native_handle(), options_);
      spdlog::info("session {}: connected (pid {}, uid {}, {})", id, peer.pid, peer.uid,
                   peer.command);
      metrics_.SessionOpened();
      auto session = std::make_shared<Session>(*this, std::move(socket), id, std::move(peer));
      sessions_.emplace(id, session);
      session->Start();
    }
    if (acceptor_.is_open()) Accept();
  });
}

void Server::Forget(ClientId id) { sessions_.erase(id); }

ClientId Server::NextId() {
  // After 2^32 sessions the count wraps: it skips the daemon's and the scheduler's own
  // accounts, and those of sessions and groups still open.
  ClientId id;
  do {
    id = next_id_++;
  } while (id == kDaemonClient || id == kSchedulerClient || store_.HasClient(id));
  return id;
}

Result<ClientId> Server::JoinGroup(std::string_view key, uint32_t uid) {
  const ClientId next = NextId();
  DEPOT_ASSIGN_OR_RETURN(const Groups::Joined joined, groups_.Join(key, uid, next));
  if (joined.created) {
    store_.AddClient(joined.account, uid);
  } else {
    next_id_ = next;  // not taken: the next session or group has it
  }
  return joined.account;
}

void Server::LeaveGroup(std::string_view key) {
  if (const std::optional<ClientId> account = groups_.Leave(key)) {
    store_.RemoveClient(*account);
    spdlog::debug("group account {} ended with its last session", *account);
  }
}

void Server::Push(ClientId session, capnp::MessageBuilder& message, wire::Reply::Builder reply) {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second->closed()) return;
  it->second->Send(message, reply, {});
}

namespace {
ClientView ViewOf(const Session& session, const ObjectStore& store) {
  return ClientView{.id = session.id(),
                    .peer = session.peer(),
                    .client_name = session.client_name(),
                    .requests = session.requests(),
                    .connected_time_ns = session.connected_time_ns(),
                    .usage = store.UsageOf(session.id())};
}
}  // namespace

std::vector<ClientView> Server::Clients() const {
  std::vector<ClientView> clients;
  for (const auto& [id, session] : sessions_) {
    if (!session->closed()) clients.push_back(ViewOf(*session, store_));
  }
  std::sort(clients.begin(), clients.end(),
            [](const ClientView& a, const ClientView& b) { return a.id < b.id; });
  return clients;
}

std::optional<ClientView> Server::FindClient(ClientId id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closed()) return std::nullopt;
  return ViewOf(*it->second, store_);
}

std::string Server::RenderMetrics() const {
  return metrics_.Render(StatusOf(store_, *this), store_, tasks_.counters());
}

void Server::Shutdown() {
  if (!listening_) return;
  listening_ = false;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.Cancel();
  ::unlink(options_.socket_path.c_str());
  auto sessions = sessions_;
  for (auto& [id, session] : sessions) session->Close("daemon shutting down");
  sessions_.clear();
}

}  // namespace depot::store
