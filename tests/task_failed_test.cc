// Failed objects over the wire, against clients that mean well and one that does not.
//
// Only the daemon makes failed objects (its scheduler seals a failed task's outputs so);
// no request does. So the daemon here is depotd's store and server run in this process,
// on a thread of their own, and the test seals objects as failed through the store on that
// thread, as the scheduler will. Clients are real: the library's, and a raw session
// speaking the protocol by hand. Each test ends with the daemon serving another client.
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon.h"
#include "depot/client.h"
#include "raw_session.h"
#include "store/arena.h"
#include "store/executor.h"
#include "store/header_table.h"
#include "store/object_store.h"
#include "store/scheduler_store.h"
#include "store/server.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using namespace std::chrono_literals;

// depotd's store and server, serving a socket in a temporary directory from a thread.
class InProcessDaemon {
 public:
  InProcessDaemon() {
    auto arena = store::Arena::Create(store::ArenaOptions{64 << 20, 16 << 20, "", {}, {}}, pool_);
    EXPECT_TRUE(arena.ok()) << arena.status().ToString();
    arena_ = std::move(arena).value();
    auto headers = store::HeaderTable::Create(4096);
    EXPECT_TRUE(headers.ok()) << headers.status().ToString();
    headers_ = std::move(headers).value();
    store_ = std::make_unique<store::ObjectStore>(loop_, executor_, *arena_, *headers_,
                                                  store::ClientLimits{}, /*eviction=*/true);
    socket_path_ = dir_.path() + "/depot.sock";
    server_ = std::make_unique<store::Server>(
        loop_, *store_,
        store::ServerOptions{.socket_path = socket_path_,
                             .max_frame_bytes = ipc::kDefaultMaxFrameBytes,
                             .max_batch = ipc::kDefaultMaxBatch,
                             .device_backend = "none (in-process test daemon)"});
    graph_ = std::make_unique<store::SchedulerStore>(*store_, events_);
    Status st = server_->Listen();
    EXPECT_TRUE(st.ok()) << st.ToString();
    thread_ = std::thread([this] { loop_.run(); });
  }
  // Runs `f` on the daemon's loop, as its scheduler would, and waits for it.
  template <typename F>
  auto OnLoop(F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto done = task.get_future();
    boost::asio::post(loop_, [&task] { task(); });
    return done.get();
  }
  ~InProcessDaemon() {
    OnLoop([this] {
      graph_.reset();
      server_->Shutdown();
    });
    work_.reset();
    loop_.stop();
    thread_.join();
    pool_.join();
  }

  const std::string& socket_path() const { return socket_path_; }

  // Seals `ids` as failed through the scheduler's view of the store, and says how many of
  // them are failed objects now.
  size_t SealFailed(std::vector<ObjectId> ids, std::string message) {
    return OnLoop([&] {
      graph_->SealFailed(ids, message);
      std::vector<scheduler::StoreAccess::Object> out(ids.size());
      graph_->Locate(ids, out);
      return static_cast<size_t>(std::ranges::count_if(
          out, [](const auto& o) { return o.state == scheduler::StoreAccess::State::kFailed; }));
    });
  }

 private:
  TempDir dir_;
  std::string socket_path_;
  boost::asio::io_context loop_{1};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      std::in_place, loop_.get_executor()};
  boost::asio::thread_pool pool_{1};
  store::WorkerPoolExecutor executor_{loop_, pool_};
  std::unique_ptr<store::Arena> arena_;
  std::unique_ptr<store::HeaderTable> headers_;
  std::unique_ptr<store::ObjectStore> store_;
  std::unique_ptr<store::Server> server_;
  struct : scheduler::ObjectEvents {
    void OnSealed(const ObjectId&, bool) override {}
    void OnFreed(const ObjectId&) override {}
    void OnMemory(const ObjectId&, bool) override {}
  } events_;
  std::unique_ptr<store::SchedulerStore> graph_;
  std::thread thread_;
};

class TaskFailedTest : public ::testing::Test {
 protected:
  Client Connect() {
    auto client = Client::Connect(daemon_.socket_path());
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return std::move(client).value();
  }
  // Another client puts and gets an object of its own, byte-exact.
  void ExpectServing(const std::string& name) {
    Client other = Connect();
    const auto bytes = SeededBytes(10'000, 99);
    const ObjectId id = ObjectId::FromName(name);
    ASSERT_TRUE(other.Put(id, bytes).ok());
    auto got = other.Get(id);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(SameBytes(got->data(), bytes));
  }

  InProcessDaemon daemon_;
};

TEST_F(TaskFailedTest, AGetOfAFailedObjectByAnyClientIsTaskFailedWithTheExactMessage) {
  const ObjectId failed = ObjectId::FromName("sum-output");
  const std::string message = "sum: input 2 is not an array of float64 (got int8) \xe2\x9c\x97";
  ASSERT_EQ(daemon_.SealFailed({failed}, message), 1u);
  Client a = Connect();
  Client b = Connect();
  for (Client* client : {&a, &b}) {
    auto one = client->Get(failed);
    ASSERT_FALSE(one.ok());
    EXPECT_EQ(one.status().code(), StatusCode::kTaskFailed);
    EXPECT_EQ(one.status().message(), message);
  }
  // In a batch, the failed object fails the get, and the object beside it is not kept.
  const ObjectId fine = ObjectId::FromName("fine");
  ASSERT_TRUE(a.Put(fine, AsBytes("bytes")).ok());
  const std::vector<ObjectId> both{fine, failed};
  auto batch = b.Get(both, 1s);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kTaskFailed);
  EXPECT_EQ(batch.status().message(), message);
  auto placement = a.Locate(both);
  ASSERT_TRUE(placement.ok());
  EXPECT_FALSE((*placement)[0].failed);
  EXPECT_TRUE((*placement)[1].found && (*placement)[1].failed);
  EXPECT_FALSE((*placement)[1].on_host);
  auto list = a.List();
  ASSERT_TRUE(list.ok());
  for (const ObjectInfo& o : *list) EXPECT_EQ(o.failed, o.id == failed) << o.id.Hex();
  auto details = a.Describe(failed);
  ASSERT_TRUE(details.ok()) << details.status().ToString();
  EXPECT_TRUE(details->info.failed);
  auto contains = a.Contains(failed);
  EXPECT_TRUE(contains.ok() && *contains);
  ExpectServing("after-get");
}

TEST_F(TaskFailedTest, AGetWaitingForAnOutputIsAnsweredWhenItIsSealedAsFailed) {
  const ObjectId late = ObjectId::FromName("late-output");
  Client waiter = Connect();
  auto got = std::async(std::launch::async, [&] { return waiter.Get(late, 10s); });
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(daemon_.SealFailed({late}, "worker 2 was killed"), 1u);
  ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
  Result<Buffer> r = got.get();
  EXPECT_EQ(r.status().code(), StatusCode::kTaskFailed);
  EXPECT_EQ(r.status().message(), "worker 2 was killed");
  ExpectServing("after-wait");
}

TEST_F(TaskFailedTest, AClientCannotTurnAnObjectIntoAFailedOneNorChangeAFailedOne) {
  RawSession raw(daemon_.socket_path());
  ASSERT_TRUE(raw.Call(1, [](wire::Request::Builder r) { FillHello(r); }));
  // An object a client made stays its own whatever the daemon seals as failed after: the
  // id exists, so it is left as it is.
  const ObjectId mine = ObjectId::FromName("mine");
  Client owner = Connect();
  ASSERT_TRUE(owner.Put(mine, AsBytes("my bytes")).ok());
  const ObjectId creating = ObjectId::FromName("creating");
  auto buffer = owner.Create(creating, 4);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(daemon_.SealFailed({mine, creating}, "no"), 0u);
  ASSERT_TRUE(owner.Seal(creating).ok());
  EXPECT_TRUE(Connect().Get(creating).ok());
  // An empty object is an empty object, not a failed one.
  const ObjectId empty = ObjectId::FromName("empty");
  ASSERT_TRUE(owner.Put(empty, {}).ok());
  auto got = Connect().Get(empty);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), 0u);

  // Against a failed object, every request that writes is refused, and its message stays.
  const ObjectId failed = ObjectId::FromName("failed");
  ASSERT_EQ(daemon_.SealFailed({failed}, "the real reason"), 1u);
  auto create = raw.Call(2, [&](wire::Request::Builder r) {
    auto c = r.initCreate();
    ipc::ToWire(failed, c.initId());
    c.setDataSize(8);
    c.setData(kj::heapArray<kj::byte>(8).asPtr());
    c.setSeal(true);
  });
  ASSERT_TRUE(create);
  EXPECT_EQ(create->get().getError(), wire::ErrorCode::ALREADY_EXISTS);
  auto seal = raw.Call(3, [&](wire::Request::Builder r) { ipc::ToWire(failed, r.initSeal()); });
  ASSERT_TRUE(seal);
  EXPECT_EQ(seal->get().getError(), wire::ErrorCode::ALREADY_SEALED);
  auto abort = raw.Call(4, [&](wire::Request::Builder r) { ipc::ToWire(failed, r.initAbort()); });
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->get().getError(), wire::ErrorCode::ALREADY_SEALED);
  // A get answers the message and holds nothing, so a release of it is NotHeld.
  auto get = raw.Call(
      5, [&](wire::Request::Builder r) { ipc::ToWire(failed, r.initGet().initIds(1)[0]); });
  ASSERT_TRUE(get);
  ASSERT_EQ(get->get().getGet().size(), 1u);
  EXPECT_EQ(get->get().getGet()[0].getError(), wire::ErrorCode::TASK_FAILED);
  EXPECT_EQ(std::string(get->get().getGet()[0].getMessage().cStr()), "the real reason");
  auto release = raw.Call(
      6, [&](wire::Request::Builder r) { ipc::ToWire(failed, r.initRelease(1)[0].initIds(1)[0]); });
  ASSERT_TRUE(release);
  EXPECT_EQ(release->get().getError(), wire::ErrorCode::NOT_HELD);
  auto again = Connect().Get(failed);
  EXPECT_EQ(again.status().code(), StatusCode::kTaskFailed);
  EXPECT_EQ(again.status().message(), "the real reason");
  // Deleting it is allowed, as for any object: the id is free for a client's own bytes.
  ASSERT_TRUE(owner.Delete(failed).ok());
  ASSERT_TRUE(owner.Put(failed, AsBytes("bytes")).ok());
  EXPECT_TRUE(Connect().Get(failed).ok());
  ExpectServing("after-hostile");
}

TEST_F(TaskFailedTest, AGetOfManyFailedObjectsKeepsItsReplyBounded) {
  std::vector<ObjectId> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(ObjectId::FromName("out-" + std::to_string(i)));
  const std::string message(8000, 'x');  // cut to 4096 bytes
  ASSERT_EQ(daemon_.SealFailed(ids, message), ids.size());
  RawSession raw(daemon_.socket_path());
  ASSERT_TRUE(raw.Call(1, [](wire::Request::Builder r) { FillHello(r); }));
  auto get = raw.Call(2, [&](wire::Request::Builder r) {
    auto list = r.initGet().initIds(static_cast<unsigned>(ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
  });
  ASSERT_TRUE(get);
  auto results = get->get().getGet();
  ASSERT_EQ(results.size(), ids.size());
  size_t message_bytes = 0, full = 0;
  for (auto r : results) {
    EXPECT_EQ(r.getError(), wire::ErrorCode::TASK_FAILED);
    message_bytes += r.getMessage().size();
    if (r.getMessage().size() == 4096) ++full;
  }
  EXPECT_EQ(results[0].getMessage().size(), 4096u);
  EXPECT_EQ(full, (1u << 20) / 4096);
  EXPECT_LT(message_bytes, (1u << 20) + ids.size() * 200);
  ExpectServing("after-many");
}

}  // namespace
}  // namespace depot::testing
