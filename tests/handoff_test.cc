// Handing objects from one process to another through a group (Client::Handoff,
// Claim, and the puts that hand off: PutAndHandoff, SealAndHandoff): what
// depot.multiprocessing sends through its queues and pipes. A handed-off object
// outlives its sender, is claimed once per handoff, goes when its claimers let
// go, and goes with its group if nobody claims it; one that cannot be handed off
// as it is put is deleted; a client outside the group, of another uid, or saying
// what the library never would, harms nothing.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "raw_session.h"
#include "test_support.h"

namespace depot::testing {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr auto kSettle = std::chrono::seconds(10);

std::string GroupKey(char fill) { return std::string(16, fill); }

Result<Client> Join(const TestDaemon& daemon, const std::string& group) {
  ConnectOptions options;
  options.group = group;
  return Client::Connect(daemon.socket_path(), options);
}

// A member of `group` that is no Client (a raw session, which starts no
// thread): keeps the group alive across a fork, for ThreadSanitizer (see
// TSAN_SKIP in the Makefile: a Client's thread in the parent and another in a
// forked child collide there).
std::unique_ptr<RawSession> RawMember(const TestDaemon& daemon, const std::string& group) {
  auto raw = std::make_unique<RawSession>(daemon.socket_path());
  EXPECT_TRUE(raw->Send(1,
                        [&](wire::Request::Builder r) {
                          auto hello = r.initHello();
                          hello.setProtocolVersion(ipc::kProtocolVersion);
                          hello.setGroup(capnp::Data::Reader(
                              reinterpret_cast<const capnp::byte*>(group.data()), group.size()));
                        })
                  .ok());
  auto reply = raw->Receive();
  EXPECT_TRUE(reply.has_value() && reply->get().getError() == wire::ErrorCode::OK);
  return raw;
}

// Puts `bytes` as `id` and hands it off, holding the creator's reference
// meanwhile.
Status PutAndHandOff(Client& client, const ObjectId& id, std::span<const std::byte> bytes,
                     std::chrono::milliseconds ttl = std::chrono::milliseconds(0)) {
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, client.Create(id, bytes.size()));
  std::memcpy(buffer.ptr(), bytes.data(), bytes.size());
  DEPOT_RETURN_NOT_OK(client.Seal(id));
  return client.Handoff(std::span(&id, 1), Client::kHostMemory, ttl);
}

// Puts `bytes` as `id`; the buffer holds the creator's reference while it lives.
Result<MutableBuffer> Put(Client& client, const ObjectId& id, std::span<const std::byte> bytes) {
  DEPOT_ASSIGN_OR_RETURN(MutableBuffer buffer, client.Create(id, bytes.size()));
  std::memcpy(buffer.ptr(), bytes.data(), bytes.size());
  DEPOT_RETURN_NOT_OK(client.Seal(id));
  return buffer;
}

// A field of the daemon's status once it is `expected`, waiting up to kSettle (the daemon
// ends sessions asynchronously, and gives a deadline's charge back once it has passed);
// returns the last seen.
uint64_t Settled(Client& client, uint64_t StoreStatus::*field, uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + kSettle;
  for (;;) {
    auto status = client.GetStatus();
    if (!status.ok()) {
      ADD_FAILURE() << status.status().ToString();
      return UINT64_MAX;
    }
    if ((*status).*field == expected || std::chrono::steady_clock::now() >= deadline) {
      return (*status).*field;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

uint64_t SealedObjects(Client& client, uint64_t expected) {
  return Settled(client, &StoreStatus::objects_sealed, expected);
}

uint64_t MetadataBytes(Client& client, uint64_t expected) {
  return Settled(client, &StoreStatus::metadata_bytes, expected);
}

class HandoffTest : public ::testing::Test {
 protected:
  HandoffTest() : daemon_({"--memory", "64MiB", "--simulate-gpus", "1:32MiB"}) {}
  void SetUp() override { ASSERT_TRUE(daemon_.ok()) << daemon_.error(); }

  TestDaemon daemon_;
  // An observer outside every group, for status.
  Client Observer() {
    auto client = Client::Connect(daemon_.socket_path());
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return std::move(client).value();
  }
};

TEST_F(HandoffTest, AnObjectOutlivesItsSenderAndGoesWhenItsClaimerLetsGo) {
  const std::string group = GroupKey('a');
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(3 * kMiB + 5, 1);
  auto member = RawMember(daemon_, group);
  // The sender, in a process of its own, exits as soon as it has handed the
  // object off.
  EXPECT_EQ(RunInChild([&] {
              auto sender = Join(daemon_, group);
              if (!sender.ok()) return ChildFailed(2, sender.status().ToString());
              Status st = PutAndHandOff(*sender, id, bytes);
              return st.ok() ? 0 : ChildFailed(3, st.ToString());
            }),
            0);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  // Operators see who holds it: the group.
  auto details = observer.Describe(id);
  ASSERT_TRUE(details.ok()) << details.status().ToString();
  ASSERT_EQ(details->holders.size(), 1u);
  EXPECT_EQ(details->holders[0].client_name, "group (handed off, not yet claimed)");
  EXPECT_EQ(details->holders[0].uid, ::geteuid());
  // Handed off objects are deleted: a get finds nothing, only a claim does.
  EXPECT_EQ(receiver->Get(id).status().code(), StatusCode::kNotFound);
  {
    auto claimed = receiver->Claim(std::span(&id, 1));
    ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
    const Buffer& buffer = (*claimed)[0];
    ASSERT_EQ(buffer.size(), bytes.size());
    EXPECT_EQ(std::memcmp(buffer.ptr(), bytes.data(), bytes.size()), 0);
    // Claimed once: a second claim finds nothing more, and says so.
    auto again = receiver->Claim(std::span(&id, 1));
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kNotHeld);
    EXPECT_NE(again.status().message().find("cannot claim object " + id.Hex()), std::string::npos)
        << again.status().ToString();
    EXPECT_EQ(SealedObjects(observer, 1), 1u);
  }
  // The claimer let go: the object goes, though its group lives on.
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, AValueSentTwiceIsStoredOnceAndClaimedTwice) {
  const std::string group = GroupKey('b');
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(100 * kKiB, 2);
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  ASSERT_TRUE(PutAndHandOff(*sender, id, bytes).ok());
  // The sender holds nothing now; the group's reference lets it hand the same
  // object again.
  ASSERT_TRUE(sender->Handoff(std::span(&id, 1)).ok());
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  auto first = receiver->Claim(std::span(&id, 1));
  auto second = sender->Claim(std::span(&id, 1));  // any member may claim
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(std::memcmp((*second)[0].ptr(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(receiver->Claim(std::span(&id, 1)).status().code(), StatusCode::kNotHeld);
  first->clear();
  EXPECT_EQ(SealedObjects(observer, 1),
            1u);  // the second claimer still reads it
  second->clear();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, WhatNobodyClaimedGoesWithTheGroupsLastSession) {
  const std::string group = GroupKey('c');
  auto member = RawMember(daemon_, group);
  // A sender killed right after its handoff: the group keeps the object for the
  // others.
  const ObjectId id = ObjectId::Random();
  ReadyPipe handed;
  ChildProcess sender = ChildProcess::Start([&] {
    auto client = Join(daemon_, group);
    if (!client.ok()) return ChildFailed(2, client.status().ToString());
    const std::vector<std::byte> bytes = SeededBytes(kMiB, 3);
    if (Status st = PutAndHandOff(*client, id, bytes); !st.ok())
      return ChildFailed(3, st.ToString());
    handed.Signal();
    ::pause();
    return 0;
  });
  ASSERT_TRUE(handed.Wait(std::chrono::seconds(10)));
  sender.Kill(SIGKILL);
  EXPECT_EQ(sender.Wait(), kSignalExitBase + SIGKILL);
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  // Another group cannot claim it.
  auto stranger = Join(daemon_, GroupKey('z'));
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(stranger->Claim(std::span(&id, 1)).status().code(), StatusCode::kNotHeld);
  // The last member goes without claiming it: the object goes too.
  member.reset();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, GpuObjectsAreHandedOffAndClaimedOnTheirGpu) {
  const std::string group = GroupKey('d');
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(kMiB, 4);
  {
    auto target = sender->CreateOnDevice(id, bytes.size(), 0);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    ASSERT_TRUE(target->simulated());
    std::memcpy(reinterpret_cast<void*>(target->device_ptr()), bytes.data(), bytes.size());
    ASSERT_TRUE(sender->Seal(id).ok());
    // Not held in host memory: handed off on GPU 0 only.
    EXPECT_EQ(sender->Handoff(std::span(&id, 1)).code(), StatusCode::kNotHeld);
    ASSERT_TRUE(sender->Handoff(std::span(&id, 1), 0).ok());
  }
  EXPECT_EQ(receiver->Claim(std::span(&id, 1)).status().code(), StatusCode::kNotHeld);
  auto claimed = receiver->ClaimOnDevice(std::span(&id, 1), 0);
  ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>((*claimed)[0].device_ptr()), bytes.data(),
                        bytes.size()),
            0);
  claimed->clear();
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, RefusalsNameWhatIsWrong) {
  auto loner = Client::Connect(daemon_.socket_path());
  ASSERT_TRUE(loner.ok());
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(64 * kKiB, 5);
  ASSERT_TRUE(loner->Put(id, bytes).ok());
  // No group: nobody to hand to, nothing to claim.
  Status st = loner->Handoff(std::span(&id, 1));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no group"), std::string::npos) << st.ToString();
  EXPECT_EQ(loner->Claim(std::span(&id, 1)).status().code(), StatusCode::kInvalidArgument);

  auto member = Join(daemon_, GroupKey('e'));
  ASSERT_TRUE(member.ok());
  // Not held by the member (another client's object): not its to hand over, and
  // not deleted.
  st = member->Handoff(std::span(&id, 1));
  EXPECT_EQ(st.code(), StatusCode::kNotHeld);
  EXPECT_NE(st.message().find("holds no reference"), std::string::npos) << st.ToString();
  EXPECT_TRUE(*loner->Contains(id));
  const ObjectId unknown = ObjectId::Random();
  EXPECT_EQ(member->Handoff(std::span(&unknown, 1)).code(), StatusCode::kNotFound);
  // Being created: not yet.
  const ObjectId creating = ObjectId::Random();
  auto buffer = member->Create(creating, kKiB);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(member->Handoff(std::span(&creating, 1)).code(), StatusCode::kNotSealed);
  // A GPU the daemon does not serve.
  EXPECT_EQ(member->Handoff(std::span(&id, 1), 3).code(), StatusCode::kInvalidArgument);
}

TEST_F(HandoffTest, AGroupKeyOfTheWrongSizeIsRefused) {
  auto client = Join(daemon_, "short");
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(client.status().message().find("a group key is 16 bytes, not 5"), std::string::npos)
      << client.status().ToString();
  EXPECT_TRUE(Client::Connect(daemon_.socket_path()).ok());  // the daemon is fine
}

// A raw client: tiers and batches the library would never send, and claims of
// objects it never saw; its session survives, and a member's object stays
// intact.
TEST_F(HandoffTest, AHostileMemberHarmsNothing) {
  const std::string group = GroupKey('f');
  auto sender = Join(daemon_, group);
  ASSERT_TRUE(sender.ok());
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(256 * kKiB, 6);
  ASSERT_TRUE(PutAndHandOff(*sender, id, bytes).ok());

  std::unique_ptr<RawSession> session = RawMember(daemon_, group);
  RawSession& raw = *session;
  uint64_t rid = 2;
  // Handoffs and claims on tiers that are not there (the disk's among them).
  for (int32_t tier : {100, -3, 99, 1 << 30, -2}) {
    ASSERT_TRUE(raw.Send(rid++,
                         [&](wire::Request::Builder r) {
                           auto h = r.initHandoff();
                           h.setDevice(tier);
                           ipc::ToWire(id, h.initIds(1)[0]);
                         })
                    .ok());
    auto reply = raw.Receive();
    ASSERT_TRUE(reply.has_value()) << "tier " << tier;
    EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT) << "tier " << tier;
    ASSERT_TRUE(raw.Send(rid++,
                         [&](wire::Request::Builder r) {
                           auto g = r.initGet();
                           g.setClaim(true);
                           g.setDevice(tier);
                           ipc::ToWire(id, g.initIds(1)[0]);
                         })
                    .ok());
    reply = raw.Receive();
    ASSERT_TRUE(reply.has_value()) << "tier " << tier;
    EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT) << "tier " << tier;
  }
  // Handoffs of objects that do not exist, many times over: refused per id, and
  // the nil id refuses the request.
  ASSERT_TRUE(raw.Send(rid++,
                       [&](wire::Request::Builder r) {
                         auto ids = r.initHandoff().initIds(2);
                         ipc::ToWire(ObjectId::Random(), ids[0]);
                         ipc::ToWire(ObjectId::Random(), ids[1]);
                       })
                  .ok());
  auto reply = raw.Receive();
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(reply->get().isHandoff());
  ASSERT_EQ(reply->get().getHandoff().size(), 2u);
  EXPECT_EQ(reply->get().getHandoff()[0], wire::ErrorCode::NOT_FOUND);
  EXPECT_EQ(reply->get().getHandoff()[1], wire::ErrorCode::NOT_FOUND);
  ASSERT_TRUE(raw.Send(rid++,
                       [&](wire::Request::Builder r) {
                         ipc::ToWire(ObjectId(), r.initHandoff().initIds(1)[0]);
                       })
                  .ok());
  reply = raw.Receive();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->get().getError(), wire::ErrorCode::INVALID_ARGUMENT);
  // Handoffs that seal: of two objects (one only), of the member's sealed object, and of
  // an object another member is creating: refused, and nothing changes hands.
  const ObjectId creating = ObjectId::Random();
  auto created = sender->Create(creating, 1000);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  for (const auto& [ids, error] : std::vector<std::pair<std::vector<ObjectId>, wire::ErrorCode>>{
           {{creating, id}, wire::ErrorCode::INVALID_ARGUMENT},
           {{id}, wire::ErrorCode::ALREADY_SEALED},
           {{creating}, wire::ErrorCode::NOT_HELD}}) {
    ASSERT_TRUE(raw.Send(rid++,
                         [&](wire::Request::Builder r) {
                           auto h = r.initHandoff();
                           h.setSeal(true);
                           auto list = h.initIds(static_cast<unsigned>(ids.size()));
                           for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
                         })
                    .ok());
    reply = raw.Receive();
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->get().getError(), error) << reply->get().getMessage().cStr();
  }
  *created = MutableBuffer();  // dropped unsealed: aborted
  EXPECT_FALSE(raw.closed());
  // It claims the member's object (a member may), twice: the second finds
  // nothing.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(raw.Send(rid++,
                         [&](wire::Request::Builder r) {
                           auto g = r.initGet();
                           g.setClaim(true);
                           ipc::ToWire(id, g.initIds(1)[0]);
                         })
                    .ok());
    reply = raw.Receive();
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->get().getGet().size(), 1u);
    EXPECT_EQ(reply->get().getGet()[0].getError(),
              i == 0 ? wire::ErrorCode::OK : wire::ErrorCode::NOT_HELD);
  }
  // The raw client holds it now; to everyone else it is deleted.
  EXPECT_EQ(sender->Get(id).status().code(), StatusCode::kNotFound);
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  // The raw client goes, its reference with it: so does the object.
  session.reset();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

// A group belongs to the uid of its first session: another user who learns its
// key cannot join it, so cannot claim what it hands off.
TEST_F(HandoffTest, AHandoffNobodyClaimsInTimeIsGivenBackWhileItsGroupLives) {
  const std::string group = GroupKey('t');
  const ObjectId id = ObjectId::Random();
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  Client observer = Observer();
  const uint64_t baseline = observer.GetStatus()->metadata_bytes;
  ASSERT_OK(PutAndHandOff(*sender, id, SeededBytes(64 * kKiB, 3), std::chrono::milliseconds(50)));
  // The group gives it back after 50 ms, though both members stay: the object goes.
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
  EXPECT_EQ(MetadataBytes(observer, baseline), baseline);
  const auto claimed = receiver->Claim(std::span(&id, 1));
  EXPECT_EQ(claimed.status().code(), StatusCode::kNotHeld) << claimed.status().ToString();
}

TEST_F(HandoffTest, AClaimInTimeKeepsTheObjectPastTheDeadline) {
  const std::string group = GroupKey('u');
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(64 * kKiB, 4);
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  Client observer = Observer();
  std::vector<Buffer> buffers;
  [&] {
    ASSERT_OK_AND_ASSIGN(MutableBuffer created, Put(*sender, id, bytes));
    const uint64_t before = observer.GetStatus()->metadata_bytes;
    ASSERT_OK(
        sender->Handoff(std::span(&id, 1), Client::kHostMemory, std::chrono::milliseconds(500)));
    // Claimed well before its deadline: 500 ms is a hundred times what the claim takes.
    auto got = receiver->Claim(std::span(&id, 1));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    buffers = std::move(got).value();
    // The deadline passes (its charge is given back then): the claimer's reference stays.
    EXPECT_EQ(MetadataBytes(observer, before), before);
  }();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  EXPECT_EQ(std::memcmp(buffers[0].ptr(), bytes.data(), bytes.size()), 0);
  buffers.clear();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, AHandoffWithoutDeadlineOutlivesOneWith) {
  const std::string group = GroupKey('v');
  const ObjectId id = ObjectId::Random();
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  Client observer = Observer();
  {
    ASSERT_OK_AND_ASSIGN(MutableBuffer created, Put(*sender, id, SeededBytes(kKiB, 5)));
    const uint64_t before = observer.GetStatus()->metadata_bytes;
    // Sent twice: once to expire, once to stay until claimed.
    ASSERT_OK(
        sender->Handoff(std::span(&id, 1), Client::kHostMemory, std::chrono::milliseconds(50)));
    ASSERT_OK(sender->Handoff(std::span(&id, 1)));
    EXPECT_EQ(MetadataBytes(observer, before), before);  // the first has expired
  }
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  auto claimed = receiver->Claim(std::span(&id, 1));
  ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
  EXPECT_EQ(receiver->Claim(std::span(&id, 1)).status().code(), StatusCode::kNotHeld);
  claimed->clear();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

// Client::PutAndHandoff: a value gathered from parts, handed to the group as it is
// sealed; the putter keeps the creator's reference, to hand it again after every claim.
TEST_F(HandoffTest, APutHandedOffIsClaimedAndItsPutterMayHandItAgain) {
  const std::string group = GroupKey('f');
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> header = SeededBytes(100, 10);
  const std::vector<std::byte> body = SeededBytes(kMiB, 11);
  const std::vector<PutPart> parts = {{0, header}, {128, body}};
  std::vector<std::byte> expected(128 + kMiB + 64);
  std::copy(header.begin(), header.end(), expected.begin());
  std::copy(body.begin(), body.end(), expected.begin() + 128);
  auto kept = sender->PutAndHandoff(id, expected.size(), parts);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_TRUE(SameBytes(kept->data(), expected));
  // Handed off: deleted, and claimed once.
  EXPECT_EQ(receiver->Get(id).status().code(), StatusCode::kNotFound);
  {
    auto claimed = receiver->Claim(std::span(&id, 1));
    ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
    EXPECT_TRUE(SameBytes((*claimed)[0].data(), expected));
  }
  EXPECT_EQ(receiver->Claim(std::span(&id, 1)).status().code(), StatusCode::kNotHeld);
  // The putter's reference lets it hand the object off again after the claim.
  ASSERT_OK(sender->Handoff(std::span(&id, 1)));
  *kept = Buffer();
  Client observer = Observer();
  EXPECT_EQ(SealedObjects(observer, 1), 1u);  // the group holds it
  {
    auto claimed = receiver->Claim(std::span(&id, 1));
    ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
    EXPECT_TRUE(SameBytes((*claimed)[0].data(), expected));
  }
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, APutThatCannotBeHandedOffIsDeleted) {
  Client observer = Observer();
  // No group: the handoff fails, and the object, sealed by then, goes rather than stay in
  // the store under an id nobody knows.
  auto loner = Client::Connect(daemon_.socket_path());
  ASSERT_TRUE(loner.ok());
  const ObjectId id = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(64 * kKiB, 12);
  const std::vector<PutPart> parts = {{0, bytes}};
  auto kept = loner->PutAndHandoff(id, bytes.size(), parts);
  ASSERT_FALSE(kept.ok());
  EXPECT_EQ(kept.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kept.status().message().find("no group"), std::string::npos)
      << kept.status().ToString();
  ASSERT_OK_AND_ASSIGN(bool stored, loner->Contains(id));
  EXPECT_FALSE(stored);
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
  // Parts that run past the object: refused before anything is created.
  auto member = Join(daemon_, GroupKey('g'));
  ASSERT_TRUE(member.ok());
  const std::vector<PutPart> past = {{1, bytes}};
  auto refused = member->PutAndHandoff(ObjectId::Random(), bytes.size(), past);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("parts run past the object's size"), std::string::npos)
      << refused.status().ToString();
  ASSERT_OK_AND_ASSIGN(StoreStatus status, observer.GetStatus());
  EXPECT_EQ(status.objects_creating, 0u);
  EXPECT_EQ(status.objects_sealed, 0u);
}

// Client::SealAndHandoff: an object written in place (here on a GPU), sealed and handed off
// in one call; deleted if the handoff fails; left alone if the seal does.
TEST_F(HandoffTest, SealAndHandoffHandsAnObjectOffOnItsTierOrDeletesIt) {
  const std::string group = GroupKey('h');
  auto sender = Join(daemon_, group);
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  Client observer = Observer();
  const std::vector<std::byte> bytes = SeededBytes(kMiB, 13);
  const ObjectId id = ObjectId::Random();
  {
    auto target = sender->CreateOnDevice(id, bytes.size(), 0);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    std::memcpy(reinterpret_cast<void*>(target->device_ptr()), bytes.data(), bytes.size());
    ASSERT_OK(sender->SealAndHandoff(id, 0));
  }
  {
    auto claimed = receiver->ClaimOnDevice(std::span(&id, 1), 0);
    ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
    EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>((*claimed)[0].device_ptr()), bytes.data(),
                          bytes.size()),
              0);
  }
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
  // Handed off in host memory, where it has no copy: NotHeld, and the object is deleted.
  const ObjectId elsewhere = ObjectId::Random();
  {
    auto target = sender->CreateOnDevice(elsewhere, bytes.size(), 0);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    const Status st = sender->SealAndHandoff(elsewhere);
    EXPECT_EQ(st.code(), StatusCode::kNotHeld) << st.ToString();
    ASSERT_OK_AND_ASSIGN(bool stored, sender->Contains(elsewhere));
    EXPECT_FALSE(stored);
  }
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
  // Another client's object: the seal fails, and nothing is handed off or deleted.
  const ObjectId theirs = ObjectId::Random();
  ASSERT_OK(observer.Put(theirs, bytes));
  EXPECT_EQ(sender->SealAndHandoff(theirs).code(), StatusCode::kAlreadySealed);
  ASSERT_OK_AND_ASSIGN(bool stored, observer.Contains(theirs));
  EXPECT_TRUE(stored);
  EXPECT_EQ(receiver->Claim(std::span(&theirs, 1)).status().code(), StatusCode::kNotHeld);
}

TEST_F(HandoffTest, ATtlOutOfRangeIsRefused) {
  auto sender = Join(daemon_, GroupKey('w'));
  ASSERT_TRUE(sender.ok());
  const ObjectId id = ObjectId::Random();
  const Status negative =
      sender->Handoff(std::span(&id, 1), Client::kHostMemory, std::chrono::milliseconds(-1));
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument) << negative.ToString();
  const Status huge =
      sender->Handoff(std::span(&id, 1), Client::kHostMemory, std::chrono::milliseconds(1ll << 33));
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument) << huge.ToString();
}

Result<Client> JoinWithGrace(const TestDaemon& daemon, const std::string& group,
                             std::chrono::milliseconds grace) {
  ConnectOptions options;
  options.group = group;
  options.handoff_grace = grace;
  return Client::Connect(daemon.socket_path(), options);
}

// A sender with a grace (a DataLoader's worker): what it handed off waits for a claim while
// it lives, however long, and goes back that long after it has gone; what was claimed stays.
TEST_F(HandoffTest, WhatASenderWithAGraceLeftUnclaimedGoesBackAfterItEnds) {
  const std::string group = GroupKey('g');
  const ObjectId claimed_id = ObjectId::Random(), left_id = ObjectId::Random();
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(receiver.ok());
  Client observer = Observer();
  const uint64_t baseline = observer.GetStatus()->metadata_bytes;
  std::vector<Buffer> claimed;
  {
    auto sender = JoinWithGrace(daemon_, group, std::chrono::milliseconds(50));
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    ASSERT_OK(PutAndHandOff(*sender, claimed_id, SeededBytes(64 * kKiB, 20)));
    ASSERT_OK(PutAndHandOff(*sender, left_id, SeededBytes(64 * kKiB, 21)));
    // Both wait while the sender lives (no ttl), their graces charged as daemon memory.
    EXPECT_GT(observer.GetStatus()->metadata_bytes, baseline);
    ASSERT_OK_AND_ASSIGN(claimed, receiver->Claim(std::span(&claimed_id, 1)));
  }
  // The sender has gone; 50 ms later the group gives back what nobody claimed, though the
  // receiver keeps the group alive.
  EXPECT_EQ(SealedObjects(observer, 1), 1u);
  EXPECT_EQ(receiver->Claim(std::span(&left_id, 1)).status().code(), StatusCode::kNotHeld);
  ASSERT_EQ(claimed.size(), 1u);
  const std::vector<std::byte> bytes = SeededBytes(64 * kKiB, 20);
  EXPECT_EQ(std::memcmp(claimed[0].ptr(), bytes.data(), bytes.size()), 0);
  claimed.clear();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
  EXPECT_EQ(MetadataBytes(observer, baseline), baseline);  // the graces' charges too
}

// Within its grace, what a sender that has gone handed off is still claimed.
TEST_F(HandoffTest, AClaimWithinTheGraceAfterTheSenderHasGoneSucceeds) {
  const std::string group = GroupKey('h');
  const ObjectId id = ObjectId::Random();
  auto receiver = Join(daemon_, group);
  ASSERT_TRUE(receiver.ok());
  Client observer = Observer();
  {
    // A minute: a thousand times what the claim below takes.
    auto sender = JoinWithGrace(daemon_, group, std::chrono::minutes(1));
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    ASSERT_OK(PutAndHandOff(*sender, id, SeededBytes(kKiB, 22)));
  }
  // The sender's end reaches the daemon before the receiver's next request does not
  // matter: either way the grace has not run out.
  auto got = receiver->Claim(std::span(&id, 1));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  got->clear();
  EXPECT_EQ(SealedObjects(observer, 0), 0u);
}

TEST_F(HandoffTest, AGraceOutOfRangeIsRefusedAtConnect) {
  for (const auto grace : {std::chrono::milliseconds(-1), std::chrono::milliseconds(1ll << 33)}) {
    auto sender = JoinWithGrace(daemon_, GroupKey('i'), grace);
    ASSERT_FALSE(sender.ok());
    EXPECT_EQ(sender.status().code(), StatusCode::kInvalidArgument) << sender.status().ToString();
    EXPECT_NE(sender.status().message().find("grace"), std::string::npos);
  }
}

// Graces are daemon memory as deadlines are: a member that hands one object off again and
// again with a grace is stopped at its group's metadata limit; its end turns them into
// deadlines, which give everything back while another member keeps the group alive.
TEST(HandoffDeadlineTest, GracesCountAgainstTheGroupsMetadataLimit) {
  TestDaemon daemon({"--memory", "64MiB", "--client-max-metadata", "64KiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  auto observer = Client::Connect(daemon.socket_path());
  ASSERT_TRUE(observer.ok());
  const uint64_t baseline = observer->GetStatus()->metadata_bytes;
  const ObjectId id = ObjectId::Random();
  auto keeper = Join(daemon, GroupKey('y'));
  ASSERT_TRUE(keeper.ok());
  {
    auto member = JoinWithGrace(daemon, GroupKey('y'), std::chrono::milliseconds(20));
    ASSERT_TRUE(member.ok());
    ASSERT_OK(PutAndHandOff(*member, id, SeededBytes(kKiB, 23)));
    Status st;
    int handed = 1;
    for (; handed < 10'000 && st.ok(); ++handed) st = member->Handoff(std::span(&id, 1));
    EXPECT_EQ(st.code(), StatusCode::kLimitExceeded) << st.ToString();
    EXPECT_LT(handed, 1000) << "64 KiB holds a few hundred graces";
    EXPECT_OK(member->GetStatus());
  }
  // The member has gone, the keeper stays: 20 ms later every reference is given back.
  EXPECT_EQ(SealedObjects(*observer, 0), 0u);
  EXPECT_EQ(MetadataBytes(*observer, baseline), baseline);
  EXPECT_OK(keeper->GetStatus());
}

// Deadlines are daemon memory: a member that hands one object off again and again, each
// with a long deadline, is stopped at its group's metadata limit, and everything is given
// back when the group ends.
TEST(HandoffDeadlineTest, DeadlinesCountAgainstTheGroupsMetadataLimit) {
  TestDaemon daemon({"--memory", "64MiB", "--client-max-metadata", "64KiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  auto observer = Client::Connect(daemon.socket_path());
  ASSERT_TRUE(observer.ok());
  const uint64_t baseline = observer->GetStatus()->metadata_bytes;
  const ObjectId id = ObjectId::Random();
  {
    auto member = Join(daemon, GroupKey('x'));
    ASSERT_TRUE(member.ok());
    ASSERT_OK(PutAndHandOff(*member, id, SeededBytes(kKiB, 6), std::chrono::hours(24)));
    Status st;
    int handed = 1;
    for (; handed < 10'000 && st.ok(); ++handed) {
      st = member->Handoff(std::span(&id, 1), Client::kHostMemory, std::chrono::hours(24));
    }
    EXPECT_EQ(st.code(), StatusCode::kLimitExceeded) << st.ToString();
    EXPECT_LT(handed, 1000) << "64 KiB holds a few hundred deadlines";
    // The daemon still serves the member.
    EXPECT_OK(member->GetStatus());
  }
  // The group ended with its only member: its references and deadlines are gone.
  EXPECT_EQ(SealedObjects(*observer, 0), 0u);
  EXPECT_EQ(MetadataBytes(*observer, baseline), baseline);
}

TEST(HandoffUidTest, AnotherUidCannotJoinAGroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as another user";
  constexpr uid_t kNobody = 65534;
  TestDaemon daemon({"--share-with-uid", std::to_string(kNobody), "--socket-mode", "0666"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  ASSERT_EQ(::chmod(daemon.dir().c_str(), 0755), 0);
  ConnectOptions options;
  options.group = GroupKey('g');
  auto owner = RawMember(daemon, options.group);
  EXPECT_EQ(RunInChild([&] {
              if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
                return ChildFailed(2, "setuid: " + std::string(strerror(errno)));
              }
              auto client = Client::Connect(daemon.socket_path(), options);
              if (client.ok()) return ChildFailed(3, "joined another uid's group");
              if (client.status().code() != StatusCode::kPermissionDenied ||
                  client.status().message().find("belongs to uid 0") == std::string::npos) {
                return ChildFailed(4, "unclear refusal: " + client.status().ToString());
              }
              return 0;
            }),
            0);
}

// A claim is a get: it counts against the claimer's limits, and one past them leaves the
// handoff with the group, to be claimed once the claimer has room.
TEST(HandoffLimitsTest, AClaimPastTheClaimersLimitsLeavesTheHandoffWithTheGroup) {
  // References may hold 6 MiB: 8 MiB less the quarter set aside for leases.
  TestDaemon daemon({"--memory", "64MiB", "--client-max-bytes", "8MiB"});
  ASSERT_TRUE(daemon.ok()) << daemon.error();
  const std::string group = GroupKey('l');
  auto sender = Join(daemon, group);
  auto receiver = Join(daemon, group);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const ObjectId held = ObjectId::Random(), sent = ObjectId::Random();
  const std::vector<std::byte> bytes = SeededBytes(2 * kMiB, 4);
  ASSERT_OK(receiver->Put(held, SeededBytes(5 * kMiB, 3)));
  ASSERT_OK_AND_ASSIGN(Buffer holding, receiver->Get(held));
  ASSERT_OK(PutAndHandOff(*sender, sent, bytes));
  auto refused = receiver->Claim(std::span(&sent, 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kLimitExceeded) << refused.status().ToString();
  holding = Buffer();
  ASSERT_OK(receiver->Contains(held).status());  // sends the release
  ASSERT_OK_AND_ASSIGN(auto claimed, receiver->Claim(std::span(&sent, 1)));
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_TRUE(SameBytes(claimed[0].data(), bytes));
}

}  // namespace
}  // namespace depot::testing
