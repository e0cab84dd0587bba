// The request path's parts with no daemon and no socket: a Responder records each request's
// latency once and drops an answer nobody reads; DataRequests answers through it, at once or
// when the store calls back, over the whole store in process (store_parts.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <capnp/serialize.h>

#include <memory>
#include <optional>
#include <vector>

#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "store/data_requests.h"
#include "store/object_store.h"
#include "store/responder.h"
#include "store_parts.h"

namespace depot::store {
namespace {

using testing::ManualExecutor;
using testing::Tiers;

constexpr ClientId kClient = 1;

ObjectId Id(uint64_t n) { return ObjectId::FromWords(n, 0x5e55); }

// A session as the handlers see it: the replies it was sent, kept to be read back.
class RecordingSink final : public Responder::Sink {
 public:
  void Send(capnp::MessageBuilder& message, wire::Reply::Builder,
            const ReplyAttachments& attach) override {
    replies_.push_back(capnp::messageToFlatArray(message));
    segments_.emplace_back(attach.segments.begin(), attach.segments.end());
  }
  bool closed() const override { return closed_; }
  uint64_t client_id() const override { return kClient; }

  size_t count() const { return replies_.size(); }
  // Reply `i`, readable while this sink lives.
  wire::Reply::Reader reply(size_t i) {
    readers_.emplace_back(std::make_unique<capnp::FlatArrayMessageReader>(replies_.at(i)));
    return readers_.back()->getRoot<wire::Reply>();
  }
  const std::vector<uint32_t>& segments(size_t i) const { return segments_.at(i); }
  void Close() { closed_ = true; }

 private:
  std::vector<kj::Array<capnp::word>> replies_;
  std::vector<std::vector<uint32_t>> segments_;
  std::vector<std::unique_ptr<capnp::FlatArrayMessageReader>> readers_;
  bool closed_ = false;
};

// A request built in memory, read as a handler reads it.
class Request {
 public:
  wire::Request::Builder root() { return message_.getRoot<wire::Request>(); }
  wire::Request::Reader read() { return message_.getRoot<wire::Request>().asReader(); }

 private:
  capnp::MallocMessageBuilder message_;
};

class ResponderTest : public ::testing::Test {
 protected:
  Responder Reply(uint64_t rid, RequestType type) {
    return Responder(sink_, metrics_, rid, type, ipc::MonotonicNanos());
  }

  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  Metrics metrics_{/*enabled=*/true};
};

TEST_F(ResponderTest, AnAnswerCarriesTheRequestsIdAndRecordsItsLatencyOnce) {
  Reply(7, RequestType::kSeal).Ok();
  Reply(8, RequestType::kSeal).Error(Status::NotFound("no such object"));
  ASSERT_EQ(sink_->count(), 2u);
  EXPECT_EQ(sink_->reply(0).getId(), 7u);
  EXPECT_TRUE(sink_->reply(0).isNone());
  EXPECT_EQ(sink_->reply(1).getId(), 8u);
  EXPECT_EQ(sink_->reply(1).getError(), wire::ErrorCode::NOT_FOUND);
  EXPECT_STREQ(sink_->reply(1).getMessage().cStr(), "no such object");
  EXPECT_EQ(metrics_.requests(RequestType::kSeal), 2u);
  EXPECT_EQ(metrics_.errors(StatusCode::kNotFound), 1u);
}

TEST_F(ResponderTest, RequestIdZeroWantsNoReplyButIsCounted) {
  Reply(0, RequestType::kRelease).Ok();
  Reply(0, RequestType::kRelease).Error(Status::NotHeld("not held"));
  EXPECT_EQ(sink_->count(), 0u);
  EXPECT_EQ(metrics_.requests(RequestType::kRelease), 2u);
  EXPECT_EQ(metrics_.errors(StatusCode::kNotHeld), 1u);
}

TEST_F(ResponderTest, AnAnswerToASessionThatHasGoneIsDropped) {
  const Responder closing = Reply(3, RequestType::kGet);
  const Responder gone = Reply(4, RequestType::kGet);
  sink_->Close();
  EXPECT_TRUE(closing.gone());
  closing.Ok();
  EXPECT_EQ(sink_->count(), 0u);
  sink_.reset();
  EXPECT_TRUE(gone.gone());
  gone.Ok();  // nobody to send it to: dropped, and still timed
  EXPECT_EQ(metrics_.requests(RequestType::kGet), 2u);
}

class DataRequestsTest : public ResponderTest {
 protected:
  DataRequestsTest()
      : store_(loop_, executor_, *tiers_.arena, *tiers_.headers, ClientLimits{},
               /*eviction=*/true, tiers_.gpu_pools()) {
    store_.AddClient(kClient, ::geteuid());
  }

  // A put of `n` (100 bytes) by the same client, in one create request.
  void Put(uint64_t n) {
    Request r;
    auto create = r.root().initCreate();
    ipc::ToWire(Id(n), create.initId());
    const std::vector<capnp::byte> data(100, 1);
    create.setDataSize(data.size());
    create.setData(capnp::Data::Reader(data.data(), data.size()));
    create.setSeal(true);
    create.setRelease(true);
    requests_.Create(Reply(100 + n, RequestType::kPut), who_, r.read().getCreate());
    executor_.Drain();
  }

  boost::asio::io_context loop_;
  ManualExecutor executor_;
  Tiers tiers_;
  ObjectStore store_;
  DataRequests requests_{store_};
  Requester who_{.client = kClient, .max_batch = 4};
};

TEST_F(DataRequestsTest, AGetThatWaitsIsAnsweredThroughItsResponderWhenTheObjectIsSealed) {
  Request r;
  auto get = r.root().initGet();
  ipc::ToWire(Id(1), get.initIds(1)[0]);
  get.setTimeoutMs(-1);
  requests_.Get(Reply(5, RequestType::kGet), who_, r.read().getGet());
  EXPECT_EQ(sink_->count(), 0u);  // waits
  Put(1);
  ASSERT_EQ(sink_->count(), 2u);  // the get's (answered by the seal), then the put's
  auto reply = sink_->reply(0);
  EXPECT_EQ(reply.getId(), 5u);
  ASSERT_TRUE(reply.isGet());
  EXPECT_EQ(reply.getGet()[0].getError(), wire::ErrorCode::OK);
  EXPECT_EQ(reply.getGet()[0].getLocation().getDataSize(), 100u);
  // The segment the object is in travels with the reply.
  EXPECT_EQ(sink_->segments(1),
            std::vector<uint32_t>{reply.getGet()[0].getLocation().getSegment()});
  EXPECT_EQ(metrics_.requests(RequestType::kGet), 1u);
}

TEST_F(DataRequestsTest, ACancelAnswersTheWaitFirstThenSaysItWasWaiting) {
  Request wait;
  auto w = wait.root().initWait();
  ipc::ToWire(Id(2), w.initIds(1)[0]);
  w.setTimeoutMs(-1);
  requests_.Wait(Reply(9, RequestType::kWait), who_, wait.read().getWait());
  requests_.CancelWait(Reply(10, RequestType::kCancelWait), who_, 9);
  ASSERT_EQ(sink_->count(), 2u);
  EXPECT_EQ(sink_->reply(0).getId(), 9u);
  ASSERT_TRUE(sink_->reply(0).isWait());
  EXPECT_FALSE(sink_->reply(0).getWait()[0]);
  EXPECT_EQ(sink_->reply(1).getId(), 10u);
  EXPECT_TRUE(sink_->reply(1).getCancelWait());
  requests_.CancelWait(Reply(11, RequestType::kCancelWait), who_, 9);
  EXPECT_FALSE(sink_->reply(2).getCancelWait());  // answered already
}

TEST_F(DataRequestsTest, IdsPastTheBatchLimitOrNilAreRefusedSayingWhy) {
  Request r;
  auto ids = r.root().initGet().initIds(5);  // the limit is 4
  for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(Id(i + 1), ids[i]);
  requests_.Get(Reply(1, RequestType::kGet), who_, r.read().getGet());
  Request nil;
  nil.root().initContains(1);  // the nil id: contains takes it, get does not
  Request nil_get;
  nil_get.root().initGet().initIds(1);
  requests_.Get(Reply(2, RequestType::kGet), who_, nil_get.read().getGet());
  requests_.Contains(Reply(3, RequestType::kContains), who_, nil.read().getContains());
  ASSERT_EQ(sink_->count(), 3u);
  EXPECT_EQ(sink_->reply(0).getError(), wire::ErrorCode::LIMIT_EXCEEDED);
  EXPECT_STREQ(sink_->reply(0).getMessage().cStr(),
               "a request may name at most 4 objects, this one names 5");
  EXPECT_EQ(sink_->reply(1).getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_FALSE(sink_->reply(2).getContains()[0]);
}

TEST_F(DataRequestsTest, AClaimOrHandoffWithoutAGroupIsRefused) {
  Put(3);
  Request claim;
  auto get = claim.root().initGet();
  ipc::ToWire(Id(3), get.initIds(1)[0]);
  get.setClaim(true);
  requests_.Get(Reply(1, RequestType::kGet), who_, claim.read().getGet());
  Request handoff;
  ipc::ToWire(Id(3), handoff.root().initHandoff().initIds(1)[0]);
  requests_.Handoff(Reply(2, RequestType::kHandoff), who_, handoff.read().getHandoff());
  ASSERT_EQ(sink_->count(), 3u);
  EXPECT_EQ(sink_->reply(1).getError(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(sink_->reply(2).getError(), wire::ErrorCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace depot::store
