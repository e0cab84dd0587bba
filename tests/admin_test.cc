// depotctl's operator view against a real depotd with known contents: show (fields, holders,
// hexdump), clients, verify (intact and corrupted objects), evict, the ls filters, and clear
// errors for bad input; and the GPU tiers of status, ls and show on simulated GPUs.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "depot/ipc/gpu.h"
#include "test_support.h"

#ifndef DEPOTCTL_PATH
#error "DEPOTCTL_PATH must name the depotctl binary (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {
namespace {

using std::chrono::seconds;

std::string Hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, value);
  return text;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The lines of `text` that mention `part`.
std::vector<std::string> LinesWith(const std::string& text, const std::string& part) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (Has(line, part)) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

class AdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace();
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
  }

  ProgramRun Depotctl(std::vector<std::string> args) {
    args.insert(args.begin(), {DEPOTCTL_PATH, "--socket", daemon_->socket_path()});
    return RunProgram(args);
  }

  Result<Client> Connect(const std::string& name = {}) {
    ConnectOptions options;
    options.client_name = name;
    return Client::Connect(daemon_->socket_path(), options);
  }

  // Puts `bytes` under `name` and leaves no reference behind.
  void PutNamed(Client& client, const std::string& name, std::span<const std::byte> bytes,
                bool checksum = false, bool pin = false) {
    CreateOptions options;
    options.name = name;
    options.checksum = checksum;
    options.pin = pin;
    ASSERT_OK(client.Put(ObjectId::FromName(name), bytes, options));
  }

  // Expects depotctl to fail with a one-line message containing `message`, and the daemon
  // to go on serving.
  void ExpectFails(std::vector<std::string> args, const std::string& message) {
    ProgramRun run = Depotctl(args);
    EXPECT_NE(run.exit_code, 0) << run.Explain();
    EXPECT_TRUE(Has(run.err, message)) << "wanted '" << message << "' in: " << run.err;
    EXPECT_EQ(LinesWith(run.err, "depotctl:").size(), 1u) << run.err;
    EXPECT_EQ(Depotctl({"status"}).exit_code, 0);
  }

  std::optional<TestDaemon> daemon_;
};

TEST_F(AdminTest, ShowPrintsTheHeaderAndTheForkedChildHoldingTheObject) {
  const std::vector<std::byte> bytes = SeededBytes(4096, 7);
  {
    ASSERT_OK_AND_ASSIGN(Client client, Connect());
    PutNamed(client, "admin/held", bytes, /*checksum=*/true);
  }
  ReadyPipe ready;
  const std::string socket = daemon_->socket_path();
  ChildProcess child = ChildProcess::Start([&]() -> int {
    auto client = Client::Connect(socket);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    auto buffer = client->Get(ObjectId::FromName("admin/held"));
    if (!buffer.ok()) return ChildFailed(3, buffer.status().ToString());
    ready.Signal();
    ::pause();  // holds the Buffer until killed
    return 0;
  });
  ASSERT_TRUE(ready.Wait(seconds(10)));
  const std::string pid = std::to_string(child.pid());

  ProgramRun show = Depotctl({"show", "admin/held"});
  ASSERT_EQ(show.exit_code, 0) << show.Explain();
  EXPECT_TRUE(Has(show.out, ObjectId::FromName("admin/held").Hex())) << show.out;
  EXPECT_TRUE(Has(show.out, "4.00 KiB (4096 bytes)")) << show.out;
  EXPECT_TRUE(Has(show.out, "xxh3-64 " + Hex64(Xxh3(bytes)))) << show.out;
  EXPECT_TRUE(Has(show.out, "host tier, segment 0")) << show.out;
  EXPECT_TRUE(Has(show.out, "uid " + std::to_string(::getuid()))) << "the owner\n" << show.out;
  auto rows = LinesWith(show.out, " " + pid + " ");
  ASSERT_EQ(rows.size(), 1u) << show.out;
  EXPECT_TRUE(Has(rows[0], "admin_test")) << rows[0];

  ProgramRun json = Depotctl({"show", "admin/held", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  EXPECT_TRUE(Has(json.out, "\"ref_count\": 1,")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"owner_uid\": " + std::to_string(::getuid()) + ",")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"checksum\": \"" + Hex64(Xxh3(bytes)) + "\"")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"holders\": [{\"session_id\": ")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"pid\": " + pid + ", \"uid\": " + std::to_string(::getuid()) +
                                ", \"command\": \"admin_test\""))
      << json.out;
  EXPECT_TRUE(Has(json.out, "\"references\": 1, \"references_by_tier\": {\"host\": 1}}]"))
      << json.out;
}

TEST_F(AdminTest, ShowHexdumpPrintsTheFirstBytesAsHexdumpDoes) {
  {
    ASSERT_OK_AND_ASSIGN(Client client, Connect());
    PutNamed(client, "admin/text", AsBytes("Hello, depot world! 0123456789abcdefghij"));
  }
  ProgramRun show = Depotctl({"show", "admin/text", "--hexdump", "20"});
  ASSERT_EQ(show.exit_code, 0) << show.Explain();
  EXPECT_TRUE(Has(show.out, "first 20 of 40 bytes")) << show.out;
  EXPECT_TRUE(Has(show.out,
                  "00000000  48 65 6c 6c 6f 2c 20 64  65 70 6f 74 20 77 6f 72  |Hello, depot wor|\n"
                  "00000010  6c 64 21 20                                       |ld! |\n"
                  "00000014\n"))
      << show.out;
  EXPECT_TRUE(Has(show.out, "holders     none")) << "the hexdump's own Get is not listed\n"
                                                 << show.out;

  ProgramRun json = Depotctl({"show", "admin/text", "--json", "--hexdump", "5"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  EXPECT_TRUE(Has(json.out, "\"data_hex\": \"48656c6c6f\"")) << json.out;
}

TEST_F(AdminTest, ClientsListsASecondClientWithItsPidAndWhatItHolds) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect("admin-second"));
  PutNamed(client, "admin/one", SeededBytes(10'000, 1));
  ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(ObjectId::FromName("admin/one")));
  const std::string pid = std::to_string(::getpid());

  ProgramRun table = Depotctl({"clients"});
  ASSERT_EQ(table.exit_code, 0) << table.Explain();
  auto rows = LinesWith(table.out, "admin-second");
  ASSERT_EQ(rows.size(), 1u) << table.out;
  EXPECT_TRUE(Has(rows[0], " " + pid + " ")) << rows[0];
  EXPECT_TRUE(Has(rows[0], "admin_test")) << rows[0];
  EXPECT_EQ(LinesWith(table.out, "depotctl").size(), 1u) << "depotctl sees itself\n" << table.out;

  ProgramRun json = Depotctl({"clients", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  auto entries = LinesWith(json.out, "\"client_name\": \"admin-second\"");
  ASSERT_EQ(entries.size(), 1u) << json.out;
  EXPECT_TRUE(Has(entries[0], "\"session_id\": " + std::to_string(client.session_id()) + ","))
      << entries[0];
  EXPECT_TRUE(Has(entries[0], "\"pid\": " + pid + ",")) << entries[0];
  EXPECT_TRUE(Has(entries[0], "\"objects_held\": 1, \"references\": 1, \"bytes_held\": 10048,"))
      << entries[0];
}

TEST_F(AdminTest, VerifyReportsIntactObjectsAsOk) {
  {
    ASSERT_OK_AND_ASSIGN(Client client, Connect());
    PutNamed(client, "admin/a", SeededBytes(1000, 1), /*checksum=*/true);
    PutNamed(client, "admin/b", SeededBytes(3 << 20, 2), /*checksum=*/true);
    PutNamed(client, "admin/plain", SeededBytes(100, 3));
  }
  ProgramRun all = Depotctl({"verify", "--all"});
  ASSERT_EQ(all.exit_code, 0) << all.Explain();
  EXPECT_TRUE(Has(all.out, "2 objects checked: 2 ok\n")) << all.out;
  EXPECT_EQ(LinesWith(all.out, " ok ").size(), 2u) << all.out;

  ProgramRun named = Depotctl({"verify", "admin/b", "admin/plain", "--json"});
  ASSERT_EQ(named.exit_code, 0) << named.Explain();
  EXPECT_TRUE(Has(named.out, "\"checked\": 2, \"ok\": 1, \"mismatch\": 0, \"no_checksum\": 1,"))
      << named.out;
  EXPECT_TRUE(Has(named.out, "\"name\": \"admin/plain\", \"result\": \"no_checksum\""))
      << named.out;
}

TEST_F(AdminTest, VerifyReportsAMismatchAfterTheBytesChangeAndExitsWithOne) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect());
  PutNamed(client, "admin/intact", SeededBytes(2 << 20, 4), /*checksum=*/true);
  const ObjectId id = ObjectId::FromName("admin/corrupt");
  CreateOptions options;
  options.name = "admin/corrupt";
  options.checksum = true;
  ASSERT_OK_AND_ASSIGN(MutableBuffer writer, client.Create(id, 64 * 1024, options));
  const std::vector<std::byte> original = SeededBytes(writer.size(), 5);
  std::memcpy(writer.ptr(), original.data(), original.size());
  ASSERT_OK(client.Seal(id));
  // The creator's mapping is shared memory: writing through it now is the corruption that
  // verify exists to catch.
  writer.ptr()[100] ^= std::byte{0x5a};
  const uint64_t actual = Xxh3(writer.data());

  ProgramRun table = Depotctl({"verify", "--all"});
  EXPECT_EQ(table.exit_code, 1) << table.Explain();
  auto rows = LinesWith(table.out, "admin/corrupt");
  ASSERT_EQ(rows.size(), 1u) << table.out;
  EXPECT_TRUE(
      Has(rows[0], "MISMATCH  expected " + Hex64(Xxh3(original)) + ", actual " + Hex64(actual)))
      << rows[0];
  EXPECT_TRUE(Has(table.out, "2 objects checked: 1 ok, 1 MISMATCHED\n")) << table.out;
  EXPECT_TRUE(Has(table.err, "1 of 2 objects do not match")) << table.err;

  ProgramRun json = Depotctl({"verify", "admin/corrupt", "--json"});
  EXPECT_EQ(json.exit_code, 1) << json.Explain();
  EXPECT_TRUE(Has(json.out, "\"result\": \"mismatch\", \"expected\": \"" + Hex64(Xxh3(original)) +
                                "\", \"actual\": \"" + Hex64(actual) + "\""))
      << json.out;

  // Verify gave back the references it took while reading.
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client.Describe(id));
  EXPECT_EQ(details.info.ref_count, 1u);
  ASSERT_EQ(details.holders.size(), 1u);
  EXPECT_EQ(details.holders[0].session_id, client.session_id());
}

TEST_F(AdminTest, EvictFreesTheAskedBytesAndLeavesPinnedAndReferencedObjects) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect());
  const std::vector<std::byte> mib = SeededBytes(1 << 20, 6);
  for (const char* name : {"evict/1", "evict/2", "evict/3"}) PutNamed(client, name, mib);
  PutNamed(client, "evict/pinned", mib, /*checksum=*/false, /*pin=*/true);
  PutNamed(client, "evict/held", mib);
  ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(ObjectId::FromName("evict/held")));
  ASSERT_OK(client.Contains(ObjectId::FromName("evict/1")));  // sends the queued releases

  ProgramRun one = Depotctl({"evict", "--bytes", "1MiB", "--json"});
  ASSERT_EQ(one.exit_code, 0) << one.Explain();
  EXPECT_TRUE(Has(one.out, "{\"objects\": 1, \"bytes\": 1048576,")) << one.out;
  EXPECT_FALSE(*client.Contains(ObjectId::FromName("evict/1"))) << "the least recently used";
  EXPECT_TRUE(*client.Contains(ObjectId::FromName("evict/2")));

  ProgramRun rest = Depotctl({"evict", "--all-unreferenced"});
  ASSERT_EQ(rest.exit_code, 0) << rest.Explain();
  EXPECT_EQ(rest.out, "evicted 2 objects, 2.00 MiB\n");
  for (const char* name : {"evict/2", "evict/3"}) {
    EXPECT_FALSE(*client.Contains(ObjectId::FromName(name))) << name;
  }
  EXPECT_TRUE(*client.Contains(ObjectId::FromName("evict/pinned")));
  EXPECT_TRUE(*client.Contains(ObjectId::FromName("evict/held")));
  EXPECT_TRUE(SameBytes(held.data(), mib));

  ProgramRun nothing = Depotctl({"evict", "--bytes", "1GiB"});
  ASSERT_EQ(nothing.exit_code, 0) << nothing.Explain();
  EXPECT_TRUE(Has(nothing.out, "evicted 0 objects, 0 B (of 1.00 GiB asked")) << nothing.out;

  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.evictions, 3u);
  EXPECT_EQ(status.evicted_bytes, 3u << 20);
}

TEST_F(AdminTest, LsFiltersSortsAndLimits) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect());
  PutNamed(client, "ls/small", SeededBytes(1024, 1));
  PutNamed(client, "ls/medium", SeededBytes(100 * 1024, 2));
  PutNamed(client, "ls/big", SeededBytes(1 << 20, 3));
  PutNamed(client, "other/x", SeededBytes(10 * 1024, 4));
  CreateOptions creating_options;
  creating_options.name = "ls/creating";
  ASSERT_OK_AND_ASSIGN(MutableBuffer creating,
                       client.Create(ObjectId::FromName("ls/creating"), 2048, creating_options));
  ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(ObjectId::FromName("ls/medium")));
  ASSERT_OK(client.Contains(ObjectId::FromName("ls/big")));  // sends the queued releases

  const auto names_in = [](const std::string& out) {
    std::vector<std::string> names;
    for (const char* name : {"ls/small", "ls/medium", "ls/big", "ls/creating", "other/x"}) {
      if (Has(out, "\"" + std::string(name) + "\"")) names.push_back(name);
    }
    return names;
  };
  using Names = std::vector<std::string>;
  const auto ls = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "ls");
    ProgramRun run = Depotctl(args);
    EXPECT_EQ(run.exit_code, 0) << run.Explain();
    return run.out;
  };
  EXPECT_EQ(names_in(ls({"--name", "ls/*", "--json"})),
            (Names{"ls/small", "ls/medium", "ls/big", "ls/creating"}));
  EXPECT_EQ(names_in(ls({"--state", "creating", "--json"})), (Names{"ls/creating"}));
  EXPECT_EQ(names_in(ls({"--state", "sealed", "--min-size", "100KiB", "--json"})),
            (Names{"ls/medium", "ls/big"}));
  EXPECT_EQ(names_in(ls({"--held", "--json"})), (Names{"ls/medium", "ls/creating"}));
  EXPECT_EQ(ls({"--older-than", "1h", "--json"}), "[]\n");
  EXPECT_EQ(names_in(ls({"--older-than", "1ms", "--name", "other/*", "--json"})),
            (Names{"other/x"}));
  EXPECT_EQ(names_in(ls({"--tier", "host", "--name", "ls/b*", "--json"})), (Names{"ls/big"}));

  const std::string by_size = ls({"--sort", "size", "--limit", "2"});
  auto lines = LinesWith(by_size, "/");
  ASSERT_EQ(lines.size(), 2u) << by_size;
  EXPECT_TRUE(Has(lines[0], "ls/big") && Has(lines[1], "ls/medium")) << by_size;

  const std::string by_name = ls({"--sort", "name", "--json"});
  const size_t big = by_name.find("\"ls/big\""), creating_at = by_name.find("\"ls/creating\"");
  const size_t medium = by_name.find("\"ls/medium\""), other = by_name.find("\"other/x\"");
  EXPECT_TRUE(big < creating_at && creating_at < medium && medium < other) << by_name;

  const std::string by_refs = ls({"--sort", "refs", "--limit", "1", "--state", "sealed"});
  EXPECT_EQ(LinesWith(by_refs, "/").size(), 1u);
  EXPECT_TRUE(Has(by_refs, "ls/medium")) << by_refs;
}

TEST_F(AdminTest, ListLargestReturnsTheLargestObjectsLargestFirstInOneRequest) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect());
  // Sizes 1..40 KiB put in a shuffled order, so that slot order is not size order.
  for (int i = 0; i < 40; ++i) {
    const int kib = 1 + (i * 17) % 40;
    PutNamed(client, "sized/" + std::to_string(kib), SeededBytes(kib * 1024, kib));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> largest, client.ListLargest(5));
  ASSERT_EQ(largest.size(), 5u);
  for (size_t i = 0; i < largest.size(); ++i) {
    EXPECT_EQ(largest[i].data_size, (40 - i) * 1024) << i;
    EXPECT_EQ(largest[i].name, "sized/" + std::to_string(40 - i));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> all, client.ListLargest(1000));
  EXPECT_EQ(all.size(), 40u);
  EXPECT_EQ(all.back().data_size, 1024u);
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> none, client.ListLargest(0));
  EXPECT_TRUE(none.empty());
}

TEST_F(AdminTest, ListWithAPrefixReturnsOnlyTheNamesThatStartWithIt) {
  ASSERT_OK_AND_ASSIGN(Client client, Connect());
  // 1,500 objects under one prefix among 3,000 under another, interleaved in slot order, so
  // that a page of the prefix's objects (1,024 at most) spans more slots than a page holds.
  for (int i = 0; i < 4500; ++i) {
    const std::string name = (i % 3 == 0 ? "zarr/a/c/" : "zarr/b/c/") + std::to_string(i);
    PutNamed(client, name, SeededBytes(16, static_cast<uint64_t>(i)));
  }
  PutNamed(client, "zarr/a", SeededBytes(16, 1));  // the prefix itself, without the slash
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> a, client.List("zarr/a/"));
  ASSERT_EQ(a.size(), 1500u);
  for (const ObjectInfo& o : a) EXPECT_TRUE(o.name.starts_with("zarr/a/c/")) << o.name;
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> both, client.List("zarr/"));
  EXPECT_EQ(both.size(), 4501u);
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> none, client.List("zarr/c"));
  EXPECT_TRUE(none.empty());
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> all, client.List());
  EXPECT_EQ(all.size(), 4501u);
  // depotctl ls asks for the part of its glob before the first special character.
  ProgramRun ls = Depotctl({"ls", "--json", "--name", "zarr/a/c/1?"});
  EXPECT_EQ(ls.exit_code, 0) << ls.Explain();
  EXPECT_TRUE(Has(ls.out, "\"zarr/a/c/12\"") && !Has(ls.out, "\"zarr/b/c/10\"")) << ls.out;

  // A prefix longer than any name is refused (fuzz_test also sends prefixes with largest).
  EXPECT_STATUS(client.List(std::string(4097, 'z')), StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> longest, client.List(std::string(4096, 'z')));
  EXPECT_TRUE(longest.empty());
}

TEST_F(AdminTest, BadInputFailsWithAClearMessage) {
  ExpectFails({"show", "admin/never-was"}, "'admin/never-was' (object " +
                                               ObjectId::FromName("admin/never-was").Hex() +
                                               ") does not exist");
  ExpectFails({"show", "admin/x", "--hexdump", "lots"}, "--hexdump:");
  ExpectFails({"ls", "--sort", "bogus"}, "--sort must be size, age, refs or name, not 'bogus'");
  ExpectFails({"ls", "--older-than", "5 parsecs"}, "--older-than: '5 parsecs' is not a duration");
  ExpectFails({"ls", "--older-than", "m"}, "is not a duration");
  ExpectFails({"ls", "--state", "frozen"}, "--state must be creating or sealed");
  ExpectFails({"ls", "--min-size", "big"}, "--min-size:");
  ExpectFails({"ls", "--tier", "gpu:0"},
              "--tier must be host, gpu or gpuK (e.g. gpu0), not 'gpu:0'");
  ExpectFails({"ls", "--tier", "disk"}, "depot has no disk tier yet");
  ExpectFails({"ls", "--device", "one"}, "--device must be a GPU index");
  ExpectFails({"ls", "--device", "-1"}, "--device must be a GPU index");
  ExpectFails({"ls", "--device", "0", "--tier", "host"}, "cannot go with --tier host");
  ExpectFails({"ls", "--device", "99"}, "--device 99: this depotd");
  ExpectFails({"verify"}, "name the objects to verify");
  ExpectFails({"verify", "admin/x", "--all"}, "not both");
  ExpectFails({"verify", "admin/never-was"}, "1 of 1 objects do not exist");
  ExpectFails({"evict"}, "give either --bytes SIZE or --all-unreferenced");
  ExpectFails({"evict", "--bytes", "1MiB", "--all-unreferenced"}, "give either");
  ExpectFails({"evict", "--bytes", "0"}, "--bytes must be more than 0");
}

// The GPU tiers, on a daemon with two simulated GPUs (their memory is host memory this test
// can write through device_ptr()). GPU 0's pool may take 16 MiB, GPU 1's 32 MiB, in chunks
// of 8 MiB. Four objects, one per combination of tiers:
//   tier/host         host memory only                            (4 KiB)
//   tier/gpu0         created on GPU 0, nowhere else              (1 MiB)
//   tier/gpu0+gpu1    created on GPU 0, replicated to GPU 1       (2 MiB), GPU 1's copy held
//   tier/host+gpu1    put in host memory, replicated to GPU 1     (1 MiB)
class AdminGpuTest : public AdminTest {
 protected:
  static constexpr uint64_t kMiB = 1 << 20;

  void SetUp() override {
    daemon_.emplace(std::vector<std::string>{"--simulate-gpus", "2:64MiB", "--gpu-memory",
                                             "0:16MiB,1:32MiB", "--gpu-chunk-size", "8MiB"});
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    ASSERT_OK_AND_ASSIGN(Client client, Connect("admin-gpu"));
    client_.emplace(std::move(client));

    PutNamed(*client_, "tier/host", SeededBytes(4096, 1));
    PutOnGpu0("tier/gpu0", kMiB, 2);
    PutOnGpu0("tier/gpu0+gpu1", 2 * kMiB, 3);
    ASSERT_OK_AND_ASSIGN(held_on_gpu1_, client_->GetOnDevice(Id("tier/gpu0+gpu1"), 1));
    PutNamed(*client_, "tier/host+gpu1", SeededBytes(kMiB, 4));
    { ASSERT_OK(client_->GetOnDevice(Id("tier/host+gpu1"), 1)); }
    ASSERT_OK(client_->Contains(Id("tier/host")));  // sends the queued releases
  }

  static ObjectId Id(const std::string& name) { return ObjectId::FromName(name); }

  // Creates `name` on GPU 0, writes it through the simulated device's pointer, seals it and
  // drops it.
  void PutOnGpu0(const std::string& name, uint64_t size, uint64_t seed) {
    CreateOptions options;
    options.name = name;
    ASSERT_OK_AND_ASSIGN(MutableDeviceBuffer buffer,
                         client_->CreateOnDevice(Id(name), size, 0, options));
    ASSERT_TRUE(buffer.simulated());
    const std::vector<std::byte> bytes = SeededBytes(size, seed);
    std::memcpy(reinterpret_cast<void*>(buffer.device_ptr()), bytes.data(), size);
    ASSERT_OK(client_->Seal(Id(name), /*stream=*/0));
  }

  // The names of this fixture's objects that `ls` printed, in the order printed.
  std::vector<std::string> Listed(std::vector<std::string> args) {
    args.insert(args.begin(), "ls");
    ProgramRun run = Depotctl(args);
    EXPECT_EQ(run.exit_code, 0) << run.Explain();
    std::vector<std::pair<size_t, std::string>> found;
    for (const char* name : {"tier/host", "tier/gpu0", "tier/gpu0+gpu1", "tier/host+gpu1"}) {
      const size_t at = run.out.find(" " + std::string(name) + " ");
      if (at != std::string::npos) found.emplace_back(at, name);
    }
    std::sort(found.begin(), found.end());
    std::vector<std::string> names;
    for (auto& [at, name] : found) names.push_back(std::move(name));
    return names;
  }

  std::optional<Client> client_;
  DeviceBuffer held_on_gpu1_;
};

TEST_F(AdminGpuTest, StatusShowsEachGpuPoolTheBackendAndObjectsByTier) {
  ProgramRun status = Depotctl({"status"});
  ASSERT_EQ(status.exit_code, 0) << status.Explain();
  const std::string& out = status.out;
  EXPECT_TRUE(Has(out, "\ngpus      simulated, 2 GPUs\n")) << out;
  EXPECT_TRUE(Has(out, "\ntiers     2 on host, 2 on gpu0, 2 on gpu1\n")) << out;
  auto gpu0 = LinesWith(out, "gpu0 ");
  ASSERT_EQ(gpu0.size(), 1u) << out;
  EXPECT_TRUE(gpu0[0].starts_with("gpu0      simulated GPU 0, GPU-")) << gpu0[0];
  EXPECT_TRUE(Has(gpu0[0], ", 64.0 MiB total")) << gpu0[0];
  auto pools = LinesWith(out, "pool limit");
  ASSERT_EQ(pools.size(), 2u) << out;
  EXPECT_EQ(
      pools[0],
      "          pool limit 16.0 MiB, reserved 8.00 MiB in 1 chunk, used 3.00 MiB (held 0 B), "
      "2 replicas");
  EXPECT_EQ(pools[1],
            "          pool limit 32.0 MiB, reserved 8.00 MiB in 1 chunk, used 3.00 MiB (held "
            "2.00 MiB), 2 replicas");
  EXPECT_TRUE(LinesWith(out, "gpu1      simulated GPU 1, GPU-").size() == 1) << out;
  EXPECT_TRUE(Has(out, "\ntiering   2 replicas made, 0 dropped; 0 spills to host (0 B)\n")) << out;

  ProgramRun json = Depotctl({"status", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  ASSERT_OK_AND_ASSIGN(StoreStatus s, client_->GetStatus());
  ASSERT_EQ(s.gpus.size(), 2u);
  const std::string uuid0 = ipc::FormatUuid(s.gpus[0].uuid);
  EXPECT_TRUE(Has(json.out,
                  "\"gpu_backend\": \"simulated\", \"gpus\": [{\"index\": 0, \"name\": "
                  "\"simulated GPU 0\", \"simulated\": true, \"uuid\": \"" +
                      uuid0 +
                      "\", \"total_bytes\": 67108864, \"limit_bytes\": 16777216, "
                      "\"reserved_bytes\": 8388608, \"chunks\": 1, \"used_bytes\": "
                      "3145728, \"held_bytes\": 0, \"replicas\": 2}, {\"index\": 1,"))
      << json.out;
  EXPECT_TRUE(Has(json.out, "\"held_bytes\": 2097152, \"replicas\": 2}]")) << json.out;
  EXPECT_TRUE(Has(json.out,
                  "\"spills\": 0, \"spilled_bytes\": 0, \"replicas_made\": 2, "
                  "\"replicas_dropped\": 0"))
      << json.out;
  EXPECT_TRUE(Has(json.out, "\"objects_by_tier\": {\"host\": 2, \"gpu0\": 2, \"gpu1\": 2}"))
      << json.out;
}

TEST_F(AdminGpuTest, LsSelectsObjectsByTierAndShowsWhereEachIs) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(Listed({}), (Names{"tier/host", "tier/gpu0", "tier/gpu0+gpu1", "tier/host+gpu1"}));
  EXPECT_EQ(Listed({"--tier", "host"}), (Names{"tier/host", "tier/host+gpu1"}));
  EXPECT_EQ(Listed({"--tier", "gpu"}), (Names{"tier/gpu0", "tier/gpu0+gpu1", "tier/host+gpu1"}));
  EXPECT_EQ(Listed({"--device", "1"}), (Names{"tier/gpu0+gpu1", "tier/host+gpu1"}));
  EXPECT_EQ(Listed({"--device", "0", "--tier", "gpu"}), (Names{"tier/gpu0", "tier/gpu0+gpu1"}));
  EXPECT_EQ(Listed({"--tier", "gpu0"}), (Names{"tier/gpu0", "tier/gpu0+gpu1"}));

  // The TIER column names every tier the object has bytes on.
  ProgramRun table = Depotctl({"ls", "--sort", "name"});
  ASSERT_EQ(table.exit_code, 0) << table.Explain();
  auto title = LinesWith(table.out, "TIER");
  ASSERT_EQ(title.size(), 1u) << table.out;
  const size_t column = title[0].find("TIER");
  for (const auto& [name, tiers] :
       std::vector<std::pair<std::string, std::string>>{{"tier/host", "host "},
                                                        {"tier/gpu0", "gpu0 "},
                                                        {"tier/gpu0+gpu1", "gpu0+gpu1 "},
                                                        {"tier/host+gpu1", "host+gpu1 "}}) {
    auto rows = LinesWith(table.out, " " + name + " ");
    ASSERT_EQ(rows.size(), 1u) << table.out;
    EXPECT_EQ(rows[0].substr(column, tiers.size()), tiers) << table.out;
  }

  ProgramRun json = Depotctl({"ls", "--json", "--device", "1", "--name", "tier/gpu0+gpu1"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  EXPECT_TRUE(Has(json.out,
                  "\"segment\": null, \"offset\": null, \"tiers\": [\"gpu0\", \"gpu1\"], "
                  "\"on_host\": false, \"gpus\": [0, 1], \"on_disk\": false}"))
      << json.out;
  ProgramRun host_json = Depotctl({"ls", "--json", "--name", "tier/host+gpu1"});
  ASSERT_EQ(host_json.exit_code, 0) << host_json.Explain();
  EXPECT_TRUE(
      Has(host_json.out,
          "\"tiers\": [\"host\", \"gpu1\"], \"on_host\": true, \"gpus\": [1], \"on_disk\": false}"))
      << host_json.out;
}

TEST_F(AdminGpuTest, LsOfATierOrGpuThereIsNotFailsClearly) {
  ExpectFails({"ls", "--device", "7"},
              "--device 7: this depotd has no GPU 7; it serves GPUs 0 to 1 (depotctl status "
              "lists them)");
  ExpectFails({"ls", "--tier", "gpu2"}, "--device 2: this depotd has no GPU 2");
  ExpectFails({"ls", "--tier", "disk"},
              "--tier disk: depot has no disk tier yet; objects are in host memory (--tier host) "
              "or on GPUs (--tier gpu)");
  ExpectFails({"ls", "--tier", "bogus"},
              "--tier must be host, gpu or gpuK (e.g. gpu0), not 'bogus'");
  ExpectFails({"ls", "--tier", "gpu0", "--device", "1"},
              "--tier gpu0 and --device 1 name different GPUs");
}

TEST_F(AdminGpuTest, ShowListsEveryReplicaAndTheTiersOfEachHoldersReferences) {
  ProgramRun show = Depotctl({"show", "tier/gpu0+gpu1"});
  ASSERT_EQ(show.exit_code, 0) << show.Explain();
  auto replicas = LinesWith(show.out, " tier ");
  ASSERT_EQ(replicas.size(), 2u) << show.out;
  EXPECT_TRUE(replicas[0].starts_with("replicas    gpu0 tier (simulated GPU 0), chunk 0, offset "))
      << show.out;
  EXPECT_TRUE(Has(replicas[0], ": 0 references, ready")) << replicas[0];
  EXPECT_TRUE(replicas[1].starts_with("            gpu1 tier (simulated GPU 1), chunk 0, offset "))
      << show.out;
  EXPECT_TRUE(Has(replicas[1], ": 1 reference, ready")) << replicas[1];
  auto holder = LinesWith(show.out, "admin-gpu");
  ASSERT_EQ(holder.size(), 1u) << show.out;
  EXPECT_TRUE(holder[0].ends_with("  1  gpu1 1")) << holder[0];

  ProgramRun host = Depotctl({"show", "tier/host+gpu1"});
  ASSERT_EQ(host.exit_code, 0) << host.Explain();
  EXPECT_TRUE(Has(host.out, "replicas    host tier, segment 0, offset ")) << host.out;
  EXPECT_TRUE(Has(host.out, "\n            gpu1 tier (simulated GPU 1), chunk 0, offset "))
      << host.out;
  EXPECT_TRUE(Has(host.out, "holders     none")) << host.out;

  ProgramRun json = Depotctl({"show", "tier/gpu0+gpu1", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  EXPECT_TRUE(Has(json.out,
                  "\"replicas\": [{\"tier\": \"gpu0\", \"gpu\": 0, \"gpu_name\": "
                  "\"simulated GPU 0\", \"chunk\": 0, \"offset\": "))
      << json.out;
  EXPECT_TRUE(Has(json.out,
                  "{\"tier\": \"gpu1\", \"gpu\": 1, \"gpu_name\": \"simulated GPU 1\", "
                  "\"chunk\": 0, \"offset\": 0, \"references\": 1, \"ready\": true, "
                  "\"state\": \"ready\"}]"))
      << json.out;
  EXPECT_TRUE(Has(json.out,
                  "\"client_name\": \"admin-gpu\", \"references\": 1, "
                  "\"references_by_tier\": {\"gpu1\": 1}}]"))
      << json.out;
}

TEST_F(AdminGpuTest, ClientsCountsAnObjectHeldOnTwoTiersOnceWithBothReferences) {
  const auto usage = [&]() -> std::pair<uint64_t, uint64_t> {
    auto clients = client_->Clients();
    EXPECT_OK(clients);
    for (const ClientInfo& c : *clients) {
      if (c.session_id == client_->session_id()) return {c.objects_held, c.references};
    }
    ADD_FAILURE() << "this client is not among the clients";
    return {};
  };
  EXPECT_EQ(usage(), (std::pair<uint64_t, uint64_t>{1, 1})) << "tier/gpu0+gpu1 on gpu1";
  {
    ASSERT_OK_AND_ASSIGN(Buffer on_host, client_->Get(Id("tier/host+gpu1")));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer on_gpu, client_->GetOnDevice(Id("tier/host+gpu1"), 1));
    EXPECT_EQ(usage(), (std::pair<uint64_t, uint64_t>{2, 3}));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer again, client_->GetOnDevice(Id("tier/gpu0+gpu1"), 0));
    EXPECT_EQ(usage(), (std::pair<uint64_t, uint64_t>{2, 4}));
  }
  ASSERT_OK(client_->Contains(Id("tier/host")));  // sends the queued releases
  EXPECT_EQ(usage(), (std::pair<uint64_t, uint64_t>{1, 1}));
}

TEST_F(AdminGpuTest, EvictDropsTheHostCopyOfAnObjectOnAGpuWithoutCountingItEvicted) {
  ASSERT_OK_AND_ASSIGN(StoreStatus before, client_->GetStatus());
  ASSERT_OK_AND_ASSIGN(EvictResult result, client_->Evict(0, /*all_unreferenced=*/true));
  EXPECT_EQ(result.objects, 1u) << "only tier/host goes";
  EXPECT_GE(result.bytes, kMiB + 4096) << "tier/host and the host copy of tier/host+gpu1";
  EXPECT_LT(result.bytes, kMiB + 64 * 1024);
  ASSERT_OK_AND_ASSIGN(bool host_only, client_->Contains(Id("tier/host")));
  EXPECT_FALSE(host_only);
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(Id("tier/host+gpu1")));
  EXPECT_FALSE(details.info.on_host);
  EXPECT_EQ(details.info.gpus, std::vector<uint32_t>{1});
  ASSERT_OK_AND_ASSIGN(StoreStatus after, client_->GetStatus());
  EXPECT_EQ(after.evictions, before.evictions + 1);
  EXPECT_EQ(after.replicas_dropped, before.replicas_dropped + 1);
}

TEST_F(AdminGpuTest, HexdumpOfAnObjectOnlyOnGpusFailsAndLeavesItThere) {
  ExpectFails({"show", "tier/gpu0", "--hexdump", "16"},
              "--hexdump shows bytes in host memory, and 'tier/gpu0' (object " +
                  Id("tier/gpu0").Hex() +
                  ") has no copy there (it is on gpu0); depotctl does not read GPU memory");
  ASSERT_OK_AND_ASSIGN(ObjectDetails details, client_->Describe(Id("tier/gpu0")));
  EXPECT_FALSE(details.info.on_host) << "show copied the object to host memory";
  EXPECT_EQ(details.replicas.size(), 1u);

  // An object with a copy in host memory shows its bytes, whatever else it is on.
  ProgramRun show = Depotctl({"show", "tier/host+gpu1", "--hexdump", "16"});
  ASSERT_EQ(show.exit_code, 0) << show.Explain();
  const std::vector<std::byte> bytes = SeededBytes(16, 4);
  char first[8];
  std::snprintf(first, sizeof(first), "%02x %02x", static_cast<unsigned>(bytes[0]),
                static_cast<unsigned>(bytes[1]));
  EXPECT_TRUE(Has(show.out, "00000000  " + std::string(first))) << show.out;
}

}  // namespace
}  // namespace depot::testing
