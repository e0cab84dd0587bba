// A client that speaks the wire protocol by hand (ipc framing, no client library), for the
// tests that play a client the library would never be: protocol_test's malformed input and
// hostile_test's attacks. Failures inside it are GoogleTest failures of the calling test.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "depot/ipc/framing.h"
#include "depot/ipc/protocol.h"
#include "depot/object_id.h"

namespace depot::testing {

inline constexpr std::chrono::milliseconds kReplyTimeout{5000};

// A reply read off the socket, with the descriptors that came with it.
struct RawReply {
  std::vector<capnp::word> words;
  std::vector<ipc::UniqueFd> fds;
  std::unique_ptr<capnp::FlatArrayMessageReader> message;

  wire::Reply::Reader get() {
    if (!message)
      message =
          std::make_unique<capnp::FlatArrayMessageReader>(kj::arrayPtr(words.data(), words.size()));
    return message->getRoot<wire::Reply>();
  }
};

// One connection to the daemon, framed by hand.
class RawSession {
 public:
  explicit RawSession(const std::string& path) : reader_(1u << 30) {
    auto fd = ipc::ConnectUnix(path);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (fd.ok()) fd_ = std::move(*fd);
  }

  int fd() const { return fd_.get(); }
  // Whether the daemon has hung up (seen by Receive).
  bool closed() const { return closed_; }

  // Sends one request; `fill` sets its body (the id is set here).
  Status Send(uint64_t id, const std::function<void(wire::Request::Builder)>& fill,
              std::vector<int> fds = {}) {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::Request>();
    request.setId(id);
    fill(request);
    DEPOT_ASSIGN_OR_RETURN(ipc::OutFrame frame, ipc::EncodeFrame(message, std::move(fds)));
    return ipc::WriteFrameFully(fd_.get(), frame);
  }

  // Writes raw bytes.
  bool SendBytes(const void* data, size_t size) {
    return ::send(fd_.get(), data, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size);
  }

  // The next reply, or nullopt if none came within `timeout` or the daemon hung up (then
  // closed() is true).
  std::optional<RawReply> Receive(std::chrono::milliseconds timeout = kReplyTimeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto next = reader_.Next();
      if (!next.ok()) {
        ADD_FAILURE() << "bad frame from the daemon: " << next.status().ToString();
        return std::nullopt;
      }
      if (next->has_value()) {
        RawReply reply;
        reply.words.assign((*next)->payload.begin(), (*next)->payload.end());
        reply.fds = std::move((*next)->fds);
        return reply;
      }
      if (closed_) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) return std::nullopt;  // 0: look once, without waiting
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      bool would_block = false;
      auto n = reader_.ReadSome(fd_.get(), &would_block);
      if (!n.ok() || (*n == 0 && !would_block)) closed_ = true;
    }
  }

  // Sends a request and returns its reply (nullopt, with a test failure, if none came).
  std::optional<RawReply> Call(uint64_t id,
                               const std::function<void(wire::Request::Builder)>& fill) {
    Status st = Send(id, fill);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto reply = Receive();
    EXPECT_TRUE(reply.has_value())
        << "no reply to request " << id << (closed_ ? ": the daemon closed the session" : "");
    if (reply) {
      EXPECT_EQ(reply->get().getId(), id);
    }
    return reply;
  }

  // Whether the daemon closes the session within `timeout`; replies that come first are
  // counted in `*replies`.
  bool ClosedWithin(std::chrono::milliseconds timeout, int* replies = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!closed_ && std::chrono::steady_clock::now() < deadline) {
      if (Receive(std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - std::chrono::steady_clock::now())) &&
          replies) {
        ++*replies;
      }
    }
    return closed_;
  }

 private:
  ipc::UniqueFd fd_;
  ipc::FrameReader reader_;
  bool closed_ = false;
};

inline void FillHello(wire::Request::Builder r, uint32_t version = ipc::kProtocolVersion) {
  auto hello = r.initHello();
  hello.setProtocolVersion(version);
  hello.setClientName("raw_session");
}

inline auto StatusRequest() {
  return [](wire::Request::Builder r) { r.setStatus(); };
}

inline auto CreateOf(const ObjectId& id, uint64_t size, std::string_view metadata = {}) {
  return [=](wire::Request::Builder r) {
    auto create = r.initCreate();
    ipc::ToWire(id, create.initId());
    create.setDataSize(size);
    create.setMetadata(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(metadata.data()), metadata.size()));
  };
}

inline auto SealOf(const ObjectId& id) {
  return [=](wire::Request::Builder r) { ipc::ToWire(id, r.initSeal()); };
}

inline auto GetOf(const std::vector<ObjectId>& ids, int64_t timeout_ms = 0) {
  return [=](wire::Request::Builder r) {
    auto get = r.initGet();
    auto list = get.initIds(static_cast<unsigned>(ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
    get.setTimeoutMs(timeout_ms);
  };
}

inline auto WaitOf(const std::vector<ObjectId>& ids, uint32_t count, int64_t timeout_ms = -1) {
  return [=](wire::Request::Builder r) {
    auto wait = r.initWait();
    auto list = wait.initIds(static_cast<unsigned>(ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(ids[i], list[i]);
    wait.setCount(count);
    wait.setTimeoutMs(timeout_ms);
  };
}

inline auto CancelWaitOf(uint64_t request) {
  return [=](wire::Request::Builder r) { r.setCancelWait(request); };
}

// release (of host references), delete, contains, locate and deleteAfterTasks all take a
// list of ids.
enum class IdList { kRelease, kDelete, kContains, kLocate, kDeleteAfterTasks };
inline auto ListOf(IdList kind, const std::vector<ObjectId>& ids) {
  return [=](wire::Request::Builder r) {
    const auto n = static_cast<unsigned>(ids.size());
    auto list = kind == IdList::kRelease    ? r.initRelease(1)[0].initIds(n)
                : kind == IdList::kDelete   ? r.initDelete(n)
                : kind == IdList::kContains ? r.initContains(n)
                : kind == IdList::kLocate   ? r.initLocate(n)
                                            : r.initDeleteAfterTasks(n);
    for (unsigned i = 0; i < n; ++i) ipc::ToWire(ids[i], list[i]);
  };
}

// A release of references on several tiers: one group per (device, ids), in this order.
using TierIds = std::pair<int32_t, std::vector<ObjectId>>;
inline auto ReleaseOf(const std::vector<TierIds>& groups) {
  return [=](wire::Request::Builder r) {
    auto tiers = r.initRelease(static_cast<unsigned>(groups.size()));
    for (unsigned g = 0; g < groups.size(); ++g) {
      tiers[g].setDevice(groups[g].first);
      auto ids = tiers[g].initIds(static_cast<unsigned>(groups[g].second.size()));
      for (unsigned i = 0; i < ids.size(); ++i) ipc::ToWire(groups[g].second[i], ids[i]);
    }
  };
}

inline std::vector<ObjectId> Ids(const std::string& prefix, size_t count) {
  std::vector<ObjectId> ids;
  for (size_t i = 0; i < count; ++i) ids.push_back(ObjectId::FromName(prefix + std::to_string(i)));
  return ids;
}

}  // namespace depot::testing
