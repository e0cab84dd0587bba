// The data requests: create (and put), seal, abort, get (and claim), wait, cancelWait,
// handoff, prefetch, release, delete, contains, locate. Each is decoded and checked here,
// done by the ObjectStore, and answered through its Responder, at once or when the store
// calls back (a seal's checksum, a get that waits, a GPU create that waits for room).
//
// One per daemon; it keeps no state of its own. A callback that outlives its session finds
// its Responder gone and does nothing (the store gave back what the session held).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "depot/object_id.h"
#include "protocol.capnp.h"
#include "store/object_store.h"
#include "store/requester.h"
#include "store/responder.h"
#include "store/room_waits.h"

namespace depot::store {

class DataRequests {
 public:
  explicit DataRequests(ObjectStore& store) : store_(store) {}
  DataRequests(const DataRequests&) = delete;
  DataRequests& operator=(const DataRequests&) = delete;

  // What decides whether a worker's create that finds no room waits (RoomWaits): the
  // scheduler's view of the task making it.
  class OutputRoom {
   public:
    virtual ~OutputRoom() = default;
    // The task making `id` if `creator` runs it now, else 0.
    virtual uint64_t MakesNow(ClientId creator, const ObjectId& id) const = 0;
    // Whether nobody wants `id` any more (its graph given up): no wait for it.
    virtual bool Unwanted(const ObjectId& id) const = 0;
    virtual RoomWaits& room_waits() = 0;
  };
  // Where a worker's create of an output of a task it runs now waits when it finds no room,
  // instead of failing. Without it, every create is answered at once.
  void WaitForRoomOfOutputs(OutputRoom* outputs) { outputs_ = outputs; }

  void Create(const Responder& reply, const Requester& who, wire::Request::Create::Reader create);
  void Seal(const Responder& reply, const Requester& who, const ObjectId& id);
  void Abort(const Responder& reply, const Requester& who, const ObjectId& id);
  // A get, or with `claim` the references the requester's group holds (ObjectStore::Claim).
  void Get(const Responder& reply, const Requester& who, wire::Request::Get::Reader get);
  void Wait(const Responder& reply, const Requester& who, wire::Request::Wait::Reader wait);
  // Answers the requester's own get or wait `target` (a request id) now, then `reply`.
  void CancelWait(const Responder& reply, const Requester& who, uint64_t target);
  void Handoff(const Responder& reply, const Requester& who,
               wire::Request::Handoff::Reader handoff);
  void Prefetch(const Responder& reply, const Requester& who, wire::Request::Get::Reader prefetch);
  // Gives back one reference per id on each group's tier; the first error (NotHeld, or a
  // tier the daemon does not serve) is the answer, the other ids are still released.
  void Release(const Responder& reply, const Requester& who,
               capnp::List<wire::Request::TierRefs>::Reader tiers);
  void Delete(const Responder& reply, const Requester& who, capnp::List<wire::Id>::Reader ids);
  void Contains(const Responder& reply, const Requester& who, capnp::List<wire::Id>::Reader ids);
  void Locate(const Responder& reply, const Requester& who, capnp::List<wire::Id>::Reader ids);

 private:
  void Claim(const Responder& reply, const Requester& who, wire::Request::Get::Reader get);
  // A create that may wait for room: its parameters, kept beyond the request.
  struct KeptCreate {
    CreateParams params;
    std::vector<std::byte> metadata;
    std::string name;
  };
  // Creates an output of a task `client` runs now; with no room, waits in room_waits_.
  // `again`: a wait for room tries it again.
  void CreateOutput(const Responder& reply, ClientId client, std::shared_ptr<KeptCreate> kept,
                    bool again = false);

  ObjectStore& store_;
  OutputRoom* outputs_ = nullptr;
};

// A create's reply, naming where the object is; `writable`: the creator will write the
// bytes (not a put), so it gets the segment's (or chunk's) writable descriptor.
void SendLocation(const Responder& reply, const Location& loc, bool writable);
// A get's reply: each result, with the descriptors of the regions its objects are in.
void SendGetReply(const Responder& reply, int32_t device, const std::vector<GetResult>& results);
void ToWire(const Location& loc, wire::Location::Builder out);

}  // namespace depot::store
