// depotctl run as a user runs it, against a real depotd: put and get files byte for byte,
// list, remove, and clear errors when something is missing.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "depotctl_json.h"
#include "test_support.h"

#ifndef DEPOTCTL_PATH
#error "DEPOTCTL_PATH must name the depotctl binary (set by tests/CMakeLists.txt)"
#endif

namespace depot::testing {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::byte> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void WriteFile(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

class DepotctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace();
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
    input_ = daemon_->dir() + "/input.bin";
    WriteFile(input_, contents_);
  }

  // Runs depotctl with `args`, talking to this test's daemon.
  ProgramRun Depotctl(std::vector<std::string> args) {
    args.insert(args.begin(), {DEPOTCTL_PATH, "--socket", daemon_->socket_path()});
    return RunProgram(args);
  }

  std::optional<TestDaemon> daemon_;
  // A few MiB of random bytes, not a multiple of any page or word size.
  const std::vector<std::byte> contents_ = SeededBytes(3 * (1 << 20) + 17, 2024);
  std::string input_;
};

TEST_F(DepotctlTest, PutWithNamePrintsTheIdOfThatName) {
  ProgramRun put = Depotctl({"put", input_, "--name", "ctl/file"});
  ASSERT_EQ(put.exit_code, 0) << put.Explain();
  EXPECT_EQ(Trim(put.out), ObjectId::FromName("ctl/file").Hex());
}

TEST_F(DepotctlTest, PutThenGetByNameRoundTripsTheFileByteForByte) {
  ProgramRun put = Depotctl({"put", input_, "--name", "ctl/file"});
  ASSERT_EQ(put.exit_code, 0) << put.Explain();
  const std::string output = daemon_->dir() + "/output.bin";
  ProgramRun get = Depotctl({"get", "ctl/file", "-o", output});
  ASSERT_EQ(get.exit_code, 0) << get.Explain();
  const std::vector<std::byte> read = ReadFile(output);
  ASSERT_EQ(read.size(), contents_.size());
  EXPECT_TRUE(SameBytes(read, contents_));
}

TEST_F(DepotctlTest, GetByPrintedIdRoundTripsTheFile) {
  ProgramRun put = Depotctl({"put", input_});
  ASSERT_EQ(put.exit_code, 0) << put.Explain();
  const std::string id = Trim(put.out);
  ASSERT_TRUE(ObjectId::FromHex(id).has_value()) << "not an id: '" << id << "'";
  const std::string output = daemon_->dir() + "/output.bin";
  ProgramRun get = Depotctl({"get", id, "-o", output});
  ASSERT_EQ(get.exit_code, 0) << get.Explain();
  EXPECT_TRUE(SameBytes(ReadFile(output), contents_));
}

TEST_F(DepotctlTest, PutFileIsReadableThroughTheClientLibrary) {
  ProgramRun put = Depotctl({"put", input_, "--name", "ctl/shared"});
  ASSERT_EQ(put.exit_code, 0) << put.Explain();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(Buffer buffer, client.Get(ObjectId::FromName("ctl/shared")));
  EXPECT_TRUE(SameBytes(buffer.data(), contents_));
}

TEST_F(DepotctlTest, LsJsonListsTheObjectWithItsName) {
  ASSERT_EQ(Depotctl({"put", input_, "--name", "ctl/listed"}).exit_code, 0);
  ProgramRun ls = Depotctl({"ls", "--json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.Explain();
  const std::string out = Trim(ls.out);
  EXPECT_TRUE(out.starts_with("[") && out.ends_with("]")) << out;
  EXPECT_NE(out.find("\"ctl/listed\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"" + ObjectId::FromName("ctl/listed").Hex() + "\""), std::string::npos)
      << out;
  EXPECT_NE(out.find(std::to_string(contents_.size())), std::string::npos) << "size: " << out;
}

TEST_F(DepotctlTest, LsJsonOfEmptyStoreIsAnEmptyArray) {
  ProgramRun ls = Depotctl({"ls", "--json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.Explain();
  EXPECT_EQ(Trim(ls.out), "[]");
}

// The one place of a status field is its table: whatever the daemon sends, depotctl prints.
TEST_F(DepotctlTest, StatusJsonHasEveryFieldOfTheTablesWithTheValueTheClientReads) {
  ASSERT_EQ(Depotctl({"put", input_, "--name", "ctl/status"}).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
  ASSERT_OK_AND_ASSIGN(StoreStatus read, client.GetStatus());
  ProgramRun status = Depotctl({"status", "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.Explain();
  ASSERT_OK_AND_ASSIGN(StoreStatus again, client.GetStatus());
  // Settings are one object of name: value; depotctl's own session counts among the clients
  // and in the daemon's memory for them.
  ExpectJsonHasEveryField(status.out, read, again,
                          {"settings", "clients", "metadata_bytes", "request_bytes"});
  for (const Setting& setting : read.settings) {
    EXPECT_NE(status.out.find(ctl::JsonString(setting.name) + ": " + ctl::JsonValue(setting.value)),
              std::string::npos)
        << setting.name << " in " << status.out;
  }
}

TEST_F(DepotctlTest, ShowJsonHasEveryFieldOfTheTablesWithTheValueTheClientReads) {
  ASSERT_EQ(Depotctl({"put", input_, "--name", "ctl/show", "--checksum"}).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
  const ObjectId id = ObjectId::FromName("ctl/show");
  ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(id));
  ASSERT_OK_AND_ASSIGN(ObjectDetails read, client.Describe(id));
  ProgramRun show = Depotctl({"show", "ctl/show", "--json"});
  ASSERT_EQ(show.exit_code, 0) << show.Explain();
  ASSERT_OK_AND_ASSIGN(ObjectDetails again, client.Describe(id));
  // The checksum is hex digits; a holder's tiers are references_by_tier; replicas are shown
  // by tier name.
  ExpectJsonHasEveryField(show.out, read.info, again.info, {"checksum"});
  ExpectJsonHasEveryField(show.out, read.holders[0], again.holders[0], {"tiers"});

  ProgramRun clients = Depotctl({"clients", "--json"});
  ASSERT_EQ(clients.exit_code, 0) << clients.Explain();
  ASSERT_OK_AND_ASSIGN(std::vector<ClientInfo> listed, client.Clients());
  ExpectJsonHasEveryField(clients.out, listed[0], listed[0], {"requests"});
}

TEST_F(DepotctlTest, GetAfterRmFailsWithAClearMessage) {
  ASSERT_EQ(Depotctl({"put", input_, "--name", "ctl/doomed"}).exit_code, 0);
  ProgramRun rm = Depotctl({"rm", "ctl/doomed"});
  ASSERT_EQ(rm.exit_code, 0) << rm.Explain();

  const std::string output = daemon_->dir() + "/output.bin";
  ProgramRun get = Depotctl({"get", "ctl/doomed", "-o", output});
  EXPECT_NE(get.exit_code, 0) << get.Explain();
  EXPECT_NE(get.err.find("ctl/doomed"), std::string::npos) << get.err;
  EXPECT_NE(get.err.find("does not exist"), std::string::npos) << get.err;
  EXPECT_FALSE(Exists(output)) << "a failed get created its output file";
}

TEST_F(DepotctlTest, RmOfUnknownObjectFailsNamingIt) {
  ProgramRun rm = Depotctl({"rm", "ctl/never-was"});
  EXPECT_NE(rm.exit_code, 0) << rm.Explain();
  EXPECT_NE(rm.err.find("ctl/never-was"), std::string::npos) << rm.err;
}

TEST_F(DepotctlTest, PutOfMissingFileFailsNamingIt) {
  const std::string missing = daemon_->dir() + "/no-such-file";
  ProgramRun put = Depotctl({"put", missing});
  EXPECT_NE(put.exit_code, 0) << put.Explain();
  EXPECT_NE(put.err.find(missing), std::string::npos) << put.err;
}

TEST_F(DepotctlTest, WithoutADaemonFailsSayingNoDaemonListens) {
  const std::string nowhere = daemon_->dir() + "/nobody-here.sock";
  ProgramRun ls = RunProgram({DEPOTCTL_PATH, "--socket", nowhere, "ls"});
  EXPECT_NE(ls.exit_code, 0) << ls.Explain();
  EXPECT_NE(ls.err.find("no depot daemon"), std::string::npos) << ls.err;
  EXPECT_NE(ls.err.find(nowhere), std::string::npos) << ls.err;
}

TEST_F(DepotctlTest, SocketCanComeFromTheEnvironment) {
  ASSERT_EQ(Depotctl({"put", input_, "--name", "ctl/env"}).exit_code, 0);
  ProgramRun ls =
      RunProgram({DEPOTCTL_PATH, "ls", "--json"}, {{"DEPOT_SOCKET", daemon_->socket_path()}});
  ASSERT_EQ(ls.exit_code, 0) << ls.Explain();
  EXPECT_NE(ls.out.find("\"ctl/env\""), std::string::npos) << ls.out;
}

// What clients name (client names, function names, labels) reaches a terminal and JSON
// readers harmlessly: control characters (C1 too) and bytes that are not UTF-8 become '?' on
// a terminal and escapes in JSON, which stays valid UTF-8.
TEST(DepotctlFormat, TextFromClientsCannotDriveATerminalOrBreakJson) {
  EXPECT_EQ(ctl::Printable("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(ctl::Printable("\x1b[2J\n"), "?[2J?");
  const std::string csi = "\xc2\x9b";  // U+009B, a C1 control: "control sequence introducer"
  EXPECT_EQ(ctl::Printable(csi + "31m"), "?31m");
  EXPECT_EQ(ctl::Printable(std::string("\x9b") + "31m\x7f"), "?31m?");
  EXPECT_EQ(ctl::Printable("\xe2\x82"), "??");  // a cut character
  EXPECT_EQ(ctl::JsonString("\"\xc3\xa9\n"), "\"\\\"\xc3\xa9\\n\"");
  EXPECT_EQ(ctl::JsonString("\xc2\x9b"), "\"\\u009b\"");
  EXPECT_EQ(ctl::JsonString("a\xff"
                            "b"),
            "\"a\\ufffdb\"");
}

}  // namespace
}  // namespace depot::testing
