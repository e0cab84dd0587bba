// depotctl's operator view against a real depotd with known contents: show (fields, holders,
// hexdump), clients, verify (intact and corrupted objects), evict, the ls filters, and clear
// errors for bad input.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
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
  auto rows = LinesWith(show.out, " " + pid + " ");
  ASSERT_EQ(rows.size(), 1u) << show.out;
  EXPECT_TRUE(Has(rows[0], "admin_test")) << rows[0];

  ProgramRun json = Depotctl({"show", "admin/held", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.Explain();
  EXPECT_TRUE(Has(json.out, "\"ref_count\": 1,")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"checksum\": \"" + Hex64(Xxh3(bytes)) + "\"")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"holders\": [{\"session_id\": ")) << json.out;
  EXPECT_TRUE(Has(json.out, "\"pid\": " + pid + ", \"uid\": " + std::to_string(::getuid()) +
                                ", \"command\": \"admin_test\""))
      << json.out;
  EXPECT_TRUE(Has(json.out, "\"references\": 1}]")) << json.out;
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
  ExpectFails({"ls", "--tier", "gpu"}, "GPU tiers and devices are not available yet");
  ExpectFails({"ls", "--tier", "gpu:0"}, "GPU tiers and devices are not available yet");
  ExpectFails({"verify"}, "name the objects to verify");
  ExpectFails({"verify", "admin/x", "--all"}, "not both");
  ExpectFails({"verify", "admin/never-was"}, "1 of 1 objects do not exist");
  ExpectFails({"evict"}, "give either --bytes SIZE or --all-unreferenced");
  ExpectFails({"evict", "--bytes", "1MiB", "--all-unreferenced"}, "give either");
  ExpectFails({"evict", "--bytes", "0"}, "--bytes must be more than 0");
}

}  // namespace
}  // namespace depot::testing
