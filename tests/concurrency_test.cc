// Many writers and readers at once, in threads sharing one Client and in separate
// processes: every object read back is exactly what was written (checked by XXH3).
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "daemon.h"
#include "depot/client.h"
#include "test_support.h"

namespace depot::testing {
namespace {

using std::chrono::milliseconds;

// An object every participant can name and verify: its contents follow from its name, and
// its metadata carries the XXH3 of its data.
struct Named {
  std::string name;
  ObjectId id;
  uint64_t seed;
  size_t size;
};

Named MakeNamed(const std::string& name) {
  const uint64_t seed = Xxh3(AsBytes(name));
  // 1 byte to 64 KiB, so small objects and multi-page ones mix.
  return Named{name, ObjectId::FromName(name), seed, 1 + seed % (64 * 1024)};
}

Status PutNamed(Client& client, const Named& o) {
  const std::vector<std::byte> data = SeededBytes(o.size, o.seed);
  const uint64_t sum = Xxh3(data);
  CreateOptions options;
  options.metadata = std::as_bytes(std::span(&sum, 1));
  options.name = o.name;
  return client.Put(o.id, data, options);
}

// Empty if `buffer` holds exactly o's contents, else what is wrong.
std::string CheckNamed(const Buffer& buffer, const Named& o) {
  if (!buffer) return o.name + ": missing";
  if (buffer.size() != o.size) {
    return o.name + ": size " + std::to_string(buffer.size()) + ", expected " +
           std::to_string(o.size);
  }
  uint64_t recorded = 0;
  if (buffer.metadata().size() != sizeof(recorded)) return o.name + ": metadata has the wrong size";
  std::memcpy(&recorded, buffer.metadata().data(), sizeof(recorded));
  const uint64_t actual = Xxh3(buffer.data());
  if (actual != recorded) return o.name + ": data does not match the checksum in its metadata";
  if (actual != Xxh3(SeededBytes(o.size, o.seed)))
    return o.name + ": data differs from what was put";
  return "";
}

std::vector<Named> NamedObjects(const std::string& owner, int count) {
  std::vector<Named> out;
  for (int i = 0; i < count; ++i)
    out.push_back(MakeNamed("concurrency/" + owner + "/" + std::to_string(i)));
  return out;
}

class ConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.emplace(std::vector<std::string>{"--memory", "256MiB", "--segment-size", "64MiB"});
    ASSERT_TRUE(daemon_->ok()) << daemon_->error();
  }

  std::optional<TestDaemon> daemon_;
};

TEST_F(ConcurrencyTest, ThreadsSharingOneClientPutAndGetIntactObjects) {
  constexpr int kThreads = 8;
  constexpr int kObjectsPerThread = 200;
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->socket_path()));
  std::vector<std::vector<Named>> objects;
  for (int t = 0; t < kThreads; ++t)
    objects.push_back(NamedObjects("thread" + std::to_string(t), kObjectsPerThread));

  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string& error = errors[t];
      for (const Named& o : objects[t]) {
        if (Status st = PutNamed(client, o); !st.ok()) {
          error = o.name + ": put: " + st.ToString();
          return;
        }
      }
      // Every thread reads every object, one at a time and in batches, waiting for those
      // other threads have not put yet.
      for (int k = 0; k < kThreads; ++k) {
        const std::vector<Named>& theirs = objects[(t + k) % kThreads];
        if (k % 2 == 0) {
          for (const Named& o : theirs) {
            auto buffer = client.Get(o.id, milliseconds(20'000));
            if (!buffer.ok()) {
              error = o.name + ": get: " + buffer.status().ToString();
              return;
            }
            if (std::string bad = CheckNamed(*buffer, o); !bad.empty()) {
              error = bad;
              return;
            }
          }
        } else {
          std::vector<ObjectId> ids;
          for (const Named& o : theirs) ids.push_back(o.id);
          auto buffers = client.Get(ids, milliseconds(20'000));
          if (!buffers.ok()) {
            error = "batch get: " + buffers.status().ToString();
            return;
          }
          for (size_t i = 0; i < theirs.size(); ++i) {
            if (std::string bad = CheckNamed((*buffers)[i], theirs[i]); !bad.empty()) {
              error = bad;
              return;
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;

  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.objects_sealed, uint64_t{kThreads * kObjectsPerThread});
  EXPECT_EQ(status.held_bytes, 0u) << "every Buffer is gone, so is every reference";
}

TEST_F(ConcurrencyTest, ProcessesExchangeObjectsByName) {
  constexpr int kProcesses = 16;
  constexpr int kObjectsPerProcess = 64;
  const std::string socket = daemon_->socket_path();
  std::vector<std::vector<Named>> objects;
  for (int p = 0; p < kProcesses; ++p)
    objects.push_back(NamedObjects("process" + std::to_string(p), kObjectsPerProcess));

  std::vector<ChildProcess> children;
  for (int p = 0; p < kProcesses; ++p) {
    children.push_back(ChildProcess::Start([&, p]() -> int {
      auto client = Client::Connect(socket);
      if (!client.ok()) return ChildFailed(2, client.status().ToString());
      for (const Named& o : objects[p]) {
        if (Status st = PutNamed(*client, o); !st.ok())
          return ChildFailed(3, o.name + ": " + st.ToString());
      }
      for (int k = 1; k <= kProcesses; ++k) {
        const std::vector<Named>& theirs = objects[(p + k) % kProcesses];
        std::vector<ObjectId> ids;
        for (const Named& o : theirs) ids.push_back(o.id);
        auto buffers = client->Get(ids, milliseconds(30'000));
        if (!buffers.ok()) return ChildFailed(4, buffers.status().ToString());
        for (size_t i = 0; i < theirs.size(); ++i) {
          if (std::string bad = CheckNamed((*buffers)[i], theirs[i]); !bad.empty())
            return ChildFailed(5, bad);
        }
      }
      return 0;
    }));
  }
  for (int p = 0; p < kProcesses; ++p)
    EXPECT_EQ(children[p].Wait(milliseconds(60'000)), 0) << "process " << p;

  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(socket));
  ASSERT_OK_AND_ASSIGN(StoreStatus status, client.GetStatus());
  EXPECT_EQ(status.objects_sealed, uint64_t{kProcesses * kObjectsPerProcess});
  // Every reader has exited; the daemon may still be closing the last sessions.
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(2000);
  while (status.held_bytes != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
    ASSERT_OK_AND_ASSIGN(status, client.GetStatus());
  }
  EXPECT_EQ(status.held_bytes, 0u);
}

// A child forked while the parent's release flusher starts or sends must not inherit a lock
// the flusher held. With an allocator that has no fork handlers of its own (ASan's), a child
// forked just after a flusher thread was created hung at its first allocation of the size
// the new thread was allocating. Each round forks at another point of a new flusher's first
// gathering round: as it starts, while it waits, and while it sends.
TEST_F(ConcurrencyTest, ForkWhileTheParentsFlusherWorksGivesAWorkingChild) {
  const std::string socket = daemon_->socket_path();
  // Small enough to be sent whole, so that no flusher has started before the first round's:
  // a process's first thread is the slowest to start.
  const ObjectId shared = ObjectId::FromName("concurrency/fork/shared");
  {
    ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(socket));
    ASSERT_OK(client.Put(shared, SeededBytes(1000, 0)));
  }
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(socket));
    {
      ASSERT_OK_AND_ASSIGN(Buffer held, client.Get(shared));
    }  // the first release starts the flusher, which sends it about 1 ms later
    std::this_thread::sleep_for(std::chrono::microseconds(50 * round));
    const ObjectId mine = ObjectId::FromName("concurrency/fork/" + std::to_string(round));
    const std::vector<std::byte> data = SeededBytes(1000, round);
    // The child takes no reference (a small put is sent whole), so it starts no flusher of
    // its own, which TSan would refuse: it would get the parent flusher's thread id.
    const int code = RunInChild(
        [&]() -> int {
          // Enough blocks of every small size that each size class of the allocator, and
          // the lock that guards it, is used here.
          std::vector<std::unique_ptr<char[]>> blocks;
          for (size_t size = 8; size <= 16 * 1024; size += size / 8) {
            for (int k = 0; k < 64; ++k) blocks.emplace_back(new char[size]);
          }
          auto child = Client::Connect(socket);
          if (!child.ok()) return ChildFailed(2, child.status().ToString());
          if (Status st = child->Put(mine, data); !st.ok()) return ChildFailed(3, st.ToString());
          auto found = child->Contains(shared);
          if (!found.ok() || !*found) return ChildFailed(4, "the shared object is not found");
          return 0;
        },
        milliseconds(20'000));
    ASSERT_EQ(code, 0) << "round " << round;
    ASSERT_OK_AND_ASSIGN(bool put, client.Contains(mine));
    EXPECT_TRUE(put) << "round " << round;
  }
}

// fork() waits for no socket write: a thread blocked writing to a daemon that reads
// nothing (stopped here) must not hold up another thread's fork, nor must the flusher,
// which then waits behind that writer with a release to send.
TEST_F(ConcurrencyTest, ForkDoesNotWaitForAWriteTheDaemonIsNotReading) {
  const std::string socket = daemon_->socket_path();
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(socket));
  const ObjectId held_id = ObjectId::FromName("concurrency/stopped/held");
  ASSERT_OK(client.Put(held_id, SeededBytes(100, 5)));
  std::optional<Buffer> held;
  ASSERT_OK_AND_ASSIGN(held, client.Get(held_id));
  const std::vector<std::byte> data = SeededBytes(Client::kInlinePutBytes, 3);
  std::vector<PutItem> items;
  for (int i = 0; i < 2 * static_cast<int>(Client::kPutManyWindow); ++i) {
    items.push_back({ObjectId::FromName("concurrency/stopped/" + std::to_string(i)), data, {}});
  }
  ASSERT_EQ(::kill(daemon_->pid(), SIGSTOP), 0);
  // Resumes the daemon once the fork has returned, or after 5 s should it wait for ever.
  std::promise<void> fork_returned;
  std::thread resumer([&, returned = fork_returned.get_future()] {
    returned.wait_for(std::chrono::seconds(5));
    ::kill(daemon_->pid(), SIGCONT);
  });
  std::vector<Status> statuses;
  std::thread writer([&] { statuses = client.PutMany(items); });  // 8 MiB: fills the socket
  std::this_thread::sleep_for(milliseconds(200));
  held.reset();  // the flusher wakes with a release, to wait for the writer's lock
  std::this_thread::sleep_for(milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  ChildProcess child = ChildProcess::Start([] { return 0; });
  const auto forked = std::chrono::steady_clock::now() - start;
  fork_returned.set_value();
  resumer.join();
  EXPECT_EQ(child.Wait(milliseconds(20'000)), 0);
  writer.join();
  EXPECT_LT(forked, milliseconds(4000)) << "fork waited for the stopped daemon";
  ASSERT_EQ(statuses.size(), items.size());
  for (const Status& st : statuses) EXPECT_OK(st);
}

// Many Clients, each with a flusher, then a fork: what the fork handlers hold does not grow
// with the number of connections (TSan's deadlock detector stops a thread holding 64 locks).
TEST_F(ConcurrencyTest, ForkWithManyClientsConnected) {
  const std::string socket = daemon_->socket_path();
  const ObjectId id = ObjectId::FromName("concurrency/many-clients");
  std::vector<Client> clients;
  {
    ASSERT_OK_AND_ASSIGN(Client first, Client::Connect(socket));
    ASSERT_OK(first.Put(id, SeededBytes(100, 4)));
  }
  for (int i = 0; i < 48; ++i) {
    ASSERT_OK_AND_ASSIGN(Client c, Client::Connect(socket));
    {
      ASSERT_OK_AND_ASSIGN(Buffer held, c.Get(id));  // its release starts a flusher
    }
    clients.push_back(std::move(c));
  }
  const int code = RunInChild(
      [&]() -> int {
        auto child = Client::Connect(socket);
        if (!child.ok()) return ChildFailed(2, child.status().ToString());
        auto found = child->Contains(id);
        return found.ok() && *found ? 0 : ChildFailed(3, "the object is not found");
      },
      milliseconds(20'000));
  EXPECT_EQ(code, 0);
}

TEST_F(ConcurrencyTest, ProcessesRacingToCreateOneIdHaveExactlyOneWinner) {
  constexpr int kProcesses = 16;
  const ObjectId id = ObjectId::FromName("concurrency/contested");
  const std::string socket = daemon_->socket_path();
  // Everyone connects first, then all create at once.
  std::vector<std::unique_ptr<ReadyPipe>> connected;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<ChildProcess> children;
  for (int p = 0; p < kProcesses; ++p) {
    connected.push_back(std::make_unique<ReadyPipe>());
    ReadyPipe& ready = *connected.back();
    children.push_back(ChildProcess::Start([&, p]() -> int {
      ::close(go[1]);
      auto client = Client::Connect(socket);
      if (!client.ok()) return ChildFailed(2, client.status().ToString());
      ready.Signal();
      char byte;
      if (::read(go[0], &byte, 1) != 0) return ChildFailed(3, "the start pipe was written to");
      const std::string mine = "winner " + std::to_string(p);
      Status st = client->Put(id, AsBytes(mine));
      if (st.ok()) return 0;
      if (st.Is(StatusCode::kAlreadyExists)) return 10;
      return ChildFailed(4, st.ToString());
    }));
  }
  ::close(go[0]);
  for (auto& ready : connected) ASSERT_TRUE(ready->Wait(milliseconds(10'000)));
  ::close(go[1]);  // end of file: go

  int winners = 0, losers = 0;
  for (ChildProcess& child : children) {
    const int code = child.Wait();
    if (code == 0) ++winners;
    if (code == 10) ++losers;
  }
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(losers, kProcesses - 1);
  ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(socket));
  ASSERT_OK_AND_ASSIGN(Buffer object, client.Get(id));
  EXPECT_TRUE(std::string_view(reinterpret_cast<const char*>(object.ptr()), object.size())
                  .starts_with("winner "));
}

}  // namespace
}  // namespace depot::testing
