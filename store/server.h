// The daemon's front door: the listening Unix socket, the sessions, and shutdown.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "depot/status.h"
#include "store/accept_retry.h"
#include "store/admin_requests.h"
#include "store/daemon_options.h"
#include "store/data_requests.h"
#include "store/groups.h"
#include "store/metrics.h"
#include "store/object_store.h"
#include "store/peer.h"
#include "store/slice_queue.h"
#include "store/task_service.h"

namespace depot::store {

class Session;

struct ServerOptions {
  std::string socket_path;
  mode_t socket_mode = 0600;
  std::optional<gid_t> socket_group;  // the socket file's group; nullopt: the daemon's
  uint32_t max_frame_bytes = 0;
  uint32_t max_batch = 0;
  bool metrics = true;  // keep request counters and latency histograms
  // What serves GPUs, for hello and status: "cuda", "simulated", or why there are none.
  std::string device_backend;
  // Other users that may read objects, and those that may create objects too
  // (docs/architecture.md, Trust).
  std::vector<uid_t> share_uids;
  std::vector<gid_t> share_gids;
  std::vector<uid_t> share_write_uids;
  std::vector<gid_t> share_write_gids;
  scheduler::SchedulerOptions scheduler;
};

// Owns the sessions and the requests' handlers, and shows the handlers what they need of
// the daemon through narrow interfaces: DaemonViews (the admin requests) and Pushes (the
// scheduler's messages to workers).
class Server final : public DaemonViews, private Pushes {
 public:
  Server(boost::asio::io_context& loop, ObjectStore& store, ServerOptions options);
  ~Server() override;

  // Checks that `path` can be listened on: refuses if it is not a socket or another daemon
  // answers there, and removes a socket left behind by a daemon that died.
  static Status ClaimSocketPath(const std::string& path);
  // Creates the socket file (after ClaimSocketPath) and starts accepting.
  Status Listen();
  // Stops accepting, closes every session and removes the socket file.
  void Shutdown();

  // For sessions.
  boost::asio::io_context& loop() { return loop_; }
  ObjectStore& store() { return store_; }
  const ServerOptions& options() const { return options_; }
  uint64_t epoch() const { return epoch_; }
  void CountRequest() { ++requests_; }
  Metrics& metrics() { return metrics_; }
  // Where requests that walk many objects run, a slice at a time.
  SliceQueue& slices() { return slices_; }
  void Forget(ClientId id);
  // The settings the daemon runs with and the file they were read from, for `status`; the
  // daemon sets them at start and on each reload.
  void SetSettings(std::string config_file, std::vector<SettingValue> values) {
    config_file_ = std::move(config_file);
    settings_ = std::move(values);
  }
  // The requests' handlers.
  DataRequests& data() { return data_; }
  AdminRequests& admin() { return admin_; }
  TaskService& tasks() { return tasks_; }
  // Adds a session of `uid` to the group `key` (Groups::Join); returns the group's account,
  // opened in the store with the group's first member.
  Result<ClientId> JoinGroup(std::string_view key, uint32_t uid);
  // Takes a session out of the group `key`; with the last, the group's account is closed,
  // which gives back the references nobody claimed.
  void LeaveGroup(std::string_view key);

  // DaemonViews.
  uint64_t start_ns() const override { return start_ns_; }
  const std::string& socket_path() const override { return options_.socket_path; }
  const std::string& device_backend() const override { return options_.device_backend; }
  size_t session_count() const override { return sessions_.size(); }
  uint64_t requests() const override { return requests_; }
  // The metrics in Prometheus text format (the `metrics` request and GET /metrics).
  std::string RenderMetrics() const override;
  std::vector<ClientView> Clients() const override;
  std::optional<ClientView> FindClient(ClientId id) const override;
  std::optional<uint32_t> GroupUid(ClientId account) const override {
    return groups_.UidOf(account);
  }
  SchedulerStatus scheduler_status() const override { return tasks_.Totals(); }
  const std::string& config_file() const override { return config_file_; }
  const std::vector<SettingValue>& settings() const override { return settings_; }

 private:
  // Pushes: to the session, if it is still connected.
  void Push(ClientId session, capnp::MessageBuilder& message, wire::Reply::Builder reply) override;
  void Accept();
  // The id of a new session's or group's account: one no other account has.
  ClientId NextId();

  boost::asio::io_context& loop_;
  ObjectStore& store_;
  ServerOptions options_;
  Metrics metrics_;
  SliceQueue slices_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  AcceptRetry accept_retry_;
  std::unordered_map<ClientId, std::shared_ptr<Session>> sessions_;
  DataRequests data_;
  AdminRequests admin_;
  TaskService tasks_;
  Groups groups_;
  ClientId next_id_ = 1;  // sessions' and groups' accounts alike (NextId)
  uint64_t epoch_ = 0;
  uint64_t start_ns_ = 0;
  uint64_t requests_ = 0;
  bool listening_ = false;
  std::string config_file_;
  std::vector<SettingValue> settings_;
};

}  // namespace depot::store
