// The admin requests (depotctl, and clients' status and metrics): status, metrics, clients,
// objectInfo, evict, and the two that walk every object, list and verify, which run as a
// session's jobs, a slice at a time.
//
// One per daemon. It reads the store, and what it needs of the daemon beyond the store
// through DaemonViews (the Server implements it), not the Server itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "depot/client.h"
#include "depot/object_id.h"
#include "depot/task.h"
#include "protocol.capnp.h"
#include "store/daemon_options.h"
#include "store/object_store.h"
#include "store/peer.h"
#include "store/requester.h"
#include "store/responder.h"

namespace depot::store {

// A connected client, as the admin views show it.
struct ClientView {
  ClientId id = 0;
  Peer peer;
  std::string client_name;  // from its hello; empty before
  uint64_t requests = 0;
  uint64_t connected_time_ns = 0;
  ClientUsage usage;
};

// What the admin requests read of the daemon beyond the store.
class DaemonViews {
 public:
  virtual ~DaemonViews() = default;
  // When the daemon started (monotonic ns), where it listens, what serves its GPUs.
  virtual uint64_t start_ns() const = 0;
  virtual const std::string& socket_path() const = 0;
  virtual const std::string& device_backend() const = 0;
  virtual size_t session_count() const = 0;
  virtual uint64_t requests() const = 0;
  // The metrics in Prometheus text format.
  virtual std::string RenderMetrics() const = 0;
  // The connected clients, by id; one of them, nullopt if it has gone.
  virtual std::vector<ClientView> Clients() const = 0;
  virtual std::optional<ClientView> FindClient(ClientId id) const = 0;
  // The uid of the group whose account is `account`, if it is a group's.
  virtual std::optional<uint32_t> GroupUid(ClientId account) const = 0;
  // The scheduler's part of the status reply.
  virtual SchedulerStatus scheduler_status() const = 0;
  // The settings the daemon runs with, and the file they were read from.
  virtual const std::string& config_file() const = 0;
  virtual const std::vector<SettingValue>& settings() const = 0;
};

// Where a session's long requests run: a slice at a time on the daemon's SliceQueue,
// between which everyone else's requests run, with what they may hold counted against the
// session's client, and dropped when the session closes. A session may have a few at once;
// then it handles none of its later requests until one ends.
class Jobs {
 public:
  virtual ~Jobs() = default;
  // Counts `bytes` (what the job may hold) against the client's limits and takes a job
  // slot; or answers `reply` LimitExceeded and returns false.
  virtual bool BeginJob(const Responder& reply, uint64_t bytes) = 0;
  // Gives back what BeginJob took.
  virtual void EndJob(uint64_t bytes) = 0;
  // Queues `slice` (which returns true when there are no more) on the SliceQueue; it is
  // dropped if the session has closed by the time it would run.
  virtual void RunSlices(std::function<bool()> slice) = 0;
  // Runs `work` (a job's callback from another part of the daemon) unless the session has
  // closed; an exception in it closes the session only.
  virtual void RunGuarded(const std::function<void()>& work) = 0;
};

class AdminRequests {
 public:
  AdminRequests(ObjectStore& store, const DaemonViews& daemon) : store_(store), daemon_(daemon) {}
  AdminRequests(const AdminRequests&) = delete;
  AdminRequests& operator=(const AdminRequests&) = delete;

  void Status(const Responder& reply) const;
  void Metrics(const Responder& reply) const;
  void Clients(const Responder& reply) const;
  void ObjectInfo(const Responder& reply, const ObjectId& id) const;
  // `who_for_logs` names the requester in the daemon's log.
  void Evict(const Responder& reply, const std::string& who_for_logs,
             wire::Request::Evict::Reader evict);
  // List and verify run as jobs of `jobs`, which holds them weakly.
  void List(const Responder& reply, const std::shared_ptr<Jobs>& jobs,
            wire::Request::ListObjects::Reader list);
  void Verify(const Responder& reply, const Requester& who, const std::shared_ptr<Jobs>& jobs,
              wire::Request::Verify::Reader verify);

 private:
  struct ListJob;
  // One slice of a list reply: a stretch of the walk, or some entries of the reply; true
  // when the reply has gone.
  bool ListSlice(ListJob& job);
  struct VerifyJob;
  // Starts verifying a small batch of the job's objects; true when the job leaves the
  // SliceQueue (enough batches in flight, or none left to start).
  bool VerifySlice(const std::shared_ptr<VerifyJob>& job);
  // Files a batch's outcomes (results `first` on); queues the job again, or replies.
  void VerifyBatchDone(const std::shared_ptr<VerifyJob>& job, unsigned first,
                       std::vector<VerifyOutcome> outcomes);
  void SendVerifyReply(VerifyJob& job);

  ObjectStore& store_;
  const DaemonViews& daemon_;
};

// A GPU as hello and status describe it (its ordinal is the client's to fill in).
GpuInfo GpuInfoOf(const ObjectStore& store, uint32_t device);

// The status reply, and what the metrics export of it (Metrics::Render).
StoreStatus StatusOf(const ObjectStore& store, const DaemonViews& daemon);

}  // namespace depot::store
