// A connection on its own: frames in, replies and descriptors out, back-pressure, and the
// ways a client can break it, over a real socket pair with no daemon.
#include "store/connection.h"

#include <capnp/serialize.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <optional>

#include "store_parts.h"

namespace depot::store {
namespace {

using testing::Tiers;
using Socket = boost::asio::local::stream_protocol::socket;

// Records what the connection hands it; its replies go back through the connection.
struct Recorder final : Connection::Handler {
  void OnFrame(kj::ArrayPtr<const capnp::word> payload) override {
    capnp::FlatArrayMessageReader message(payload);
    ids.push_back(message.getRoot<wire::Request>().getId());
  }
  bool Saturated() const override { return saturated; }
  Status Charge(int64_t bytes) override {
    charged += bytes;
    return Status::OK();
  }
  void OnClosed(const std::string& why, bool protocol_error) override {
    reason = why;
    violation = protocol_error;
  }

  std::vector<uint64_t> ids;
  bool saturated = false;
  int64_t charged = 0;
  std::optional<std::string> reason;
  bool violation = false;
};

// A segment a reply carried.
struct SentSegment {
  uint32_t index;
  bool writable;
  bool dedicated;
  uint32_t generation = 0;
  bool operator==(const SentSegment&) const = default;
};

class ConnectionTest : public ::testing::Test {
 protected:
  ConnectionTest() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    client_.reset(fds[0]);
    connection_ = std::make_shared<Connection>(
        loop_, Socket(loop_, boost::asio::local::stream_protocol(), fds[1]), 1 << 20, *tiers_.arena,
        std::span<gpu::DevicePool* const>(gpus_), Arena::kTrustedWriters, recorder_);
    connection_->Start();
  }
  ~ConnectionTest() override { connection_->Close("test over"); }

  // Sends a reply with `attach` and reads it back: the segments it carried (each with one
  // descriptor, checked here).
  std::vector<SentSegment> SendAndRead(const ReplyAttachments& attach);

  // Sends a request frame with id `id` (and `fds`) from the client's end.
  void SendRequest(uint64_t id, std::vector<int> fds = {}) {
    capnp::MallocMessageBuilder message;
    message.initRoot<wire::Request>().setId(id);
    auto frame = ipc::EncodeFrame(message, std::move(fds));
    ASSERT_TRUE(frame.ok());
    ASSERT_TRUE(ipc::WriteFrameFully(client_.get(), *frame).ok());
  }
  // Runs the loop until `done`, for at most 10 s (far more than any of it takes).
  template <typename Pred>
  bool RunUntil(Pred done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      if (loop_.stopped()) loop_.restart();  // it ran out of work earlier in the test
      loop_.run_one_for(std::chrono::milliseconds(50));
    }
    return done();
  }
  // The next reply on the client's end, with its descriptors.
  ipc::FrameReader::Frame ReadReply() {
    while (true) {
      auto frame = reader_.Next();
      EXPECT_TRUE(frame.ok());
      if (frame.ok() && frame->has_value()) return std::move(**frame);
      bool would_block = false;
      auto n = reader_.ReadSome(client_.get(), &would_block);
      EXPECT_TRUE(n.ok() && *n > 0);
      if (!n.ok() || *n == 0) return {};
    }
  }

  Tiers tiers_;
  std::vector<gpu::DevicePool*> gpus_ = tiers_.gpu_pools();
  boost::asio::io_context loop_;
  Recorder recorder_;
  ipc::UniqueFd client_;
  ipc::FrameReader reader_{1 << 20};
  std::shared_ptr<Connection> connection_;
};

TEST_F(ConnectionTest, HandsTheHandlerEachFrameInOrder) {
  for (uint64_t id = 1; id <= 40; ++id) SendRequest(id);  // more than one turn's worth
  ASSERT_TRUE(RunUntil([&] { return recorder_.ids.size() == 40; }));
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(recorder_.ids[i], i + 1);
}

TEST_F(ConnectionTest, ASaturatedHandlerGetsNothingUntilItResumes) {
  recorder_.saturated = true;
  SendRequest(1);
  SendRequest(2);
  loop_.run_for(std::chrono::milliseconds(100));  // whatever runs, nothing may be handed over
  EXPECT_TRUE(recorder_.ids.empty());
  recorder_.saturated = false;
  connection_->Resume();
  ASSERT_TRUE(RunUntil([&] { return recorder_.ids.size() == 2; }));
}

TEST_F(ConnectionTest, AClientThatSendsDescriptorsBreaksTheProtocol) {
  SendRequest(1, {client_.get()});
  ASSERT_TRUE(RunUntil([&] { return recorder_.reason.has_value(); }));
  EXPECT_TRUE(recorder_.violation);
  EXPECT_NE(recorder_.reason->find("file descriptors"), std::string::npos) << *recorder_.reason;
  EXPECT_TRUE(connection_->closed());
}

TEST_F(ConnectionTest, AClientThatHangsUpClosesIt) {
  client_.reset();
  ASSERT_TRUE(RunUntil([&] { return recorder_.reason.has_value(); }));
  EXPECT_FALSE(recorder_.violation);
  EXPECT_EQ(*recorder_.reason, "client disconnected");
}

std::vector<SentSegment> ConnectionTest::SendAndRead(const ReplyAttachments& attach) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(9);
  connection_->Send(message, reply, attach);
  ipc::FrameReader::Frame frame = ReadReply();
  capnp::FlatArrayMessageReader read(frame.payload);
  std::vector<SentSegment> sent;
  for (auto s : read.getRoot<wire::Reply>().getNewSegments()) {
    sent.push_back({s.getIndex(), s.getWritable(), s.getDedicated(), s.getGeneration()});
  }
  EXPECT_EQ(frame.fds.size(), sent.size());
  return sent;
}

TEST_F(ConnectionTest, ASharedSegmentGoesToTheClientOnceReadOnlyAndOnceWritable) {
  // Segment 0 holds an object of this client's class (the trusted one).
  ASSERT_TRUE(tiers_.arena->Allocate(64).has_value());
  const uint32_t zero = 0;
  const std::vector<ReplyAttachments> replies = {
      {.segments = std::span(&zero, 1)},
      {.segments = std::span(&zero, 1)},                         // sent already: nothing
      {.segments = std::span(&zero, 1), .writable_segment = 0},  // the writable one, once
      {.segments = std::span(&zero, 1), .writable_segment = 0},
  };
  const std::vector<std::vector<SentSegment>> expected = {
      {{0, false, false}}, {}, {{0, true, false}}, {}};
  for (size_t i = 0; i < replies.size(); ++i) {
    EXPECT_EQ(SendAndRead(replies[i]), expected[i]) << "reply " << i;
  }
}

TEST_F(ConnectionTest, AnotherClassesSegmentIsNeverSentWritable) {
  // Segment 0 holds another uid's object: this (trusted) client may read it, never write it.
  auto theirs = tiers_.arena->Allocate(64, /*writers=*/4242);
  ASSERT_TRUE(theirs.has_value());
  ASSERT_EQ(theirs->region, 0u);
  const uint32_t zero = 0;
  EXPECT_EQ(SendAndRead({.segments = std::span(&zero, 1), .writable_segment = 0}),
            (std::vector<SentSegment>{{0, false, false}}));
  EXPECT_EQ(SendAndRead({.segments = std::span(&zero, 1), .writable_segment = 0}),
            std::vector<SentSegment>{});
  // Empty, it goes to this client's class with a new file: sent again, both ways.
  tiers_.arena->Free(theirs->region, theirs->handle);
  tiers_.WaitPrepared();
  auto mine = tiers_.arena->AllocateIn(0, 64, Arena::kTrustedWriters);
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(tiers_.arena->generation(0), 1u);
  EXPECT_EQ(SendAndRead({.segments = std::span(&zero, 1), .writable_segment = 0}),
            (std::vector<SentSegment>{{0, false, false, 1}, {0, true, false, 1}}));
  EXPECT_EQ(SendAndRead({.segments = std::span(&zero, 1), .writable_segment = 0}),
            std::vector<SentSegment>{});
}

TEST_F(ConnectionTest, AReplyWaitingToBeSentKeepsTheFilesItNames) {
  // A small send buffer, and a large reply the client does not read: the next one waits.
  const int small = 4096;
  ASSERT_EQ(::setsockopt(connection_->native_handle(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small),
            0);
  auto theirs = tiers_.arena->Allocate(64, /*writers=*/4242);
  ASSERT_TRUE(theirs.has_value());
  struct stat before {};
  ASSERT_EQ(::fstat(tiers_.arena->read_fd(0), &before), 0);
  {
    capnp::MallocMessageBuilder message;
    auto reply = message.initRoot<wire::Reply>();
    reply.setId(8);
    reply.setMetrics(std::string(512 << 10, 'm'));  // within the reader's 1 MiB
    connection_->Send(message, reply);
  }
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  reply.setId(9);
  const uint32_t zero = 0;
  connection_->Send(message, reply, {.segments = std::span(&zero, 1)});
  // Meanwhile the segment empties and goes to another class with a new file: its old
  // descriptors are closed, and their numbers taken by whatever is opened next.
  tiers_.arena->Free(theirs->region, theirs->handle);
  tiers_.WaitPrepared();
  ASSERT_TRUE(tiers_.arena->AllocateIn(0, 64, Arena::kTrustedWriters).has_value());
  std::vector<ipc::UniqueFd> squatters;
  for (int i = 0; i < 8; ++i) squatters.emplace_back(::memfd_create("squatter", MFD_CLOEXEC));
  // The client reads on, as the loop sends: the waiting reply carries the file it named
  // when it was made.
  ASSERT_EQ(::fcntl(client_.get(), F_SETFL, O_NONBLOCK), 0);
  std::vector<std::pair<uint64_t, std::vector<ipc::UniqueFd>>> replies;
  ASSERT_TRUE(RunUntil([&] {
    while (true) {
      auto frame = reader_.Next();
      EXPECT_TRUE(frame.ok());
      if (frame.ok() && frame->has_value()) {
        capnp::FlatArrayMessageReader read((*frame)->payload);
        replies.emplace_back(read.getRoot<wire::Reply>().getId(), std::move((*frame)->fds));
        continue;
      }
      bool would_block = false;
      auto n = reader_.ReadSome(client_.get(), &would_block);
      if (!n.ok() || *n == 0) break;
    }
    return replies.size() == 2;
  }));
  ASSERT_EQ(replies[1].first, 9u);
  ASSERT_EQ(replies[1].second.size(), 1u);
  struct stat sent {};
  ASSERT_EQ(::fstat(replies[1].second[0].get(), &sent), 0);
  EXPECT_EQ(sent.st_ino, before.st_ino);
  EXPECT_EQ(sent.st_dev, before.st_dev);
}

TEST_F(ConnectionTest, OnlyTheSegmentsAReplyNamesGoWithIt) {
  // Two segments in use: the arena adds them as objects fill it.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(tiers_.arena->Allocate(4 * Tiers::kMiB).has_value());
  ASSERT_EQ(tiers_.arena->segment_count(), 2u);
  const std::vector<uint32_t> named = {1, 1};
  EXPECT_EQ(SendAndRead({.segments = named}), (std::vector<SentSegment>{{1, false, false}}))
      << "segment 0 is not named, so not sent; 1 is sent once";
  const std::vector<uint32_t> both = {0, 1};
  EXPECT_EQ(SendAndRead({.segments = both}), (std::vector<SentSegment>{{0, false, false}}));
}

TEST_F(ConnectionTest, ADedicatedSegmentGoesWithEveryReplyThatNamesIt) {
  // Larger than a segment (4 MiB): a segment of its own.
  auto block = tiers_.arena->Allocate(5 * Tiers::kMiB);
  ASSERT_TRUE(block.has_value());
  ASSERT_TRUE(Arena::IsDedicated(block->region));
  const uint32_t segment = block->region;
  const std::vector<uint32_t> twice = {segment, segment};
  const SentSegment read{segment, false, true};
  EXPECT_EQ(SendAndRead({.segments = twice, .writable_segment = segment}),
            (std::vector<SentSegment>{read, {segment, true, true}}));
  EXPECT_EQ(SendAndRead({.segments = twice}), std::vector<SentSegment>{read});
  EXPECT_EQ(SendAndRead({.segments = twice}), std::vector<SentSegment>{read});
  tiers_.arena->Free(block->region, block->handle);
}

TEST_F(ConnectionTest, AClosedConnectionSendsNothingAndTellsItsHandlerOnce) {
  connection_->Close("first");
  connection_->Close("second");
  connection_->Violation("third");
  EXPECT_EQ(*recorder_.reason, "first");
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Reply>();
  connection_->Send(message, reply);  // dropped
  char byte;
  EXPECT_EQ(::read(client_.get(), &byte, 1), 0);  // end of stream, nothing before it
}

}  // namespace
}  // namespace depot::store
