// Node join on the bulk path, below the node: a checkpoint file sent whole
// with SendWithBulk over tcp://127.0.0.1 lands in a SnapshotFileInstaller's
// file (spliced), every block checked as it lands, and the tree is served in
// place. Also: an announced size over the limit (or the free space) is
// refused before anything is created; corrupt or truncated bytes leave no
// file behind; an interrupted transfer keeps its checked blocks and the next
// one continues after them, also from a file torn by a crash.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "base/fd.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"
#include "transport/registry.h"
#include "tree/snapshot.h"
#include "tree/store.h"

namespace canopy::tree {
namespace {

using canopy::testing::TempDir;
namespace fs = std::filesystem;

constexpr char kTree[] = "t";
constexpr uint64_t kPieceBytes = 8 << 10;  // small pieces (two 4 KiB blocks): many Landed() calls

// A store holding tree `t` with a few thousand nodes in small blocks and a checkpoint of it.
std::unique_ptr<Store> SourceStore(const std::string& dir) {
  StoreOptions o;
  o.fsync = FsyncPolicy::kNone;
  o.snapshot_chunk_bytes = 4096;
  auto store = Store::Open(dir, o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->CreateTree(kTree).ok());
  for (int c = 0; c < 20; ++c) {
    std::vector<Op> ops;
    for (int i = 0; i < 100; ++i) {
      ops.push_back(Op::AppendChild({}));
      ops.push_back(Op::PutAttribute({static_cast<uint64_t>(c * 100 + i)}, "v",
                                     testing::RandomBytes(40 + i, c * 1000 + i)));
    }
    EXPECT_TRUE((*store)->CommitOps(kTree, std::move(ops)).ok());
  }
  EXPECT_TRUE((*store)->Checkpoint(kTree).ok());
  return std::move(*store);
}

std::unique_ptr<Store> EmptyStore(const std::string& dir, uint64_t max_file_bytes = uint64_t{1} << 40) {
  StoreOptions o;
  o.fsync = FsyncPolicy::kNone;
  o.max_install_file_bytes = max_file_bytes;
  auto store = Store::Open(dir, o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return std::move(*store);
}

size_t FilesUnder(const std::string& dir) {
  size_t n = 0;
  if (!fs::exists(dir)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

// Sends bytes [offset, length) of the file `fd` as one bulk message over
// loopback TCP and lands them in `in` piece by piece, stopping (the
// connection then closes, as when a joiner loses its leader) after
// `max_pieces` pieces. Returns the first error of Landed, or OK; sets
// *received to the bulk bytes consumed.
Status Transfer(int fd, uint64_t offset, uint64_t length, SnapshotFileInstaller& in, uint64_t* received,
                size_t max_pieces = SIZE_MAX) {
  transport::RegisterBuiltinTransports();
  transport::TransportOptions topts;
  auto listener = transport::ListenOn("tcp://127.0.0.1:0", topts);
  if (!listener.ok()) return listener.status();
  std::string uri = (*listener)->local_endpoint().ToUri();
  Status send_status;
  std::thread sender([&] {
    auto conn = transport::Dial(uri, topts);
    if (!conn.ok()) {
      send_status = conn.status();
      return;
    }
    send_status = (*conn)->SendWithBulk(7, "file", transport::BulkSource::FromFile(fd, offset, length - offset));
    // Wait for the receiver to finish with the connection.
    (void)(*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  });
  auto conn = (*listener)->Accept(Deadline::After(std::chrono::seconds(10)));
  Status s = conn.status();
  *received = 0;
  if (s.ok()) {
    auto m = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
    s = m.status();
    if (s.ok() && m->bulk_bytes != length - offset) s = Status::Internal("wrong bulk length");
    uint64_t landed = offset;
    size_t pieces = 0;
    while (s.ok() && landed < length && pieces++ < max_pieces) {
      uint64_t piece = std::min(kPieceBytes, length - landed);
      s = (*conn)->ReceiveBulk(transport::BulkSink::ToFile(in.fd(), landed), piece,
                               Deadline::After(std::chrono::seconds(10)));
      if (!s.ok()) break;
      landed += piece;
      *received += piece;
      s = in.Landed(landed);
    }
    (*conn)->Close();
  }
  sender.join();
  return s;
}

// A copy of `from` with byte `at` flipped.
std::string CorruptCopy(const std::string& from, const std::string& to, uint64_t at) {
  auto bytes = ReadFileToString(from);
  EXPECT_TRUE(bytes.ok());
  (*bytes)[at] = static_cast<char>((*bytes)[at] ^ 0x5a);
  std::ofstream(to, std::ios::binary) << *bytes;
  return to;
}

TEST(JoinFile, CheckpointFileSentWithBulkIsCheckedAndServedInPlace) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_GT(file->info.bytes, 20 * kPieceBytes);  // many pieces, many blocks
  auto source_digest = src->Latest(kTree)->Digest();
  EXPECT_EQ(file->info.digest, source_digest);

  auto dst = EmptyStore(dir.File("dst"));
  auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ((*in)->resume_offset(), 0u);
  uint64_t received = 0;
  ASSERT_TRUE(Transfer(file->fd.get(), 0, file->info.bytes, **in, &received).ok());
  EXPECT_EQ(received, file->info.bytes);
  auto v = (*in)->Finish();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->number(), file->info.version);
  EXPECT_EQ(v->Digest(), source_digest);
  EXPECT_EQ(dst->Latest(kTree)->Digest(), source_digest);
  // The received file is the tree's newest checkpoint, and nothing is left over.
  auto got = dst->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->info, file->info);
  EXPECT_EQ(FilesUnder(dst->dir() + "/partial"), 0u);
  EXPECT_EQ(FilesUnder(dst->dir() + "/tmp"), 0u);
  // Deltas after the checkpoint apply on top, and the install survives a reopen.
  ASSERT_TRUE(dst->CommitOps(kTree, {Op::PutAttribute({}, "after", "join")}).ok());
  auto after = dst->Latest(kTree)->Digest();
  dst.reset();
  auto reopened = EmptyStore(dir.File("dst"));
  EXPECT_EQ(reopened->Latest(kTree)->Digest(), after);
}

// One node record spanning many pieces (a root attribute of 200 KiB: a
// block of its own, 25 pieces of 8 KiB; and of 3 MiB, a block larger than
// the buffer blocks are read into to be checked): the installer waits for
// the whole block before it checks it, and a flipped byte inside it is
// still caught.
class JoinFileBigRecord : public ::testing::TestWithParam<size_t> {};

TEST_P(JoinFileBigRecord, BlockSpanningManyPiecesIsCheckedOnceWhole) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  ASSERT_TRUE(src->CommitOps(kTree, {Op::PutAttribute({}, "big", testing::RandomBytes(GetParam(), 7))}).ok());
  ASSERT_TRUE(src->Checkpoint(kTree).ok());
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const auto source_digest = src->Latest(kTree)->Digest();
  auto dst = EmptyStore(dir.File("dst"));
  {
    auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    uint64_t received = 0;
    ASSERT_TRUE(Transfer(file->fd.get(), 0, file->info.bytes, **in, &received).ok());
    auto v = (*in)->Finish();
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->Digest(), source_digest);
    EXPECT_EQ(v->root()->attribute("big"), src->Latest(kTree)->root()->attribute("big"));
  }
  // The record sits in the file's last blocks (post-order: the root last).
  // The newest file has the greatest name (zero-padded versions).
  std::string path;
  for (const auto& e : fs::directory_iterator(src->dir() + "/trees/t")) {
    if (e.path().extension() == ".snap" && e.path().string() > path) path = e.path().string();
  }
  ASSERT_FALSE(path.empty());
  auto other = EmptyStore(dir.File("other"));
  std::string bad = CorruptCopy(path, dir.File("bad"), file->info.bytes - (100 << 10));
  auto fd = OpenFile(bad, O_RDONLY);
  ASSERT_TRUE(fd.ok());
  auto in = other->BeginSnapshotFileInstall(kTree, file->info);
  ASSERT_TRUE(in.ok());
  uint64_t received = 0;
  Status s = Transfer(fd->get(), 0, file->info.bytes, **in, &received);
  if (s.ok()) s = (*in)->Finish().status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_FALSE(other->HasTree(kTree));
}

// 9 MiB: the installer starts write-back twice as the file lands (every 4 MiB).
INSTANTIATE_TEST_SUITE_P(JoinFile, JoinFileBigRecord,
                         ::testing::Values(size_t{200} << 10, size_t{3} << 20, size_t{9} << 20));

TEST(JoinFile, HugeAnnouncedSizeIsRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  auto dst = EmptyStore(dir.File("dst"), /*max_file_bytes=*/64 << 20);
  // Over the configured limit.
  auto r = dst->BeginSnapshotFileInstall(kTree, CheckpointFileInfo{5, uint64_t{1} << 50, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("over the limit of 67108864 bytes"), std::string::npos)
      << r.status().ToString();
  // Under the limit but over the free space of the file system.
  auto big = EmptyStore(dir.File("big"), UINT64_MAX);
  r = big->BeginSnapshotFileInstall(kTree, CheckpointFileInfo{5, uint64_t{1} << 62, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("bytes free in"), std::string::npos) << r.status().ToString();
  // Too short to be a checkpoint at all.
  r = dst->BeginSnapshotFileInstall(kTree, CheckpointFileInfo{5, 3, 1});
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  // Nothing was created: no partial file, no tree.
  EXPECT_FALSE(fs::exists(dst->dir() + "/partial/t"));
  EXPECT_FALSE(fs::exists(big->dir() + "/partial/t"));
  EXPECT_FALSE(dst->HasTree(kTree));
  EXPECT_EQ(FilesUnder(dst->dir() + "/tmp"), 0u);
}

TEST(JoinFile, CorruptBytesOnTheWireAreCaughtAndLeaveNoFile) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok());
  std::string path = src->dir() + "/trees/t/" + [&] {
    for (const auto& e : fs::directory_iterator(src->dir() + "/trees/t")) {
      if (e.path().extension() == ".snap") return e.path().filename().string();
    }
    return std::string();
  }();
  auto dst = EmptyStore(dir.File("dst"));
  const uint64_t n = file->info.bytes;
  for (uint64_t at : {uint64_t{0}, uint64_t{20}, n / 3, n / 2 + 7, n - 30, n - 1}) {
    SCOPED_TRACE("byte " + std::to_string(at));
    std::string bad = CorruptCopy(path, dir.File("bad-" + std::to_string(at)), at);
    auto fd = OpenFile(bad, O_RDONLY);
    ASSERT_TRUE(fd.ok());
    auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    uint64_t received = 0;
    Status s = Transfer(fd->get(), 0, n, **in, &received);
    if (s.ok()) s = (*in)->Finish().status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    in->reset();
    EXPECT_EQ(FilesUnder(dst->dir() + "/partial"), 0u) << "a half file stayed in place";
    EXPECT_EQ(FilesUnder(dst->dir() + "/tmp"), 0u);
    EXPECT_FALSE(dst->HasTree(kTree));
    EXPECT_FALSE(dst->PartialCheckpointFile(kTree).ok());
  }
  // A transfer that stops short is not installed either.
  auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
  ASSERT_TRUE(in.ok());
  ASSERT_TRUE((*in)->Landed(0).ok());
  auto v = (*in)->Finish();
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
  EXPECT_FALSE(dst->HasTree(kTree));
  // The wrong identity (digest) is caught once the file is complete.
  CheckpointFileInfo lie = file->info;
  lie.digest ^= 1;
  in = dst->BeginSnapshotFileInstall(kTree, lie);
  ASSERT_TRUE(in.ok());
  uint64_t received = 0;
  ASSERT_TRUE(Transfer(file->fd.get(), 0, n, **in, &received).ok());
  v = (*in)->Finish();
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
  EXPECT_FALSE(dst->HasTree(kTree));
  EXPECT_EQ(FilesUnder(dst->dir() + "/partial"), 0u);
}

TEST(JoinFile, InterruptedTransferResumesAfterItsCheckedBlocks) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok());
  const uint64_t n = file->info.bytes;
  auto dst = EmptyStore(dir.File("dst"));
  EXPECT_FALSE(dst->PartialCheckpointFile(kTree).ok());
  uint64_t first = 0;
  {
    auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
    ASSERT_TRUE(in.ok());
    // The connection goes away after 10 pieces (of at least 20).
    ASSERT_TRUE(Transfer(file->fd.get(), 0, n, **in, &first, 10).ok());
    ASSERT_EQ(first, 10 * kPieceBytes);
  }  // the installer goes unfinished
  EXPECT_FALSE(dst->HasTree(kTree));
  auto partial = dst->PartialCheckpointFile(kTree);
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  EXPECT_EQ(partial->info, file->info);
  // Whole checked blocks only: at most one block (4 KiB here) short of what landed.
  EXPECT_LE(partial->held, first);
  EXPECT_GT(partial->held, first - 8192);

  // It survives a restart of the store (a node restarted mid-join).
  dst.reset();
  dst = EmptyStore(dir.File("dst"));
  partial = dst->PartialCheckpointFile(kTree);
  ASSERT_TRUE(partial.ok());

  // A sender resuming at another offset than the one held is refused, and
  // the partial file dropped (the next offer starts afresh); send the first
  // part again to have one.
  auto wrong = dst->BeginSnapshotFileInstall(kTree, file->info, partial->held + 1);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_FALSE(dst->PartialCheckpointFile(kTree).ok());
  {
    auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
    ASSERT_TRUE(in.ok());
    ASSERT_TRUE(Transfer(file->fd.get(), 0, n, **in, &first, 10).ok());
  }
  partial = dst->PartialCheckpointFile(kTree);
  ASSERT_TRUE(partial.ok());

  auto in = dst->BeginSnapshotFileInstall(kTree, file->info, partial->held);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ((*in)->resume_offset(), partial->held);
  uint64_t second = 0;
  ASSERT_TRUE(Transfer(file->fd.get(), partial->held, n, **in, &second).ok());
  EXPECT_EQ(second, n - partial->held);  // nothing held was fetched again
  auto v = (*in)->Finish();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->Digest(), src->Latest(kTree)->Digest());
  EXPECT_FALSE(dst->PartialCheckpointFile(kTree).ok());
  EXPECT_EQ(FilesUnder(dst->dir() + "/partial"), 0u);
}

TEST(JoinFile, FileTornByACrashKeepsItsGoodBlocks) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok());
  const uint64_t n = file->info.bytes;
  auto dst = EmptyStore(dir.File("dst"));
  ASSERT_TRUE(fs::create_directories(dst->dir() + "/partial/t"));
  // What a killed joiner leaves: bytes that reached the file, the last block torn.
  char name[80];
  std::snprintf(name, sizeof name, "%llu-%llu-%016llx", static_cast<unsigned long long>(file->info.version),
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(file->info.digest));
  const std::string partial_path = dst->dir() + "/partial/t/" + name;
  std::string all(n, '\0');
  ASSERT_EQ(::pread(file->fd.get(), all.data(), n, 0), static_cast<ssize_t>(n));
  const uint64_t torn = n / 2 + 1234;
  std::ofstream(partial_path, std::ios::binary) << all.substr(0, torn);
  auto partial = dst->PartialCheckpointFile(kTree);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->held, torn);
  // Offered as held, refused (the torn block does not check out), cut back to the good blocks.
  auto r = dst->BeginSnapshotFileInstall(kTree, file->info, partial->held);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  partial = dst->PartialCheckpointFile(kTree);
  ASSERT_TRUE(partial.ok());
  EXPECT_LT(partial->held, torn);
  EXPECT_GT(partial->held, torn - 8192);
  // The next offer resumes there.
  auto in = dst->BeginSnapshotFileInstall(kTree, file->info, partial->held);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  uint64_t second = 0;
  ASSERT_TRUE(Transfer(file->fd.get(), partial->held, n, **in, &second).ok());
  EXPECT_EQ(second, n - partial->held);
  auto v = (*in)->Finish();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->Digest(), src->Latest(kTree)->Digest());
}

// A partial file of another checkpoint (the sender moved on) is dropped, not mixed in.
TEST(JoinFile, PartialFileOfAnotherCheckpointIsDropped) {
  TempDir dir;
  auto src = SourceStore(dir.File("src"));
  auto file = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(file.ok());
  auto dst = EmptyStore(dir.File("dst"));
  {
    auto in = dst->BeginSnapshotFileInstall(kTree, file->info);
    ASSERT_TRUE(in.ok());
    uint64_t got = 0;
    ASSERT_TRUE(Transfer(file->fd.get(), 0, file->info.bytes, **in, &got, 5).ok());
  }
  ASSERT_TRUE(dst->PartialCheckpointFile(kTree).ok());
  // The source commits and checkpoints again: a different file.
  ASSERT_TRUE(src->CommitOps(kTree, {Op::PutAttribute({}, "more", "data")}).ok());
  ASSERT_TRUE(src->Checkpoint(kTree).ok());
  auto newer = src->OpenNewestCheckpointFile(kTree);
  ASSERT_TRUE(newer.ok());
  ASSERT_NE(newer->info, file->info);
  auto in = dst->BeginSnapshotFileInstall(kTree, newer->info);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(FilesUnder(dst->dir() + "/partial"), 1u);  // only the new one
  uint64_t got = 0;
  ASSERT_TRUE(Transfer(newer->fd.get(), 0, newer->info.bytes, **in, &got).ok());
  auto v = (*in)->Finish();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->Digest(), src->Latest(kTree)->Digest());
}

}  // namespace
}  // namespace canopy::tree
