// The field tables of the info structs (client/fields/info_fields.h) against the wire schema,
// field by field, both ways (the daemon writes its replies through them, the client reads
// them), and the structs a real daemon's replies fill through them.
//
// A unit test of a header private to the project (as cuda_driver_test is): the tables are
// where a field of StoreStatus, ObjectInfo, ... is declared for the daemon, the wire, Python
// and depotctl alike.
#include <unistd.h>

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "depot/task.h"
#include "info_fields.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using internal::Info;
using internal::InfoFields;

// Whether two values of a field are the same, generically (records field by field).
template <typename V>
bool Same(const V& a, const V& b) {
  if constexpr (Info<V>) {
    // Field by field, those on the wire (GpuInfo::ordinal is this process's, not read).
    bool same = true;
    internal::ForEachField<V>([&](const auto& field) {
      if constexpr (std::decay_t<decltype(field)>::kOnWire) {
        same = same && Same(a.*field.member, b.*field.member);
      }
    });
    return same;
  } else if constexpr (requires {
                         a.size();
                         a[0];
                       } &&
                       !std::is_same_v<V, std::string>) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!Same(a[i], b[i])) return false;
    }
    return true;
  } else {
    return a == b;
  }
}

// Sets `field` of `out` to a value other than its default: 7, true, "x", 16 bytes, an
// enumerant other than the first, a list of one element, a struct with its first field set.
void SetNotDefault(capnp::DynamicStruct::Builder out, capnp::StructSchema::Field field) {
  using capnp::schema::Type;
  const capnp::Type type = field.getType();
  switch (type.which()) {
    case Type::BOOL:
      out.set(field, true);
      return;
    case Type::INT8:
    case Type::INT16:
    case Type::INT32:
    case Type::INT64:
    case Type::UINT8:
    case Type::UINT16:
    case Type::UINT32:
    case Type::UINT64:
      out.set(field, 7);
      return;
    case Type::FLOAT32:
    case Type::FLOAT64:
      out.set(field, 2.5);
      return;
    case Type::TEXT:
      out.set(field, capnp::Text::Reader("x"));
      return;
    case Type::DATA: {
      static const kj::byte bytes[16] = {0xab, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
      out.set(field, capnp::Data::Reader(bytes, sizeof(bytes)));
      return;
    }
    case Type::ENUM:
      out.set(field, capnp::DynamicEnum(type.asEnum().getEnumerants()[1]));
      return;
    case Type::LIST:
      out.init(field, 1);
      return;
    case Type::STRUCT: {
      auto inner = out.init(field).as<capnp::DynamicStruct>();
      SetNotDefault(inner, type.asStruct().getFields()[0]);
      return;
    }
    default:
      ADD_FAILURE() << "no test value for the type of " << field.getProto().getName().cStr();
  }
}

// The wire's name of a table's field: lowerCamelCase of its name, except where the client
// says GPU and the wire device (a worker's gpus are gpus on both).
std::string WireName(const std::string& record, const std::string& name) {
  if (record != "WorkerInfo" && name == "gpus") return "devices";
  if (name == "gpu_backend") return "deviceBackend";
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '_' && i + 1 < name.size()) {
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(name[++i])));
    } else {
      out += name[i];
    }
  }
  return out;
}

// For each field of T's wire struct: a reply with only that field set to something other than
// its default must change exactly one member of T, the one of the same name. So every field
// of the schema is in T's table, under its own name, read by its own getter.
template <Info T>
void ExpectEachWireFieldReachesItsMember() {
  using Wire = typename InfoFields<T>::Wire;
  const capnp::StructSchema schema = capnp::Schema::from<Wire>();
  capnp::MallocMessageBuilder empty;
  empty.initRoot<Wire>();
  const T base = internal::FromWire<T>(empty.getRoot<Wire>().asReader());
  std::set<std::string> reached;
  for (capnp::StructSchema::Field field : schema.getFields()) {
    const std::string wire_name = field.getProto().getName().cStr();
    capnp::MallocMessageBuilder message;
    SetNotDefault(message.initRoot<capnp::DynamicStruct>(schema), field);
    const T converted = internal::FromWire<T>(message.getRoot<Wire>().asReader());
    std::vector<std::string> changed;
    internal::ForEachField<T>([&](const auto& f) {
      if (!Same(base.*f.member, converted.*f.member)) changed.push_back(f.name);
    });
    ASSERT_EQ(changed.size(), 1u) << InfoFields<T>::kName << "." << wire_name
                                  << " changes no member, or more than one";
    EXPECT_EQ(WireName(InfoFields<T>::kName, changed[0]), wire_name)
        << InfoFields<T>::kName << "." << wire_name << " reaches " << changed[0];
    reached.insert(changed[0]);
  }
  internal::ForEachField<T>([&](const auto& f) {
    if constexpr (std::decay_t<decltype(f)>::kOnWire) {
      EXPECT_TRUE(reached.count(f.name))
          << InfoFields<T>::kName << "::" << f.name << " is read from a field no other member is";
    }
  });
}

TEST(InfoFieldsTest, EveryWireFieldReachesTheMemberOfItsName) {
  ExpectEachWireFieldReachesItsMember<GpuInfo>();
  ExpectEachWireFieldReachesItsMember<ObjectInfo>();
  ExpectEachWireFieldReachesItsMember<SchedulerStatus>();
  ExpectEachWireFieldReachesItsMember<StoreStatus>();
  ExpectEachWireFieldReachesItsMember<DiskStatus>();
  ExpectEachWireFieldReachesItsMember<ClientInfo>();
  ExpectEachWireFieldReachesItsMember<TierReferences>();
  ExpectEachWireFieldReachesItsMember<Holder>();
  ExpectEachWireFieldReachesItsMember<Replica>();
  ExpectEachWireFieldReachesItsMember<ObjectDetails>();
  ExpectEachWireFieldReachesItsMember<VerifyResult>();
  ExpectEachWireFieldReachesItsMember<EvictResult>();
  ExpectEachWireFieldReachesItsMember<WorkerInfo>();
  ExpectEachWireFieldReachesItsMember<TaskInfo>();
}

TEST(InfoFieldsTest, OnlyTheOrdinalIsNotOnTheWire) {
  std::vector<std::string> local;
  internal::ForEachField<GpuInfo>([&](const auto& f) {
    if constexpr (!std::decay_t<decltype(f)>::kOnWire) local.push_back(f.name);
  });
  EXPECT_EQ(local, std::vector<std::string>{"ordinal"});
}

// Sets `value` to what its wire field does not have by default, as SetNotDefault does a wire
// field: 7, true, "x", an id, 16 bytes, an enumerator other than the wire's first, a list of
// one element, a resource, every member of a struct.
template <typename V>
void MakeNotDefault(V& value) {
  if constexpr (Info<V>) {
    internal::ForEachField<V>([&](const auto& f) { MakeNotDefault(value.*f.member); });
  } else if constexpr (std::is_same_v<V, bool>) {
    value = true;  // the wire's bools are false by default (some members are true)
  } else if constexpr (std::is_arithmetic_v<V>) {
    value = static_cast<V>(value == 7 ? 8 : 7);
  } else if constexpr (std::is_same_v<V, std::string>) {
    value = "x";
  } else if constexpr (std::is_same_v<V, ObjectId>) {
    value = ObjectId::FromName("x");
  } else if constexpr (std::is_same_v<V, std::array<uint8_t, 16>>) {
    value.fill(0xab);
  } else if constexpr (std::is_same_v<V, ObjectState>) {
    value = ObjectState::kSealed;  // not the wire's default, creating
  } else if constexpr (std::is_same_v<V, VerifyState>) {
    value = VerifyState::kMismatch;  // not the wire's default, ok
  } else if constexpr (std::is_same_v<V, TaskState>) {
    value = TaskState::kRunning;
  } else if constexpr (std::is_same_v<V, std::map<std::string, double>>) {
    value = {{"x", 2.5}};
  } else {
    MakeNotDefault(value.emplace_back());
  }
}

// A struct with every member set (MakeNotDefault), written as the daemon writes its replies
// (ToWire), must set every field of the wire struct, nested ones too, and read back
// (FromWire) as the same struct: so the daemon's replies carry every field of the schema.
template <Info T>
void ExpectToWireSetsEveryFieldAndReadsBack() {
  using Wire = typename InfoFields<T>::Wire;
  T value;
  MakeNotDefault(value);
  capnp::MallocMessageBuilder message;
  internal::ToWire(value, message.initRoot<Wire>());
  const capnp::DynamicStruct::Reader written = message.getRoot<Wire>().asReader();
  for (capnp::StructSchema::Field field : capnp::Schema::from<Wire>().getFields()) {
    EXPECT_TRUE(written.has(field, capnp::HasMode::NON_DEFAULT))
        << InfoFields<T>::kName << ": ToWire leaves " << field.getProto().getName().cStr()
        << " at its default";
  }
  const T read = internal::FromWire<T>(message.getRoot<Wire>().asReader());
  internal::ForEachField<T>([&](const auto& f) {
    if constexpr (std::decay_t<decltype(f)>::kOnWire) {
      EXPECT_TRUE(Same(read.*f.member, value.*f.member))
          << InfoFields<T>::kName << "::" << f.name << " does not read back as written";
    }
  });
}

TEST(InfoFieldsTest, ToWireSetsEveryWireFieldAndReadsBackTheSame) {
  ExpectToWireSetsEveryFieldAndReadsBack<GpuInfo>();
  ExpectToWireSetsEveryFieldAndReadsBack<ObjectInfo>();
  ExpectToWireSetsEveryFieldAndReadsBack<SchedulerStatus>();
  ExpectToWireSetsEveryFieldAndReadsBack<StoreStatus>();
  ExpectToWireSetsEveryFieldAndReadsBack<DiskStatus>();
  ExpectToWireSetsEveryFieldAndReadsBack<Setting>();
  ExpectToWireSetsEveryFieldAndReadsBack<ClientInfo>();
  ExpectToWireSetsEveryFieldAndReadsBack<TierReferences>();
  ExpectToWireSetsEveryFieldAndReadsBack<Holder>();
  ExpectToWireSetsEveryFieldAndReadsBack<Replica>();
  ExpectToWireSetsEveryFieldAndReadsBack<ObjectDetails>();
  ExpectToWireSetsEveryFieldAndReadsBack<VerifyResult>();
  ExpectToWireSetsEveryFieldAndReadsBack<EvictResult>();
  ExpectToWireSetsEveryFieldAndReadsBack<WorkerInfo>();
  ExpectToWireSetsEveryFieldAndReadsBack<TaskInfo>();
}

uint64_t RealtimeNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

TEST(InfoFieldsTest, StatusFromARealDaemonHasEveryFieldItKnows) {
  TestDaemon daemon({"--max-objects", "1000", "--memory", "32MiB", "--simulate-gpus", "2"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  auto client = Client::Connect(daemon.socket_path());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(client->Put(ObjectId::FromName("one"), AsBytes(std::string(1000, 'a'))).ok());

  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  const StoreStatus& s = *status;
  EXPECT_FALSE(s.daemon_version.empty());
  EXPECT_EQ(s.pid, static_cast<uint32_t>(daemon.pid()));
  EXPECT_GT(s.uptime_ns, 0u);
  EXPECT_EQ(s.socket_path, daemon.socket_path());
  EXPECT_EQ(s.arena_backend, "memfd");
  EXPECT_EQ(s.capacity_bytes, 32u << 20);
  EXPECT_EQ(s.mapped_bytes, uint64_t{s.segments} * (16u << 20));
  EXPECT_GE(s.used_bytes, 1000u);
  EXPECT_EQ(s.held_bytes, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_GT(s.largest_free_block, 0u);
  EXPECT_GE(s.segments, 1u);
  EXPECT_EQ(s.objects_sealed, 1u);
  EXPECT_EQ(s.objects_creating, 0u);
  EXPECT_EQ(s.clients, 1u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_TRUE(s.eviction_enabled);
  EXPECT_EQ(s.header_slots, 1000u);
  EXPECT_GE(s.requests, 2u);
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpu_backend, "simulated");
  EXPECT_EQ(s.objects_on_host, 1u);
  EXPECT_GT(s.metadata_bytes, 0u);
  for (size_t d = 0; d < s.gpus.size(); ++d) {
    const GpuInfo& g = s.gpus[d];
    EXPECT_EQ(g.ordinal, static_cast<int>(d));
    EXPECT_TRUE(g.simulated);
    EXPECT_FALSE(g.name.empty());
    EXPECT_NE(g.uuid, (std::array<uint8_t, 16>{}));
    EXPECT_GT(g.total_bytes, 0u);
    EXPECT_GT(g.limit_bytes, 0u);
    EXPECT_EQ(g.replicas, 0u);
  }
}

TEST(InfoFieldsTest, ClientsFromARealDaemonSayWhoAndSinceWhen) {
  TestDaemon daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  const uint64_t before = RealtimeNanos();
  ConnectOptions options;
  options.client_name = "info-fields-test";
  auto client = Client::Connect(daemon.socket_path(), options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const uint64_t after = RealtimeNanos();

  auto clients = client->Clients();
  ASSERT_TRUE(clients.ok()) << clients.status().ToString();
  ASSERT_EQ(clients->size(), 1u);
  const ClientInfo& c = (*clients)[0];
  EXPECT_EQ(c.session_id, client->session_id());
  EXPECT_EQ(c.pid, static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(c.uid, ::getuid());
  EXPECT_FALSE(c.command.empty());
  EXPECT_EQ(c.client_name, "info-fields-test");
  EXPECT_EQ(c.objects_held, 0u);
  EXPECT_GE(c.requests, 1u);
  EXPECT_GE(c.connected_time_ns, before);
  EXPECT_LE(c.connected_time_ns, after);
}

// A metric's samples as `name{labels}` and their values, and each family's TYPE and HELP.
struct ScrapedMetrics {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::map<std::string, std::string> helps;
};

ScrapedMetrics Scrape(const std::string& text) {
  ScrapedMetrics out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    if (line.starts_with("# TYPE ") || line.starts_with("# HELP ")) {
      const size_t name_end = line.find(' ', 7);
      auto& into = line.starts_with("# TYPE ") ? out.types : out.helps;
      into[line.substr(7, name_end - 7)] = line.substr(name_end + 1);
    } else if (!line.starts_with("#")) {
      out.samples[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
    }
  }
  return out;
}

// A status field as its metric should show it.
struct ExpectedSample {
  internal::Metric metric;
  std::string key;  // name{labels}
  double value = 0;
};

std::vector<ExpectedSample> SamplesOf(const StoreStatus& status) {
  std::vector<ExpectedSample> samples;
  internal::ForEachMetric(
      status, [&](const internal::Metric& metric, const std::string& labels, auto value) {
        double number = static_cast<double>(value);
        if (metric.unit == internal::MetricUnit::kNanosAsSeconds) number /= 1e9;
        samples.push_back(
            {metric, std::string(metric.family.name) + (labels.empty() ? "" : "{" + labels + "}"),
             number});
      });
  return samples;
}

// The one place of a metric of a status field is its table entry: every field given a metric
// there is in the daemon's metrics, under its family (type and help as the table says) and
// labels, with the value the client reads in status; and the table's families have no sample
// the table does not give. A daemon with GPUs and a spill directory, so that every table with
// metrics (GpuInfo's per GPU, DiskStatus, SchedulerStatus) has its fields there.
TEST(InfoFieldsTest, MetricsHaveEveryFieldWithAMetricWithTheValueStatusReads) {
  TempDir spill;
  ASSERT_TRUE(spill.error().empty()) << spill.error();
  TestDaemon daemon({"--memory", "32MiB", "--simulate-gpus", "2", "--spill-dir", spill.path()});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  auto client = Client::Connect(daemon.socket_path());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(client->Put(ObjectId::FromName("one"), AsBytes(std::string(1000, 'a'))).ok());
  auto held = client->Get(ObjectId::FromName("one"));
  ASSERT_TRUE(held.ok()) << held.status().ToString();

  auto before = client->GetStatus();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  auto text = client->Metrics();
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_TRUE(before->disk.enabled);
  ASSERT_EQ(before->gpus.size(), 2u);

  const ScrapedMetrics scraped = Scrape(*text);
  const std::vector<ExpectedSample> expected = SamplesOf(*before);
  const std::vector<ExpectedSample> later = SamplesOf(*after);
  ASSERT_EQ(expected.size(), later.size());
  std::map<std::string, size_t> per_family;
  for (size_t i = 0; i < expected.size(); ++i) {
    const ExpectedSample& e = expected[i];
    const std::string family = e.metric.family.name;
    ++per_family[family];
    const auto it = scraped.samples.find(e.key);
    if (it == scraped.samples.end()) {
      ADD_FAILURE() << e.key << " is not in the metrics:\n" << *text;
      continue;
    }
    // Counters and gauges may move between the two reads (the uptime does); the metric was
    // read between them, and rounded as it is written (seconds to the ms).
    const double slack = e.metric.unit == internal::MetricUnit::kNanosAsSeconds ? 1e-3 : 1e-6;
    EXPECT_GE(it->second, std::min(e.value, later[i].value) - slack) << e.key;
    EXPECT_LE(it->second, std::max(e.value, later[i].value) + slack) << e.key;
    EXPECT_EQ(scraped.types.at(family),
              e.metric.family.type == internal::MetricType::kCounter ? "counter" : "gauge")
        << family;
    EXPECT_EQ(scraped.helps.at(family), e.metric.family.help) << family;
  }
  for (const auto& [family, count] : per_family) {
    size_t samples = 0;
    for (const auto& [key, value] : scraped.samples) {
      samples += key == family || key.starts_with(family + "{");
    }
    EXPECT_EQ(samples, count) << family << " has samples its fields do not give:\n" << *text;
  }
  // Not a vacuous pass: the per-GPU and disk families are among them.
  EXPECT_TRUE(per_family.count("depot_capacity_bytes") && per_family.count("depot_disk_bytes") &&
              per_family.count("depot_tasks_total"));
}

}  // namespace
}  // namespace depot::testing
