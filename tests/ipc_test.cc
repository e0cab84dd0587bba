// Unit tests of the ipc layer: sizes, object ids, status, and framing over a real socket.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <string_view>
#include <thread>

#include "depot/ipc/framing.h"
#include "depot/ipc/protocol.h"
#include "depot/ipc/units.h"
#include "depot/object_id.h"
#include "depot/status.h"

namespace depot::ipc {
namespace {

TEST(ParseSize, AcceptsUnitsAsPowersOf1024) {
  EXPECT_EQ(*ParseSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("512M"), 512ull << 20);
  EXPECT_EQ(*ParseSize("1.5 GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("2kb"), 2048u);
  EXPECT_EQ(*ParseSize(" 7 B "), 7u);
}

TEST(ParseSize, RejectsWhatIsNotASizeWithAClearMessage) {
  for (const char* bad : {"", "abc", "4 parsecs", "-1G", "1.5", "G", "1e3"}) {
    auto r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("is not a size"), std::string::npos)
        << r.status().message();
  }
}

TEST(CutUtf8, CutsAtACharacterBoundaryAtMostThatLong) {
  EXPECT_EQ(ipc::CutUtf8("short", 10), "short");
  EXPECT_EQ(ipc::CutUtf8("abcdef", 3), "abc");
  // "é" is two bytes: a cut in its middle leaves it out whole.
  EXPECT_EQ(ipc::CutUtf8("ab\xc3\xa9", 3), "ab");
  EXPECT_EQ(ipc::CutUtf8("ab\xc3\xa9", 4), "ab\xc3\xa9");
  EXPECT_EQ(ipc::CutUtf8("\xe2\x82\xac", 2), "");
}

TEST(NextUtf8, ReadsWellFormedCharactersAndNothingElse) {
  EXPECT_EQ(ipc::NextUtf8("a", 0).code, U'a');
  EXPECT_EQ(ipc::NextUtf8("\xc3\xa9", 0).code, U'\u00e9');
  EXPECT_EQ(ipc::NextUtf8("\xe2\x82\xac", 0).length, 3u);
  EXPECT_EQ(ipc::NextUtf8("\xf0\x9f\x98\x80", 0).code, U'\U0001f600');
  for (const char* bad :
       {"\x80", "\xc3", "\xc0\xaf" /* overlong '/' */, "\xed\xa0\x80" /* U+D800 */,
        "\xf4\x90\x80\x80" /* past U+10FFFF */, "\xff", "\xe2\x82"}) {
    EXPECT_EQ(ipc::NextUtf8(bad, 0).length, 0u) << bad;
  }
}

TEST(IsDisplayText, TakesPrintableUtf8Only) {
  EXPECT_TRUE(ipc::IsDisplayText(""));
  EXPECT_TRUE(ipc::IsDisplayText("('sum-abc', 0, 1) \xc3\xa9\xe2\x82\xac"));
  EXPECT_FALSE(ipc::IsDisplayText("a\nb"));
  EXPECT_FALSE(ipc::IsDisplayText("\x1b[2J"));
  EXPECT_FALSE(ipc::IsDisplayText("\x7f"));
  EXPECT_FALSE(ipc::IsDisplayText("\xc2\x9b"));  // U+009B, a C1 control
  EXPECT_FALSE(ipc::IsDisplayText("\x9b"));      // the raw byte: not UTF-8
  EXPECT_FALSE(ipc::IsDisplayText(std::string_view("a\0b", 3)));
}

TEST(FormatSize, WritesHumanSizes) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatSize(4ull << 30), "4.00 GiB");
  EXPECT_EQ(FormatSize(300ull << 20), "300 MiB");
}

TEST(FormatExactSize, GivesTheBytesBesideTheRoundedSize) {
  EXPECT_EQ(FormatExactSize(1023), "1023 B");
  EXPECT_EQ(FormatExactSize((1ull << 30) + 64), "1073741888 bytes (1.00 GiB)");
}

TEST(ObjectId, FromNameIsXxh3Of128BitsInCanonicalHex) {
  // Reference values from the xxhash Python package (xxh3_128_hexdigest).
  EXPECT_EQ(ObjectId::FromName("weights/layer1").Hex(), "c34000baa444de958ae09f46b5c618e2");
  EXPECT_EQ(ObjectId::FromName("").Hex(), "99aa06d3014798d86001c324468d497f");
}

TEST(ObjectId, HexAndBytesRoundTrip) {
  const ObjectId id = ObjectId::Random();
  EXPECT_FALSE(id.IsNil());
  EXPECT_EQ(ObjectId::FromHex(id.Hex()), id);
  EXPECT_EQ(ObjectId::FromBytes(id.Bytes()), id);
  EXPECT_EQ(ObjectId::FromHex(id.Hex().substr(0, 31)), std::nullopt);
  EXPECT_EQ(ObjectId::FromHex(std::string(32, 'g')), std::nullopt);
  EXPECT_NE(ObjectId::Random(), ObjectId::Random());
}

TEST(Status, CarriesCodeAndMessage) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status st = Status::NotFound("object 12 does not exist");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.ToString(), "NotFound: object 12 does not exist");
  Result<int> r = st;
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "object 12 does not exist");
  Result<int> bad = Status::OK();  // a programming error, reported rather than hidden
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

TEST(Status, EveryCodeHasItsOwnNameAndRoundTripsTheWire) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
    const auto code = static_cast<StatusCode>(c);
    EXPECT_NE(StatusCodeName(code), "Unknown") << c;
    EXPECT_TRUE(names.insert(StatusCodeName(code)).second) << StatusCodeName(code);
    EXPECT_EQ(FromWire(ToWire(code)), code);
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kTaskFailed), "TaskFailed");
  EXPECT_EQ(ToWire(StatusCode::kTaskFailed), wire::ErrorCode::TASK_FAILED);
  EXPECT_EQ(Status::TaskFailed("sum: bad input").ToString(), "TaskFailed: sum: bad input");
}

TEST(Protocol, UnknownWireErrorCodesBecomeInternal) {
  EXPECT_EQ(FromWire(static_cast<wire::ErrorCode>(200)), StatusCode::kInternal);
  EXPECT_EQ(FromWire(wire::ErrorCode::TIMEOUT), StatusCode::kTimeout);
}

class FramingTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }

  static OutFrame StatusRequest(uint64_t id, std::vector<int> fds = {}) {
    capnp::MallocMessageBuilder message;
    auto req = message.initRoot<wire::Request>();
    req.setId(id);
    req.setStatus();
    return std::move(*EncodeFrame(message, std::move(fds)));
  }

  // Reads until a frame is complete.
  Result<FrameReader::Frame> ReadFrame(FrameReader& reader) {
    for (;;) {
      auto next = reader.Next();
      if (!next.ok()) return next.status();
      if (next->has_value()) return std::move(**next);
      bool would_block = false;
      auto n = reader.ReadSome(fds_[1], &would_block);
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::Disconnected("end of stream");
    }
  }

  int fds_[2];
};

TEST_F(FramingTest, FramesArriveWholeAndInOrder) {
  for (uint64_t i = 1; i <= 3; ++i) {
    auto f = StatusRequest(i);
    ASSERT_TRUE(WriteFrameFully(fds_[0], f).ok());
  }
  FrameReader reader(1 << 20);
  for (uint64_t i = 1; i <= 3; ++i) {
    auto frame = ReadFrame(reader);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    capnp::FlatArrayMessageReader msg(frame->payload);
    EXPECT_EQ(msg.getRoot<wire::Request>().getId(), i);
  }
}

TEST_F(FramingTest, FrameSplitAcrossWritesIsReassembled) {
  auto f = StatusRequest(7);
  const auto* bytes = reinterpret_cast<const char*>(f.bytes.data());
  const size_t total = f.bytes.size() * sizeof(capnp::word);
  FrameReader reader(1 << 20);
  for (size_t i = 0; i < total; ++i) {
    ASSERT_EQ(::write(fds_[0], bytes + i, 1), 1);
    bool would_block = false;
    ASSERT_TRUE(reader.ReadSome(fds_[1], &would_block).ok());
    auto next = reader.Next();
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->has_value(), i + 1 == total);
  }
}

TEST_F(FramingTest, DescriptorsTravelWithTheirFrame) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto plain = StatusRequest(1);
  auto with_fd = StatusRequest(2, {pipe_fds[1]});
  ASSERT_TRUE(WriteFrameFully(fds_[0], plain).ok());
  ASSERT_TRUE(WriteFrameFully(fds_[0], with_fd).ok());
  FrameReader reader(1 << 20);
  auto first = ReadFrame(reader);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->fds.empty());
  auto second = ReadFrame(reader);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->fds.size(), 1u);
  // The received descriptor is the pipe's write end: what goes in comes out.
  ASSERT_EQ(::write(second->fds[0].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST_F(FramingTest, AFrameCarriesMoreDescriptorsThanOneWriteCan) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  // Linux attaches at most 253 to one sendmsg: these go in two writes.
  constexpr size_t kCount = 300;
  auto many = StatusRequest(1, std::vector<int>(kCount, pipe_fds[1]));
  auto after = StatusRequest(2);
  ASSERT_TRUE(WriteFrameFully(fds_[0], many).ok());
  ASSERT_TRUE(WriteFrameFully(fds_[0], after).ok());
  FrameReader reader(1 << 20);
  auto first = ReadFrame(reader);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->fds.size(), kCount);
  for (const UniqueFd& fd : first->fds) ASSERT_EQ(::write(fd.get(), "x", 1), 1);
  char drained[kCount];
  EXPECT_EQ(::read(pipe_fds[0], drained, kCount), static_cast<ssize_t>(kCount));
  auto second = ReadFrame(reader);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->fds.empty());
  capnp::FlatArrayMessageReader msg(second->payload);
  EXPECT_EQ(msg.getRoot<wire::Request>().getId(), 2u);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  // Past the frame's limit, encoding refuses.
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::Request>().setStatus();
  EXPECT_EQ(EncodeFrame(message, std::vector<int>(kMaxFdsPerFrame + 1, 0)).status().code(),
            StatusCode::kLimitExceeded);
}

TEST_F(FramingTest, OversizedFrameIsRefusedBeforeItIsRead) {
  const FrameHeader header{64u << 20, 0};
  ASSERT_EQ(::write(fds_[0], &header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  FrameReader reader(1 << 20);
  auto frame = ReadFrame(reader);
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kLimitExceeded);
  EXPECT_NE(frame.status().message().find("exceeds the limit"), std::string::npos);
}

TEST_F(FramingTest, MalformedHeaderIsRefused) {
  const FrameHeader header{13, 0};  // not a whole number of words
  ASSERT_EQ(::write(fds_[0], &header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  FrameReader reader(1 << 20);
  auto frame = ReadFrame(reader);
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(FramingTest, FrameAnnouncingDescriptorsThatNeverCameIsRefused) {
  auto f = StatusRequest(1);
  FrameHeader header;
  std::memcpy(&header, f.bytes.data(), sizeof(header));
  header.fd_count = 2;
  std::memcpy(static_cast<void*>(f.bytes.data()), &header, sizeof(header));
  ASSERT_TRUE(WriteFrameFully(fds_[0], f).ok());
  FrameReader reader(1 << 20);
  auto frame = ReadFrame(reader);
  ASSERT_FALSE(frame.ok());
  EXPECT_NE(frame.status().message().find("file descriptors"), std::string::npos);
}

TEST_F(FramingTest, MessageOverTheSendersLimitIsNotEncoded) {
  capnp::MallocMessageBuilder message;
  auto req = message.initRoot<wire::Request>();
  req.setId(1);
  req.initCreate().setMetadata(kj::heapArray<kj::byte>(8192));
  auto frame = EncodeFrame(message, {}, 4096);
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kLimitExceeded);
}

TEST(ConnectUnix, NoDaemonGivesAnActionableMessage) {
  auto fd = ConnectUnix("/tmp/depot-test-nobody-listens-here.sock");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kConnectionFailed);
  EXPECT_NE(fd.status().message().find("no depot daemon is listening"), std::string::npos);
}

TEST(ConnectUnix, OverlongPathIsRefused) {
  auto fd = ConnectUnix(std::string(200, 'a'));
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace depot::ipc
