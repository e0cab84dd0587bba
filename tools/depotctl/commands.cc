#include "commands.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <span>
#include <string_view>

#include "depot/client.h"
#include "depot/ipc/gpu.h"
#include "depot/ipc/units.h"
#include "format.h"
#include "json_fields.h"

namespace depot::ctl {

namespace {

// A file descriptor closed when it goes out of scope.
class OpenFile {
 public:
  explicit OpenFile(int fd) : fd_(fd) {}
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  ~OpenFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error a write-back may only show here.
  Status Close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Status::FromErrno("cannot write " + path, errno);
    return Status::OK();
  }

 private:
  int fd_;
};

// A single read or write moves at most this much, well under Linux's 2 GiB limit.
constexpr size_t kMaxIo = size_t{1} << 30;

Status ReadFully(int fd, std::span<std::byte> into, const std::string& path) {
  size_t done = 0;
  while (done < into.size()) {
    const ssize_t n = ::read(fd, into.data() + done, std::min(into.size() - done, kMaxIo));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot read " + path, errno);
    }
    if (n == 0) return Status::IoError(path + " shrank while it was being read");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status WriteFully(int fd, std::span<const std::byte> from, const std::string& path) {
  size_t done = 0;
  while (done < from.size()) {
    const ssize_t n = ::write(fd, from.data() + done, std::min(from.size() - done, kMaxIo));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot write " + path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

std::string Hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, value);
  return text;
}

// A JSON array of already formatted elements.
std::string JsonArray(const std::vector<std::string>& elements) {
  std::string out = "[";
  for (size_t i = 0; i < elements.size(); ++i) out += (i == 0 ? "" : ", ") + elements[i];
  return out + "]";
}

uint64_t AgeNanos(uint64_t since_ns, uint64_t now_ns) {
  return now_ns > since_ns ? now_ns - since_ns : 0;
}

std::string Flags(const ObjectInfo& o) {
  std::string flags;
  auto add = [&](const char* flag) { flags += (flags.empty() ? "" : ",") + std::string(flag); };
  if (o.pinned) add("pinned");
  if (o.has_checksum) add("checksum");
  if (o.delete_pending) add("deleted");
  if (o.failed) add("failed");
  return flags.empty() ? "-" : flags;
}

// An object as its table writes it, with: its checksum as hex digits, null without one;
// segment and offset null without a host copy; `tiers`, every tier it has bytes on, by name
// (as ls's TIER column), before on_host; and failed and owner_uid where depotctl wrote them
// before the table, so that the members end with where the object is.
JsonObject ObjectJson(const ObjectInfo& o) {
  JsonObject json = JsonOf(o);
  if (o.has_checksum) {
    json.String("checksum", Hex64(o.checksum));
  } else {
    json.Null("checksum");
  }
  if (!o.on_host) json.Null("segment").Null("offset");
  std::vector<std::string> tiers;
  if (o.on_host) tiers.push_back(JsonString("host"));
  for (uint32_t gpu : o.gpus) tiers.push_back(JsonString(TierName(static_cast<int>(gpu))));
  if (o.on_disk) tiers.push_back(JsonString("disk"));
  return json.Json("tiers", JsonArray(tiers))
      .MoveBefore("tiers", "on_host")
      .MoveBefore("failed", "delete_pending")
      .MoveBefore("owner_uid", "has_checksum");
}

// How many objects have a copy on each tier (copies being made included), as the daemon
// counts them.
struct TierCounts {
  uint64_t host = 0;
  std::vector<uint64_t> gpus;  // by the daemon's GPU index
};

TierCounts CountByTier(const StoreStatus& s) {
  TierCounts counts{s.objects_on_host, {}};
  for (const GpuInfo& g : s.gpus) counts.gpus.push_back(g.replicas);
  return counts;
}

// A GPU as its table writes it, with the daemon's `index` for it first, and the members in
// the order depotctl wrote them before the table (index, name, simulated, uuid, sizes, chunks).
std::string GpuJson(size_t index, const GpuInfo& g) {
  return JsonOf(g)
      .Number("index", index)
      .MoveBefore("index", "uuid")
      .MoveBefore("uuid", "total_bytes")
      .MoveBefore("chunks", "used_bytes")
      .str();
}

// The status as its table writes it, with: each GPU as GpuJson; the settings as one object of
// name: value; gpu_backend just before gpus, as before the table; and objects_by_tier, how
// many objects each tier has, by tier name.
std::string StatusJson(const StoreStatus& s, const TierCounts& counts) {
  std::vector<std::string> gpus;
  for (size_t d = 0; d < s.gpus.size(); ++d) gpus.push_back(GpuJson(d, s.gpus[d]));
  JsonObject by_tier;
  by_tier.Number("host", counts.host);
  for (size_t d = 0; d < counts.gpus.size(); ++d) {
    by_tier.Number(TierName(static_cast<int>(d)), counts.gpus[d]);
  }
  JsonObject settings;
  for (const Setting& setting : s.settings) settings.String(setting.name, setting.value);
  return JsonOf(s)
      .Json("gpus", JsonArray(gpus))
      .MoveBefore("gpu_backend", "gpus")
      .Json("settings", settings.str())
      .Json("objects_by_tier", by_tier.str())
      .str();
}

std::string Count(uint64_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// The status lines about GPUs: the backend, each pool, and the copies between tiers.
void AddGpuFields(std::vector<std::pair<std::string, std::string>>& fields, const StoreStatus& s) {
  using ipc::FormatSize;
  if (s.gpus.empty()) {
    fields.emplace_back("gpus", s.gpu_backend);
    return;
  }
  fields.emplace_back("gpus", s.gpu_backend + ", " + Count(s.gpus.size(), "GPU"));
  for (size_t d = 0; d < s.gpus.size(); ++d) {
    const GpuInfo& g = s.gpus[d];
    fields.emplace_back(
        TierName(static_cast<int>(d)),
        GpuName(g) + ", " + ipc::FormatUuid(g.uuid) + ", " + FormatSize(g.total_bytes) + " total");
    fields.emplace_back("", "pool limit " + FormatSize(g.limit_bytes) + ", reserved " +
                                FormatSize(g.reserved_bytes) + " in " + Count(g.chunks, "chunk") +
                                ", used " + FormatSize(g.used_bytes) + " (held " +
                                FormatSize(g.held_bytes) + "), " + Count(g.replicas, "replica"));
  }
  fields.emplace_back("tiering", Count(s.replicas_made, "replica") + " made, " +
                                     std::to_string(s.replicas_dropped) + " dropped; " +
                                     Count(s.spills, "spill") + " to host (" +
                                     FormatSize(s.spilled_bytes) + ")");
}

// Bytes per second of `bytes` moved in `seconds`, for a person; "-" before any.
std::string Rate(uint64_t bytes, double seconds) {
  if (seconds <= 0) return "-";
  return ipc::FormatSize(static_cast<uint64_t>(static_cast<double>(bytes) / seconds)) + "/s";
}

// The status lines about the disk tier, when there is one.
void AddDiskFields(std::vector<std::pair<std::string, std::string>>& fields, const StoreStatus& s) {
  using ipc::FormatSize;
  const DiskStatus& d = s.disk;
  if (!d.enabled) {
    fields.emplace_back("disk", "none (no --spill-dir): objects that leave host memory are gone");
    return;
  }
  fields.emplace_back("disk", d.dir + ", " + FormatSize(d.used_bytes) + " used of " +
                                  FormatSize(d.limit_bytes) + " (" + Count(d.files, "file") +
                                  " of " + FormatSize(d.file_bytes) + "), " +
                                  Count(d.objects, "object") + ", " +
                                  (d.direct_io ? "direct" : "buffered") + " I/O");
  fields.emplace_back(
      "", Count(d.spills, "spill") + " (" + FormatSize(d.spilled_bytes) + ", " +
              Rate(d.spilled_bytes, d.spill_seconds) + ", " + Count(d.writes, "write") + "), " +
              Count(d.restores, "restore") + " (" + FormatSize(d.restored_bytes) + ", " +
              Rate(d.restored_bytes, d.restore_seconds) + ", " + Count(d.reads, "read") + "), " +
              Count(d.drops, "drop") + " for good (" + FormatSize(d.dropped_bytes) +
              "); failed: " + std::to_string(d.spill_failures) + " spills, " +
              std::to_string(d.restore_failures) + " restores (objects lost)");
}

// The status lines about tasks: the scheduler's totals and what placement assumes.
void AddTaskFields(std::vector<std::pair<std::string, std::string>>& fields, const StoreStatus& s) {
  using ipc::FormatSize;
  const SchedulerStatus& t = s.scheduler;
  fields.emplace_back("tasks", Count(t.workers, "worker") + ", " + std::to_string(t.tasks_pending) +
                                   " pending; " + std::to_string(t.submitted) + " submitted, " +
                                   std::to_string(t.completed) + " done, " +
                                   std::to_string(t.failed) + " failed, " +
                                   std::to_string(t.cancelled) + " cancelled, " +
                                   std::to_string(t.retried) + " retried");
  fields.emplace_back("", "inputs " + FormatSize(t.local_bytes) + " where their tasks ran, " +
                              FormatSize(t.moved_bytes) + " moved; " +
                              std::to_string(t.prefetches) + " prefetched, " +
                              std::to_string(t.steals) + " stolen, " +
                              std::to_string(t.preemptions) + " preempted; bandwidths " +
                              (t.bandwidths_measured ? "measured " : "set ") +
                              FormatSize(static_cast<uint64_t>(t.host_to_gpu)) + "/s host<->GPU, " +
                              FormatSize(static_cast<uint64_t>(t.gpu_to_gpu)) + "/s GPU<->GPU");
}

std::string TierCountsText(const TierCounts& counts) {
  std::string text = std::to_string(counts.host) + " on host";
  for (size_t d = 0; d < counts.gpus.size(); ++d) {
    text += ", " + std::to_string(counts.gpus[d]) + " on " + TierName(static_cast<int>(d));
  }
  return text;
}

}  // namespace

Status PrintMetrics(const std::string& socket) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::string text, client.Metrics());
  std::cout << text;
  return Status::OK();
}

Status ShowStatus(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(StoreStatus s, client.GetStatus());
  const TierCounts counts = CountByTier(s);
  if (json) {
    std::cout << StatusJson(s, counts) << '\n';
    return Status::OK();
  }
  using ipc::FormatSize;
  std::vector<std::pair<std::string, std::string>> fields{
      {"daemon", "depotd " + s.daemon_version + ", pid " + std::to_string(s.pid) + ", up " +
                     FormatAge(s.uptime_ns)},
      {"socket", s.socket_path},
      {"settings",
       (s.config_file.empty() ? "from flags" : "from " + s.config_file) + " (--json lists them)"},
      {"arena", s.arena_backend + ": " + FormatSize(s.capacity_bytes) + " capacity, " +
                    FormatSize(s.mapped_bytes) + " mapped in " + Count(s.segments, "segment") +
                    ", " + s.arena_pages +
                    (s.arena_page_locked_bytes == 0 ? std::string()
                                                    : ", " + FormatSize(s.arena_page_locked_bytes) +
                                                          " page-locked for GPU copies")},
      {"used", FormatSize(s.used_bytes) + " (held " + FormatSize(s.held_bytes) + ", pinned " +
                   FormatSize(s.pinned_bytes) + "), largest free block " +
                   FormatSize(s.largest_free_block) +
                   (s.kept_bytes == 0
                        ? std::string()
                        : ", " + FormatSize(s.kept_bytes) + " kept for large objects (free)")},
      {"objects", std::to_string(s.objects_sealed) + " sealed, " +
                      std::to_string(s.objects_creating) + " being created"},
      {"tiers", TierCountsText(counts)},
      {"metadata", FormatSize(s.metadata_bytes) + " of daemon memory for clients" +
                       (s.metadata_budget_bytes == 0
                            ? std::string(", no budget")
                            : " (budget " + FormatSize(s.metadata_budget_bytes) + ")") +
                       ", " + FormatSize(s.request_bytes) + " for requests in progress"},
      {"clients", std::to_string(s.clients)},
      {"eviction", std::string(s.eviction_enabled ? "on" : "off") + ", " +
                       Count(s.evictions, "object") + " evicted (" + FormatSize(s.evicted_bytes) +
                       ")"},
  };
  AddGpuFields(fields, s);
  AddDiskFields(fields, s);
  AddTaskFields(fields, s);
  fields.emplace_back("header", std::to_string(s.header_slots) + " slots");
  fields.emplace_back("requests", std::to_string(s.requests));
  PrintFields(std::cout, fields);
  return Status::OK();
}

namespace {

enum class SortKey { kSlot, kSize, kAge, kRefs, kName };
enum class TierFilter { kAny, kHost, kGpu };

// The checked form of ListOptions.
struct ObjectFilter {
  std::string name_glob;
  std::optional<ObjectState> state;
  uint64_t min_size = 0;
  uint64_t older_than_ns = 0;
  bool held = false;
  TierFilter tier = TierFilter::kAny;
  std::optional<uint32_t> device;  // the daemon's GPU index (implies kGpu)
  SortKey sort = SortKey::kSlot;

  bool Keep(const ObjectInfo& o, uint64_t now) const {
    // A pattern selects among named objects: even "*" leaves out those without a name.
    if (!name_glob.empty() &&
        (o.name.empty() || ::fnmatch(name_glob.c_str(), o.name.c_str(), 0) != 0)) {
      return false;
    }
    if (state && o.state != *state) return false;
    if (o.data_size < min_size) return false;
    if (older_than_ns != 0 && AgeNanos(o.create_time_ns, now) < older_than_ns) return false;
    if (tier == TierFilter::kHost && !o.on_host) return false;
    if (tier == TierFilter::kGpu && o.gpus.empty()) return false;
    if (device && std::find(o.gpus.begin(), o.gpus.end(), *device) == o.gpus.end()) return false;
    return !held || o.ref_count > 0;
  }
};

// A GPU index as given on the command line: decimal digits only.
std::optional<uint32_t> ParseGpuIndex(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  uint32_t index = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + static_cast<uint32_t>(c - '0');
  }
  return index;
}

// --tier host|gpu|gpuK and --device K.
Status ParseTier(const ListOptions& options, ObjectFilter& filter) {
  const std::string& tier = options.tier;
  if (tier == "host") {
    filter.tier = TierFilter::kHost;
  } else if (tier == "gpu") {
    filter.tier = TierFilter::kGpu;
  } else if (tier.starts_with("gpu") && ParseGpuIndex(std::string_view(tier).substr(3))) {
    filter.tier = TierFilter::kGpu;
    filter.device = ParseGpuIndex(std::string_view(tier).substr(3));
  } else if (tier == "disk") {
    return Status::InvalidArgument(
        "--tier disk: depot has no disk tier yet; objects are in host memory (--tier host) "
        "or on GPUs (--tier gpu)");
  } else if (!tier.empty()) {
    return Status::InvalidArgument("--tier must be host, gpu or gpuK (e.g. gpu0), not '" +
                                   Printable(tier) + "'");
  }
  if (options.device.empty()) return Status::OK();
  const std::optional<uint32_t> device = ParseGpuIndex(options.device);
  if (!device) {
    const std::string given = Printable(options.device);
    return Status::InvalidArgument("--device must be a GPU index as status lists them, not '" +
                                   given + "'");
  }
  if (filter.tier == TierFilter::kHost) {
    return Status::InvalidArgument("--device " + options.device +
                                   " selects a GPU; it cannot go with --tier host");
  }
  if (filter.device && *filter.device != *device) {
    return Status::InvalidArgument("--tier " + tier + " and --device " + options.device +
                                   " name different GPUs");
  }
  filter.tier = TierFilter::kGpu;
  filter.device = device;
  return Status::OK();
}

// Fails, naming the GPUs there are, if the daemon does not serve the GPU `device`.
Status CheckGpuServed(Client& client, uint32_t device) {
  DEPOT_ASSIGN_OR_RETURN(StoreStatus s, client.GetStatus());
  if (device < s.gpus.size()) return Status::OK();
  const std::string asked = "--device " + std::to_string(device) + ": ";
  if (s.gpus.empty()) {
    return Status::InvalidArgument(asked + "this depotd serves no GPUs (" + s.gpu_backend + ")");
  }
  const std::string served =
      s.gpus.size() == 1 ? "only GPU 0" : "GPUs 0 to " + std::to_string(s.gpus.size() - 1);
  return Status::InvalidArgument(asked + "this depotd has no GPU " + std::to_string(device) +
                                 "; it serves " + served + " (depotctl status lists them)");
}

Result<ObjectFilter> ParseFilter(const ListOptions& options) {
  ObjectFilter filter;
  DEPOT_RETURN_NOT_OK(ParseTier(options, filter));
  filter.name_glob = options.name_glob;
  if (options.state == "creating") {
    filter.state = ObjectState::kCreating;
  } else if (options.state == "sealed") {
    filter.state = ObjectState::kSealed;
  } else if (!options.state.empty()) {
    return Status::InvalidArgument("--state must be creating or sealed, not '" +
                                   Printable(options.state) + "'");
  }
  if (!options.min_size.empty()) {
    auto size = ipc::ParseSize(options.min_size);
    if (!size.ok()) return Status::InvalidArgument("--min-size: " + size.status().message());
    filter.min_size = *size;
  }
  if (!options.older_than.empty()) {
    auto age = ParseDuration(options.older_than);
    if (!age.ok()) return Status::InvalidArgument("--older-than: " + age.status().message());
    filter.older_than_ns = *age;
  }
  filter.held = options.held;
  if (options.sort == "size") {
    filter.sort = SortKey::kSize;
  } else if (options.sort == "age") {
    filter.sort = SortKey::kAge;
  } else if (options.sort == "refs") {
    filter.sort = SortKey::kRefs;
  } else if (options.sort == "name") {
    filter.sort = SortKey::kName;
  } else if (!options.sort.empty()) {
    return Status::InvalidArgument("--sort must be size, age, refs or name, not '" +
                                   Printable(options.sort) + "'");
  }
  return filter;
}

// Sorts stably, so that ties stay in slot order.
void SortObjects(std::vector<ObjectInfo>& objects, SortKey key) {
  const auto by = [&](auto before) { std::stable_sort(objects.begin(), objects.end(), before); };
  switch (key) {
    case SortKey::kSlot:
      return;
    case SortKey::kSize:
      return by([](const ObjectInfo& a, const ObjectInfo& b) { return a.data_size > b.data_size; });
    case SortKey::kAge:
      return by([](const ObjectInfo& a, const ObjectInfo& b) {
        return a.create_time_ns < b.create_time_ns;
      });
    case SortKey::kRefs:
      return by([](const ObjectInfo& a, const ObjectInfo& b) { return a.ref_count > b.ref_count; });
    case SortKey::kName:
      return by([](const ObjectInfo& a, const ObjectInfo& b) { return a.name < b.name; });
  }
}

// The names a glob can match all start with what comes before its first special character:
// the daemon is asked for those only.
std::string LiteralPrefix(const std::string& glob) {
  constexpr size_t kLongestName = 4096;  // the daemon refuses longer prefixes, as names
  return glob.substr(0, std::min({glob.find_first_of("*?[\\"), glob.size(), kLongestName}));
}

}  // namespace

Status ListObjects(const std::string& socket, const ListOptions& options) {
  DEPOT_ASSIGN_OR_RETURN(ObjectFilter filter, ParseFilter(options));
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  if (filter.device) {
    DEPOT_RETURN_NOT_OK(CheckGpuServed(client, *filter.device));
  }
  DEPOT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> listed,
                         client.List(LiteralPrefix(filter.name_glob)));
  const uint64_t now = ipc::WallNanos();
  std::vector<ObjectInfo> objects;
  for (ObjectInfo& o : listed) {
    if (filter.Keep(o, now)) objects.push_back(std::move(o));
  }
  SortObjects(objects, filter.sort);
  if (options.limit != 0 && objects.size() > options.limit) objects.resize(options.limit);
  if (options.json) {
    std::cout << '[';
    for (size_t i = 0; i < objects.size(); ++i) {
      std::cout << (i == 0 ? "\n  " : ",\n  ") << ObjectJson(objects[i]).str();
    }
    std::cout << (objects.empty() ? "]\n" : "\n]\n");
    return Status::OK();
  }
  using Align = Table::Align;
  Table table({{"ID"},
               {"NAME"},
               {"STATE"},
               {"TIER"},
               {"SIZE", Align::kRight},
               {"META", Align::kRight},
               {"REFS", Align::kRight},
               {"AGE", Align::kRight},
               {"FLAGS"}});
  for (const ObjectInfo& o : objects) {
    table.AddRow({o.id.Hex(), o.name.empty() ? "-" : Printable(o.name),
                  o.state == ObjectState::kSealed ? "sealed" : "creating", TiersText(o),
                  ipc::FormatSize(o.data_size), ipc::FormatSize(o.metadata_size),
                  std::to_string(o.ref_count), FormatAge(AgeNanos(o.create_time_ns, now)),
                  Flags(o)});
  }
  table.Print(std::cout);
  return Status::OK();
}

Status PutFile(const std::string& socket, const PutOptions& options) {
  const std::string& path = options.file;
  OpenFile file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) return Status::FromErrno("cannot open " + path, errno);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return Status::FromErrno("cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(path +
                                   " is not a regular file (depotctl put needs its size "
                                   "up front)");
  }

  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  const ObjectId id = options.name.empty() ? ObjectId::Random() : ObjectId::FromName(options.name);
  CreateOptions create;
  create.name = options.name;
  create.pin = options.pin;
  create.checksum = options.checksum;
  auto buffer = client.Create(id, static_cast<uint64_t>(st.st_size), create);
  if (!buffer.ok()) {
    const std::string as = options.name.empty() ? "" : " as '" + Printable(options.name) + "'";
    return Status(buffer.status().code(),
                  "cannot store " + path + as + ": " + buffer.status().message());
  }
  // Read straight into shared memory: no copy in between. On failure the buffer is dropped
  // unsealed, which aborts the object.
  DEPOT_RETURN_NOT_OK(ReadFully(file.get(), buffer->data(), path));
  DEPOT_RETURN_NOT_OK(client.Seal(id));
  std::cout << id.Hex() << '\n';
  return Status::OK();
}

Status GetFile(const std::string& socket, const std::string& target_text,
               const std::string& output) {
  const Target target = ParseTarget(target_text);
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  auto buffer = client.Get(target.id);
  if (buffer.status().Is(StatusCode::kNotFound)) {
    return Status::NotFound(target.label + " does not exist (or is not sealed yet)");
  }
  if (!buffer.ok()) return buffer.status();

  // Opened only now, so that a failed get leaves an existing file untouched.
  if (output == "-") return WriteFully(STDOUT_FILENO, buffer->data(), "standard output");
  OpenFile file(::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (file.get() < 0) return Status::FromErrno("cannot create " + output, errno);
  DEPOT_RETURN_NOT_OK(WriteFully(file.get(), buffer->data(), output));
  return file.Close(output);
}

Status RemoveObjects(const std::string& socket, const std::vector<std::string>& targets) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  // One at a time, so that each failure can name the object as the user wrote it.
  Status last_error;
  for (const std::string& text : targets) {
    const Target target = ParseTarget(text);
    Status st = client.Delete(target.id);
    if (st.ok()) continue;
    if (st.Is(StatusCode::kNotFound)) {
      st = Status::NotFound(target.label + " does not exist");
    } else if (st.Is(StatusCode::kNotSealed)) {
      st = Status::NotSealed(target.label + " is still being created; delete it once sealed");
    }
    if (!last_error.ok()) ReportError(last_error);
    last_error = std::move(st);
  }
  return last_error;
}

namespace {

// A holder as its table writes it, with its references by tier as one object of tier name:
// references, `references_by_tier`, instead of the table's list of (device, references).
std::string HolderJson(const Holder& h) {
  JsonObject by_tier;
  for (const TierReferences& t : h.tiers) by_tier.Number(TierName(t.device), t.references);
  return JsonOf(h).Remove("tiers").Json("references_by_tier", by_tier.str()).str();
}

// A holder's references by tier: "host 1, gpu1 2".
std::string HolderTiers(const Holder& h) {
  std::string text;
  for (const TierReferences& t : h.tiers) {
    text += (text.empty() ? "" : ", ") + TierName(t.device) + " " + std::to_string(t.references);
  }
  return text.empty() ? "-" : text;
}

// A replica's bytes: ready, or on their way (written by the creator, or copied in).
std::string ReplicaState(const Replica& r, const ObjectInfo& o) {
  if (r.ready) return "ready";
  return o.state == ObjectState::kCreating ? "being created" : "copying";
}

// A replica as its table writes it, with, as before the table: its tier by name (`tier`) in
// place of the daemon's device number; on a GPU, the GPU's index and name, and its segment
// as `chunk` (a GPU pool's chunk, not an arena segment); and `state`, ReplicaState.
std::string ReplicaJson(const Replica& r, const ObjectInfo& o, const std::vector<GpuInfo>& gpus) {
  JsonObject json = JsonOf(r);
  json.String("tier", TierName(r.device)).MoveBefore("tier", "device").Remove("device");
  if (r.device >= 0) {
    const size_t d = static_cast<size_t>(r.device);
    json.Number("gpu", d)
        .String("gpu_name", d < gpus.size() ? gpus[d].name : "")
        .Number("chunk", r.segment)
        .MoveBefore("gpu", "segment")
        .MoveBefore("gpu_name", "segment")
        .MoveBefore("chunk", "segment")
        .Remove("segment");
  }
  return json.String("state", ReplicaState(r, o)).str();
}

// One replica for people: "host tier, segment 0, offset 4096 (0x1000): 1 reference, ready".
std::string ReplicaText(const Replica& r, const ObjectInfo& o, const std::vector<GpuInfo>& gpus) {
  char offset[64];
  std::snprintf(offset, sizeof(offset), "%" PRIu64 " (0x%" PRIx64 ")", r.offset, r.offset);
  std::string where;
  if (r.device < 0) {
    where = "host tier, segment " + std::to_string(r.segment);
  } else {
    const size_t d = static_cast<size_t>(r.device);
    where = TierName(r.device) + " tier" + (d < gpus.size() ? " (" + GpuName(gpus[d]) + ")" : "") +
            ", chunk " + std::to_string(r.segment);
  }
  return where + ", offset " + offset + ": " + Count(r.references, "reference") + ", " +
         ReplicaState(r, o);
}

std::string ClientJson(const ClientInfo& c) { return JsonOf(c).str(); }

std::string Bytes(uint64_t n) {
  return ipc::FormatSize(n) + " (" + std::to_string(n) + " byte" + (n == 1 ? "" : "s") + ")";
}

std::string HexBytes(std::span<const std::byte> bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    char two[3];
    std::snprintf(two, sizeof(two), "%02x", static_cast<unsigned>(b));
    out += two;
  }
  return out;
}

}  // namespace

Status ShowObject(const std::string& socket, const std::string& target_text, bool json,
                  const std::string& hexdump_text) {
  uint64_t hexdump = 0;
  if (!hexdump_text.empty()) {
    auto size = ipc::ParseSize(hexdump_text);
    if (!size.ok()) return Status::InvalidArgument("--hexdump: " + size.status().message());
    hexdump = *size;
  }
  const Target target = ParseTarget(target_text);
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  auto described = client.Describe(target.id);
  if (described.status().Is(StatusCode::kNotFound)) {
    return Status::NotFound(target.label + " does not exist");
  }
  if (!described.ok()) return described.status();
  const ObjectDetails& details = *described;
  const ObjectInfo& o = details.info;
  // The GPUs' names, for replicas on them.
  std::vector<GpuInfo> gpus;
  if (!o.gpus.empty() || std::any_of(details.replicas.begin(), details.replicas.end(),
                                     [](const Replica& r) { return r.device >= 0; })) {
    DEPOT_ASSIGN_OR_RETURN(StoreStatus s, client.GetStatus());
    gpus = std::move(s.gpus);
  }

  // The data is read after Describe, so that this command is not among the holders shown.
  Buffer buffer;
  if (hexdump > 0) {
    if (o.state != ObjectState::kSealed) {
      return Status::NotSealed(target.label +
                               " is still being created; its data can be shown "
                               "once it is sealed");
    }
    // A get from host memory would copy a GPU-only object there: show must change nothing.
    if (!o.on_host) {
      return Status::InvalidArgument("--hexdump shows bytes in host memory, and " + target.label +
                                     " has no copy there (it is on " + TiersText(o) +
                                     "); depotctl does not read GPU memory");
    }
    auto got = client.Get(target.id);
    if (!got.ok()) {
      return Status(got.status().code(),
                    "cannot read the data of " + target.label + ": " + got.status().message());
    }
    buffer = std::move(got).value();
  }
  const auto shown = buffer.data().first(std::min<uint64_t>(hexdump, buffer.size()));

  if (json) {
    std::vector<std::string> holders;
    for (const Holder& h : details.holders) holders.push_back(HolderJson(h));
    std::vector<std::string> replicas;
    for (const Replica& r : details.replicas) replicas.push_back(ReplicaJson(r, o, gpus));
    JsonObject out = ObjectJson(o);
    out.Json("replicas", JsonArray(replicas)).Json("holders", JsonArray(holders));
    if (hexdump > 0) out.String("data_hex", HexBytes(shown));
    std::cout << out.str() << '\n';
    return Status::OK();
  }
  const uint64_t now = ipc::WallNanos();
  std::vector<std::pair<std::string, std::string>> fields{
      {"id", o.id.Hex()},
      {"name", o.name.empty() ? "-" : Printable(o.name)},
      {"state", std::string(o.state == ObjectState::kSealed ? "sealed" : "being created") +
                    (o.failed ? ", failed (a task's output: a get answers TaskFailed)" : "") +
                    (o.delete_pending ? ", deleted (goes with its last reference)" : "")},
      {"data", Bytes(o.data_size)},
      {"metadata", Bytes(o.metadata_size)},
  };
  // Every copy, one line each: the first after the key, the others under it.
  for (size_t i = 0; i < details.replicas.size(); ++i) {
    fields.emplace_back(i == 0 ? "replicas" : "", ReplicaText(details.replicas[i], o, gpus));
  }
  if (details.replicas.empty()) fields.emplace_back("replicas", "none");
  const std::vector<std::pair<std::string, std::string>> rest{
      {"checksum", o.has_checksum ? "xxh3-64 " + Hex64(o.checksum) : "none"},
      {"flags", Flags(o)},
      {"owner", "uid " + std::to_string(o.owner_uid)},
      {"references", std::to_string(o.ref_count)},
      {"created",
       FormatTime(o.create_time_ns) + " (" + FormatAge(AgeNanos(o.create_time_ns, now)) + " ago)"},
      {"accessed",
       FormatTime(o.access_time_ns) + " (" + FormatAge(AgeNanos(o.access_time_ns, now)) + " ago)"},
      {"holders", details.holders.empty() ? std::string("none")
                                          : std::to_string(details.holders.size()) + " client" +
                                                (details.holders.size() == 1 ? "" : "s")},
  };
  fields.insert(fields.end(), rest.begin(), rest.end());
  PrintFields(std::cout, fields);
  if (!details.holders.empty()) {
    using Align = Table::Align;
    Table table({{"SESSION", Align::kRight},
                 {"PID", Align::kRight},
                 {"UID", Align::kRight},
                 {"COMMAND"},
                 {"NAME"},
                 {"REFS", Align::kRight},
                 {"ON TIERS"}});
    for (const Holder& h : details.holders) {
      table.AddRow({std::to_string(h.session_id), std::to_string(h.pid), std::to_string(h.uid),
                    Printable(h.command), h.client_name.empty() ? "-" : Printable(h.client_name),
                    std::to_string(h.references), HolderTiers(h)});
    }
    std::cout << '\n';
    table.Print(std::cout);
  }
  if (hexdump > 0) {
    std::cout << "\ndata, first " << shown.size() << " of " << buffer.size() << " bytes:\n";
    HexDump(std::cout, reinterpret_cast<const unsigned char*>(shown.data()), shown.size());
  }
  return Status::OK();
}

Status ListClients(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<ClientInfo> clients, client.Clients());
  if (json) {
    std::cout << '[';
    for (size_t i = 0; i < clients.size(); ++i) {
      std::cout << (i == 0 ? "\n  " : ",\n  ") << ClientJson(clients[i]);
    }
    std::cout << (clients.empty() ? "]\n" : "\n]\n");
    return Status::OK();
  }
  using Align = Table::Align;
  Table table({{"SESSION", Align::kRight},
               {"PID", Align::kRight},
               {"UID", Align::kRight},
               {"COMMAND"},
               {"NAME"},
               {"OBJECTS", Align::kRight},
               {"REFS", Align::kRight},
               {"HELD", Align::kRight},
               {"REQUESTS", Align::kRight},
               {"CONNECTED", Align::kRight}});
  const uint64_t now = ipc::WallNanos();
  for (const ClientInfo& c : clients) {
    table.AddRow({std::to_string(c.session_id), std::to_string(c.pid), std::to_string(c.uid),
                  Printable(c.command), c.client_name.empty() ? "-" : Printable(c.client_name),
                  std::to_string(c.objects_held), std::to_string(c.references),
                  ipc::FormatSize(c.bytes_held), std::to_string(c.requests),
                  FormatAge(AgeNanos(c.connected_time_ns, now)) + " ago"});
  }
  table.Print(std::cout);
  return Status::OK();
}

Status VerifyObjects(const std::string& socket, const std::vector<std::string>& targets, bool all,
                     bool json) {
  if (all && !targets.empty()) {
    return Status::InvalidArgument("give objects to verify or --all, not both");
  }
  if (!all && targets.empty()) {
    return Status::InvalidArgument("name the objects to verify (ids or names), or give --all");
  }
  std::vector<Target> parsed;
  std::vector<ObjectId> ids;
  for (const std::string& text : targets) {
    parsed.push_back(ParseTarget(text));
    ids.push_back(parsed.back().id);
  }
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<VerifyResult> results, client.Verify(ids));
  // Names for the report: the store's, or the one given on the command line.
  DEPOT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> listed, client.List());
  std::map<ObjectId, std::string> names;
  for (const ObjectInfo& o : listed) {
    if (!o.name.empty()) names.emplace(o.id, o.name);
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!ObjectId::FromHex(targets[i])) names.emplace(parsed[i].id, targets[i]);
  }
  const auto name_of = [&](const ObjectId& id) {
    auto it = names.find(id);
    return it == names.end() ? std::string() : it->second;
  };

  std::map<VerifyState, size_t> counts;
  for (const VerifyResult& r : results) counts[r.state]++;
  if (json) {
    std::vector<std::string> objects;
    for (const VerifyResult& r : results) {
      // Its table's fields, with, as before the table: the object's name after its id; the
      // state as `result`; and the checksums as hex digits (as show's), null where none was
      // computed.
      JsonObject o = JsonOf(r);
      o.String("name", name_of(r.id)).MoveBefore("name", "state");
      o.String("result", VerifyStateName(r.state)).MoveBefore("result", "state").Remove("state");
      if (r.state == VerifyState::kOk || r.state == VerifyState::kMismatch) {
        o.String("expected", Hex64(r.expected)).String("actual", Hex64(r.actual));
      } else {
        o.Null("expected").Null("actual");
      }
      objects.push_back(o.str());
    }
    JsonObject out;
    out.Number("checked", results.size());
    for (VerifyState state :
         {VerifyState::kOk, VerifyState::kMismatch, VerifyState::kNoChecksum,
          VerifyState::kNotFound, VerifyState::kNotSealed, VerifyState::kNotOnHost}) {
      out.Number(VerifyStateName(state), counts[state]);
    }
    std::cout << out.Json("objects", JsonArray(objects)).str() << '\n';
  } else {
    Table table({{"ID"}, {"NAME"}, {"RESULT"}, {"DETAIL"}});
    for (const VerifyResult& r : results) {
      std::string result = VerifyStateName(r.state);
      std::replace(result.begin(), result.end(), '_', ' ');
      std::string detail = "-";
      if (r.state == VerifyState::kOk) {
        detail = "xxh3-64 " + Hex64(r.actual);
      } else if (r.state == VerifyState::kMismatch) {
        result = "MISMATCH";
        detail = "expected " + Hex64(r.expected) + ", actual " + Hex64(r.actual);
      }
      const std::string name = name_of(r.id);
      table.AddRow({r.id.Hex(), name.empty() ? "-" : Printable(name), result, detail});
    }
    if (!results.empty()) table.Print(std::cout);
    std::string summary = std::to_string(results.size()) + " object" +
                          (results.size() == 1 ? "" : "s") +
                          " checked: " + std::to_string(counts[VerifyState::kOk]) + " ok";
    const std::pair<VerifyState, const char*> others[] = {
        {VerifyState::kMismatch, "MISMATCHED"},
        {VerifyState::kNoChecksum, "without a checksum"},
        {VerifyState::kNotFound, "not found"},
        {VerifyState::kNotSealed, "not sealed yet"},
        {VerifyState::kNotOnHost, "only on GPUs"}};
    for (const auto& [state, what] : others) {
      if (counts[state] != 0) summary += ", " + std::to_string(counts[state]) + " " + what;
    }
    std::cout << summary << '\n';
  }
  const size_t mismatched = counts[VerifyState::kMismatch];
  const size_t missing = counts[VerifyState::kNotFound];
  if (mismatched != 0) {
    return Status::IoError("verify failed: " + std::to_string(mismatched) + " of " +
                           std::to_string(results.size()) +
                           " objects do not match the checksum taken at seal (their bytes "
                           "changed since)");
  }
  if (missing != 0) {
    return Status::NotFound("verify failed: " + std::to_string(missing) + " of " +
                            std::to_string(results.size()) + " objects do not exist");
  }
  return Status::OK();
}

Status EvictObjects(const std::string& socket, const std::string& bytes_text, bool all_unreferenced,
                    bool json) {
  if (all_unreferenced == !bytes_text.empty()) {
    return Status::InvalidArgument("give either --bytes SIZE or --all-unreferenced");
  }
  uint64_t bytes = 0;
  if (!bytes_text.empty()) {
    auto size = ipc::ParseSize(bytes_text);
    if (!size.ok()) return Status::InvalidArgument("--bytes: " + size.status().message());
    if (*size == 0) return Status::InvalidArgument("--bytes must be more than 0");
    bytes = *size;
  }
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(EvictResult evicted, client.Evict(bytes, all_unreferenced));
  if (json) {
    std::cout << JsonOf(evicted)
                     .Number("requested_bytes", bytes)
                     .Bool("all_unreferenced", all_unreferenced)
                     .str()
              << '\n';
    return Status::OK();
  }
  std::cout << "evicted " << evicted.objects << " object" << (evicted.objects == 1 ? "" : "s")
            << ", " << ipc::FormatSize(evicted.bytes);
  if (!all_unreferenced && evicted.bytes < bytes) {
    std::cout << " (of " << ipc::FormatSize(bytes)
              << " asked: everything else is referenced, pinned or being created)";
  }
  std::cout << '\n';
  return Status::OK();
}

}  // namespace depot::ctl
