// Tests for tools/rcopy: the protocol codec, path safety, checksums, and
// client/server behaviour over tcp://127.0.0.1 (in-process server threads and
// the real rcopy binary).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/coding.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/client.h"
#include "tools/rcopy/protocol.h"
#include "tools/rcopy/safe_path.h"
#include "tools/rcopy/server.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::rcopy {
namespace {

using canopy::testing::BinaryPath;
using canopy::testing::RandomBytes;
using canopy::testing::RunCommand;
using canopy::testing::TempDir;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- codec

OpenRequest SampleOpen() {
  OpenRequest open;
  open.transfer_id = 0x1122334455667788ull;
  open.name = "dir/file.bin";
  open.file_size = 10'000'000;
  open.mode = 0640;
  open.streams = 4;
  open.stream_index = 2;
  ByteRange r = SplitRange(open.file_size, open.streams, open.stream_index);
  open.range_offset = r.offset;
  open.range_length = r.length;
  open.flags = kOpenFlagVerify;
  open.checksum = ChecksumAlgorithm::kXxh3;
  return open;
}

TEST(RcopyProtocol, MessagesRoundTrip) {
  OpenRequest open = SampleOpen();
  auto decoded = DecodeOpen(EncodeOpen(open));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, open);

  auto data = DecodeData(EncodeData(DataHeader{123456789012ull}));
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(data->offset, 123456789012ull);

  CommitRequest commit{42, ChecksumAlgorithm::kCrc32c, 0xdeadbeef};
  auto c = DecodeCommit(EncodeCommit(commit));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, commit);

  ResultMessage result;
  result.code = StatusCode::kResourceExhausted;
  result.text = "No space left on device";
  result.bytes = 7;
  result.checksum = ChecksumAlgorithm::kXxh3;
  result.digest = 99;
  auto r = DecodeResult(EncodeResult(result));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, result);
  EXPECT_EQ(r->ToStatus().code(), StatusCode::kResourceExhausted);
}

TEST(RcopyProtocol, EncodingIsLittleEndian) {
  std::string data = EncodeData(DataHeader{0x0102030405060708ull});
  ASSERT_EQ(data.size(), 9u);
  EXPECT_EQ(data[0], static_cast<char>(kProtocolVersion));
  EXPECT_EQ(data[1], 0x08);
  EXPECT_EQ(data[8], 0x01);
}

TEST(RcopyProtocol, EveryTruncationAndTrailingByteIsCorruption) {
  std::vector<std::string> encoded = {EncodeOpen(SampleOpen()), EncodeData(DataHeader{5}),
                                      EncodeCommit(CommitRequest{1, ChecksumAlgorithm::kXxh3, 2}),
                                      EncodeResult(ResultMessage::FromStatus(Status::IOError("x")))};
  for (size_t m = 0; m < encoded.size(); ++m) {
    const std::string& full = encoded[m];
    for (size_t n = 0; n < full.size(); ++n) {
      std::string_view prefix(full.data(), n);
      Status s = m == 0 ? DecodeOpen(prefix).status()
                 : m == 1 ? DecodeData(prefix).status()
                 : m == 2 ? DecodeCommit(prefix).status()
                          : DecodeResult(prefix).status();
      EXPECT_TRUE(s.IsCorruption()) << "message " << m << " prefix " << n << ": " << s.ToString();
    }
    std::string longer = full + "x";
    Status s = m == 0 ? DecodeOpen(longer).status()
               : m == 1 ? DecodeData(longer).status()
               : m == 2 ? DecodeCommit(longer).status()
                        : DecodeResult(longer).status();
    EXPECT_TRUE(s.IsCorruption()) << "message " << m << " with a trailing byte";
  }
}

TEST(RcopyProtocol, DecodeOpenRejectsInconsistentFields) {
  auto rejects = [](OpenRequest open, const char* what) {
    auto r = DecodeOpen(EncodeOpen(open));
    EXPECT_FALSE(r.ok()) << what;
    EXPECT_TRUE(r.status().IsCorruption()) << what << ": " << r.status().ToString();
  };
  OpenRequest o = SampleOpen();
  o.streams = 0;
  rejects(o, "zero streams");
  o = SampleOpen();
  o.streams = kMaxStreams + 1;
  rejects(o, "too many streams");
  o = SampleOpen();
  o.stream_index = o.streams;
  rejects(o, "stream index out of range");
  o = SampleOpen();
  o.range_length += 1;
  rejects(o, "range not the split range");
  o = SampleOpen();
  o.range_offset = o.file_size;
  o.range_length = 10;
  rejects(o, "range past the end");
  o = SampleOpen();
  o.range_offset = UINT64_MAX - 2;
  o.range_length = 5;
  rejects(o, "range overflow");
  o = SampleOpen();
  o.flags |= 1u << 7;
  rejects(o, "unknown flag");
  o = SampleOpen();
  o.checksum = ChecksumAlgorithm::kNone;
  rejects(o, "verify without checksum");
  o = SampleOpen();
  o.mode = 0100644;
  rejects(o, "file type bits in mode");
  o = SampleOpen();
  o.name.assign(kMaxNameBytes + 1, 'a');
  rejects(o, "overlong name");

  std::string bad_version = EncodeOpen(SampleOpen());
  bad_version[0] = 9;
  EXPECT_TRUE(DecodeOpen(bad_version).status().IsCorruption());
  std::string bad_algorithm = EncodeCommit(CommitRequest{1, ChecksumAlgorithm::kXxh3, 2});
  bad_algorithm[9] = 7;
  EXPECT_TRUE(DecodeCommit(bad_algorithm).status().IsCorruption());
}

TEST(RcopyProtocol, DecodeResultRejectsUnknownCodeAndHugeText) {
  std::string bad_code = EncodeResult(ResultMessage{});
  bad_code[1] = static_cast<char>(200);
  EXPECT_TRUE(DecodeResult(bad_code).status().IsCorruption());

  // A length prefix announcing more text than allowed (and than present).
  std::string huge;
  PutFixed8(&huge, kProtocolVersion);
  PutFixed8(&huge, static_cast<uint8_t>(StatusCode::kIOError));
  PutVarint64(&huge, 1ull << 40);
  huge += "abc";
  EXPECT_TRUE(DecodeResult(huge).status().IsCorruption());
}

TEST(RcopyProtocol, SplitRangeCoversTheFileExactlyOnce) {
  for (uint64_t size : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 65536ull * 3 + 7, 10485763ull}) {
    for (uint16_t streams : {1, 2, 3, 4, 7, 64}) {
      uint64_t expected_offset = 0;
      for (uint16_t i = 0; i < streams; ++i) {
        ByteRange r = SplitRange(size, streams, i);
        EXPECT_EQ(r.offset, expected_offset) << size << "/" << streams << "/" << i;
        if (r.offset + r.length < size) {
          EXPECT_EQ((r.offset + r.length) % kRangeAlignment, 0u);
        }
        expected_offset = r.offset + r.length;
      }
      EXPECT_EQ(expected_offset, size) << size << "/" << streams;
    }
  }
  ByteRange huge = SplitRange(UINT64_MAX, 3, 2);
  EXPECT_EQ(huge.offset + huge.length, UINT64_MAX);
}

// ---------------------------------------------------------- path safety

TEST(RcopySafePath, AcceptsRelativeNames) {
  auto p = SplitSafeRelativePath("./a//b/./c.txt");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->directories, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(p->file, "c.txt");
  EXPECT_EQ(p->ToString(), "a/b/c.txt");
  auto dotted = SplitSafeRelativePath("..hidden/x..y");
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ(dotted->ToString(), "..hidden/x..y");
}

TEST(RcopySafePath, RejectsEscapesAndNonsense) {
  for (const char* name : {"../x", "a/../../x", "a/..", "..", "/etc/x", "/"}) {
    auto p = SplitSafeRelativePath(name);
    EXPECT_EQ(p.status().code(), StatusCode::kPermissionDenied) << name << ": " << p.status().ToString();
  }
  for (std::string name : {std::string(""), std::string("."), std::string("a/"), std::string("a/."),
                           std::string("a\0b", 3), std::string(256, 'x'), std::string(5000, 'a')}) {
    auto p = SplitSafeRelativePath(name);
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << name.size() << ": " << p.status().ToString();
  }
}

TEST(RcopySafePath, RefusesSymlinkComponentsAndCreatesMissingDirs) {
  TempDir root;
  TempDir outside;
  ASSERT_EQ(::symlink(outside.path().c_str(), root.File("link").c_str()), 0);
  auto root_fd = OpenRootDirectory(root.path());
  ASSERT_TRUE(root_fd.ok());

  auto via_link = OpenParentBeneath(root_fd->get(), *SplitSafeRelativePath("link/x"), true);
  EXPECT_EQ(via_link.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(via_link.status().message().find("symbolic link"), std::string::npos) << via_link.status().ToString();
  auto deep_link = OpenParentBeneath(root_fd->get(), *SplitSafeRelativePath("link/sub/x"), true);
  EXPECT_EQ(deep_link.status().code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(outside.File("sub")));

  auto missing = OpenParentBeneath(root_fd->get(), *SplitSafeRelativePath("new/dir/x"), false);
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
  auto created = OpenParentBeneath(root_fd->get(), *SplitSafeRelativePath("new/dir/x"), true);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(fs::is_directory(root.File("new/dir")));

  ASSERT_TRUE(WriteFileAtomic(root.File("plain"), "x").ok());
  auto through_file = OpenParentBeneath(root_fd->get(), *SplitSafeRelativePath("plain/x"), true);
  EXPECT_EQ(through_file.status().code(), StatusCode::kPermissionDenied);
}

// ------------------------------------------------------ checksums, units

TEST(RcopyChecksum, KnownValuesAndFileRanges) {
  EXPECT_EQ(DigestOf(ChecksumAlgorithm::kCrc32c, "123456789"), 0xE3069283u);
  EXPECT_EQ(DigestOf(ChecksumAlgorithm::kXxh3, ""), 0x2D06800538D394C2ull);
  EXPECT_EQ(DigestOf(ChecksumAlgorithm::kNone, "abc"), 0u);

  std::string bytes = RandomBytes(3 * (1 << 20) + 17, 7);
  Digest pieces(ChecksumAlgorithm::kXxh3);
  pieces.Update(bytes.substr(0, 1000));
  pieces.Update(bytes.substr(1000));
  EXPECT_EQ(pieces.Value(), DigestOf(ChecksumAlgorithm::kXxh3, bytes));

  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("f"), bytes).ok());
  auto fd = OpenFile(dir.File("f"), O_RDONLY);
  ASSERT_TRUE(fd.ok());
  for (auto algorithm : {ChecksumAlgorithm::kXxh3, ChecksumAlgorithm::kCrc32c}) {
    auto d = DigestFileRange(fd->get(), 12345, 2 * (1 << 20), algorithm);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, DigestOf(algorithm, std::string_view(bytes).substr(12345, 2 * (1 << 20))));
  }
  EXPECT_TRUE(DigestFileRange(fd->get(), bytes.size() - 10, 20, ChecksumAlgorithm::kXxh3).status().IsCorruption());
  EXPECT_EQ(DigestHex(0xabc), "0000000000000abc");
}

// --------------------------------------------------- client and server

class RcopyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::RegisterBuiltinTransports();
    StartServer();
  }

  void StartServer(std::chrono::milliseconds idle = std::chrono::seconds(10)) {
    ServerOptions options;
    options.root = root_.path();
    options.listen_uri = "tcp://127.0.0.1:0";
    options.idle_timeout = idle;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    port_ = server_->local_endpoint().port;
    ASSERT_NE(port_, 0);
  }

  ClientOptions Options(const std::string& source, const std::string& destination) {
    ClientOptions o;
    o.source = source;
    o.host = "127.0.0.1";
    o.port = port_;
    o.destination = destination;
    o.chunk_bytes = 64 << 10;
    o.transport.io_timeout = std::chrono::seconds(10);
    return o;
  }

  std::string WriteSource(const std::string& name, size_t size, uint64_t seed) {
    std::string path = src_.File(name);
    EXPECT_TRUE(WriteFileAtomic(path, RandomBytes(size, seed)).ok());
    return path;
  }

  std::string ReadAll(const std::string& path) {
    auto r = ReadFileToString(path);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::string();
  }

  // Temporary files the server left anywhere under its root.
  std::vector<std::string> TempFiles() {
    std::vector<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(root_.path())) {
      if (entry.path().filename().string().find(".rcopy-") != std::string::npos) out.push_back(entry.path());
    }
    return out;
  }

  // Waits (bounded) until the server removed every temporary file.
  bool NoTempFilesWithin(std::chrono::milliseconds limit) {
    Deadline deadline = Deadline::After(limit);
    while (!TempFiles().empty()) {
      if (deadline.expired()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  TempDir root_;
  TempDir src_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
};

TEST_F(RcopyServerTest, RoundTripIsByteExactForManySizes) {
  const size_t chunk = 64 << 10;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, chunk - 1, chunk, chunk * 3 + 7, size_t{(1 << 20) + 123}}) {
    std::string name = "file-" + std::to_string(size);
    std::string source = WriteSource(name, size, size + 1);
    ASSERT_EQ(::chmod(source.c_str(), 0640), 0);
    CopyReport report = CopyFile(Options(source, name));
    ASSERT_TRUE(report.status.ok()) << size << ": " << report.status.ToString();
    EXPECT_EQ(report.file_bytes, size);
    EXPECT_EQ(report.bytes_sent, size);
    EXPECT_EQ(ReadAll(root_.File(name)), ReadAll(source)) << size;
    struct stat st;
    ASSERT_EQ(::stat(root_.File(name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
  }
  EXPECT_TRUE(TempFiles().empty());
}

TEST_F(RcopyServerTest, OverwritesAnExistingFileAtomically) {
  ASSERT_TRUE(WriteFileAtomic(root_.File("f"), "old contents").ok());
  std::string source = WriteSource("f", 100000, 3);
  CopyReport report = CopyFile(Options(source, "f"));
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(ReadAll(root_.File("f")), ReadAll(source));
}

TEST_F(RcopyServerTest, ParallelStreamsWithVerify) {
  for (auto algorithm : {ChecksumAlgorithm::kXxh3, ChecksumAlgorithm::kCrc32c}) {
    std::string source = WriteSource("p", 5 * (1 << 20) + 17, 11);
    ClientOptions o = Options(source, "sub/dir/p");
    o.streams = 4;
    o.verify = true;
    o.checksum = algorithm;
    CopyReport report = CopyFile(o);
    ASSERT_TRUE(report.status.ok()) << report.status.ToString();
    EXPECT_EQ(ReadAll(root_.File("sub/dir/p")), ReadAll(source));
    ASSERT_EQ(report.digests.size(), 4u);
    auto fd = OpenFile(source, O_RDONLY);
    ASSERT_TRUE(fd.ok());
    for (uint16_t i = 0; i < 4; ++i) {
      ByteRange r = SplitRange(report.file_bytes, 4, i);
      EXPECT_EQ(report.digests[i], *DigestFileRange(fd->get(), r.offset, r.length, algorithm));
    }
  }
  EXPECT_TRUE(TempFiles().empty());
}

TEST_F(RcopyServerTest, MoreStreamsThanDataAndEmptyFile) {
  std::string small = WriteSource("small", 5000, 5);  // ranges 2..7 are empty
  ClientOptions o = Options(small, "small");
  o.streams = 8;
  o.verify = true;
  CopyReport report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(ReadAll(root_.File("small")), ReadAll(small));

  std::string empty = WriteSource("empty", 0, 1);
  o = Options(empty, "empty");
  o.streams = 3;
  report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_TRUE(fs::exists(root_.File("empty")));
  EXPECT_EQ(fs::file_size(root_.File("empty")), 0u);
}

TEST_F(RcopyServerTest, SinkWritesNothing) {
  std::string source = WriteSource("s", 3 << 20, 9);
  for (bool verify : {false, true}) {
    ClientOptions o = Options(source, "s");
    o.sink = true;
    o.verify = verify;
    o.streams = 2;
    CopyReport report = CopyFile(o);
    ASSERT_TRUE(report.status.ok()) << report.status.ToString();
    EXPECT_EQ(report.bytes_sent, 3u << 20);
    EXPECT_GT(report.gbit_per_second(), 0);
  }
  EXPECT_TRUE(fs::is_empty(root_.path()));
}

TEST_F(RcopyServerTest, TraversalAttemptsAreRefused) {
  TempDir outside;
  std::string source = WriteSource("t", 1000, 1);
  ASSERT_EQ(::symlink(outside.path().c_str(), root_.File("escape").c_str()), 0);
  std::string victim = outside.File("victim");
  ASSERT_TRUE(WriteFileAtomic(victim, "precious").ok());
  ASSERT_EQ(::symlink(victim.c_str(), root_.File("final-link").c_str()), 0);

  const std::string escapee = "rcopy-escape-" + std::to_string(::getpid());
  for (std::string name : {"../" + escapee, "a/../../" + escapee, "/etc/" + escapee, std::string("escape/x"),
                           std::string("escape/new/x")}) {
    CopyReport report = CopyFile(Options(source, name));
    EXPECT_EQ(report.status.code(), StatusCode::kPermissionDenied) << name << ": " << report.status.ToString();
  }
  EXPECT_TRUE(fs::is_empty(outside.path()) || fs::directory_iterator(outside.path())->path() == victim);
  EXPECT_FALSE(fs::exists(outside.File("x")));
  EXPECT_FALSE(fs::exists(outside.File("new")));
  EXPECT_FALSE(fs::exists(fs::path(root_.path()).parent_path() / escapee));
  EXPECT_FALSE(fs::exists("/etc/" + escapee));

  // A symlink as the final name is replaced, not written through.
  CopyReport report = CopyFile(Options(source, "final-link"));
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_FALSE(fs::is_symlink(root_.File("final-link")));
  EXPECT_EQ(ReadAll(root_.File("final-link")), ReadAll(source));
  EXPECT_EQ(ReadAll(victim), "precious");
}

TEST_F(RcopyServerTest, DestinationThatIsADirectoryIsRefused) {
  fs::create_directory(root_.File("d"));
  std::string source = WriteSource("x", 10, 1);
  CopyReport report = CopyFile(Options(source, "d"));
  EXPECT_FALSE(report.status.ok());
  EXPECT_NE(report.status.message().find("is a directory"), std::string::npos) << report.status.ToString();
}

// Raw protocol clients: what a broken or malicious client can do.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    transport::TransportOptions options;
    auto c = transport::Dial("tcp://127.0.0.1:" + std::to_string(port), options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) conn = std::move(c).value();
  }
  Result<ResultMessage> ReadResult() {
    auto m = conn->Receive(Deadline::After(std::chrono::seconds(10)));
    if (!m.ok()) return m.status();
    if (m->type != kMsgResult) return Status::Corruption("not a RESULT");
    return DecodeResult(m->payload);
  }
  std::unique_ptr<transport::Connection> conn;
};

OpenRequest OpenFor(const std::string& name, uint64_t size, uint32_t flags = 0) {
  static std::atomic<uint64_t> next_id{0x5151};
  OpenRequest open;
  open.transfer_id = next_id++;
  open.name = name;
  open.file_size = size;
  open.range_length = size;
  open.flags = flags;
  if (flags & kOpenFlagVerify) open.checksum = ChecksumAlgorithm::kXxh3;
  return open;
}

TEST_F(RcopyServerTest, DisconnectMidTransferLeavesNoFile) {
  RawClient client(port_);
  ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("partial", 1 << 20))).ok());
  auto accepted = client.ReadResult();
  ASSERT_TRUE(accepted.ok() && accepted->ok()) << accepted.status().ToString();
  std::string half = RandomBytes(300000, 2);
  ASSERT_TRUE(client.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                        transport::BulkSource::FromMemory(half))
                  .ok());
  client.conn->Close();
  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));
  EXPECT_FALSE(fs::exists(root_.File("partial")));
}

TEST_F(RcopyServerTest, ChecksumMismatchPublishesNothing) {
  RawClient client(port_);
  std::string bytes = RandomBytes(10000, 4);
  ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("m", bytes.size(), kOpenFlagVerify))).ok());
  ASSERT_TRUE(client.ReadResult().ok());
  ASSERT_TRUE(client.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                        transport::BulkSource::FromMemory(bytes))
                  .ok());
  uint64_t wrong = DigestOf(ChecksumAlgorithm::kXxh3, bytes) ^ 1;
  ASSERT_TRUE(client.conn->Send(kMsgCommit, EncodeCommit(CommitRequest{bytes.size(), ChecksumAlgorithm::kXxh3, wrong}))
                  .ok());
  auto result = client.ReadResult();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->code, StatusCode::kCorruption);
  EXPECT_NE(result->text.find("mismatch"), std::string::npos) << result->text;
  EXPECT_FALSE(fs::exists(root_.File("m")));
  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));
}

TEST_F(RcopyServerTest, ProtocolViolationsGetAnErrorResult) {
  {
    RawClient client(port_);  // garbage instead of OPEN
    ASSERT_TRUE(client.conn->Send(kMsgOpen, "\x01\x02garbage").ok());
    auto result = client.ReadResult();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->code, StatusCode::kCorruption);
  }
  {
    RawClient client(port_);  // DATA outside the announced range
    ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("r", 100))).ok());
    ASSERT_TRUE(client.ReadResult().ok());
    std::string bytes(200, 'x');
    ASSERT_TRUE(client.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                          transport::BulkSource::FromMemory(bytes))
                    .ok());
    auto result = client.ReadResult();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->code, StatusCode::kCorruption);
    EXPECT_NE(result->text.find("does not fit"), std::string::npos) << result->text;
  }
  {
    RawClient client(port_);  // COMMIT before all bytes arrived
    ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("c", 100))).ok());
    ASSERT_TRUE(client.ReadResult().ok());
    ASSERT_TRUE(client.conn->Send(kMsgCommit, EncodeCommit(CommitRequest{100, ChecksumAlgorithm::kNone, 0})).ok());
    auto result = client.ReadResult();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->code, StatusCode::kCorruption);
  }
  EXPECT_FALSE(fs::exists(root_.File("r")));
  EXPECT_FALSE(fs::exists(root_.File("c")));
  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));
}

TEST_F(RcopyServerTest, IdleConnectionIsDroppedAndItsFileRemoved) {
  server_.reset();
  StartServer(std::chrono::milliseconds(300));
  RawClient client(port_);
  ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("idle", 100))).ok());
  ASSERT_TRUE(client.ReadResult().ok());
  auto result = client.ReadResult();  // the server gives up and says why
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->code, StatusCode::kTimeout) << result->text;
  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));
}

TEST_F(RcopyServerTest, ConcurrentClients) {
  std::vector<std::string> sources;
  for (int i = 0; i < 4; ++i) sources.push_back(WriteSource("c" + std::to_string(i), 700000 + i, 20 + i));
  std::vector<CopyReport> reports(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      ClientOptions o = Options(sources[i], "c" + std::to_string(i));
      o.streams = static_cast<uint16_t>(1 + i % 2);
      reports[i] = CopyFile(o);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(reports[i].status.ok()) << reports[i].status.ToString();
    EXPECT_EQ(ReadAll(root_.File("c" + std::to_string(i))), ReadAll(sources[i]));
  }
}

// ------------------------------------------------------ the rcopy binary

std::string Rcopy() { return BinaryPath("tools/rcopy/rcopy"); }

// Runs a command and returns its stdout only (stderr discarded) in *out.
int RunStdout(const std::string& command, std::string* out) {
  return RunCommand("{ " + command + " 2>/dev/null; }", out);
}

TEST_F(RcopyServerTest, CliCopiesAndPrintsJson) {
  std::string source = WriteSource("cli", 3 * (1 << 20) + 5, 8);
  std::string out;
  int rc = RunCommand(Rcopy() + " --json -p " + std::to_string(port_) + " --chunk 256K -P 4 --verify " + source +
                          " 127.0.0.1:copies/",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out.substr(0, out.find('\n')));
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["bytes"].get<uint64_t>(), 3u * (1 << 20) + 5);
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_GT(j["gbit_per_s"].get<double>(), 0);
  EXPECT_EQ(j["streams"].get<int>(), 4);
  EXPECT_EQ(j["checksum"].get<std::string>(), "xxh3-64");
  EXPECT_EQ(j["digests"].size(), 4u);
  EXPECT_EQ(j["destination"].get<std::string>(), "copies/cli");
  EXPECT_EQ(ReadAll(root_.File("copies/cli")), ReadAll(source));

  out.clear();
  rc = RunCommand(Rcopy() + " -p " + std::to_string(port_) + " " + source + " 127.0.0.1:plain", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Gbit/s (1 Gbit = 10^9 bits)"), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(3 * (1 << 20) + 5) + " bytes"), std::string::npos) << out;
}

TEST_F(RcopyServerTest, CliRefusedPathFailsWithReasonAndJson) {
  std::string source = WriteSource("x", 100, 8);
  std::string out;
  int rc = RunCommand(Rcopy() + " -p " + std::to_string(port_) + " " + source + " 127.0.0.1:../x", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("'..'"), std::string::npos) << out;

  std::string json_out;
  rc = RunStdout(Rcopy() + " --json -q -p " + std::to_string(port_) + " " + source + " 127.0.0.1:/etc/x", &json_out);
  EXPECT_EQ(rc, 1) << json_out;
  auto j = nlohmann::json::parse(json_out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"].get<std::string>(), "PermissionDenied");
  EXPECT_NE(j["error"].get<std::string>().find("absolute"), std::string::npos);
}

// A port nothing listens on: bind one, note it, close it.
uint16_t UnusedPort() {
  auto listener = transport::ListenOn("tcp://127.0.0.1:0", transport::TransportOptions{});
  EXPECT_TRUE(listener.ok());
  uint16_t port = (*listener)->local_endpoint().port;
  (*listener)->Close();
  return port;
}

TEST(RcopyCli, UnreachableServerIsAClearError) {
  transport::RegisterBuiltinTransports();
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("f"), "data").ok());
  uint16_t port = UnusedPort();
  std::string out;
  int rc = RunCommand(Rcopy() + " --connect-timeout 3 -p " + std::to_string(port) + " " + dir.File("f") +
                          " 127.0.0.1:f",
                      &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("connect to tcp://127.0.0.1:" + std::to_string(port)), std::string::npos) << out;
  EXPECT_NE(out.find("Unavailable"), std::string::npos) << out;

  std::string json_out;
  rc = RunStdout(Rcopy() + " --json -p " + std::to_string(port) + " " + dir.File("f") + " 127.0.0.1", &json_out);
  EXPECT_EQ(rc, 1);
  auto j = nlohmann::json::parse(json_out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"].get<std::string>(), "Unavailable");
}

TEST(RcopyCli, MissingSourceIsAClearError) {
  std::string out;
  int rc = RunCommand(Rcopy() + " /nonexistent/file 127.0.0.1", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("/nonexistent/file"), std::string::npos) << out;
}

TEST(RcopyCli, BadFlagsGiveUsage) {
  for (const char* args : {"--bogus", "", "onlyone", "--chunk 0 a 127.0.0.1", "--chunk 12Q a 127.0.0.1",
                           "-P 0 a 127.0.0.1", "-P 65 a 127.0.0.1", "--checksum md5 a 127.0.0.1", "--server",
                           "--root /tmp a 127.0.0.1", "-p 70000 a 127.0.0.1", "a :dst", "a [::1"}) {
    std::string out;
    int rc = RunCommand(Rcopy() + " " + args, &out);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find("usage: rcopy"), std::string::npos) << args << ": " << out;
  }
  std::string json_out;
  int rc = RunStdout(Rcopy() + " --json --bogus", &json_out);
  EXPECT_EQ(rc, 2);
  auto j = nlohmann::json::parse(json_out);
  EXPECT_FALSE(j["ok"].get<bool>());
}

TEST(RcopyCli, HelpExplainsEveryOption) {
  std::string out;
  ASSERT_EQ(RunCommand(Rcopy() + " --help", &out), 0);
  for (const char* option : {"--port", "--transport ", "--transport-arg", "--quiet", "--json", "--chunk",
                             "--parallel", "--verify", "--checksum", "--sink", "--connect-timeout", "--timeout",
                             "--server", "--root", "--bind", "--idle-timeout", "--max-connections", "--port-file",
                             "10^9"}) {
    EXPECT_NE(out.find(option), std::string::npos) << option;
  }
}

// Disk full, simulated with RLIMIT_FSIZE on a real server process: writes past
// the limit fail with EFBIG (SIGXFSZ ignored). The client must exit non-zero
// with the reason, and no file may appear under the final name.
TEST(RcopyCli, DiskFullIsReportedAndNothingIsPublished) {
  TempDir root;
  TempDir src;
  std::string port_file = src.File("port");
  pid_t server = canopy::testing::ForkChild([&]() -> int {
    struct rlimit limit{256 << 10, 256 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 90;
    std::signal(SIGXFSZ, SIG_IGN);
    std::string binary = Rcopy();
    ::execl(binary.c_str(), binary.c_str(), "--server", "-q", "--root", root.path().c_str(), "--bind", "127.0.0.1",
            "-p", "0", "--port-file", port_file.c_str(), "--idle-timeout", "10", static_cast<char*>(nullptr));
    return 91;
  });
  ASSERT_GT(server, 0);
  // Stop the server however this test ends (a failed ASSERT returns early).
  struct KillOnExit {
    pid_t pid;
    int status = -1;
    void Stop() {
      if (pid <= 0) return;
      ::kill(pid, SIGTERM);
      status = canopy::testing::WaitChild(pid, std::chrono::seconds(10));
      pid = -1;
    }
    ~KillOnExit() { Stop(); }
  } guard{server};
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (!PathExists(port_file) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto port_text = ReadFileToString(port_file);
  ASSERT_TRUE(port_text.ok()) << "server did not start";
  std::string port = port_text->substr(0, port_text->find('\n'));

  ASSERT_TRUE(WriteFileAtomic(src.File("big"), RandomBytes(4 << 20, 3)).ok());
  std::string out;
  int rc = RunCommand(Rcopy() + " --chunk 64K -p " + port + " " + src.File("big") + " 127.0.0.1:big", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_NE(out.find("ResourceExhausted"), std::string::npos) << out;

  std::string json_out;
  rc = RunStdout(Rcopy() + " --json -P 2 --chunk 64K -p " + port + " " + src.File("big") + " 127.0.0.1:big2",
                 &json_out);
  EXPECT_EQ(rc, 1) << json_out;
  auto j = nlohmann::json::parse(json_out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"].get<std::string>(), "ResourceExhausted") << json_out;

  EXPECT_FALSE(fs::exists(root.File("big")));
  EXPECT_FALSE(fs::exists(root.File("big2")));
  Deadline cleanup = Deadline::After(std::chrono::seconds(5));
  while (!fs::is_empty(root.path()) && !cleanup.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(fs::is_empty(root.path())) << "temporary files left behind";

  guard.Stop();
  EXPECT_TRUE(WIFEXITED(guard.status) && WEXITSTATUS(guard.status) == 0) << guard.status;
}

}  // namespace
}  // namespace canopy::rcopy
