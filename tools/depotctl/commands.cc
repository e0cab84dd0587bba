#include "commands.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <span>

#include "depot/client.h"
#include "depot/ipc/units.h"
#include "format.h"

namespace depot::ctl {

namespace {

// An object named on the command line: 32 hex digits are an id, anything else is a name.
struct Target {
  ObjectId id;
  std::string label;  // how messages name it
};

Target ParseTarget(const std::string& text) {
  if (auto id = ObjectId::FromHex(text)) return {*id, "object " + id->Hex()};
  const ObjectId id = ObjectId::FromName(text);
  return {id, "'" + Printable(text) + "' (object " + id.Hex() + ")"};
}

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

uint64_t AgeNanos(uint64_t since_ns, uint64_t now_ns) {
  return now_ns > since_ns ? now_ns - since_ns : 0;
}

std::string Flags(const ObjectInfo& o) {
  std::string flags;
  auto add = [&](const char* flag) { flags += (flags.empty() ? "" : ",") + std::string(flag); };
  if (o.pinned) add("pinned");
  if (o.has_checksum) add("checksum");
  if (o.delete_pending) add("deleted");
  return flags.empty() ? "-" : flags;
}

std::string ObjectJson(const ObjectInfo& o) {
  JsonObject json;
  json.String("id", o.id.Hex())
      .String("name", o.name)
      .String("state", o.state == ObjectState::kSealed ? "sealed" : "creating")
      .Number("data_size", o.data_size)
      .Number("metadata_size", o.metadata_size)
      .Number("ref_count", o.ref_count)
      .Bool("pinned", o.pinned)
      .Bool("delete_pending", o.delete_pending);
  if (o.has_checksum) {
    json.String("checksum", Hex64(o.checksum));
  } else {
    json.Null("checksum");
  }
  json.Number("create_time_ns", o.create_time_ns)
      .Number("access_time_ns", o.access_time_ns)
      .Number("segment", o.segment)
      .Number("offset", o.offset);
  return json.str();
}

std::string StatusJson(const StoreStatus& s) {
  return JsonObject()
      .String("daemon_version", s.daemon_version)
      .Number("pid", s.pid)
      .Number("uptime_ns", s.uptime_ns)
      .String("socket_path", s.socket_path)
      .String("arena_backend", s.arena_backend)
      .Number("capacity_bytes", s.capacity_bytes)
      .Number("mapped_bytes", s.mapped_bytes)
      .Number("used_bytes", s.used_bytes)
      .Number("held_bytes", s.held_bytes)
      .Number("pinned_bytes", s.pinned_bytes)
      .Number("largest_free_block", s.largest_free_block)
      .Number("segments", s.segments)
      .Number("objects_sealed", s.objects_sealed)
      .Number("objects_creating", s.objects_creating)
      .Number("clients", s.clients)
      .Number("evictions", s.evictions)
      .Number("evicted_bytes", s.evicted_bytes)
      .Bool("eviction_enabled", s.eviction_enabled)
      .Number("header_slots", s.header_slots)
      .Number("requests", s.requests)
      .str();
}

}  // namespace

Status ShowStatus(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(StoreStatus s, client.GetStatus());
  if (json) {
    std::cout << StatusJson(s) << '\n';
    return Status::OK();
  }
  using ipc::FormatSize;
  const auto count = [](uint64_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  PrintFields(
      std::cout,
      {
          {"daemon", "depotd " + s.daemon_version + ", pid " + std::to_string(s.pid) + ", up " +
                         FormatAge(s.uptime_ns)},
          {"socket", s.socket_path},
          {"arena", s.arena_backend + ": " + FormatSize(s.capacity_bytes) + " capacity, " +
                        FormatSize(s.mapped_bytes) + " mapped in " + count(s.segments, "segment")},
          {"used", FormatSize(s.used_bytes) + " (held " + FormatSize(s.held_bytes) + ", pinned " +
                       FormatSize(s.pinned_bytes) + "), largest free block " +
                       FormatSize(s.largest_free_block)},
          {"objects", std::to_string(s.objects_sealed) + " sealed, " +
                          std::to_string(s.objects_creating) + " being created"},
          {"clients", std::to_string(s.clients)},
          {"eviction", std::string(s.eviction_enabled ? "on" : "off") + ", " +
                           count(s.evictions, "object") + " evicted (" +
                           FormatSize(s.evicted_bytes) + ")"},
          {"header", std::to_string(s.header_slots) + " slots"},
          {"requests", std::to_string(s.requests)},
      });
  return Status::OK();
}

Status ListObjects(const std::string& socket, bool json) {
  DEPOT_ASSIGN_OR_RETURN(Client client, Client::Connect(socket));
  DEPOT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, client.List());
  if (json) {
    std::cout << '[';
    for (size_t i = 0; i < objects.size(); ++i) {
      std::cout << (i == 0 ? "\n  " : ",\n  ") << ObjectJson(objects[i]);
    }
    std::cout << (objects.empty() ? "]\n" : "\n]\n");
    return Status::OK();
  }
  using Align = Table::Align;
  Table table({{"ID"},
               {"NAME"},
               {"STATE"},
               {"SIZE", Align::kRight},
               {"META", Align::kRight},
               {"REFS", Align::kRight},
               {"AGE", Align::kRight},
               {"FLAGS"}});
  const uint64_t now = ipc::WallNanos();
  for (const ObjectInfo& o : objects) {
    table.AddRow({o.id.Hex(), o.name.empty() ? "-" : Printable(o.name),
                  o.state == ObjectState::kSealed ? "sealed" : "creating",
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

}  // namespace depot::ctl
