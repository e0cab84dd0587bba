// The wire protocol spoken by hand (ipc framing, no client library) against a real depotd:
// the handshake, replies and their error codes, and bad input of every kind, which must
// close only the offending session.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon.h"
#include "depot/ipc/framing.h"
#include "depot/ipc/object_header.h"
#include "depot/ipc/protocol.h"
#include "depot/object_id.h"
#include "raw_session.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class ProtocolTest : public ::testing::Test {
 protected:
  explicit ProtocolTest(std::vector<std::string> flags = {}) : flags_(std::move(flags)) {}

  void SetUp() override {
    daemon_.emplace(flags_);
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
  }

  std::unique_ptr<RawSession> Open() {
    return std::make_unique<RawSession>(daemon_->socket_path());
  }

  // A session that has said hello.
  std::unique_ptr<RawSession> OpenSession() {
    auto s = Open();
    auto reply = s->Call(1, [](auto r) { FillHello(r); });
    EXPECT_TRUE(reply && reply->get().getError() == wire::ErrorCode::OK && reply->get().isHello());
    return s;
  }

  // Checks that `s` is still served: it creates, seals and gets an object of its own.
  void ExpectServes(RawSession& s, const std::string& name) {
    const ObjectId id = ObjectId::FromName("protocol/" + name);
    auto created = s.Call(100, CreateOf(id, 64));
    ASSERT_TRUE(created);
    ASSERT_EQ(created->get().getError(), wire::ErrorCode::OK) << created->get().getMessage().cStr();
    auto sealed = s.Call(101, SealOf(id));
    ASSERT_TRUE(sealed);
    ASSERT_EQ(sealed->get().getError(), wire::ErrorCode::OK) << sealed->get().getMessage().cStr();
    auto got = s.Call(102, GetOf({id}));
    ASSERT_TRUE(got);
    ASSERT_TRUE(got->get().isGet());
    ASSERT_EQ(got->get().getGet().size(), 1u);
    EXPECT_EQ(got->get().getGet()[0].getError(), wire::ErrorCode::OK);
  }

  std::vector<std::string> flags_;
  std::optional<TestDaemon> daemon_;
};

TEST_F(ProtocolTest, HelloReplyCarriesVersionSessionAndTheHeaderTable) {
  auto s = Open();
  auto reply = s->Call(1, [](auto r) { FillHello(r); });
  ASSERT_TRUE(reply);
  auto r = reply->get();
  ASSERT_EQ(r.getError(), wire::ErrorCode::OK) << r.getMessage().cStr();
  ASSERT_TRUE(r.isHello());
  auto hello = r.getHello();
  EXPECT_EQ(hello.getProtocolVersion(), ipc::kProtocolVersion);
  EXPECT_NE(hello.getEpoch(), 0u);
  EXPECT_NE(hello.getSessionId(), 0u);
  EXPECT_GT(hello.getHeaderSlots(), 0u);
  EXPECT_EQ(hello.getMaxFrameBytes(), ipc::kDefaultMaxFrameBytes);
  EXPECT_EQ(hello.getMaxBatch(), ipc::kDefaultMaxBatch);
  EXPECT_STRNE(hello.getDaemonVersion().cStr(), "");

  ASSERT_EQ(reply->fds.size(), 2u)
      << "the hello reply carries exactly the header table and the lease table";
  EXPECT_GT(hello.getLeaseEntries(), 0u);
  const size_t bytes = size_t{hello.getHeaderSlots()} * sizeof(ipc::ObjectHeader);
  struct stat st {};
  ASSERT_EQ(::fstat(reply->fds[0].get(), &st), 0);
  EXPECT_GE(static_cast<size_t>(st.st_size), bytes);
  void* table = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, reply->fds[0].get(), 0);
  ASSERT_NE(table, MAP_FAILED);
  ::munmap(table, bytes);
}

TEST_F(ProtocolTest, WrongProtocolVersionIsAnsweredWithProtocolMismatchThenClosed) {
  auto s = Open();
  auto reply = s->Call(1, [](auto r) { FillHello(r, 999); });
  ASSERT_TRUE(reply);
  auto r = reply->get();
  EXPECT_EQ(r.getError(), wire::ErrorCode::PROTOCOL_MISMATCH);
  const std::string message = r.getMessage().cStr();
  EXPECT_NE(message.find("999"), std::string::npos) << message;
  EXPECT_NE(message.find("version " + std::to_string(ipc::kProtocolVersion)), std::string::npos)
      << message;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000)));
}

TEST_F(ProtocolTest, HelloOfTheVersionBeforeIsRefusedNamingBothVersions) {
  // A client of the release before: its releases would be of a form this daemon retired.
  const uint32_t before = ipc::kProtocolVersion - 1;
  auto s = Open();
  auto reply = s->Call(1, [&](auto r) { FillHello(r, before); });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::PROTOCOL_MISMATCH);
  const std::string message = reply->get().getMessage().cStr();
  EXPECT_NE(message.find("version " + std::to_string(before)), std::string::npos) << message;
  EXPECT_NE(message.find("version " + std::to_string(ipc::kProtocolVersion)), std::string::npos)
      << message;
  EXPECT_NE(message.find("same release"), std::string::npos) << message;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000)));
}

TEST_F(ProtocolTest, RequestBeforeHelloClosesTheSession) {
  auto s = Open();
  ASSERT_OK(s->Send(1, StatusRequest()));
  int replies = 0;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000), &replies));
  EXPECT_EQ(replies, 0);
}

TEST_F(ProtocolTest, RequestIdZeroIsRefusedForAnythingButRelease) {
  auto s = OpenSession();
  ASSERT_OK(s->Send(0, StatusRequest()));
  int replies = 0;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000), &replies));
  EXPECT_EQ(replies, 0);
}

TEST_F(ProtocolTest, ReleaseOfAnObjectNotHeldIsNotHeld) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/not-held");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(id)));
  ASSERT_TRUE(s->Call(4, ListOf(IdList::kRelease, {id})));  // the creator's reference

  auto reply = s->Call(5, ListOf(IdList::kRelease, {id}));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::NOT_HELD);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find(id.Hex()), std::string::npos);
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-not-held"));
}

TEST_F(ProtocolTest, ReleaseOfAnUnknownObjectIsNotHeld) {
  auto s = OpenSession();
  auto reply = s->Call(2, ListOf(IdList::kRelease, {ObjectId::FromName("protocol/nowhere")}));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::NOT_HELD);
}

TEST_F(ProtocolTest, CreateThatSealsWithoutAllItsDataIsRefused) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/seal-without-data");
  auto reply = s->Call(2, [&](wire::Request::Builder r) {
    auto create = r.initCreate();
    ipc::ToWire(id, create.initId());
    create.setDataSize(64);
    create.setData(kj::heapArray<kj::byte>(10));  // 10 of the 64 bytes
    create.setSeal(true);
  });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find("must carry all 64 bytes"),
            std::string::npos);
  // Nothing was created: the id is free.
  auto created = s->Call(3, CreateOf(id, 64));
  ASSERT_TRUE(created);
  EXPECT_EQ(created->get().getError(), wire::ErrorCode::OK);
}

TEST_F(ProtocolTest, CreateWithDataSealAndReleaseIsAPutInOneRequest) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/inline-put");
  auto reply = s->Call(2, [&](wire::Request::Builder r) {
    auto create = r.initCreate();
    ipc::ToWire(id, create.initId());
    create.setDataSize(16);
    create.setData(kj::heapArray<kj::byte>(16));
    create.setSeal(true);
    create.setRelease(true);
  });
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->get().getError(), wire::ErrorCode::OK);
  // Sealed, and the creator holds no reference: releasing it again is NotHeld.
  auto got = s->Call(3, GetOf({id}));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->get().getGet()[0].getError(), wire::ErrorCode::OK);
  auto release = s->Call(4, ListOf(IdList::kRelease, {id, id}));
  ASSERT_TRUE(release);
  EXPECT_EQ(release->get().getError(), wire::ErrorCode::NOT_HELD);
}

TEST_F(ProtocolTest, ReleaseWithIdZeroGetsNoReply) {
  auto s = OpenSession();
  ASSERT_OK(s->Send(0, ListOf(IdList::kRelease, {ObjectId::FromName("protocol/nowhere")})));
  auto reply = s->Call(7, StatusRequest());
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getId(), 7u) << "the release with id 0 was answered";
}

TEST_F(ProtocolTest, ReleaseListingAnIdTwiceReleasesTwoReferences) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/twice");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(id)));
  ASSERT_TRUE(s->Call(4, GetOf({id})));  // a second reference
  auto both = s->Call(5, ListOf(IdList::kRelease, {id, id}));
  ASSERT_TRUE(both);
  EXPECT_EQ(both->get().getError(), wire::ErrorCode::OK) << both->get().getMessage().cStr();
  auto third = s->Call(6, ListOf(IdList::kRelease, {id}));
  ASSERT_TRUE(third);
  EXPECT_EQ(third->get().getError(), wire::ErrorCode::NOT_HELD);
}

TEST_F(ProtocolTest, ReleaseStillReleasesTheHeldIdsWhenAnotherIsNotHeld) {
  auto s = OpenSession();
  const ObjectId held = ObjectId::FromName("protocol/held");
  ASSERT_TRUE(s->Call(2, CreateOf(held, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(held)));
  auto mixed =
      s->Call(4, ListOf(IdList::kRelease, {ObjectId::FromName("protocol/stranger"), held}));
  ASSERT_TRUE(mixed);
  EXPECT_EQ(mixed->get().getError(), wire::ErrorCode::NOT_HELD);
  auto status = s->Call(5, StatusRequest());
  ASSERT_TRUE(status);
  EXPECT_EQ(status->get().getStatus().getHeldBytes(), 0u) << "the held id was not released";
}

// Releases are the most frequent message after gets: a host id costs what it cost in the
// host-only release of protocol 5, 16 bytes, and a frame's tier groups a few words each.
TEST(ReleaseEncodingTest, AHostIdCostsSixteenBytesAndATierGroupThreeWords) {
  auto frame_bytes = [](const std::vector<TierIds>& groups) {
    capnp::MallocMessageBuilder message(1 << 14);  // words: one segment, no far pointers
    auto request = message.initRoot<wire::Request>();
    ReleaseOf(groups)(request);
    auto frame = ipc::EncodeFrame(message);
    EXPECT_TRUE(frame.ok());
    return frame.ok() ? frame->bytes.size() * sizeof(capnp::word) : 0;
  };
  const auto ids = Ids("protocol/cost", 1024);
  const size_t one = frame_bytes({{ipc::kHostDevice, {ids[0]}}});
  const size_t many = frame_bytes({{ipc::kHostDevice, ids}});
  EXPECT_EQ(many - one, 1023u * 16);
  // The same ids on two tiers: one more group.
  const std::vector<ObjectId> half(ids.begin(), ids.begin() + 512);
  const std::vector<ObjectId> rest(ids.begin() + 512, ids.end());
  EXPECT_EQ(frame_bytes({{ipc::kHostDevice, half}, {0, rest}}) - many, 3u * 8);
}

TEST_F(ProtocolTest, RetiredReleaseFormsAreInvalidArgumentAndTheSessionGoesOn) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/retired");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(id)));
  for (bool refs : {false, true}) {
    auto reply = s->Call(4, [&](wire::Request::Builder r) {
      refs ? r.setRetiredReleaseRefs() : r.setRetiredRelease();
    });
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
    EXPECT_NE(std::string(reply->get().getMessage().cStr()).find("retired in protocol version 6"),
              std::string::npos)
        << reply->get().getMessage().cStr();
  }
  // The creator's reference is still held, and the one release form gives it back.
  auto released = s->Call(5, ReleaseOf({{ipc::kHostDevice, {id}}}));
  ASSERT_TRUE(released);
  EXPECT_EQ(released->get().getError(), wire::ErrorCode::OK) << released->get().getMessage().cStr();
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-retired"));
}

TEST_F(ProtocolTest, ReleaseOnTiersTheDaemonDoesNotServeIsInvalidArgumentAndReleasesTheRest) {
  auto s = OpenSession();
  const ObjectId held = ObjectId::FromName("protocol/bad-tier-held");
  ASSERT_TRUE(s->Call(2, CreateOf(held, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(held)));
  // No GPUs here: every tier but the host is wrong, whatever its number (255 and -2 would
  // alias the host tier if the daemon kept only 8 bits of it). An empty group counts too.
  auto reply = s->Call(
      4,
      ReleaseOf(
          {{0, {held}}, {255, {held}}, {-2, {}}, {INT32_MIN, {held}}, {ipc::kHostDevice, {held}}}));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  const std::string message = reply->get().getMessage().cStr();
  EXPECT_NE(message.find("there is no GPU 0"), std::string::npos) << message;
  auto status = s->Call(5, StatusRequest());
  ASSERT_TRUE(status);
  EXPECT_EQ(status->get().getStatus().getHeldBytes(), 0u) << "the host reference was not released";
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-bad-tiers"));
}

TEST_F(ProtocolTest, ReleaseOfMaxBatchIdsNeverHeldIsNotHeldAndOneMoreIsLimitExceeded) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  auto ids = Ids("protocol/never-held", ipc::kDefaultMaxBatch);
  auto reply = s->Call(2, ListOf(IdList::kRelease, ids));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::NOT_HELD);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find(ids[0].Hex()), std::string::npos)
      << "the message names the first id: " << reply->get().getMessage().cStr();
  // One more id, in a group of its own: over the limit, answered, and nothing released.
  auto over = s->Call(3, ReleaseOf({{ipc::kHostDevice, ids}, {ipc::kHostDevice, {ids[0]}}}));
  ASSERT_TRUE(over);
  EXPECT_EQ(over->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  EXPECT_NE(std::string(over->get().getMessage().cStr()).find(std::to_string(ids.size() + 1)),
            std::string::npos)
      << over->get().getMessage().cStr();
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-huge-release"));
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "beside-huge-release"));
}

TEST_F(ProtocolTest, LocateSaysWhereEachIdIsAndRefusesMoreThanABatch) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/locate");
  auto created = s->Call(2, CreateOf(id, 100, "meta"));
  ASSERT_TRUE(created);
  auto sealed = s->Call(3, [&](auto r) { ipc::ToWire(id, r.initSeal()); });
  ASSERT_TRUE(sealed);
  ASSERT_EQ(sealed->get().getError(), wire::ErrorCode::OK);
  const ObjectId never = ObjectId::FromName("protocol/never-put");
  auto reply = s->Call(4, ListOf(IdList::kLocate, {id, never, ObjectId()}));
  ASSERT_TRUE(reply);
  auto placements = reply->get().getLocate();
  ASSERT_EQ(placements.size(), 3u);
  EXPECT_TRUE(placements[0].getFound());
  EXPECT_EQ(placements[0].getTiers(), ipc::kTierHost);
  EXPECT_EQ(placements[0].getDataSize(), 100u);
  EXPECT_EQ(placements[0].getMetadataSize(), 4u);
  EXPECT_FALSE(placements[1].getFound());
  EXPECT_FALSE(placements[2].getFound()) << "the nil id is found nowhere";
  EXPECT_EQ(placements[2].getTiers(), 0u);
  auto over =
      s->Call(5, ListOf(IdList::kLocate, Ids("protocol/locate-many", ipc::kDefaultMaxBatch + 1)));
  ASSERT_TRUE(over);
  EXPECT_EQ(over->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-huge-locate"));
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "beside-huge-locate"));
}

TEST_F(ProtocolTest, HeaderTableShowsStateAndReferenceCount) {
  auto s = Open();
  auto hello = s->Call(1, [](auto r) { FillHello(r); });
  ASSERT_TRUE(hello);
  ASSERT_EQ(hello->fds.size(), 2u);  // the header table, then the lease table
  const size_t bytes = size_t{hello->get().getHello().getHeaderSlots()} * sizeof(ipc::ObjectHeader);
  void* mapped = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, hello->fds[0].get(), 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const auto* table = static_cast<const ipc::ObjectHeader*>(mapped);

  const ObjectId id = ObjectId::FromName("protocol/header");
  auto created = s->Call(2, CreateOf(id, 100, "meta"));
  ASSERT_TRUE(created);
  const ipc::ObjectHeader& h = table[created->get().getCreate().getSlot()];
  auto state = [&] { return ipc::UnpackState(h.state_refs.load(std::memory_order_acquire)); };
  auto refs = [&] { return ipc::UnpackRefs(h.state_refs.load(std::memory_order_acquire)); };
  EXPECT_EQ(state(), ipc::ObjectState::kCreating);
  EXPECT_EQ(refs(), 1u);
  EXPECT_EQ(ObjectId::FromWords(h.id_lo, h.id_hi), id);
  EXPECT_EQ(h.data_size, 100u);
  EXPECT_EQ(h.metadata_size, 4u);

  ASSERT_TRUE(s->Call(3, SealOf(id)));
  EXPECT_EQ(state(), ipc::ObjectState::kSealed);
  auto other = OpenSession();
  ASSERT_TRUE(other->Call(2, GetOf({id})));
  EXPECT_EQ(refs(), 2u);
  ASSERT_TRUE(other->Call(3, ListOf(IdList::kRelease, {id})));
  ASSERT_TRUE(s->Call(4, ListOf(IdList::kRelease, {id})));
  EXPECT_EQ(refs(), 0u);
  EXPECT_EQ(state(), ipc::ObjectState::kSealed);
  ::munmap(mapped, bytes);
}

TEST_F(ProtocolTest, ClientThatNeverReadsRepliesIsThrottledWithoutStallingOthers) {
  auto bystander = OpenSession();
  auto flooder = OpenSession();
  // Objects with long names make each list reply large (about 100 KiB).
  for (const ObjectId& id : Ids("protocol/flood/" + std::string(200, 'n') + "/", 400)) {
    ASSERT_TRUE(bystander->Call(2, [&](wire::Request::Builder r) {
      CreateOf(id, 64)(r);
      r.getCreate().setName(std::string(200, 'n'));
    }));
  }
  ASSERT_EQ(::fcntl(flooder->fd(), F_SETFL, O_NONBLOCK), 0);
  const uint64_t before = PrivateResidentKiB(daemon_->pid());
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<wire::Request>();
  request.setId(9);
  request.initList().setLimit(10'000);
  // Send list requests, never reading, until the daemon stops reading them too.
  constexpr int kMaxRequests = 8000;  // ~800 MiB of replies: far past any sane queue
  int sent = 0;
  bool stalled = false;
  while (sent < kMaxRequests && !stalled) {
    auto frame = ipc::EncodeFrame(message);
    ASSERT_OK(frame);
    for (;;) {
      auto done = ipc::WriteFrame(flooder->fd(), *frame);
      ASSERT_OK(done);
      if (*done) break;
      pollfd p{flooder->fd(), POLLOUT, 0};
      if (::poll(&p, 1, 500) == 0) {
        stalled = true;
        break;
      }
    }
    ++sent;
  }
  EXPECT_TRUE(stalled) << "the daemon read all " << sent
                       << " requests of a client that reads no replies";
  // Others are still served. A daemon stalled on the flooder would never answer; the bound
  // leaves room for the backlog the daemon is still working through, which took 1.5 s under
  // TSan on a loaded 2-core machine.
  const auto start = Clock::now();
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "while-flooded"));
  EXPECT_LT(Clock::now() - start, milliseconds(10'000));
  // The daemon holds a small backlog for the flooder: a few MiB of replies, not the
  // hundreds of MiB that 8,000 requests would make.
  const uint64_t after = PrivateResidentKiB(daemon_->pid());
  EXPECT_LT(after, before + 32 * 1024) << "daemon RssAnon went from " << before << " to " << after
                                       << " KiB after " << sent << " requests";
}

TEST_F(ProtocolTest, ReleasingTheCreatorsReferenceToAnUnsealedObjectAbortsIt) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/abandoned");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 4096)));
  auto released = s->Call(3, ListOf(IdList::kRelease, {id}));
  ASSERT_TRUE(released);
  EXPECT_EQ(released->get().getError(), wire::ErrorCode::OK);
  auto status = s->Call(4, StatusRequest());
  ASSERT_TRUE(status);
  EXPECT_EQ(status->get().getStatus().getObjectsCreating(), 0u);
  EXPECT_EQ(status->get().getStatus().getUsedBytes(), 0u);
  auto seal = s->Call(5, SealOf(id));
  ASSERT_TRUE(seal);
  EXPECT_EQ(seal->get().getError(), wire::ErrorCode::NOT_FOUND);
}

TEST_F(ProtocolTest, GarbagePayloadClosesOnlyThatSession) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  // A well-formed frame header, then bytes that are no Cap'n Proto message.
  std::vector<uint8_t> frame(8 + 64, 0xff);
  const ipc::FrameHeader header{64, 0};
  std::memcpy(frame.data(), &header, sizeof(header));
  ASSERT_TRUE(s->SendBytes(frame.data(), frame.size()));
  int replies = 0;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000), &replies));
  EXPECT_EQ(replies, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-garbage"));
}

TEST_F(ProtocolTest, MalformedFrameHeaderClosesOnlyThatSession) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  // Header and payload in one send: the daemon may hang up as soon as it reads the header,
  // and a second send would then fail.
  char frame[sizeof(ipc::FrameHeader) + 12];
  const ipc::FrameHeader header{12, 0};  // payloads are whole words
  std::memcpy(frame, &header, sizeof(header));
  std::memcpy(frame + sizeof(header), "0123456789ab", 12);
  ASSERT_TRUE(s->SendBytes(frame, sizeof(frame)));
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000)));
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-bad-header"));
}

TEST_F(ProtocolTest, RandomBytesCloseOnlyThatSession) {
  auto bystander = OpenSession();
  auto s = Open();
  const std::vector<std::byte> noise = SeededBytes(4096, 42);
  s->SendBytes(noise.data(), noise.size());  // the daemon may hang up before reading it all
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000)));
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-noise"));
}

class SmallFrameProtocolTest : public ProtocolTest {
 protected:
  SmallFrameProtocolTest() : ProtocolTest({"--max-frame", "64KiB"}) {}
};

TEST_F(SmallFrameProtocolTest, FrameOverTheLimitClosesOnlyThatSession) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  // Only the header: the daemon must refuse on the size it announces, not wait for 1 MiB.
  const ipc::FrameHeader header{1u << 20, 0};
  ASSERT_TRUE(s->SendBytes(&header, sizeof(header)));
  int replies = 0;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000), &replies));
  EXPECT_EQ(replies, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-oversized"));
}

TEST_F(SmallFrameProtocolTest, HelloAnnouncesTheFrameLimit) {
  auto s = Open();
  auto reply = s->Call(1, [](auto r) { FillHello(r); });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getHello().getMaxFrameBytes(), 64u * 1024);
}

TEST_F(ProtocolTest, TruncatedFrameThenHangUpLeavesTheDaemonServing) {
  auto bystander = OpenSession();
  {
    auto s = OpenSession();
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(2);
    CreateOf(ObjectId::FromName("protocol/truncated"), 64, std::string(512, 'm'))(request);
    auto frame = ipc::EncodeFrame(message);
    ASSERT_OK(frame);
    const size_t bytes = frame->bytes.size() * sizeof(capnp::word);
    ASSERT_TRUE(s->SendBytes(frame->bytes.data(), bytes / 2));
  }  // closed mid-frame
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-truncated"));
  auto status = bystander->Call(9, StatusRequest());
  ASSERT_TRUE(status);
  EXPECT_EQ(status->get().getStatus().getObjectsCreating(), 0u);
}

TEST_F(ProtocolTest, FileDescriptorFromAClientClosesOnlyThatSession) {
  auto bystander = OpenSession();
  auto s = OpenSession();
  ipc::UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(devnull);
  // A valid request frame that announces and carries one descriptor.
  ASSERT_OK(s->Send(2, StatusRequest(), {devnull.get()}));
  int replies = 0;
  EXPECT_TRUE(s->ClosedWithin(milliseconds(2000), &replies));
  EXPECT_EQ(replies, 0) << "the request that carried a descriptor was answered";
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*bystander, "after-fd"));
}

class SmallBatchProtocolTest : public ProtocolTest {
 protected:
  SmallBatchProtocolTest() : ProtocolTest({"--max-batch", "8"}) {}
};

TEST_F(SmallBatchProtocolTest, GetOfMoreIdsThanMaxBatchIsLimitExceeded) {
  auto s = OpenSession();
  auto reply = s->Call(2, GetOf(Ids("protocol/batch", 9)));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  const std::string message = reply->get().getMessage().cStr();
  EXPECT_NE(message.find('8'), std::string::npos) << message;
  EXPECT_NE(message.find('9'), std::string::npos) << message;
  ASSERT_NO_FATAL_FAILURE(ExpectServes(*s, "after-big-batch"));
}

TEST_F(SmallBatchProtocolTest, GetOfExactlyMaxBatchIdsIsAnswered) {
  auto s = OpenSession();
  auto reply = s->Call(2, GetOf(Ids("protocol/batch", 8)));
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->get().getError(), wire::ErrorCode::OK) << reply->get().getMessage().cStr();
  ASSERT_EQ(reply->get().getGet().size(), 8u);
  for (auto result : reply->get().getGet())
    EXPECT_EQ(result.getError(), wire::ErrorCode::NOT_FOUND);
}

TEST_F(SmallBatchProtocolTest, ReleaseDeleteAndContainsOfMoreIdsThanMaxBatchAreLimitExceeded) {
  auto s = OpenSession();
  uint64_t id = 2;
  for (IdList kind :
       {IdList::kRelease, IdList::kDelete, IdList::kContains, IdList::kDeleteAfterTasks}) {
    auto reply = s->Call(id++, ListOf(kind, Ids("protocol/batch", 9)));
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED)
        << "request kind " << static_cast<int>(kind);
  }
}

TEST_F(SmallBatchProtocolTest, ReleaseCountsTheIdsOfEveryGroupAndEachEmptyGroupAgainstMaxBatch) {
  auto s = OpenSession();
  const auto ids = Ids("protocol/batch", 9);
  const std::vector<ObjectId> five(ids.begin(), ids.begin() + 5);
  const std::vector<ObjectId> four(ids.begin() + 5, ids.end());
  auto split = s->Call(2, ReleaseOf({{ipc::kHostDevice, five}, {ipc::kHostDevice, four}}));
  ASSERT_TRUE(split);
  EXPECT_EQ(split->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  auto empty = s->Call(3, ReleaseOf(std::vector<TierIds>(9, {ipc::kHostDevice, {}})));
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  auto eight = s->Call(4, ReleaseOf(std::vector<TierIds>(8, {ipc::kHostDevice, {}})));
  ASSERT_TRUE(eight);
  EXPECT_EQ(eight->get().getError(), wire::ErrorCode::OK) << eight->get().getMessage().cStr();
}

TEST_F(SmallBatchProtocolTest, OversizedReleaseWithIdZeroGetsNoReply) {
  // Id 0 means no reply is wanted: errors are only logged, whatever they are.
  auto s = OpenSession();
  ASSERT_OK(s->Send(0, ListOf(IdList::kRelease, Ids("protocol/batch", 9))));
  auto reply = s->Call(7, StatusRequest());
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getId(), 7u)
      << "the release with id 0 was answered (error " << static_cast<int>(reply->get().getError())
      << ": " << reply->get().getMessage().cStr() << ")";
}

TEST_F(ProtocolTest, GetOfTheNilIdIsInvalidArgument) {
  auto s = OpenSession();
  auto reply = s->Call(2, GetOf({ObjectId()}));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
}

TEST_F(ProtocolTest, WaitingGetDoesNotHoldUpLaterRequests) {
  auto s = OpenSession();
  auto writer = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/later");
  ASSERT_OK(s->Send(2, GetOf({id}, 10'000)));
  auto status = s->Call(3, StatusRequest());  // answered while the get waits
  ASSERT_TRUE(status);
  ASSERT_TRUE(writer->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(writer->Call(3, SealOf(id)));
  auto got = s->Receive();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->get().getId(), 2u);
  ASSERT_TRUE(got->get().isGet());
  EXPECT_EQ(got->get().getGet()[0].getError(), wire::ErrorCode::OK);
}

TEST_F(ProtocolTest, GetWithAHugeTimeoutWaitsForTheSeal) {
  auto s = OpenSession();
  auto writer = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/patient");
  ASSERT_OK(s->Send(2, GetOf({id}, INT64_MAX)));
  if (auto early = s->Receive(milliseconds(200))) {
    auto r = early->get();
    FAIL() << "a get with a timeout of INT64_MAX ms was answered at once: error "
           << static_cast<int>(r.getError()) << " " << r.getMessage().cStr()
           << (r.isGet() && r.getGet().size() == 1
                   ? ", result " + std::to_string(static_cast<int>(r.getGet()[0].getError()))
                   : std::string());
  }
  ASSERT_TRUE(writer->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(writer->Call(3, SealOf(id)));
  auto got = s->Receive();
  ASSERT_TRUE(got);
  ASSERT_TRUE(got->get().isGet());
  EXPECT_EQ(got->get().getGet()[0].getError(), wire::ErrorCode::OK);
}

TEST_F(ProtocolTest, WaitingGetNamingAnIdTwiceGetsTwoReferences) {
  auto s = OpenSession();
  auto writer = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/dup-wait");
  ASSERT_OK(s->Send(2, GetOf({id, id}, 10'000)));
  ASSERT_TRUE(writer->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(writer->Call(3, SealOf(id)));
  auto got = s->Receive();
  ASSERT_TRUE(got);
  ASSERT_TRUE(got->get().isGet());
  ASSERT_EQ(got->get().getGet().size(), 2u);
  EXPECT_EQ(got->get().getGet()[0].getError(), wire::ErrorCode::OK);
  EXPECT_EQ(got->get().getGet()[1].getError(), wire::ErrorCode::OK);
  auto both = s->Call(3, ListOf(IdList::kRelease, {id, id}));
  ASSERT_TRUE(both);
  EXPECT_EQ(both->get().getError(), wire::ErrorCode::OK) << both->get().getMessage().cStr();
  auto third = s->Call(4, ListOf(IdList::kRelease, {id}));
  ASSERT_TRUE(third);
  EXPECT_EQ(third->get().getError(), wire::ErrorCode::NOT_HELD);
}

TEST_F(ProtocolTest, GetAnswersTimeoutForIdsNotSealedInTime) {
  auto s = OpenSession();
  const ObjectId present = ObjectId::FromName("protocol/present");
  const ObjectId absent = ObjectId::FromName("protocol/absent");
  ASSERT_TRUE(s->Call(2, CreateOf(present, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(present)));
  const auto start = Clock::now();
  auto reply = s->Call(4, GetOf({present, absent}, 100));
  ASSERT_TRUE(reply);
  EXPECT_GE(Clock::now() - start, milliseconds(95));
  ASSERT_TRUE(reply->get().isGet());
  auto results = reply->get().getGet();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].getError(), wire::ErrorCode::OK);
  EXPECT_EQ(results[1].getError(), wire::ErrorCode::TIMEOUT);
}

TEST_F(ProtocolTest, DeleteAnswersOneCodePerId) {
  auto s = OpenSession();
  const ObjectId sealed = ObjectId::FromName("protocol/del-sealed");
  const ObjectId creating = ObjectId::FromName("protocol/del-creating");
  const ObjectId unknown = ObjectId::FromName("protocol/del-unknown");
  ASSERT_TRUE(s->Call(2, CreateOf(sealed, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(sealed)));
  ASSERT_TRUE(s->Call(4, CreateOf(creating, 64)));
  auto reply = s->Call(5, ListOf(IdList::kDelete, {sealed, unknown, creating}));
  ASSERT_TRUE(reply);
  ASSERT_TRUE(reply->get().isDelete());
  auto codes = reply->get().getDelete();
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_EQ(codes[0], wire::ErrorCode::OK);
  EXPECT_EQ(codes[1], wire::ErrorCode::NOT_FOUND);
  EXPECT_EQ(codes[2], wire::ErrorCode::NOT_SEALED);
}

TEST_F(ProtocolTest, ContainsIsTrueOnlyForSealedObjects) {
  auto s = OpenSession();
  const ObjectId sealed = ObjectId::FromName("protocol/c-sealed");
  const ObjectId creating = ObjectId::FromName("protocol/c-creating");
  ASSERT_TRUE(s->Call(2, CreateOf(sealed, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(sealed)));
  ASSERT_TRUE(s->Call(4, CreateOf(creating, 64)));
  auto reply = s->Call(
      5, ListOf(IdList::kContains, {sealed, creating, ObjectId::FromName("protocol/c-none")}));
  ASSERT_TRUE(reply);
  ASSERT_TRUE(reply->get().isContains());
  auto answers = reply->get().getContains();
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_TRUE(answers[0]);
  EXPECT_FALSE(answers[1]);
  EXPECT_FALSE(answers[2]);
}

TEST_F(ProtocolTest, CreateReplyPlacesDataWithTheMetadataRightAfterIt) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/metadata");
  const std::string metadata = "dtype=f32 shape=[7]";
  auto reply = s->Call(2, CreateOf(id, 28, metadata));
  ASSERT_TRUE(reply);
  auto r = reply->get();
  ASSERT_EQ(r.getError(), wire::ErrorCode::OK) << r.getMessage().cStr();
  ASSERT_TRUE(r.isCreate());
  auto location = r.getCreate();
  EXPECT_EQ(location.getDataSize(), 28u);
  EXPECT_EQ(location.getMetadataSize(), metadata.size());
  EXPECT_EQ(location.getOffset() % 64, 0u) << "objects are 64-byte aligned";
  // The reply brings the segment the object is in: read-only, then writable for the creator.
  auto segments = r.getNewSegments();
  ASSERT_EQ(segments.size(), 2u);
  ASSERT_EQ(reply->fds.size(), 2u);
  EXPECT_EQ(segments[0].getIndex(), location.getSegment());
  EXPECT_FALSE(segments[0].getWritable());
  EXPECT_EQ(segments[1].getIndex(), location.getSegment());
  EXPECT_TRUE(segments[1].getWritable());
  const size_t size = segments[0].getSize();
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, reply->fds[0].get(), 0);
  ASSERT_NE(base, MAP_FAILED);
  const char* meta = static_cast<const char*>(base) + location.getOffset() + location.getDataSize();
  EXPECT_EQ(std::string(meta, metadata.size()), metadata);
  ::munmap(base, size);
}

TEST_F(ProtocolTest, EachSegmentIsSentToASessionOnceReadOnlyAndOnceWritable) {
  auto s = OpenSession();
  auto first = s->Call(2, CreateOf(ObjectId::FromName("protocol/seg-1"), 64));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->get().getNewSegments().size(), 2u);
  EXPECT_EQ(first->fds.size(), 2u);
  auto second = s->Call(3, CreateOf(ObjectId::FromName("protocol/seg-2"), 64));
  ASSERT_TRUE(second);
  ASSERT_EQ(second->get().getCreate().getSegment(), first->get().getCreate().getSegment());
  EXPECT_EQ(second->get().getNewSegments().size(), 0u);
  EXPECT_TRUE(second->fds.empty());
  // Another session is sent the segment with its first reply that refers to it.
  auto other = OpenSession();
  ASSERT_TRUE(s->Call(4, SealOf(ObjectId::FromName("protocol/seg-1"))));
  auto got = other->Call(2, GetOf({ObjectId::FromName("protocol/seg-1")}));
  ASSERT_TRUE(got);
  ASSERT_EQ(got->get().getNewSegments().size(), 1u);
  EXPECT_FALSE(got->get().getNewSegments()[0].getWritable()) << "a reader gets it read-only";
  EXPECT_EQ(got->fds.size(), 1u);
  // A put (create, seal and release in one request) writes nothing through shared memory.
  auto put = other->Call(3, [](wire::Request::Builder r) {
    CreateOf(ObjectId::FromName("protocol/seg-3"), 4)(r);
    r.getCreate().setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>("abcd"), 4));
    r.getCreate().setSeal(true);
    r.getCreate().setRelease(true);
  });
  ASSERT_TRUE(put);
  EXPECT_EQ(put->get().getNewSegments().size(), 0u);
}

TEST_F(ProtocolTest, ListPagesThroughEveryObject) {
  auto s = OpenSession();
  std::set<ObjectId> created;
  for (const ObjectId& id : Ids("protocol/list", 5)) {
    ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
    created.insert(id);
  }
  std::set<ObjectId> listed;
  uint32_t start = 0;
  for (int page = 0; page < 10; ++page) {
    auto reply = s->Call(3, [&](wire::Request::Builder r) {
      auto list = r.initList();
      list.setStartSlot(start);
      list.setLimit(2);
    });
    ASSERT_TRUE(reply);
    auto p = reply->get().getList();
    EXPECT_LE(p.getObjects().size(), 2u);
    for (auto o : p.getObjects()) {
      listed.insert(ipc::FromWire(o.getId()));
      EXPECT_EQ(o.getState(), wire::ObjectState::CREATING);
    }
    if (p.getDone()) break;
    ASSERT_GT(p.getNextSlot(), start);
    start = p.getNextSlot();
  }
  EXPECT_EQ(listed, created);
}

TEST_F(ProtocolTest, ListOfTheLargestIsCappedAtAPageWhateverItAsks) {
  auto s = OpenSession();
  for (const ObjectId& id : Ids("protocol/largest", 3)) ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  // An absurd count, no limit, an absurd start: one reply with what there is, done.
  auto reply = s->Call(3, [&](wire::Request::Builder r) {
    auto list = r.initList();
    list.setLargest(4'000'000'000u);
    list.setStartSlot(4'000'000'000u);
  });
  ASSERT_TRUE(reply);
  auto page = reply->get().getList();
  EXPECT_EQ(page.getObjects().size(), 3u);
  EXPECT_TRUE(page.getDone());
  // The session goes on being served.
  EXPECT_TRUE(s->Call(4, CreateOf(ObjectId::FromName("protocol/largest/after"), 64)));
}

class PendingLimitProtocolTest : public ProtocolTest {
 protected:
  PendingLimitProtocolTest() : ProtocolTest({"--client-max-pending", "2"}) {}
};

TEST_F(PendingLimitProtocolTest, TooManyWaitingGetsIsLimitExceeded) {
  auto s = OpenSession();
  const std::vector<ObjectId> ids = Ids("protocol/pending", 3);
  ASSERT_OK(s->Send(2, GetOf({ids[0]}, 10'000)));
  ASSERT_OK(s->Send(3, GetOf({ids[1]}, 10'000)));
  auto third = s->Call(4, GetOf({ids[2]}, 10'000));
  ASSERT_TRUE(third);
  EXPECT_EQ(third->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  EXPECT_NE(std::string(third->get().getMessage().cStr()).find("--client-max-pending"),
            std::string::npos);
  // A get that need not wait is still answered.
  auto now = s->Call(5, GetOf({ids[2]}));
  ASSERT_TRUE(now);
  EXPECT_EQ(now->get().getError(), wire::ErrorCode::OK);
}

TEST_F(ProtocolTest, ObjectInfoOfAnUnknownIdIsNotFoundNamingTheId) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/never-created");
  auto reply = s->Call(2, [&](wire::Request::Builder r) { ipc::ToWire(id, r.initObjectInfo()); });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::NOT_FOUND);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find(id.Hex()), std::string::npos)
      << reply->get().getMessage().cStr();
  ExpectServes(*s, "after-object-info");
}

TEST_F(ProtocolTest, ObjectInfoNamesTheSessionHoldingTheObject) {
  auto s = Open();
  auto hello = s->Call(1, [](auto r) { FillHello(r); });
  ASSERT_TRUE(hello && hello->get().isHello());
  const uint64_t session = hello->get().getHello().getSessionId();
  const ObjectId id = ObjectId::FromName("protocol/held");
  auto created = s->Call(2, CreateOf(id, 64));
  ASSERT_TRUE(created && created->get().getError() == wire::ErrorCode::OK);

  auto reply = s->Call(3, [&](wire::Request::Builder r) { ipc::ToWire(id, r.initObjectInfo()); });
  ASSERT_TRUE(reply);
  ASSERT_TRUE(reply->get().isObjectInfo()) << reply->get().getMessage().cStr();
  auto details = reply->get().getObjectInfo();
  EXPECT_EQ(details.getInfo().getState(), wire::ObjectState::CREATING);
  EXPECT_EQ(details.getInfo().getRefCount(), 1u);
  ASSERT_EQ(details.getHolders().size(), 1u);
  auto holder = details.getHolders()[0];
  EXPECT_EQ(holder.getSessionId(), session);
  EXPECT_EQ(holder.getPid(), static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(holder.getUid(), ::getuid());
  EXPECT_STREQ(holder.getClientName().cStr(), "raw_session");
  EXPECT_EQ(holder.getReferences(), 1u);
}

TEST_F(ProtocolTest, VerifyOfAnUnknownIdReportsNotFound) {
  auto s = OpenSession();
  const ObjectId known = ObjectId::FromName("protocol/verified");
  ExpectServes(*s, "verified");  // creates, seals and gets protocol/verified, no checksum
  const ObjectId unknown = ObjectId::FromName("protocol/never-created");
  auto reply = s->Call(2, [&](wire::Request::Builder r) {
    auto ids = r.initVerify().initIds(3);
    ipc::ToWire(unknown, ids[0]);
    ipc::ToWire(known, ids[1]);
    ipc::ToWire(ObjectId(), ids[2]);
  });
  ASSERT_TRUE(reply);
  ASSERT_EQ(reply->get().getError(), wire::ErrorCode::OK) << reply->get().getMessage().cStr();
  ASSERT_TRUE(reply->get().isVerify());
  auto results = reply->get().getVerify().getResults();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(ipc::FromWire(results[0].getId()), unknown);
  EXPECT_EQ(results[0].getState(), wire::VerifyState::NOT_FOUND);
  EXPECT_EQ(results[1].getState(), wire::VerifyState::NO_CHECKSUM);
  EXPECT_EQ(results[2].getState(), wire::VerifyState::NOT_FOUND);
}

TEST_F(ProtocolTest, EvictAskingForNothingIsInvalidArgument) {
  auto s = OpenSession();
  auto reply = s->Call(2, [](wire::Request::Builder r) { r.initEvict(); });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  ExpectServes(*s, "after-evict");
}

TEST_F(SmallBatchProtocolTest, VerifyOfMoreIdsThanMaxBatchIsLimitExceeded) {
  auto s = OpenSession();
  const std::vector<ObjectId> ids = Ids("protocol/verify-batch", 17);
  auto reply = s->Call(2, [&](wire::Request::Builder r) {
    auto list = r.initVerify().initIds(static_cast<unsigned>(ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::LIMIT_EXCEEDED);
}

TEST_F(ProtocolTest, VerifyOfIdsAndAllAtOnceIsInvalidArgument) {
  auto s = OpenSession();
  auto reply = s->Call(2, [&](wire::Request::Builder r) {
    auto verify = r.initVerify();
    ipc::ToWire(ObjectId::FromName("protocol/both"), verify.initIds(1)[0]);
    verify.setAll(true);
  });
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find("not both"), std::string::npos);
  ExpectServes(*s, "after-verify-both");
}

// GPU fields spoken by hand: a device the daemon does not serve, a GPU create that tries to
// seal in the same request, a release on the wrong tier. Each is a clear error that leaves
// the session (and the daemon) serving.
class GpuProtocolTest : public ProtocolTest {
 protected:
  GpuProtocolTest() : ProtocolTest({"--simulate-gpus", "1:16MiB"}) {}
};

TEST_F(GpuProtocolTest, CreateOrGetOnADeviceTheDaemonDoesNotServeIsInvalidArgument) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/gpu-nowhere");
  for (int32_t device : {1, 63, -2, 1 << 30}) {
    auto created = s->Call(2, [&](wire::Request::Builder r) {
      CreateOf(id, 64)(r);
      r.getCreate().setDevice(device);
    });
    ASSERT_TRUE(created);
    EXPECT_EQ(created->get().getError(), wire::ErrorCode::INVALID_ARGUMENT) << device;
    EXPECT_NE(std::string(created->get().getMessage().cStr()).find("serves 1 GPU"),
              std::string::npos)
        << created->get().getMessage().cStr();
    auto got = s->Call(3, [&](wire::Request::Builder r) {
      GetOf({id})(r);
      r.getGet().setDevice(device);
    });
    ASSERT_TRUE(got);
    EXPECT_EQ(got->get().getError(), wire::ErrorCode::INVALID_ARGUMENT) << device;
  }
  ExpectServes(*s, "gpu-after-bad-device");
}

TEST_F(GpuProtocolTest, GpuCreateThatSealsOrCarriesDataIsRefused) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/gpu-put");
  auto sealing = s->Call(2, [&](wire::Request::Builder r) {
    auto create = r.initCreate();
    ipc::ToWire(id, create.initId());
    create.setDataSize(8);
    create.setData(kj::heapArray<kj::byte>(8));
    create.setSeal(true);
    create.setDevice(0);
  });
  ASSERT_TRUE(sealing);
  EXPECT_EQ(sealing->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(std::string(sealing->get().getMessage().cStr()).find("cannot seal"), std::string::npos);
  auto with_data = s->Call(3, [&](wire::Request::Builder r) {
    auto create = r.initCreate();
    ipc::ToWire(id, create.initId());
    create.setDataSize(8);
    create.setData(kj::heapArray<kj::byte>(8));
    create.setDevice(0);
  });
  ASSERT_TRUE(with_data);
  EXPECT_EQ(with_data->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(std::string(with_data->get().getMessage().cStr()).find("inline data"),
            std::string::npos);
  ExpectServes(*s, "gpu-after-bad-create");
}

TEST_F(GpuProtocolTest, ReleaseOnATierWhereNothingIsHeldIsNotHeld) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/gpu-release");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(id)));
  // The session holds the host copy (the creator's reference), not one on GPU 0.
  auto reply = s->Call(4, ReleaseOf({{0, {id}}}));
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::NOT_HELD);
  EXPECT_NE(std::string(reply->get().getMessage().cStr()).find("simulated GPU 0"),
            std::string::npos)
      << reply->get().getMessage().cStr();
  // A tier the daemon does not serve (255 would alias the host tier in an 8-bit key).
  for (int32_t device : {1, 255, -3}) {
    auto bad = s->Call(5, ReleaseOf({{device, {id}}}));
    ASSERT_TRUE(bad) << "the daemon closed the session over device " << device;
    EXPECT_EQ(bad->get().getError(), wire::ErrorCode::INVALID_ARGUMENT) << device;
  }
  // The creator's host reference survived all of that: releasing it works once.
  auto host = s->Call(6, ListOf(IdList::kRelease, {id}));
  ASSERT_TRUE(host);
  EXPECT_EQ(host->get().getError(), wire::ErrorCode::OK);
  ExpectServes(*s, "gpu-after-bad-release");
}

TEST_F(GpuProtocolTest, OneReleaseGivesBackReferencesOnSeveralTiers) {
  auto s = OpenSession();
  const ObjectId id = ObjectId::FromName("protocol/gpu-and-host");
  ASSERT_TRUE(s->Call(2, CreateOf(id, 64)));
  ASSERT_TRUE(s->Call(3, SealOf(id)));
  auto on_gpu = s->Call(4, [&](wire::Request::Builder r) {
    GetOf({id})(r);
    r.getGet().setDevice(0);
  });
  ASSERT_TRUE(on_gpu);
  ASSERT_EQ(on_gpu->get().getGet()[0].getError(), wire::ErrorCode::OK);
  // The session holds one reference on each tier; GPU group first, as a client may send it.
  auto both = s->Call(5, ReleaseOf({{0, {id}}, {ipc::kHostDevice, {id}}}));
  ASSERT_TRUE(both);
  EXPECT_EQ(both->get().getError(), wire::ErrorCode::OK) << both->get().getMessage().cStr();
  for (int32_t device : {0, ipc::kHostDevice}) {
    auto again = s->Call(6, ReleaseOf({{device, {id}}}));
    ASSERT_TRUE(again);
    EXPECT_EQ(again->get().getError(), wire::ErrorCode::NOT_HELD) << device;
  }
  ExpectServes(*s, "gpu-after-release-on-two-tiers");
}

}  // namespace
}  // namespace depot::testing
