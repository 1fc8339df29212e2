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
#include "tests/http_test_util.h"
#include "tests/testing/json_schema.h"
#include "tests/testing/test_util.h"
#include "tools/rcopy/batch.h"
#include "tests/tls_test_util.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/client.h"
#include "tools/rcopy/file_list.h"
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

  CommitRequest commit{42, ChecksumAlgorithm::kCrc32c, 0xdeadbeef, 0xfeedface};
  auto c = DecodeCommit(EncodeCommit(commit));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, commit);

  ResultMessage result;
  result.code = StatusCode::kResourceExhausted;
  result.text = "No space left on device";
  result.bytes = 7;
  result.checksum = ChecksumAlgorithm::kXxh3;
  result.digest = 99;
  result.file_digest = 100;
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
                                      EncodeCommit(CommitRequest{1, ChecksumAlgorithm::kXxh3, 2, 3}),
                                      EncodeResult(ResultMessage::FromStatus(Status::IOError("x"))),
                                      EncodeQuery(QueryRequest{"a/b", ChecksumAlgorithm::kCrc32c, 9}),
                                      EncodeResumeInfo(ResumeInfo{ResumeBase::kPartial, 8, ChecksumAlgorithm::kXxh3,
                                                                  7, 6})};
  auto decode = [](size_t m, std::string_view bytes) {
    switch (m) {
      case 0: return DecodeOpen(bytes).status();
      case 1: return DecodeData(bytes).status();
      case 2: return DecodeCommit(bytes).status();
      case 3: return DecodeResult(bytes).status();
      case 4: return DecodeQuery(bytes).status();
      default: return DecodeResumeInfo(bytes).status();
    }
  };
  for (size_t m = 0; m < encoded.size(); ++m) {
    const std::string& full = encoded[m];
    ASSERT_TRUE(decode(m, full).ok()) << "message " << m;
    for (size_t n = 0; n < full.size(); ++n) {
      Status s = decode(m, std::string_view(full.data(), n));
      EXPECT_TRUE(s.IsCorruption()) << "message " << m << " prefix " << n << ": " << s.ToString();
    }
    Status s = decode(m, full + "x");
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
  std::string bad_algorithm = EncodeCommit(CommitRequest{1, ChecksumAlgorithm::kXxh3, 2, 0});
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

  void StartServer(std::chrono::milliseconds idle = std::chrono::seconds(10), size_t max_connections = 256,
                   const std::string& secret = "", const std::string& listen_uri = "tcp://127.0.0.1:0",
                   std::vector<std::string> transport_args = {}) {
    server_.reset();
    ServerOptions options;
    options.root = root_.path();
    options.listen_uri = listen_uri;
    options.idle_timeout = idle;
    options.max_connections = max_connections;
    options.secret = secret;
    options.transport.backend_args = std::move(transport_args);
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

// A stream that connects after its transfer failed on another stream is told
// the first failure (its code and reason), not only that it came too late:
// the client reports whichever stream's answer it reads (issue 19).
TEST_F(RcopyServerTest, LateStreamOfAFailedTransferGetsTheFirstFailure) {
  const uint64_t size = 3 * kRangeAlignment;
  OpenRequest open = OpenFor("late", size);
  open.streams = 2;
  const ByteRange first_range = SplitRange(size, 2, 0);
  const ByteRange second_range = SplitRange(size, 2, 1);
  ASSERT_GT(second_range.length, 0u);
  open.range_length = first_range.length;
  {
    RawClient first(port_);  // stream 1 of 2 sends DATA beyond its range: Corruption
    ASSERT_TRUE(first.conn->Send(kMsgOpen, EncodeOpen(open)).ok());
    auto accepted = first.ReadResult();
    ASSERT_TRUE(accepted.ok() && accepted->ok()) << accepted.status().ToString() << " " << accepted->text;
    std::string bytes(first_range.length + 1, 'x');
    ASSERT_TRUE(first.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                         transport::BulkSource::FromMemory(bytes))
                    .ok());
    auto result = first.ReadResult();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->code, StatusCode::kCorruption);
  }
  Deadline deadline = Deadline::After(std::chrono::seconds(5));
  while (server_->stats().transfers_failed == 0 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->stats().transfers_failed, 1u);
  RawClient late(port_);  // stream 2 of 2 arrives after the transfer failed
  open.stream_index = 1;
  open.range_offset = second_range.offset;
  open.range_length = second_range.length;
  ASSERT_TRUE(late.conn->Send(kMsgOpen, EncodeOpen(open)).ok());
  auto result = late.ReadResult();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->code, StatusCode::kCorruption) << result->text;
  EXPECT_NE(result->text.find("already failed on another stream"), std::string::npos) << result->text;
  EXPECT_NE(result->text.find("does not fit"), std::string::npos) << result->text;
  EXPECT_FALSE(fs::exists(root_.File("late")));
}

// A QUERY never takes the temporary file of a live transfer (it is locked):
// only orphans of a dead server become partial files.
TEST_F(RcopyServerTest, ResumeQueryLeavesALiveTransfersTemporaryFileAlone) {
  std::string bytes = RandomBytes(100000, 9);
  RawClient live(port_);
  ASSERT_TRUE(live.conn->Send(kMsgOpen, EncodeOpen(OpenFor("busy", 2 * bytes.size()))).ok());
  auto accepted = live.ReadResult();
  ASSERT_TRUE(accepted.ok() && accepted->ok());
  ASSERT_TRUE(live.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                      transport::BulkSource::FromMemory(bytes))
                  .ok());
  Deadline deadline = Deadline::After(std::chrono::seconds(5));
  while (server_->stats().bytes_received < bytes.size() && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(TempFiles().size(), 1u);
  std::string source = WriteSource("busy", 2 * bytes.size(), 10);
  ClientOptions o = Options(source, "busy");
  o.resume = true;
  o.streams = 2;
  CopyReport report = CopyFile(o);  // a second copy of the same name meanwhile
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(report.resume, ResumeOutcome::kNothing);
  EXPECT_EQ(ReadAll(root_.File("busy")), ReadAll(source));
  // The live transfer still goes on, and publishes its own bytes over it.
  ASSERT_TRUE(live.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{bytes.size()}),
                                      transport::BulkSource::FromMemory(bytes))
                  .ok());
  ASSERT_TRUE(live.conn->Send(kMsgCommit, EncodeCommit(CommitRequest{2 * bytes.size(), ChecksumAlgorithm::kNone, 0}))
                  .ok());
  auto result = live.ReadResult();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->ok()) << result->text;
  EXPECT_EQ(ReadAll(root_.File("busy")), bytes + bytes);
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

// --secret-file: the shared HMAC handshake (transport/auth.h) before OPEN.
TEST_F(RcopyServerTest, SharedSecretIsCheckedBeforeAnyDataByte) {
  StartServer(std::chrono::seconds(10), 256, "rcopy secret 1");
  std::string source = WriteSource("s", 300 << 10, 21);
  ClientOptions o = Options(source, "good");
  o.secret = "rcopy secret 1";
  o.streams = 2;
  CopyReport good = CopyFile(o);
  ASSERT_TRUE(good.status.ok()) << good.status.ToString();
  EXPECT_EQ(ReadAll(root_.File("good")), ReadAll(source));
  const uint64_t received = server_->stats().bytes_received;

  // A wrong secret: the client sees the server's proof fail and never sends OPEN.
  o = Options(source, "wrong");
  o.secret = "rcopy secret 2";
  CopyReport wrong = CopyFile(o);
  EXPECT_EQ(wrong.status.code(), StatusCode::kPermissionDenied) << wrong.status.ToString();
  EXPECT_NE(wrong.status.message().find("failed to prove the shared secret"), std::string::npos)
      << wrong.status.ToString();
  // No secret: OPEN arrives where HELLO was due; the server answers RESULT.
  o = Options(source, "none");
  CopyReport none = CopyFile(o);
  EXPECT_EQ(none.status.code(), StatusCode::kPermissionDenied) << none.status.ToString();
  EXPECT_NE(none.status.message().find("authentication required"), std::string::npos) << none.status.ToString();
  // A raw client that pushes OPEN and DATA at once gets nothing accepted.
  auto conn = transport::Dial("tcp://127.0.0.1:" + std::to_string(port_), transport::TransportOptions{});
  ASSERT_TRUE(conn.ok());
  OpenRequest open;
  open.transfer_id = 77;
  open.name = "raw";
  open.file_size = 4;
  open.streams = 1;
  open.range_length = 4;
  ASSERT_TRUE((*conn)->Send(kMsgOpen, EncodeOpen(open)).ok());
  (void)(*conn)->SendWithBulk(kMsgData, "", transport::BulkSource::FromMemory("data"));
  auto refusal = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(refusal.ok()) << refusal.status().ToString();
  ASSERT_EQ(refusal->type, kMsgResult);
  auto result = DecodeResult(refusal->payload);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->code, StatusCode::kPermissionDenied);
  (*conn)->Close();

  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));
  for (const char* name : {"wrong", "none", "raw"}) EXPECT_FALSE(PathExists(root_.File(name))) << name;
  EXPECT_EQ(server_->stats().bytes_received, received);
  // The server counts a refusal after sending it, and a published file after
  // its last stream sent the final RESULT: wait (bounded) for the counts.
  Deadline counted = Deadline::After(std::chrono::seconds(5));
  while ((server_->stats().auth_failures < 3 || server_->stats().files_published < 1) && !counted.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->stats().auth_failures, 3u);
  EXPECT_EQ(server_->stats().files_published, 1u);
}

TEST_F(RcopyServerTest, OpenServerRefusesAnAuthenticatingClient) {
  std::string source = WriteSource("o", 1000, 22);
  ClientOptions o = Options(source, "x");
  o.secret = "rcopy secret 1";
  CopyReport report = CopyFile(o);
  EXPECT_EQ(report.status.code(), StatusCode::kPermissionDenied) << report.status.ToString();
  EXPECT_NE(report.status.message().find("open (started without --secret-file)"), std::string::npos)
      << report.status.ToString();
  EXPECT_FALSE(PathExists(root_.File("x")));
}

TEST_F(RcopyServerTest, CopiesOverTlsWithSecretAndVerify) {
  const auto& pki = canopy::testing::GetTestPki();
  StartServer(std::chrono::seconds(10), 256, "rcopy secret 1", "tls+tcp://127.0.0.1:0",
              canopy::testing::ServerTlsArgs(pki, /*require_client_cert=*/true));
  std::string source = WriteSource("t", (2 << 20) + 123, 23);
  ClientOptions o = Options(source, "tls");
  o.scheme = "tls+tcp";
  o.transport.backend_args = canopy::testing::ClientTlsArgs(pki, /*with_client_cert=*/true);
  o.secret = "rcopy secret 1";
  o.streams = 3;
  o.verify = true;
  CopyReport report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(ReadAll(root_.File("tls")), ReadAll(source));
  // Without a client certificate the server refuses the TLS session.
  o.transport.backend_args = canopy::testing::ClientTlsArgs(pki, /*with_client_cert=*/false);
  o.destination = "no-cert";
  CopyReport refused = CopyFile(o);
  EXPECT_EQ(refused.status.code(), StatusCode::kPermissionDenied) << refused.status.ToString();
  EXPECT_FALSE(PathExists(root_.File("no-cert")));
}

TEST_F(RcopyServerTest, CliServerIsOpenOnLoopbackOnlyWithoutASecret) {
  std::string out;
  ASSERT_EQ(RunCommand(Rcopy() + " --server --root " + root_.path() + " -p 0 --max-duration 0.2 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("WARNING: this server is OPEN"), std::string::npos) << out;
  EXPECT_NE(out.find("on tcp://127.0.0.1:"), std::string::npos) << out;
  // With a secret: both sides authenticate, no warning, all interfaces.
  std::string secret = src_.File("secret");
  ASSERT_TRUE(WriteFileAtomic(secret, "cli secret 123\n").ok());
  std::string source = WriteSource("cli-secret", 5000, 24);
  std::string port_file = src_.File("port");
  out.clear();
  int rc = RunCommand("{ " + Rcopy() + " --server --root " + root_.path() + " -p 0 --port-file " + port_file +
                          " --secret-file " + secret + " --max-duration 20 2>" + src_.File("server.err") +
                          " & pid=$!; for i in $(seq 100); do [ -s " + port_file +
                          " ] && break; sleep 0.05; done; p=$(cat " + port_file + "); " + Rcopy() +
                          " -q --secret-file " + secret + " -p $p " + source + " 127.0.0.1:with-secret; echo rc1=$?; " +
                          Rcopy() + " -p $p " + source + " 127.0.0.1:without 2>&1; echo rc2=$?; kill $pid; wait $pid; }",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rc1=0"), std::string::npos) << out;
  EXPECT_NE(out.find("rc2=1"), std::string::npos) << out;
  EXPECT_NE(out.find("authentication required"), std::string::npos) << out;
  EXPECT_EQ(ReadAll(root_.File("with-secret")), ReadAll(source));
  EXPECT_FALSE(PathExists(root_.File("without")));
  auto server_err = ReadFileToString(src_.File("server.err"));
  ASSERT_TRUE(server_err.ok());
  EXPECT_EQ(server_err->find("OPEN"), std::string::npos) << *server_err;
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
  const std::string connect_text = "connect to tcp://127.0.0.1:" + std::to_string(port);
  EXPECT_NE(out.find(connect_text), std::string::npos) << out;
  // Each layer adds only what it knows: the server is named once.
  EXPECT_EQ(out.find(connect_text), out.rfind(connect_text)) << out;
  EXPECT_EQ(out.find(": :"), std::string::npos) << out;
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
                           "--root /tmp a 127.0.0.1", "-p 70000 a 127.0.0.1", "a :dst", "a [::1",
                           "--rate 5X a 127.0.0.1", "--rate -1 a 127.0.0.1", "--resume --sink a 127.0.0.1",
                           "--max-duration 5 a 127.0.0.1", "--server --root /tmp --max-duration -1",
                           "--server --root /tmp a"}) {
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
                             "--resume", "--no-partial", "--rate", "--recursive", "--max-duration",
                             "rcopy.schema.json", "prefix mismatch", ".rcopy-partial", "10^9"}) {
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


// ============================================== resume, many files, rate, limits

// ------------------------------------------------ protocol version 2

TEST(RcopyProtocol, ResumeMessagesRoundTrip) {
  QueryRequest query{"dir/f.bin", ChecksumAlgorithm::kCrc32c, 123456789};
  auto q = DecodeQuery(EncodeQuery(query));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(*q, query);

  ResumeInfo info{ResumeBase::kTarget, 4096, ChecksumAlgorithm::kXxh3, 0xabcdef, 0x1234};
  auto i = DecodeResumeInfo(EncodeResumeInfo(info));
  ASSERT_TRUE(i.ok()) << i.status().ToString();
  EXPECT_EQ(*i, info);
  ResumeInfo nothing;
  EXPECT_EQ(*DecodeResumeInfo(EncodeResumeInfo(nothing)), nothing);

  OpenRequest open = SampleOpen();
  open.resume_offset = 1'000'003;
  open.resume_base = ResumeBase::kPartial;
  open.base_id = 99;
  ByteRange r = StreamRange(open.file_size, open.resume_offset, open.streams, open.stream_index);
  open.range_offset = r.offset;
  open.range_length = r.length;
  auto o = DecodeOpen(EncodeOpen(open));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(*o, open);
  EXPECT_EQ(kProtocolVersion, 2);
}

TEST(RcopyProtocol, DecodersRejectInconsistentResumeFields) {
  auto open_rejects = [](OpenRequest open, const char* what) {
    ByteRange r = StreamRange(open.file_size, std::min(open.resume_offset, open.file_size), open.streams,
                              open.stream_index);
    open.range_offset = r.offset;
    open.range_length = r.length;
    auto decoded = DecodeOpen(EncodeOpen(open));
    EXPECT_TRUE(decoded.status().IsCorruption()) << what << ": " << decoded.status().ToString();
  };
  OpenRequest o = SampleOpen();
  o.resume_base = ResumeBase::kPartial;
  o.base_id = 1;
  o.resume_offset = o.file_size + 1;
  open_rejects(o, "resume offset past the end");
  o.resume_offset = 0;
  open_rejects(o, "a base without an offset");
  o = SampleOpen();
  o.resume_offset = 4096;
  open_rejects(o, "an offset without a base");
  o.resume_base = ResumeBase::kTarget;
  o.base_id = 0;
  open_rejects(o, "a base without an identity");
  o.base_id = 5;
  o.flags |= kOpenFlagSink;
  open_rejects(o, "resume with sink");

  // The ranges of a resumed OPEN are the split of what is left, not of the file.
  o = SampleOpen();
  o.resume_offset = 8192;
  o.resume_base = ResumeBase::kTarget;
  o.base_id = 5;
  EXPECT_TRUE(DecodeOpen(EncodeOpen(o)).status().IsCorruption());

  std::string base = EncodeResumeInfo(ResumeInfo{ResumeBase::kPartial, 1, ChecksumAlgorithm::kXxh3, 2, 3});
  base[1] = 3;  // unknown base
  EXPECT_TRUE(DecodeResumeInfo(base).status().IsCorruption());
  EXPECT_TRUE(DecodeResumeInfo(EncodeResumeInfo(ResumeInfo{ResumeBase::kPartial, 1, ChecksumAlgorithm::kXxh3, 2, 0}))
                  .status()
                  .IsCorruption());
  EXPECT_TRUE(DecodeQuery(EncodeQuery(QueryRequest{"x", ChecksumAlgorithm::kNone, 1})).status().IsCorruption());

  // A version 1 peer is refused with both versions named.
  std::string v1 = EncodeQuery(QueryRequest{"x", ChecksumAlgorithm::kXxh3, 1});
  v1[0] = 1;
  Status old = DecodeQuery(v1).status();
  EXPECT_TRUE(old.IsCorruption());
  EXPECT_NE(old.message().find("version 1 not supported"), std::string::npos) << old.ToString();
}

TEST(RcopyProtocol, StreamRangeCoversWhatIsLeft) {
  for (uint64_t size : {0ull, 1ull, 4097ull, 10485763ull}) {
    for (uint64_t resume : std::vector<uint64_t>{0, 1, 4095, size / 2, size}) {
      if (resume > size) continue;
      for (uint16_t streams : {1, 3, 8}) {
        uint64_t next = resume;
        for (uint16_t i = 0; i < streams; ++i) {
          ByteRange r = StreamRange(size, resume, streams, i);
          EXPECT_EQ(r.offset, next) << size << "/" << resume << "/" << streams << "/" << i;
          next = r.offset + r.length;
        }
        EXPECT_EQ(next, size);
      }
    }
  }
}

TEST(RcopyProtocol, PartialFileNameIsDeterministicAndFits) {
  EXPECT_EQ(PartialFileName("f.bin"), ".f.bin.rcopy-partial");
  std::string a(255, 'a');
  std::string b = a;
  b.back() = 'b';
  EXPECT_LE(PartialFileName(a).size(), 255u);
  EXPECT_NE(PartialFileName(a), PartialFileName(b));
  EXPECT_EQ(PartialFileName(a), PartialFileName(a));
  EXPECT_TRUE(SplitSafeRelativePath(PartialFileName(a)).ok());
}

// ------------------------------------------------------ file lists

TEST(RcopyFileList, OneFileKeepsTheDestinationRules) {
  auto one = [](const std::string& dst) { return PlanCopies({"/some/where/f.txt"}, dst, false); };
  EXPECT_EQ(one("").items.at(0).destination, "f.txt");
  EXPECT_EQ(one("d/").items.at(0).destination, "d/f.txt");
  EXPECT_EQ(one("new-name").items.at(0).destination, "new-name");
  EXPECT_FALSE(one("").destination_is_directory);

  TempDir dir;
  CopyPlan plan = PlanCopies({dir.path()}, "", false);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].problem.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.items[0].problem.message().find("-r"), std::string::npos);
}

TEST(RcopyFileList, SeveralFilesAndTreesKeepRelativePaths) {
  TempDir src;
  fs::create_directories(src.File("tree/a/b"));
  fs::create_directories(src.File("tree/empty"));
  for (const char* f : {"one", "two", "tree/top", "tree/a/x", "tree/a/b/deep"}) {
    ASSERT_TRUE(WriteFileAtomic(src.File(f), f).ok());
  }
  ASSERT_EQ(::symlink("/etc/passwd", src.File("tree/a/link").c_str()), 0);
  ASSERT_EQ(::mkfifo(src.File("tree/fifo").c_str(), 0600), 0);

  CopyPlan files = PlanCopies({src.File("one"), src.File("two")}, "dst/", false);
  EXPECT_TRUE(files.destination_is_directory);
  ASSERT_EQ(files.items.size(), 2u);
  EXPECT_EQ(files.items[0].destination, "dst/one");
  EXPECT_EQ(files.items[1].destination, "dst/two");
  CopyPlan at_root = PlanCopies({src.File("one"), src.File("two")}, "", false);
  EXPECT_EQ(at_root.items[1].destination, "two");

  // Without -r a directory among several SRCs is a failed item, the rest go.
  CopyPlan no_r = PlanCopies({src.File("one"), src.File("tree")}, "d", false);
  ASSERT_EQ(no_r.items.size(), 2u);
  EXPECT_TRUE(no_r.items[0].problem.ok());
  EXPECT_EQ(no_r.items[1].problem.code(), StatusCode::kInvalidArgument);

  CopyPlan tree = PlanCopies({src.File("tree"), src.File("one")}, "d", true);
  std::vector<std::string> destinations;
  for (const CopyItem& item : tree.items) {
    EXPECT_TRUE(item.problem.ok()) << item.source << ": " << item.problem.ToString();
    destinations.push_back(item.destination);
  }
  EXPECT_EQ(destinations,
            (std::vector<std::string>{"d/tree/a/b/deep", "d/tree/a/x", "d/tree/top", "d/one"}));
  ASSERT_EQ(tree.skipped.size(), 2u);  // the symlink and the FIFO, never followed or opened
  EXPECT_EQ(tree.skipped[0].source, src.File("tree/a/link"));
  EXPECT_EQ(tree.skipped[0].reason, "symbolic link");
  EXPECT_EQ(tree.skipped[1].reason, "not a regular file");

  // A trailing '/' sends the contents (as rsync).
  CopyPlan contents = PlanCopies({src.File("tree/")}, "", true);
  ASSERT_EQ(contents.items.size(), 3u);
  EXPECT_EQ(contents.items[0].destination, "a/b/deep");
  EXPECT_EQ(contents.items[2].destination, "top");
}

// --------------------------------------------- resume against a server

// Waits (bounded) until `path` exists.
bool AppearsWithin(const std::string& path, std::chrono::milliseconds limit) {
  Deadline deadline = Deadline::After(limit);
  while (!fs::exists(path)) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Starts a transfer by hand and sends `sent[i]` bytes of stream i's range in
// chunks of `chunk`, then disconnects every stream: an interrupted copy.
void InterruptedTransfer(Server& server, const std::string& name, const std::string& bytes, uint16_t streams,
                         const std::vector<uint64_t>& sent, uint64_t chunk, uint32_t flags = kOpenFlagKeepPartial) {
  const uint16_t port = server.local_endpoint().port;
  const uint64_t received_before = server.stats().bytes_received;
  static std::atomic<uint64_t> next_id{0x7000};
  const uint64_t id = next_id++;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (uint16_t i = 0; i < streams; ++i) {
    auto client = std::make_unique<RawClient>(port);
    ASSERT_TRUE(client->conn);
    OpenRequest open;
    open.transfer_id = id;
    open.name = name;
    open.file_size = bytes.size();
    open.streams = streams;
    open.stream_index = i;
    ByteRange r = SplitRange(bytes.size(), streams, i);
    open.range_offset = r.offset;
    open.range_length = r.length;
    open.flags = flags;
    ASSERT_TRUE(client->conn->Send(kMsgOpen, EncodeOpen(open)).ok());
    auto accepted = client->ReadResult();
    ASSERT_TRUE(accepted.ok() && accepted->ok()) << accepted.status().ToString();
    for (uint64_t done = 0; done < sent[i];) {
      uint64_t n = std::min(chunk, sent[i] - done);
      std::string_view piece(bytes.data() + r.offset + done, n);
      ASSERT_TRUE(client->conn
                      ->SendWithBulk(kMsgData, EncodeData(DataHeader{r.offset + done}),
                                     transport::BulkSource::FromMemory(piece))
                      .ok());
      done += n;
    }
    clients.push_back(std::move(client));
  }
  // Each stream reads every byte sent before it sees its end of stream, but
  // the first stream to see it ends the transfer for the others: wait until
  // the server has read all that was sent.
  uint64_t total = 0;
  for (uint64_t n : sent) total += n;
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (server.stats().bytes_received < received_before + total && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& c : clients) c->conn->Close();
}

TEST_F(RcopyServerTest, InterruptedCopyKeepsItsPrefixAndResumeSendsTheRest) {
  const size_t size = 1 << 20;
  std::string source = WriteSource("r", size, 31);
  std::string bytes = ReadAll(source);
  InterruptedTransfer(*server_, "sub/r", bytes, 1, {3 * 65536}, 65536);
  const std::string partial = root_.File("sub/.r.rcopy-partial");
  ASSERT_TRUE(AppearsWithin(partial, std::chrono::seconds(10)));
  EXPECT_FALSE(fs::exists(root_.File("sub/r")));
  EXPECT_EQ(ReadAll(partial), bytes.substr(0, 3 * 65536));

  ClientOptions o = Options(source, "sub/r");
  o.resume = true;
  o.verify = true;
  o.streams = 3;
  CopyReport report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(report.resume, ResumeOutcome::kResumed);
  EXPECT_EQ(report.resume_base, ResumeBase::kPartial);
  EXPECT_EQ(report.resumed_from, 3u * 65536);
  EXPECT_EQ(report.bytes_skipped, 3u * 65536);
  EXPECT_EQ(report.bytes_sent, size - 3 * 65536);
  EXPECT_EQ(report.file_digest, DigestOf(ChecksumAlgorithm::kXxh3, bytes));  // whole file, both sides
  EXPECT_EQ(ReadAll(root_.File("sub/r")), bytes);
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(TempFiles().empty());
}

TEST_F(RcopyServerTest, InterruptedParallelCopyKeepsOnlyTheContiguousPrefix) {
  const size_t size = 600000;
  std::string source = WriteSource("p", size, 32);
  std::string bytes = ReadAll(source);
  ByteRange first = SplitRange(size, 3, 0);
  // Stream 1 complete, stream 2 half way, stream 3 a little: the prefix ends
  // where stream 2 stopped.
  InterruptedTransfer(*server_, "p", bytes, 3, {first.length, 65536, 4096}, 16384);
  const std::string partial = root_.File(".p.rcopy-partial");
  ASSERT_TRUE(AppearsWithin(partial, std::chrono::seconds(10)));
  EXPECT_EQ(TempFiles(), std::vector<std::string>{partial});  // the temporary file became the partial one
  EXPECT_EQ(fs::file_size(partial), first.length + 65536);
  EXPECT_EQ(ReadAll(partial), bytes.substr(0, first.length + 65536));

  ClientOptions o = Options(source, "p");
  o.resume = true;
  CopyReport report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(report.resumed_from, first.length + 65536);
  EXPECT_EQ(ReadAll(root_.File("p")), bytes);
}

TEST_F(RcopyServerTest, ResumeComparesThePrefixWithTheTargetOrPartialFile) {
  const size_t size = 300000;
  std::string source = WriteSource("t", size, 33);
  std::string bytes = ReadAll(source);
  auto resume = [&](bool verify, ChecksumAlgorithm algorithm = ChecksumAlgorithm::kXxh3) {
    ClientOptions o = Options(source, "t");
    o.resume = true;
    o.verify = verify;
    o.checksum = algorithm;
    o.streams = 2;
    CopyReport report = CopyFile(o);
    EXPECT_TRUE(report.status.ok()) << report.status.ToString();
    EXPECT_EQ(ReadAll(root_.File("t")), bytes);
    EXPECT_TRUE(TempFiles().empty());
    return report;
  };

  // Nothing on the server: everything is sent.
  CopyReport r = resume(false);
  EXPECT_EQ(r.resume, ResumeOutcome::kNothing);
  EXPECT_EQ(r.bytes_sent, size);

  // A shorter target with our prefix: only the rest is sent, and the target
  // stays intact until the new file is renamed over it.
  ASSERT_TRUE(WriteFileAtomic(root_.File("t"), bytes.substr(0, 100000)).ok());
  r = resume(true, ChecksumAlgorithm::kCrc32c);
  EXPECT_EQ(r.resume, ResumeOutcome::kResumed);
  EXPECT_EQ(r.resume_base, ResumeBase::kTarget);
  EXPECT_EQ(r.resumed_from, 100000u);
  EXPECT_EQ(r.bytes_sent, size - 100000);

  // A target equal to the source: nothing is sent at all.
  r = resume(true);
  EXPECT_EQ(r.resume, ResumeOutcome::kComplete);
  EXPECT_EQ(r.bytes_sent, 0u);
  EXPECT_EQ(r.bytes_skipped, size);

  // A shorter target whose bytes differ: prefix mismatch, sent from offset 0.
  std::string wrong = bytes.substr(0, 100000);
  wrong[5000] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(root_.File("t"), wrong).ok());
  r = resume(false);
  EXPECT_EQ(r.resume, ResumeOutcome::kPrefixMismatch);
  EXPECT_EQ(r.existing_bytes, 100000u);
  EXPECT_EQ(r.resumed_from, 0u);
  EXPECT_EQ(r.bytes_sent, size);

  // A longer target: sent again from offset 0.
  ASSERT_TRUE(WriteFileAtomic(root_.File("t"), bytes + "more").ok());
  r = resume(false);
  EXPECT_EQ(r.resume, ResumeOutcome::kLonger);
  EXPECT_EQ(r.bytes_sent, size);

  // A partial file wins over the target; a bad one is replaced and removed.
  ASSERT_TRUE(WriteFileAtomic(root_.File(".t.rcopy-partial"), wrong).ok());
  r = resume(true);
  EXPECT_EQ(r.resume, ResumeOutcome::kPrefixMismatch);
  EXPECT_EQ(r.resume_base, ResumeBase::kPartial);
  EXPECT_FALSE(fs::exists(root_.File(".t.rcopy-partial")));

  // A symlink as the target is never read.
  TempDir outside;
  ASSERT_TRUE(WriteFileAtomic(outside.File("secret"), bytes.substr(0, 1000)).ok());
  fs::remove(root_.File("t"));
  ASSERT_EQ(::symlink(outside.File("secret").c_str(), root_.File("t").c_str()), 0);
  r = resume(false);
  EXPECT_EQ(r.resume, ResumeOutcome::kNothing);
  EXPECT_FALSE(fs::is_symlink(root_.File("t")));
  EXPECT_EQ(ReadAll(outside.File("secret")), bytes.substr(0, 1000));
}

TEST_F(RcopyServerTest, OnlyInterruptionsKeepAPartialFile) {
  std::string bytes = RandomBytes(10000, 4);
  {
    RawClient client(port_);  // checksum mismatch: the data is suspect
    OpenRequest open = OpenFor("m", bytes.size(), kOpenFlagVerify | kOpenFlagKeepPartial);
    ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(open)).ok());
    ASSERT_TRUE(client.ReadResult().ok());
    ASSERT_TRUE(client.conn->SendWithBulk(kMsgData, EncodeData(DataHeader{0}), transport::BulkSource::FromMemory(bytes))
                    .ok());
    uint64_t wrong = DigestOf(ChecksumAlgorithm::kXxh3, bytes) ^ 1;
    ASSERT_TRUE(
        client.conn->Send(kMsgCommit, EncodeCommit(CommitRequest{bytes.size(), ChecksumAlgorithm::kXxh3, wrong, 0}))
            .ok());
    auto result = client.ReadResult();
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->code, StatusCode::kCorruption);
  }
  {
    RawClient client(port_);  // protocol violation
    ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("v", 100, kOpenFlagKeepPartial))).ok());
    ASSERT_TRUE(client.ReadResult().ok());
    ASSERT_TRUE(client.conn->Send(kMsgCommit, EncodeCommit(CommitRequest{100, ChecksumAlgorithm::kNone, 0, 0})).ok());
    ASSERT_TRUE(client.ReadResult().ok());
  }
  EXPECT_TRUE(NoTempFilesWithin(std::chrono::seconds(5)));

  // Stopping the server interrupts a transfer: what arrived is kept.
  InterruptedTransfer(*server_, "unused", bytes, 1, {0}, 4096);  // nothing arrived: nothing kept
  RawClient client(port_);
  ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(OpenFor("s", bytes.size(), kOpenFlagKeepPartial))).ok());
  ASSERT_TRUE(client.ReadResult().ok());
  const uint64_t received_before = server_->stats().bytes_received;
  ASSERT_TRUE(client.conn
                  ->SendWithBulk(kMsgData, EncodeData(DataHeader{0}),
                                 transport::BulkSource::FromMemory(std::string_view(bytes).substr(0, 4096)))
                  .ok());
  // Wait (bounded) until the bytes are on the server, then stop it.
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (server_->stats().bytes_received < received_before + 4096 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server_->Stop();
  EXPECT_EQ(ReadAll(root_.File(".s.rcopy-partial")), bytes.substr(0, 4096));
  EXPECT_FALSE(fs::exists(root_.File(".unused.rcopy-partial")));
  EXPECT_EQ(TempFiles(), std::vector<std::string>{root_.File(".s.rcopy-partial")});
}

TEST_F(RcopyServerTest, ResumeBaseChangedAfterTheQueryIsAConflict) {
  std::string bytes = RandomBytes(50000, 5);
  ASSERT_TRUE(WriteFileAtomic(root_.File(".c.rcopy-partial"), bytes.substr(0, 20000)).ok());
  RawClient query(port_);
  ASSERT_TRUE(query.conn->Send(kMsgQuery, EncodeQuery(QueryRequest{"c", ChecksumAlgorithm::kXxh3, bytes.size()})).ok());
  auto m = query.conn->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->type, kMsgResumeInfo);
  auto info = DecodeResumeInfo(m->payload);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->base, ResumeBase::kPartial);
  EXPECT_EQ(info->size, 20000u);
  EXPECT_EQ(info->digest, DigestOf(ChecksumAlgorithm::kXxh3, bytes.substr(0, 20000)));

  // Someone replaces the partial file before the OPEN.
  ASSERT_TRUE(WriteFileAtomic(root_.File(".c.rcopy-partial"), bytes.substr(0, 30000)).ok());
  RawClient client(port_);
  OpenRequest open = OpenFor("c", bytes.size());
  open.resume_offset = info->size;
  open.resume_base = ResumeBase::kPartial;
  open.base_id = info->base_id;
  ByteRange r = StreamRange(bytes.size(), info->size, 1, 0);
  open.range_offset = r.offset;
  open.range_length = r.length;
  ASSERT_TRUE(client.conn->Send(kMsgOpen, EncodeOpen(open)).ok());
  auto result = client.ReadResult();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->code, StatusCode::kConflict) << result->text;
  EXPECT_EQ(fs::file_size(root_.File(".c.rcopy-partial")), 30000u);  // left alone
  EXPECT_FALSE(fs::exists(root_.File("c")));
}

// --------------------------------------------------------- rate limit

TEST_F(RcopyServerTest, RateLimitIsHeld) {
  std::string source = WriteSource("rate", 2'000'000, 34);
  const double limit = 80e6;  // bit/s: 2 MB take 0.2 s
  for (uint16_t streams : {1, 2}) {
    ClientOptions o = Options(source, "rate");
    o.sink = true;
    o.streams = streams;
    o.rate_bits_per_second = static_cast<uint64_t>(limit);
    CopyReport report = CopyFile(o);
    ASSERT_TRUE(report.status.ok()) << report.status.ToString();
    double achieved = static_cast<double>(report.bytes_sent) * 8 / report.seconds;
    EXPECT_LE(achieved, limit * 1.10) << streams << " streams, " << report.seconds << " s";
    // The limit is a ceiling: a pacer thread that wakes late (a loaded
    // machine) forfeits credit older than 20 ms rather than bursting past the
    // rate, so only gross over-throttling (4x) is a failure here (0.31x was
    // seen at load 40).
    EXPECT_GE(achieved, limit * 0.25) << streams << " streams, " << report.seconds << " s";
    EXPECT_LT(report.seconds, 2.0);
    EXPECT_EQ(report.chunk_bytes, 64u << 10);  // 20 ms at 80 Mbit/s is more than the 64 KiB chunk
  }
  // A real copy cannot go faster either, and still arrives intact.
  ClientOptions o = Options(source, "rate");
  o.rate_bits_per_second = static_cast<uint64_t>(limit);
  o.chunk_bytes = 16 << 20;
  CopyReport report = CopyFile(o);
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(report.chunk_bytes, 200'000u);  // messages of 20 ms at the rate
  EXPECT_LE(static_cast<double>(report.bytes_sent) * 8 / report.seconds, limit * 1.10);
  EXPECT_EQ(ReadAll(root_.File("rate")), ReadAll(source));
}

// ------------------------------------------------ connection limits

TEST_F(RcopyServerTest, ClientsBeyondMaxConnectionsGetServerBusy) {
  server_.reset();
  StartServer(std::chrono::seconds(10), /*max_connections=*/2);
  std::string source = WriteSource("b", 100000, 35);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(held.back()->conn->Send(kMsgOpen, EncodeOpen(OpenFor("held" + std::to_string(i), 10))).ok());
    ASSERT_TRUE(held.back()->ReadResult().ok());
  }
  for (bool resume : {false, true}) {
    ClientOptions o = Options(source, "b");
    o.resume = resume;
    Clock::time_point start = Clock::now();
    CopyReport report = CopyFile(o);
    EXPECT_EQ(report.status.code(), StatusCode::kResourceExhausted) << report.status.ToString();
    EXPECT_NE(report.status.message().find("server busy"), std::string::npos) << report.status.ToString();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));  // an answer, not a hang
  }
  EXPECT_FALSE(fs::exists(root_.File("b")));

  held.clear();  // once they are gone, copies go through again
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (server_->stats().active_connections > 0 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CopyReport report = CopyFile(Options(source, "b"));
  ASSERT_TRUE(report.status.ok()) << report.status.ToString();
  EXPECT_EQ(ReadAll(root_.File("b")), ReadAll(source));
}

TEST_F(RcopyServerTest, ManyConcurrentClientsWithResumeAndVerify) {
  constexpr int kClients = 6;
  std::vector<std::string> sources;
  for (int i = 0; i < kClients; ++i) sources.push_back(WriteSource("k" + std::to_string(i), 300000 + i, 40 + i));
  ASSERT_TRUE(WriteFileAtomic(root_.File("k0"), ReadAll(sources[0]).substr(0, 1000)).ok());
  std::vector<CopyReport> reports(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      ClientOptions o = Options(sources[i], "k" + std::to_string(i));
      o.streams = static_cast<uint16_t>(1 + i % 3);
      o.resume = i % 2 == 0;
      o.verify = i % 3 == 0;
      reports[i] = CopyFile(o);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(reports[i].status.ok()) << i << ": " << reports[i].status.ToString();
    EXPECT_EQ(ReadAll(root_.File("k" + std::to_string(i))), ReadAll(sources[i]));
  }
  EXPECT_EQ(reports[0].resumed_from, 1000u);
  EXPECT_TRUE(TempFiles().empty());
}

// ------------------------------------------------------ CLI, JSON schema

const nlohmann::json& Schema() {
  static const nlohmann::json schema = canopy::testing::LoadJsonSchema("tools/rcopy/rcopy.schema.json");
  return schema;
}

TEST_F(RcopyServerTest, CliSuccessConformsToTheSchema) {
  std::string source = WriteSource("s1", 200000, 50);
  std::string out;
  int rc = RunStdout(Rcopy() + " --json --verify -P 2 -p " + std::to_string(port_) + " " + source + " 127.0.0.1", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["mode"], "client");
  EXPECT_EQ(j["files"].size(), 1u);
  EXPECT_EQ(j["totals"]["files_ok"], 1);
  EXPECT_EQ(j["source"], source);  // one file: its fields at the top level too
}

TEST_F(RcopyServerTest, CliCopiesManyFilesAndTrees) {
  fs::create_directories(src_.File("tree/a/b"));
  std::vector<std::string> tree_files = {"tree/a/b/deep", "tree/a/x", "tree/top"};
  for (size_t i = 0; i < tree_files.size(); ++i) WriteSource(tree_files[i], 1000 * (i + 1), 60 + i);
  ASSERT_EQ(::symlink("/etc/passwd", src_.File("tree/a/link").c_str()), 0);
  std::string one = WriteSource("one", 70000, 61);
  std::string two = WriteSource("two", 0, 62);

  std::string out;
  int rc = RunStdout(Rcopy() + " --json -r -p " + std::to_string(port_) + " " + src_.File("tree") + " " + one + " " +
                         two + " 127.0.0.1:in/here",
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["files"].size(), 5u);
  EXPECT_EQ(j["files"][0]["destination"], "in/here/tree/a/b/deep");
  EXPECT_EQ(j["totals"]["files"], 5);
  EXPECT_EQ(j["totals"]["files_ok"], 5);
  EXPECT_EQ(j["totals"]["files_skipped"], 1);
  EXPECT_EQ(j["totals"]["bytes"], 1000 + 2000 + 3000 + 70000);
  EXPECT_EQ(j["skipped"][0]["reason"], "symbolic link");
  EXPECT_FALSE(j.contains("source"));  // several files: only per file
  for (const std::string& f : tree_files) {
    EXPECT_EQ(ReadAll(root_.File("in/here/" + f)), ReadAll(src_.File(f))) << f;
  }
  EXPECT_EQ(ReadAll(root_.File("in/here/one")), ReadAll(one));
  EXPECT_TRUE(fs::exists(root_.File("in/here/two")));
  EXPECT_FALSE(fs::exists(root_.File("in/here/tree/a/link")));

  // Text: a line per file and the totals.
  out.clear();
  rc = RunStdout(Rcopy() + " -p " + std::to_string(port_) + " " + one + " " + two + " 127.0.0.1:again", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("'again/one'"), std::string::npos) << out;
  EXPECT_NE(out.find("'again/two'"), std::string::npos) << out;
  EXPECT_NE(out.find("rcopy: 2 files (0 failed), 70000 bytes sent"), std::string::npos) << out;
}

// Several files with -P 4: four copies in flight at once, one connection
// each (the server saw them together), every file byte-exact; a failure that
// concerns the server stops the run and no further file starts.
TEST_F(RcopyServerTest, BatchUsesTheStreamsAcrossFiles) {
  CopyPlan plan;
  plan.destination_is_directory = true;
  std::vector<std::string> sources;
  for (int i = 0; i < 6; ++i) {
    sources.push_back(WriteSource("f" + std::to_string(i), 50000, 300 + i));
    plan.items.push_back(CopyItem{sources.back(), "many/f" + std::to_string(i), Status::Ok()});
  }
  CopyBatchOptions batch;
  batch.client = Options("", "");
  batch.client.streams = 4;
  // 50000 bytes at 1 Mbit/s: >= 0.4 s per file, so the copies overlap.
  batch.client.rate_bits_per_second = 1'000'000;
  std::vector<size_t> done_order;
  batch.on_file_done = [&](size_t index, const CopyReport&) { done_order.push_back(index); };
  CopyBatchResult result = CopyBatch(plan, batch);
  ASSERT_EQ(result.failed, 0u) << result.first_failure.ToString();
  EXPECT_EQ(result.not_attempted, 0u);
  EXPECT_EQ(done_order.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(result.reports[i].status.ok()) << i << ": " << result.reports[i].status.ToString();
    EXPECT_EQ(result.reports[i].streams, 1) << i;
    EXPECT_EQ(ReadAll(root_.File("many/f" + std::to_string(i))), ReadAll(sources[i])) << i;
  }
  EXPECT_GE(result.peak_files_at_once, 2u);
  EXPECT_LE(result.peak_files_at_once, 4u);
  EXPECT_GE(server_->stats().peak_active_connections, 2u);

  // The server goes away: the first copies fail with Unavailable, and the run
  // stops instead of trying every other file.
  server_.reset();
  batch.client.rate_bits_per_second = 0;
  batch.client.streams = 2;
  batch.client.transport.connect_timeout = std::chrono::seconds(2);
  result = CopyBatch(plan, batch);
  EXPECT_EQ(result.first_failure.code(), StatusCode::kUnavailable) << result.first_failure.ToString();
  EXPECT_GE(result.failed, 1u);
  EXPECT_LE(result.failed, 2u);
  EXPECT_EQ(result.failed + result.not_attempted, 6u);
}

TEST_F(RcopyServerTest, CliPerFileFailuresAreReportedAndTheRunGoesOn) {
  std::string one = WriteSource("one", 5000, 63);
  std::string out;
  int rc = RunStdout(Rcopy() + " --json -p " + std::to_string(port_) + " /nonexistent/f " + src_.path() + " " + one +
                         " 127.0.0.1:d",
                     &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"], "NotFound");
  EXPECT_EQ(j["totals"]["files_failed"], 2);
  EXPECT_EQ(j["totals"]["files_ok"], 1);
  EXPECT_EQ(j["files"][1]["error_code"], "InvalidArgument");  // a directory without -r
  EXPECT_EQ(ReadAll(root_.File("d/one")), ReadAll(one));

  // The server's path rules hold for trees: a symlinked directory on the
  // server is refused for every file, nothing lands outside.
  TempDir outside;
  ASSERT_EQ(::symlink(outside.path().c_str(), root_.File("escape").c_str()), 0);
  fs::create_directories(src_.File("t/sub"));
  WriteSource("t/sub/f", 100, 64);
  WriteSource("t/g", 100, 65);
  out.clear();
  rc = RunStdout(Rcopy() + " --json -r -p " + std::to_string(port_) + " " + src_.File("t/") + " 127.0.0.1:escape",
                 &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["error_code"], "PermissionDenied");
  EXPECT_EQ(j["totals"]["files_failed"], 2);
  EXPECT_TRUE(fs::is_empty(outside.path()));
}

TEST_F(RcopyServerTest, CliServerBusyIsAJsonError) {
  server_.reset();
  StartServer(std::chrono::seconds(10), /*max_connections=*/1);
  RawClient held(port_);
  ASSERT_TRUE(held.conn->Send(kMsgOpen, EncodeOpen(OpenFor("held", 10))).ok());
  ASSERT_TRUE(held.ReadResult().ok());
  std::string source = WriteSource("x", 1000, 66);
  std::string out;
  int rc = RunStdout(Rcopy() + " --json -p " + std::to_string(port_) + " " + source + " " + source + " 127.0.0.1:d",
                     &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["error_code"], "ResourceExhausted");
  EXPECT_NE(j["error"].get<std::string>().find("server busy"), std::string::npos) << out;
  EXPECT_EQ(j["totals"]["files_not_attempted"], 1);  // the run stops: the server, not the file, failed
}

// An rcopy server process (the real binary) on 127.0.0.1.
class ServerProcess {
 public:
  ServerProcess(const std::string& root, const std::vector<std::string>& extra) : port_file_(dir_.File("port")) {
    std::vector<std::string> args = {Rcopy(), "--server", "-q",       "--root",      root,        "--bind",
                                     "127.0.0.1", "-p",   "0",        "--port-file", port_file_};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = canopy::testing::ForkChild([&]() -> int {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      return 91;
    });
  }
  ~ServerProcess() { Stop(); }

  // The port, once the server wrote its port file (bounded wait).
  std::string WaitForPort() {
    Deadline deadline = Deadline::After(std::chrono::seconds(10));
    while (!PathExists(port_file_) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto text = ReadFileToString(port_file_);
    return text.ok() ? text->substr(0, text->find('\n')) : std::string();
  }

  // SIGTERM (or `signal`) and wait; returns the wait status (-1 on timeout).
  int Stop(int signal = SIGTERM) {
    if (pid_ <= 0) return status_;
    ::kill(pid_, signal);
    status_ = canopy::testing::WaitChild(pid_, std::chrono::seconds(10));
    pid_ = -1;
    return status_;
  }

 private:
  TempDir dir_;
  std::string port_file_;
  pid_t pid_ = -1;
  int status_ = -1;
};

std::string ReadWhole(const std::string& path) {
  auto r = ReadFileToString(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

TEST(RcopyCli, KilledCopyIsResumedFromItsPartialFile) {
  TempDir root;
  TempDir src;
  ServerProcess server(root.path(), {"--idle-timeout", "10"});
  std::string port = server.WaitForPort();
  ASSERT_FALSE(port.empty()) << "server did not start";
  const size_t size = 4 << 20;
  std::string bytes = RandomBytes(size, 70);
  ASSERT_TRUE(WriteFileAtomic(src.File("big"), bytes).ok());

  // A slow copy (40 Mbit/s: about 0.8 s), killed once 1 MiB arrived.
  std::string binary = Rcopy();
  std::string source = src.File("big");
  pid_t client = canopy::testing::ForkChild([&]() -> int {
    int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    ::execl(binary.c_str(), binary.c_str(), "-q", "--rate", "40M", "--chunk", "64K", "-p", port.c_str(),
            source.c_str(), "127.0.0.1:big", static_cast<char*>(nullptr));
    return 91;
  });
  ASSERT_GT(client, 0);
  // The bytes that landed in the temporary file: its allocated blocks (the
  // server gives it its final size up front, as a hole).
  auto temp_bytes = [&]() -> uint64_t {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root.path(), ec)) {
      struct stat st;
      if (e.path().extension() == ".tmp" && ::stat(e.path().c_str(), &st) == 0) {
        return static_cast<uint64_t>(st.st_blocks) * 512;
      }
    }
    return 0;
  };
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (temp_bytes() < (1u << 20) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(client, SIGKILL);
  int status = canopy::testing::WaitChild(client, std::chrono::seconds(10));
  ASSERT_TRUE(WIFSIGNALED(status)) << "the copy finished before it was killed: " << status;

  const std::string partial = root.File(".big.rcopy-partial");
  ASSERT_TRUE(AppearsWithin(partial, std::chrono::seconds(10)));
  EXPECT_FALSE(fs::exists(root.File("big")));
  const uint64_t kept = fs::file_size(partial);
  EXPECT_GE(kept, 1u << 20);
  EXPECT_LT(kept, size);
  EXPECT_EQ(kept % (64 << 10), 0u);  // whole DATA messages only
  EXPECT_EQ(ReadWhole(partial), bytes.substr(0, kept));

  std::string out;
  int rc = RunStdout(Rcopy() + " --json --resume --verify -p " + port + " " + source + " 127.0.0.1:big", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["resume"]["outcome"], "resumed");
  EXPECT_EQ(j["resume"]["base"], "partial");
  EXPECT_EQ(j["bytes_skipped"].get<uint64_t>(), kept);
  EXPECT_EQ(j["resumed_from"].get<uint64_t>(), kept);
  EXPECT_EQ(j["bytes_sent"].get<uint64_t>(), size - kept);
  EXPECT_TRUE(j.contains("file_digest"));
  EXPECT_EQ(ReadWhole(root.File("big")), bytes);
  EXPECT_FALSE(fs::exists(partial));

  // Again: already complete, nothing sent, said in words.
  out.clear();
  rc = RunStdout(Rcopy() + " --resume -p " + port + " " + source + " 127.0.0.1:big", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("nothing sent"), std::string::npos) << out;
  // A changed source: prefix mismatch, copied again from offset 0.
  bytes[10] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(source, bytes.substr(0, size - 5)).ok());
  ASSERT_TRUE(WriteFileAtomic(source + "2", bytes).ok());
  out.clear();
  rc = RunStdout(Rcopy() + " --resume -p " + port + " " + source + "2 127.0.0.1:big", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("prefix mismatch"), std::string::npos) << out;
  EXPECT_EQ(ReadWhole(root.File("big")), bytes);

  EXPECT_EQ(server.Stop(), 0);
}

// A server killed with SIGKILL in the middle of a -P 2 copy leaves its
// temporary file; the next --resume (served by a new server on the same root)
// uses the part written from the start, checksum-verified, and sends only the
// rest (issue 19).
TEST(RcopyCli, TemporaryFileOfAKilledServerIsResumed) {
  TempDir root;
  TempDir src;
  const size_t size = 4 << 20;
  std::string bytes = RandomBytes(size, 71);
  ASSERT_TRUE(WriteFileAtomic(src.File("big"), bytes).ok());
  const std::string source = src.File("big");
  const std::string binary = Rcopy();
  auto temp_file = [&]() -> std::string {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root.path(), ec)) {
      if (e.path().extension() == ".tmp") return e.path();
    }
    return "";
  };
  {
    ServerProcess server(root.path(), {"--idle-timeout", "10"});
    std::string port = server.WaitForPort();
    ASSERT_FALSE(port.empty()) << "server did not start";
    // A slow copy over 2 streams (40 Mbit/s in all: about 0.8 s).
    pid_t client = canopy::testing::ForkChild([&]() -> int {
      int null_fd = ::open("/dev/null", O_WRONLY);
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
      ::execl(binary.c_str(), binary.c_str(), "-q", "-P", "2", "--rate", "40M", "--chunk", "64K", "-p",
              port.c_str(), source.c_str(), "127.0.0.1:big", static_cast<char*>(nullptr));
      return 91;
    });
    ASSERT_GT(client, 0);
    // Stream 2 writes from 2 MiB on: wait until both streams wrote 256 KiB
    // (each stream's part ends at a hole: the server sizes the file up front).
    Deadline deadline = Deadline::After(std::chrono::seconds(10));
    for (;;) {
      std::string temp = temp_file();
      int fd = temp.empty() ? -1 : ::open(temp.c_str(), O_RDONLY | O_CLOEXEC);
      off_t hole = fd < 0 ? 0 : ::lseek(fd, 0, SEEK_HOLE);
      constexpr off_t kSecond = 2 << 20;
      off_t hole2 =
          fd >= 0 && ::lseek(fd, kSecond, SEEK_DATA) == kSecond ? ::lseek(fd, kSecond, SEEK_HOLE) : 0;
      if (fd >= 0) ::close(fd);
      if (hole >= (256 << 10) && hole2 >= kSecond + (256 << 10)) break;
      ASSERT_FALSE(deadline.expired()) << "the copy did not progress";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int status = server.Stop(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(status)) << status;
    status = canopy::testing::WaitChild(client, std::chrono::seconds(20));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  }
  ASSERT_FALSE(temp_file().empty()) << "the killed server left no temporary file";
  EXPECT_FALSE(fs::exists(root.File("big")));

  ServerProcess server(root.path(), {"--idle-timeout", "10"});
  std::string port = server.WaitForPort();
  ASSERT_FALSE(port.empty()) << "server did not start";
  std::string out;
  int rc = RunStdout(binary + " --json --resume --verify -P 2 -p " + port + " " + source + " 127.0.0.1:big", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["resume"]["outcome"], "resumed") << out;
  EXPECT_EQ(j["resume"]["base"], "partial") << out;
  const uint64_t skipped = j["bytes_skipped"].get<uint64_t>();
  EXPECT_GE(skipped, 64u << 10) << out;  // stream 1's part, at least one DATA message
  EXPECT_LT(skipped, 2u << 20) << out;   // not stream 2's range: a hole came first
  EXPECT_EQ(j["bytes_sent"].get<uint64_t>(), size - skipped);
  EXPECT_EQ(ReadWhole(root.File("big")), bytes);
  EXPECT_TRUE(temp_file().empty());
  EXPECT_FALSE(fs::exists(root.File(".big.rcopy-partial")));
  EXPECT_EQ(server.Stop(), 0);
}

// rcopy --server --metrics: its totals in the Prometheus text format.
TEST(RcopyCli, ServerExposesItsTotalsAsMetrics) {
  TempDir root;
  TempDir src;
  const std::string metrics_port_file = src.File("metrics-port");
  ServerProcess server(root.path(), {"--metrics", "127.0.0.1:0", "--metrics-port-file", metrics_port_file});
  std::string port = server.WaitForPort();
  ASSERT_FALSE(port.empty()) << "server did not start";
  ASSERT_TRUE(WriteFileAtomic(src.File("f"), RandomBytes(300000, 80)).ok());
  std::string out;
  ASSERT_EQ(RunCommand(Rcopy() + " -q -P 2 -p " + port + " " + src.File("f") + " 127.0.0.1:f", &out), 0) << out;
  auto metrics_port = ReadFileToString(metrics_port_file);
  ASSERT_TRUE(metrics_port.ok());
  // The server counts a transfer once its last stream detached, just after
  // the client got its answer: scrape until it shows (bounded).
  canopy::testing::RawResponse response;
  Deadline deadline = Deadline::After(std::chrono::seconds(5));
  do {
    response = canopy::testing::RawResponse();
    ASSERT_TRUE(canopy::testing::RoundTrip(static_cast<uint16_t>(std::stoul(*metrics_port)),
                                           canopy::testing::Get("/metrics"), &response));
    if (response.body.find("canopy_rcopy_files_published_total 1\n") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (!deadline.expired());
  EXPECT_EQ(response.status, 200);
  EXPECT_NE(response.headers.Find("Content-Type")->find("text/plain; version=0.0.4"), std::string::npos);
  const std::string& text = response.body;
  EXPECT_NE(text.find("# TYPE canopy_rcopy_files_published_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_rcopy_files_published_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_rcopy_connections_total 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_rcopy_bytes_received_total 300000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_transport_connections_total{direction=\"accepted\",scheme=\"tcp\"} 2"),
            std::string::npos)
      << text;
  EXPECT_EQ(server.Stop(), 0);
  // A client option is refused: --metrics belongs to the server.
  EXPECT_EQ(RunCommand(Rcopy() + " --metrics 127.0.0.1:0 " + src.File("f") + " 127.0.0.1", &out), 2) << out;
}

TEST(RcopyCli, ServerStopsAfterMaxDuration) {
  TempDir root;
  TempDir dir;
  const std::string port_file = dir.File("port");
  std::string out;
  int rc = -1;
  Clock::time_point start = Clock::now();
  std::thread server([&] {
    rc = RunStdout(Rcopy() + " --server --json --root " + root.path() + " --bind 127.0.0.1 -p 0 --port-file " +
                       port_file + " --max-duration 1.5",
                   &out);
  });
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (!PathExists(port_file) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto port = ReadFileToString(port_file);
  if (port.ok()) {
    ASSERT_TRUE(WriteFileAtomic(dir.File("f"), "served while it ran").ok());
    std::string copy_out;
    EXPECT_EQ(RunCommand(Rcopy() + " -q -p " + port->substr(0, port->find('\n')) + " " + dir.File("f") + " 127.0.0.1",
                         &copy_out),
              0)
        << copy_out;
  }
  server.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(port.ok()) << "server did not start";
  EXPECT_EQ(rc, 0) << out;
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["stop_reason"], "max-duration");
  EXPECT_EQ(j["files_published"], 1);
  EXPECT_TRUE(fs::exists(root.File("f")));
}

TEST(RcopyCli, JsonConformsOnEveryFailure) {
  transport::RegisterBuiltinTransports();
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("f"), "data").ok());
  struct Case {
    std::string args;
    int exit_status;
    const char* error_code;
  };
  const std::string unused = std::to_string(UnusedPort());
  std::vector<Case> cases = {
      {"-p " + unused + " " + dir.File("f") + " 127.0.0.1", 1, "Unavailable"},          // unreachable peer
      {"-p " + unused + " --resume " + dir.File("f") + " 127.0.0.1", 1, "Unavailable"},  // ... asked to resume
      {"-p " + unused + " " + dir.File("f") + " " + dir.File("f") + " 127.0.0.1:d", 1, "Unavailable"},
      {"/nonexistent/file 127.0.0.1", 1, "NotFound"},                                    // missing source
      {"-p " + unused + " " + dir.path() + " 127.0.0.1", 1, "InvalidArgument"},          // a directory, no -r
      {"--bogus", 2, "InvalidArgument"},                                                 // usage errors
      {"onlyone", 2, "InvalidArgument"},
      {"--rate 12Q a 127.0.0.1", 2, "InvalidArgument"},
      {"--resume --sink a 127.0.0.1", 2, "InvalidArgument"},
      {"--server", 2, "InvalidArgument"},
      {"--server --root /tmp --max-duration -3", 2, "InvalidArgument"},
      {"--server --root /nonexistent/root -p 0", 1, "NotFound"},                         // server cannot start
  };
  for (const Case& c : cases) {
    std::string out;
    int rc = RunStdout(Rcopy() + " --json --connect-timeout 3 " + c.args, &out);
    EXPECT_EQ(rc, c.exit_status) << c.args << ": " << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "") << c.args;
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << c.args << ": " << out;
    EXPECT_FALSE(j["ok"].get<bool>()) << c.args;
    EXPECT_EQ(j["error_code"], c.error_code) << c.args << ": " << out;
    EXPECT_EQ(j.contains("usage"), c.exit_status == 2) << c.args;
  }
}

}  // namespace
}  // namespace canopy::rcopy
