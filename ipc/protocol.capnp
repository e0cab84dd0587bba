# depot's wire protocol. Both sides compile this file; see docs/architecture.md.
#
# Every message on the socket is one frame: an 8-byte header (payload size, number of file
# descriptors attached) then a Cap'n Proto message in flat-array form. A client sends
# Requests; the daemon answers each Request whose id is non-zero with one Reply carrying the
# same id. Replies may come in any order (a get that waits does not hold up later requests).
@0xc1f3a6d7e2b49a05;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("depot::wire");

# An ObjectId as two 64-bit words (see ObjectId::FromWords).
struct Id {
  lo @0 :UInt64;
  hi @1 :UInt64;
}

# The same values as depot::StatusCode.
enum ErrorCode {
  ok @0;
  invalidArgument @1;
  notFound @2;
  alreadyExists @3;
  notSealed @4;
  alreadySealed @5;
  notHeld @6;
  outOfMemory @7;
  timeout @8;
  limitExceeded @9;
  protocolMismatch @10;
  connectionFailed @11;
  disconnected @12;
  ioError @13;
  internal @14;
  permissionDenied @15;
  # The object is the output of a task that failed (sealed as failed by the scheduler);
  # Reply.GetResult.message says why.
  taskFailed @16;
}

struct Request {
  # 0 means "no reply wanted" (allowed for release only: errors are then only logged).
  id @0 :UInt64;
  union {
    hello @1 :Hello;
    create @2 :Create;
    seal @3 :Id;
    abort @4 :Id;
    get @5 :Get;
    # Ordinals of protocol v5's two release forms (`release`, host ids, and `releaseRefs`,
    # ids with a tier), retired in v6 for the one `release` below: a union member cannot be
    # removed, nor its ordinal reused. The daemon answers them with invalidArgument.
    retiredRelease @6 :Void;
    delete @7 :List(Id);
    contains @8 :List(Id);
    list @9 :ListObjects;
    status @10 :Void;
    metrics @11 :Void;
    # Admin requests (depotctl), answered from the daemon's own tables.
    clients @12 :Void;       # every connected session
    objectInfo @13 :Id;      # one object and which sessions hold it
    verify @14 :Verify;      # recompute checksums and compare them with those taken at seal
    evict @15 :Evict;        # evict unreferenced, unpinned objects now, least recently used first
    retiredReleaseRefs @16 :Void;
    # Makes a copy of each object on `device` (as a get there would), then answers; holds
    # nothing, so the copies stay until room is needed. `timeoutMs` is not used.
    prefetch @17 :Get;
    # Gives references back, host and GPU alike: for each group, one reference per listed id
    # (an id may be listed several times) on the group's tier. The only request that may
    # carry id 0 (no reply wanted).
    release @18 :List(TierRefs);
    # Where each object's bytes are, holding nothing: what a client also reads from the
    # header table for the objects it holds (ObjectHeader.tiers), for any id.
    locate @19 :List(Id);

    # Tasks (docs/architecture.md, "The scheduler").
    # Makes this session a worker: the daemon then pushes it `assign` messages (Reply with
    # id 0) and it answers each task with a completion.
    registerWorker @20 :RegisterWorker;
    # Submits tasks, all or none; answered with each task's output ids.
    submit @21 :List(TaskSpec);
    # A worker reports tasks it ran. Id 0 allowed: no reply wanted (errors are only logged).
    complete @22 :List(Completion);
    # Cancels the tasks producing these outputs, where they have not started.
    cancel @23 :List(Id);
    # A worker asks to leave: no new tasks; it may close once its running ones are complete.
    drainWorker @24 :Void;
    workers @25 :Void;       # the workers attached (depotctl workers)
    tasks @26 :Void;         # pending tasks and the last finished ones (depotctl tasks)

    # Hands objects to this session's group (Hello.group) for other members to claim (a get
    # with `claim`): the group takes one reference per id on `device`, and the object is
    # deleted, so that it goes once the group and its claimers have let go. The session must
    # hold a reference there, or the group one already (the same value sent again).
    handoff @27 :Handoff;

    # Waits, holding nothing, until `count` of `ids` are sealed (as succeeded or failed:
    # whatever a get would answer at once), or until `timeoutMs` has passed; answered with
    # which ones are. Never copies between tiers.
    wait @28 :Wait;
    # Answers this session's get or wait with this request id now, as if its time were up:
    # its ids not sealed yet are timeout (a get's copies under way are dropped, and so are
    # those ids). Its reply goes out before this one's, which says whether it was waiting.
    # A get or wait ends without a reply when its session closes.
    cancelWait @29 :UInt64;

    # Deletes each object once no pending task reads or makes it: the outputs of tasks
    # whose readers have all been submitted, given up by the client that submitted them
    # (docs/architecture.md, "The scheduler"). Objects no pending task reads or makes are
    # deleted at once, as by `delete`.
    deleteAfterTasks @30 :List(Id);
  }

  struct Wait {
    ids @0 :List(Id);
    # Milliseconds to wait: 0 = do not wait, -1 = forever (as Get.timeoutMs).
    timeoutMs @1 :Int64;
    # Answer once this many of the ids are sealed; 0 = all of them. At most the number of
    # ids (an id listed twice counts twice).
    count @2 :UInt32;
  }

  struct Handoff {
    ids @0 :List(Id);
    device @1 :Int32 = -1;
    # 0: the group holds each reference until it is claimed or the group ends. Otherwise it
    # also gives one back after this many milliseconds if nobody has claimed it (a claim
    # takes the reference that would expire first).
    ttlMs @2 :UInt32;
    # The one id is an object this session is creating: the daemon seals it first, and if
    # the handoff then fails, deletes it; so a sender that dies never leaves it sealed in
    # the store under an id nobody knows (protocol 19).
    seal @3 :Bool;
    # 0: none. Otherwise the group also gives each reference back this many milliseconds
    # after this session has ended, if nobody has claimed it by then (or at its ttl, if
    # sooner): a sender's values outlive it only as long as a receiver needs to claim what
    # was already on its way (depot.multiprocessing's DataLoader workers). Protocol 21.
    graceMs @4 :UInt32;
  }

  struct RegisterWorker {
    name @0 :Text;
    cpus @1 :Float64;        # CPU slots
    gpus @2 :List(Data);     # the GPUs it may use, by UUID (Reply.Hello.devices)
    resources @3 :List(Resource);  # custom resources, e.g. ssd = 1
    functions @4 :List(Text);  # the names of the functions it runs (the CPU variant of two)
    # Of those names and others: functions it has a GPU variant of, run in place of the one
    # above when a task runs on a GPU (Assignment.device).
    gpuFunctions @5 :List(Text);
  }

  struct Verify {
    ids @0 :List(Id);        # these objects (at most maxBatch), answered in order
    # Instead of ids: every sealed object that has a checksum, a page at a time, from this
    # slot on (the reply says where the next page starts).
    all @1 :Bool;
    startSlot @2 :UInt32;
  }

  # The first request of a session; nothing else is accepted before it.
  struct Hello {
    protocolVersion @0 :UInt32;
    clientName @1 :Text;     # for logs and `depotctl clients`
    # 16 random bytes naming a group of sessions of one uid (depot.multiprocessing's process
    # tree), or empty. References handed off in a group (`handoff`) live until claimed or
    # until every session of the group has gone.
    group @2 :Data;
  }

  struct Create {
    id @0 :Id;
    dataSize @1 :UInt64;
    metadata @2 :Data;       # small: stored after the data, bounded by the frame size
    name @3 :Text;           # optional key the id was derived from, kept for display
    pin @4 :Bool;            # never evicted
    checksum @5 :Bool;       # compute XXH3-64 of data and metadata at seal
    # A put in one round trip (small objects): the daemon copies `data` (exactly dataSize
    # bytes) into the object, then seals it if `seal`, then drops the creator's reference if
    # `release` (which needs `seal`).
    data @6 :Data;
    seal @7 :Bool;
    release @8 :Bool;
    # Where the object is made: -1 = host memory; k >= 0 = the k-th GPU of Reply.Hello.devices.
    # A GPU object takes no inline data; its writer fills it through its own mapping.
    device @9 :Int32 = -1;
    # Never spilled to disk (depotd --spill-dir): under memory pressure the object is evicted
    # for good, as without a spill directory (a cache cheaper to recompute than to read back).
    noSpill @10 :Bool;
  }

  struct Get {
    ids @0 :List(Id);
    # Milliseconds to wait for ids that are not sealed yet: 0 = do not wait, -1 = forever.
    timeoutMs @1 :Int64;
    # Where the caller wants the bytes (as Create.device). The daemon makes a replica there
    # when the object lives elsewhere, and answers when it is ready.
    device @2 :Int32 = -1;
    # Take references the session's group holds (`handoff`) instead of new ones: each id is
    # answered as a get, or notHeld if the group holds none on `device`. Never waits.
    claim @3 :Bool;
  }

  # References on one tier (Create.device numbering), for `release`. The ids are grouped
  # by tier, not each paired with its own, because releases are the most frequent message
  # after gets and nearly all are of host ids: in a List(Id) an id costs 16 bytes, as in
  # v5's host-only release, where a List of {id :Id, device :Int32} costs 32 per id (each
  # Id a struct of its own behind a pointer) and one with the id's words inlined 24. A group
  # costs 24 bytes, and a client sends one per tier it releases on.
  # A group whose device is -2 (ipc::kLeasedReads) holds no references: it names objects
  # the client read through its lease table (depot/ipc/lease.h) and has let go of since its
  # last frame. The daemon counts them as gets (LRU order, access time, counters), and looks
  # at the lease tables again now, not at its next round, if such an object waits for that.
  struct TierRefs {
    device @0 :Int32 = -1;
    ids @1 :List(Id);
  }

  struct ListObjects {
    startSlot @0 :UInt32;    # resume point from the previous page's nextSlot
    limit @1 :UInt32;        # at most this many entries (the daemon may return fewer)
    # If not 0: instead of a page, the `largest` largest objects by data size (ties: oldest
    # first), largest first, in one reply (done), at most 10,000; `limit` is not used. For `top`.
    largest @2 :UInt32;
    # Since protocol 20: only objects whose name starts with these bytes (at most 4,096; not
    # with `largest`); empty: every object. `limit` counts the objects that match.
    prefix @3 :Text;
  }

  # Evicts until `bytes` are freed (or nothing evictable is left), or, with
  # `allUnreferenced`, everything evictable. One of the two must be given.
  struct Evict {
    bytes @0 :UInt64;
    allUnreferenced @1 :Bool;
  }
}

# Where an object's bytes live. In host memory (device -1): a segment of the host arena and an
# offset in it, and the metadata follows the data directly: [offset + dataSize, + metadataSize).
# On a GPU (device k): a chunk of that GPU's pool (`segment` is the chunk's index) and an
# offset in it; the metadata, kept by the daemon in host memory, travels in `metadata`.
struct Location {
  slot @0 :UInt32;           # index of its header in the shared header table
  segment @1 :UInt32;
  offset @2 :UInt64;
  dataSize @3 :UInt64;
  metadataSize @4 :UInt64;
  device @5 :Int32 = -1;
  metadata @6 :Data;
}

# A segment of the host arena that a reply names and the session has not been sent yet, or
# not yet for writing. Its file descriptor is attached to the frame, in the order of
# Reply.newSegments. Every segment comes first read-only (`writable` false: a descriptor that
# cannot be mapped writable); the reply to a session's first create in a segment also
# carries it writable (after the read-only entry when both are new). A shared segment is sent
# once per session and generation, and mapped for the session's life: when the daemon gives
# an empty segment a new file (for another uid's objects), its generation grows, and the next
# reply that names it sends it again; the client maps the new file in place of the old one
# and drops its writable view of the old. A `dedicated` segment holds one object larger than
# a shared segment: it comes with every reply that names it (the client maps it while it
# holds the object, and may keep the mapping after), and its index names one file for the
# daemon's life (a segment kept when its object went serves the next large object of its
# writers' class under the same index).
struct Segment {
  index @0 :UInt32;
  size @1 :UInt64;
  writable @2 :Bool;
  dedicated @3 :Bool;
  generation @4 :UInt32;
}

# How a client reaches a chunk of a GPU pool (depot::ipc::ChunkHandle).
enum ChunkHandle {
  posixFd @0;                # cuMemCreate memory exported as a file descriptor
  legacyIpc @1;              # a CUDA IPC handle (in `ipcHandle`), for devices without fd export
  memfd @2;                  # a simulated device's memory: a memfd to map
}

# A chunk of a GPU pool the session has not been sent yet. The file descriptors of those
# whose handle has one are attached to the frame after the new segments' ones, in order.
struct Chunk {
  device @0 :UInt32;         # index into Reply.Hello.devices
  index @1 :UInt32;
  size @2 :UInt64;
  handle @3 :ChunkHandle;
  ipcHandle @4 :Data;
  # Whether the descriptor maps read-write. A session gets each chunk read-only where the
  # daemon can share it so (simulated devices), and read-write besides with its first create
  # there; CUDA chunks come read-write only.
  writable @5 :Bool;
}

# Where one object's bytes are (Reply.locate).
struct Placement {
  found @0 :Bool;            # sealed and not deleted; the rest is zero if not
  tiers @1 :UInt64;          # with ready bytes: bit 0 host memory, bit k + 1 GPU k of hello's devices
  dataSize @2 :UInt64;
  metadataSize @3 :UInt64;
  failed @4 :Bool;           # found, and sealed as failed (a get answers taskFailed): no bytes
}

# A named amount of a resource: a worker's capacity, or a task's request.
struct Resource {
  name @0 :Text;
  amount @1 :Float64;
}

enum Affinity {
  none @0;
  soft @1;                   # prefer the GPU holding most input bytes when it can start there
  hard @2;                   # only that GPU
}

struct TaskSpec {
  function @0 :Text;
  inputs @1 :List(Id);       # in order; a task's output ids make a graph
  args @2 :Data;             # small inline arguments, passed as they are
  outputs @3 :List(Id);      # named by the caller, or empty for `numOutputs` derived ids
  numOutputs @4 :UInt32 = 1;
  cpu @5 :Float64 = 1;       # CPU slots it holds
  gpu @6 :Float64;           # share of one GPU, 0 to 1 (0: a CPU task)
  resources @7 :List(Resource);  # custom resources it holds
  affinity @8 :Affinity;
  priority @9 :Int32;        # higher first
  retries @10 :UInt32 = 1;   # runs again after its worker died, at most this often
  outputBytes @11 :UInt64;   # what its outputs take, if known: it starts only where they fit
  detach @12 :Bool;          # it runs even if its submitter disconnects before it starts
  variant @13 :Variant;
  # Indices of inputs the task reads in host memory wherever it runs (a Python function's
  # pickle, its stored arguments): never copied to its GPU, nor counted as copies there.
  hostInputs @14 :List(UInt32);
  # What people see of it in `depotctl tasks` and `tasks` (a Dask key, say): display only,
  # at most 256 bytes. A daemon older than the field ignores it (no version bump).
  label @15 :Text;
  # A memory bound it shares with the submitter's other tasks naming the same `boundId`
  # (a graph's: depot.dask's memory= on a shared daemon): it starts only while the outputs
  # of that bound's tasks still stored, those its placed tasks declared and its own
  # declared `outputBytes` fit `boundBytes`. 0: none. Every task naming a bound gives the
  # same bytes. A daemon older than the fields ignores them (no version bump).
  boundId @16 :UInt64;
  boundBytes @17 :UInt64;
  # Its kind (a Dask layer, say; at most 256 bytes): a task that declares no `outputBytes`
  # is expected to make as much as the most a task of its kind, of this submitter, made so
  # far, and is placed and bounded as if it had declared that. A daemon older than the field
  # ignores it (no version bump).
  kind @18 :Text;
  # With a bound: held back by it, the task waits for the submitter to free the bound's
  # outputs it holds, however long (depot's Client.map(memory=), whose caller frees results
  # as it goes), instead of failing once nothing of the bound has run or changed for the
  # grace period (a graph's bound, whose stored outputs only its own tasks free). It fails
  # only if its output alone is larger than the bound. A daemon older than the field ignores
  # it (no version bump).
  boundWaits @19 :Bool;
}

# Which implementation of a function a task runs, where some worker has a GPU variant.
enum Variant {
  auto @0;                   # the scheduler chooses, for a task that asks no GPU: the CPU
                             # variant with its resources, or the GPU variant with one GPU
                             # and its custom resources, whichever would finish first
  cpu @1;
  gpu @2;                    # the GPU variant (one GPU, unless the task asks a share)
}

struct Completion {
  task @0 :UInt64;
  ok @1 :Bool;               # its outputs are sealed; false: it failed, for `message`
  message @2 :Text;
  # Small outputs carried here rather than put by the worker (no round trip each): the
  # daemon stores each in host memory as the worker's put would, before it reads `ok`.
  outputs @3 :List(OutputValue);
  # Indices of outputs this session created and filled and has not sealed: with `ok`, the
  # daemon seals each as this session's seal request would, before it counts the task done
  # (no round trip each). A seal it cannot make fails the task, with why.
  seal @4 :List(UInt32);
}

struct OutputValue {
  index @0 :UInt32;          # which of the task's outputs
  data @1 :Data;             # data and metadata together at most kMaxInlineOutputBytes
  metadata @2 :Data;
}

# A task a worker is to run now (Reply.assign).
struct Assignment {
  task @0 :UInt64;
  attempt @1 :UInt32;        # 2 and more: earlier workers died running it
  device @2 :Int32;          # -1: a CPU task; else the GPU it was given (hello's numbering)
  function @3 :Text;
  inputs @4 :List(Id);
  args @5 :Data;
  outputs @6 :List(Id);      # to create and seal (on `device` for a GPU task, as it likes)
  sealed @7 :List(UInt32);   # indices of outputs an earlier attempt sealed: not to be made again
  after @8 :UInt64;          # 0, or a task running on this worker: start this one when that
                             # one's function has returned (it takes over its resources)
  # With the tasks of this push, nothing is left on the worker that a task could start on
  # (no CPU and no GPU share): until one of its tasks ends, the daemon sends it only tasks
  # to follow them (`after`). The worker need not read while they run; the thread whose task
  # ends reads next. Added within protocol 18: a worker that ignores it reads as before.
  workerFull @9 :Bool;
}

enum CancelOutcome {
  cancelled @0;              # it will not run; its outputs are sealed as failed
  running @1;                # it runs already and will finish
  finished @2;               # it is done or failed already
  unknown @3;                # no task of this daemon produces this id
}

struct WorkerInfo {
  sessionId @0 :UInt64;
  name @1 :Text;
  cpus @2 :Float64;
  freeCpus @3 :Float64;
  gpus @4 :List(Int32);      # hello's numbering
  freeGpuShares @5 :List(Float64);  # of each of `gpus`
  resources @6 :List(Resource);
  functions @7 :List(Text);
  running @8 :UInt64;
  queued @9 :UInt64;         # placed on it, waiting for its resources
  done @10 :UInt64;
  failed @11 :UInt64;
  draining @12 :Bool;
  attachedS @13 :Float64;    # seconds since it attached
  gpuFunctions @14 :List(Text);  # the functions it has a GPU variant of
}

enum TaskState {
  waiting @0;                # for inputs to be sealed
  ready @1;                  # for a worker with room
  queued @2;                 # placed on a worker, waiting for its resources
  running @3;
  done @4;
  failed @5;
  cancelled @6;
}

struct TaskInfo {
  task @0 :UInt64;
  function @1 :Text;
  state @2 :TaskState;
  submitter @3 :UInt64;      # session id
  worker @4 :UInt64;         # session id, 0 if none yet
  device @5 :Int32;
  outputs @6 :List(Id);
  priority @7 :Int32;
  attempts @8 :UInt32;
  inputsMissing @9 :UInt32;
  localBytes @10 :UInt64;    # input bytes already where it runs
  movedBytes @11 :UInt64;    # input bytes copied there
  waitS @12 :Float64;        # the placement's estimate: queue wait, transfers, duration
  transferS @13 :Float64;
  durationS @14 :Float64;
  reason @15 :Text;          # why it waits (ready) or failed
  variant @16 :Text;         # "cpu" or "gpu" for a task placed by variant, else empty
  variantReason @17 :Text;   # why that one: the estimates compared, or exploring
  label @18 :Text;           # its submitter's label (TaskSpec.label)
}

# The scheduler's totals (StoreStatus.scheduler).
struct SchedulerStatus {
  workers @0 :UInt64;
  tasksPending @1 :UInt64;
  submitted @2 :UInt64;
  completed @3 :UInt64;
  failed @4 :UInt64;
  cancelled @5 :UInt64;
  retried @6 :UInt64;
  placements @7 :UInt64;
  localBytes @8 :UInt64;
  movedBytes @9 :UInt64;
  prefetches @10 :UInt64;
  hostToGpu @11 :Float64;    # bandwidths placement assumes, bytes per second
  gpuToHost @12 :Float64;
  gpuToGpu @13 :Float64;
  bandwidthsMeasured @14 :Bool;  # they are the store's measured copies (assumed until one is made)
  steals @15 :UInt64;        # queued tasks taken from a busy worker for an idle one
  preemptions @16 :UInt64;   # queued tasks that gave their place to a ready task outranking them
}

# A GPU the daemon serves (Reply.Hello.devices, StoreStatus.devices).
struct Device {
  uuid @0 :Data;             # 16 bytes, as cuDeviceGetUuid reports it
  name @1 :Text;
  simulated @2 :Bool;        # a test and demo device backed by host memory
  totalBytes @3 :UInt64;     # the device's memory
  limitBytes @4 :UInt64;     # what the daemon's pool may take of it (--gpu-memory)
  reservedBytes @5 :UInt64;  # in chunks allocated so far
  usedBytes @6 :UInt64;      # allocated to objects
  heldBytes @7 :UInt64;      # of which held by references or objects being created
  chunks @8 :UInt32;
  replicas @9 :UInt64;       # objects with bytes on this device
}

struct Reply {
  id @0 :UInt64;
  error @1 :ErrorCode;       # ok, or why the request failed as a whole
  message @2 :Text;          # for a person: what went wrong and what to do about it
  newSegments @3 :List(Segment);
  newChunks @17 :List(Chunk);
  union {
    none @4 :Void;
    hello @5 :Hello;
    create @6 :Location;
    get @7 :List(GetResult);
    contains @8 :List(Bool);
    delete @9 :List(ErrorCode);
    list @10 :ObjectPage;
    status @11 :StoreStatus;
    metrics @12 :Text;       # Prometheus text exposition format 0.0.4
    clients @13 :List(ClientInfo);  # in session id order
    objectInfo @14 :ObjectDetails;
    verify @15 :VerifyPage;
    evict @16 :EvictResult;
    prefetch @18 :List(ErrorCode);  # in request order: ok (ready there), notFound, outOfMemory
    locate @19 :List(Placement);    # in request order
    submit @20 :List(TaskOutputs);  # in request order
    # Pushed to a worker (id 0), not a reply: tasks to run now.
    assign @21 :List(Assignment);
    cancel @22 :List(CancelOutcome);  # in request order
    workers @23 :List(WorkerInfo);  # in session id order
    tasks @24 :List(TaskInfo);      # pending in task order, then finished ones
    # Pushed to a draining worker (id 0) once it has nothing left to run: it may close.
    drained @25 :Void;
    handoff @26 :List(ErrorCode);  # in request order: ok, notFound, notSealed, notHeld, ...
    wait @27 :List(Bool);      # in request order: sealed when answered
    cancelWait @28 :Bool;      # that get or wait was waiting, and has been answered
    # In request order: ok (deleted, or to be once no pending task reads or makes it),
    # notFound, notSealed (being created by a client, not by a task).
    deleteAfterTasks @29 :List(ErrorCode);
  }

  struct TaskOutputs {
    ids @0 :List(Id);
  }

  # The hello reply carries one file descriptor: the shared header table (map it read-only).
  struct Hello {
    protocolVersion @0 :UInt32;
    daemonVersion @1 :Text;
    epoch @2 :UInt64;        # random per daemon start
    sessionId @3 :UInt64;
    headerSlots @4 :UInt32;  # the table holds this many ObjectHeader slots
    maxFrameBytes @5 :UInt32;
    maxBatch @6 :UInt32;     # most ids in one get/release/delete/contains
    devices @7 :List(Device);  # the GPUs, in the order requests number them
    deviceBackend @8 :Text;  # "cuda", "simulated", or why there are no GPUs
    # Entries of the session's lease table (depot/ipc/lease.h), whose descriptor follows the
    # header table's; 0: the daemon gives no leases, and sends no second descriptor.
    leaseEntries @9 :UInt32;
    # The daemon honours a lease only on an object of at most this many bytes of data and
    # metadata (0: any size): what the session's limits set aside for its table, divided by
    # its entries. A client takes no lease on a larger object, which it gets through the
    # socket instead; a lease it takes on one anyway keeps nothing (docs/leases.md).
    leaseMaxBytes @10 :UInt64;
  }

  struct GetResult {
    # ok, notFound (did not exist and no wait), timeout, taskFailed, or why a copy to the
    # tier asked for failed (outOfMemory, ...)
    error @0 :ErrorCode;
    location @1 :Location;   # ok
    # taskFailed: the task's message, at most 4096 bytes. A reply carries at most 1 MiB of
    # them in all: past that, a result's message only says so (get that object alone).
    message @2 :Text;
  }

  struct VerifyPage {
    results @0 :List(VerifyResult);  # in request order; for `all`, in slot order
    nextSlot @1 :UInt32;     # for `all`: where the next page starts
    done @2 :Bool;           # for `all`: no objects after this page
  }

  struct ObjectPage {
    objects @0 :List(ObjectInfo);
    nextSlot @1 :UInt32;
    done @2 :Bool;
  }
}

enum ObjectState {
  creating @0;
  sealed @1;
}

struct ObjectInfo {
  id @0 :Id;
  name @1 :Text;
  state @2 :ObjectState;
  dataSize @3 :UInt64;
  metadataSize @4 :UInt64;
  refCount @5 :UInt32;
  pinned @6 :Bool;
  hasChecksum @7 :Bool;
  checksum @8 :UInt64;
  createTimeNs @9 :UInt64;   # CLOCK_REALTIME
  accessTimeNs @10 :UInt64;
  segment @11 :UInt32;
  offset @12 :UInt64;
  deletePending @13 :Bool;   # deleted, gone when the last reference is released
  onHost @14 :Bool;          # has bytes in host memory (segment and offset are valid)
  devices @15 :List(UInt32); # the GPUs it has bytes on (a replica each)
  ownerUid @16 :UInt32;      # the uid of the session that created it
  failed @17 :Bool;          # sealed as failed by the scheduler: no bytes; a get answers taskFailed
  onDisk @18 :Bool;          # has a copy in the daemon's spill directory (a get restores it)
}

struct StoreStatus {
  daemonVersion @0 :Text;
  pid @1 :UInt32;
  uptimeNs @2 :UInt64;
  socketPath @3 :Text;
  arenaBackend @4 :Text;     # "memfd" or the --arena-dir path
  capacityBytes @5 :UInt64;
  mappedBytes @6 :UInt64;    # in segments created so far
  usedBytes @7 :UInt64;      # allocated to objects
  heldBytes @8 :UInt64;      # of which held by references (cannot be evicted)
  pinnedBytes @9 :UInt64;
  segments @10 :UInt32;
  objectsSealed @11 :UInt64;
  objectsCreating @12 :UInt64;
  clients @13 :UInt32;
  evictions @14 :UInt64;
  evictedBytes @15 :UInt64;
  evictionEnabled @16 :Bool;
  largestFreeBlock @17 :UInt64;
  headerSlots @18 :UInt32;
  requests @19 :UInt64;
  devices @20 :List(Device);
  deviceBackend @21 :Text;   # "cuda", "simulated", or why there are no GPUs
  spills @22 :UInt64;        # objects moved from a full GPU to host memory
  spilledBytes @23 :UInt64;
  replicasMade @24 :UInt64;  # copies made for a get on another tier (spills not included)
  replicasDropped @25 :UInt64;  # extra copies dropped to make room
  arenaPageLockedBytes @26 :UInt64;  # of the arena, registered with the CUDA driver (pinned)
                                     # so copies to and from GPUs run at full speed
  objectsOnHost @27 :UInt64;  # objects with a copy in host memory (Device.replicas: on a GPU)
  metadataBytes @28 :UInt64;  # daemon memory kept for clients: object entries, names, GPU
                              # metadata, waiting gets
  metadataBudgetBytes @29 :UInt64;  # its limit (--metadata-budget; 0: none)
  requestBytes @30 :UInt64;  # daemon memory kept for requests in progress (large frames
                             # being read, list and verify work), within the same budget
  scheduler @31 :SchedulerStatus;
  disk @32 :DiskStatus;      # the disk tier; `enabled` false without --spill-dir
  configFile @33 :Text;      # --config; empty: none
  settings @34 :List(Setting);  # every setting the daemon runs with (after reloads)
  keptBytes @35 :UInt64;     # of large objects gone, kept for the next ones: free for any
                             # object, given back on demand (not in mappedBytes)
  arenaPageBytes @36 :UInt64;  # the size of the arena's pages (huge ones: --huge-pages)
  arenaPages @37 :Text;      # how the arena got its pages, or why not huge ones if asked
}

# A daemon setting: its key (the flag without dashes) and value, as the file writes them.
struct Setting {
  name @0 :Text;
  value @1 :Text;
}

# The disk tier (depotd --spill-dir): host objects spilled when the arena needs room, and
# read back by gets.
struct DiskStatus {
  enabled @0 :Bool;
  dir @1 :Text;
  limitBytes @2 :UInt64;      # --spill-limit
  usedBytes @3 :UInt64;       # allocated to objects in spill files
  fileBytes @4 :UInt64;       # of the spill files open (what they may take on disk)
  files @5 :UInt32;
  objects @6 :UInt64;         # objects with a copy on disk
  spills @7 :UInt64;          # objects written to disk to make room in host memory
  spilledBytes @8 :UInt64;
  spillSeconds @9 :Float64;   # while writes were under way (throughput: bytes / seconds)
  restores @10 :UInt64;       # objects read back for gets
  restoredBytes @11 :UInt64;
  restoreSeconds @12 :Float64;
  drops @13 :UInt64;          # objects dropped from disk for good: the spill limit was reached
  droppedBytes @14 :UInt64;
  spillFailures @15 :UInt64;  # writes that failed: those objects stayed in host memory
  restoreFailures @16 :UInt64;  # reads that failed (I/O error, checksum mismatch): objects lost
  copiesInFlight @17 :UInt32;   # spills (ahead of need too) and restores under way
  directIo @18 :Bool;           # the bulk of each copy bypasses the page cache (O_DIRECT)
  writes @19 :UInt64;           # disk writes made by spills: one for each run of small objects
  reads @20 :UInt64;            # disk reads made by restores: one for each window of small objects
}

# A connected session (the `clients` request). pid, uid and command come from SO_PEERCRED
# and /proc/<pid>/comm when the client connected.
struct ClientInfo {
  sessionId @0 :UInt64;
  pid @1 :UInt32;
  uid @2 :UInt32;
  command @3 :Text;
  clientName @4 :Text;       # from its hello; empty before hello
  objectsHeld @5 :UInt64;    # distinct objects it holds references to (or is creating)
  references @6 :UInt64;     # references it holds, all objects together
  bytesHeld @7 :UInt64;      # allocated bytes of the objects it holds
  requests @8 :UInt64;       # requests it has sent
  connectedTimeNs @9 :UInt64;  # CLOCK_REALTIME
}

# A session holding references to an object (the `objectInfo` request). Session id 0 is the
# daemon itself, holding an object while a `verify` reads it.
struct Holder {
  sessionId @0 :UInt64;
  pid @1 :UInt32;
  uid @2 :UInt32;
  command @3 :Text;
  clientName @4 :Text;
  references @5 :UInt32;
  tiers @6 :List(TierReferences);  # the same references by tier, host first; only tiers with some
}

# A holder's references on one tier (Holder.tiers).
struct TierReferences {
  device @0 :Int32;          # -1: host memory; else the GPU (Reply.Hello.devices numbering)
  references @1 :UInt32;
}

struct ObjectDetails {
  info @0 :ObjectInfo;
  holders @1 :List(Holder);  # in session id order; their references sum to info.refCount
  replicas @2 :List(Replica);  # host first, then GPUs in order
}

# One copy of an object's bytes (the `objectInfo` request).
struct Replica {
  device @0 :Int32;          # -1: host memory; -2: the daemon's spill directory
  segment @1 :UInt32;        # arena segment, or chunk of the GPU's pool
  offset @2 :UInt64;
  references @3 :UInt32;     # references to this copy
  ready @4 :Bool;            # false while it is being copied
}

enum VerifyState {
  ok @0;                     # the checksum recomputed now matches the one taken at seal
  mismatch @1;               # it does not: the bytes changed after seal
  noChecksum @2;             # created without a checksum: nothing to compare with
  notFound @3;               # no such object (or deleted)
  notSealed @4;              # still being created
  notOnHost @5;              # its bytes are only on GPUs now; the checksum is of host bytes
}

struct VerifyResult {
  id @0 :Id;
  state @1 :VerifyState;
  expected @2 :UInt64;       # XXH3-64 taken at seal (ok, mismatch)
  actual @3 :UInt64;         # XXH3-64 of the bytes now (ok, mismatch)
}

struct EvictResult {
  objects @0 :UInt64;
  bytes @1 :UInt64;          # allocated bytes freed
}
