// Writes the seed corpus of every fuzz target (valid encodings, so that the
// fuzzers start from inputs that reach deep into each decoder):
//   make_corpus DIR      -> DIR/<target>/<name>
// fuzz/corpus/ in the repository was made with it; rerun it when a format
// changes. The selector byte some targets read first is prepended here.
#include <cstdio>
#include <string>
#include <vector>

#include "base/file.h"
#include "replication/protocol.h"
#include "tools/rcopy/protocol.h"
#include "tree/delta.h"
#include "tree/snapshot.h"
#include "tree/store.h"

namespace {

using namespace canopy;

void Write(const std::string& dir, const std::string& target, const std::string& name, const std::string& bytes) {
  std::string d = dir + "/" + target;
  if (!CreateDirs(d).ok() || !WriteFileAtomic(d + "/" + name, bytes).ok()) {
    std::fprintf(stderr, "make_corpus: cannot write %s/%s\n", d.c_str(), name.c_str());
    std::exit(1);
  }
}

std::string Selected(int selector, const std::string& payload) { return std::string(1, char(selector)) + payload; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  std::string out = argv[1];
  std::string store_dir = out + "/.store";
  (void)RemoveTree(store_dir);
  tree::StoreOptions options;
  options.fsync = tree::FsyncPolicy::kNone;
  auto store = tree::Store::Open(store_dir, options);
  if (!store.ok()) {
    std::fprintf(stderr, "make_corpus: %s\n", store.status().ToString().c_str());
    return 1;
  }
  if (!(*store)->CreateTree("docs").ok()) return 1;
  std::string wal;
  for (int i = 0; i < 4; ++i) {
    auto txn = (*store)->Begin("docs");
    if (!txn.ok()) return 1;
    auto child = txn->AppendChild({});
    if (!child.ok()) return 1;
    (void)txn->PutAttribute(*child, "title", "entry " + std::to_string(i));
    (void)txn->PutAttribute({}, "count", std::to_string(i));
    if (i == 3) (void)txn->DeleteChild({}, 0);
    auto committed = (*store)->Commit(std::move(*txn));
    if (!committed.ok()) return 1;
    Write(out, "delta", "commit" + std::to_string(i), committed->encoded_delta);
    wal += committed->encoded_delta;
  }
  Write(out, "wal", "four-records", wal);
  Write(out, "wal", "torn-tail", wal.substr(0, wal.size() - 3));
  auto latest = (*store)->Latest("docs");
  if (!latest.ok()) return 1;
  // fuzz_snapshot's first byte picks its mode (see snapshot_fuzz.cc): even,
  // a whole stream; odd, a NODES payload (after a node-count byte).
  std::string snapshot(1, '\0');
  for (const std::string& chunk : tree::EncodeSnapshotChunks(*latest, tree::kMinSnapshotChunkBytes)) snapshot += chunk;
  Write(out, "snapshot", "docs", snapshot);
  auto whole = tree::EncodeSnapshotChunks(*latest);  // HEAD, one NODES block, TAIL
  std::string nodes = "\x01";
  nodes += static_cast<char>(tree::CountNodes(latest->root()));
  nodes += whole[1].substr(tree::kChunkHeaderBytes, whole[1].size() - tree::kChunkOverheadBytes);
  Write(out, "snapshot", "docs-nodes", nodes);
  // A run of leaves with the same key and value length (the checker compares
  // those word by word), whole and cut into two NODES blocks (mode 3).
  std::vector<tree::NodePtr> leaves;
  for (int i = 0; i < 60; ++i) {
    leaves.push_back(tree::Node::Make(tree::Node::Attributes{{"id", "value" + std::to_string(100 + i)}}, {}));
  }
  tree::Version run("run", 1, tree::Node::Make(tree::Node::Attributes{}, std::move(leaves)));
  auto run_blocks = tree::EncodeSnapshotChunks(run);
  std::string run_payload =
      run_blocks[1].substr(tree::kChunkHeaderBytes, run_blocks[1].size() - tree::kChunkOverheadBytes);
  Write(out, "snapshot", "leaf-run", std::string("\x01\x3d", 2) + run_payload);
  Write(out, "snapshot", "leaf-run-cut", std::string("\x03\x3d\x80", 3) + run_payload);

  namespace r = replication;
  r::Hello hello{"cluster", "1", r::PeerRole::kNode, r::kProtocolVersion, std::string(r::kNonceBytes, 'n'),
                 "tcp://127.0.0.1:7001"};
  Write(out, "replication", "hello", Selected(0, r::Encode(hello)));
  r::Subscribe subscribe;
  subscribe.tree = "docs";
  subscribe.epoch = 2;
  subscribe.have_version = 3;
  subscribe.node_id = "2";
  Write(out, "replication", "subscribe", Selected(4, r::Encode(subscribe)));
  r::Ack ack{"docs", 2, 4};
  Write(out, "replication", "ack", Selected(9, r::Encode(ack)));
  r::CommitRequest commit;
  commit.tree = "docs";
  commit.edits.push_back(r::Edit{r::Edit::Kind::kPutAttribute, {0}, "k", "v", 0});
  commit.edits.push_back(r::Edit{r::Edit::Kind::kInsertChild, {}, "", "", 1});
  Write(out, "replication", "commit", Selected(12, r::Encode(commit)));

  rcopy::OpenRequest open;
  open.transfer_id = 42;
  open.name = "dir/file.bin";
  open.file_size = 1 << 20;
  open.range_length = 1 << 20;
  Write(out, "rcopy", "open", Selected(0, rcopy::EncodeOpen(open)));
  Write(out, "rcopy", "data", Selected(1, rcopy::EncodeData(rcopy::DataHeader{4096})));
  Write(out, "rcopy", "commit", Selected(2, rcopy::EncodeCommit(rcopy::CommitRequest{1 << 20})));
  Write(out, "rcopy", "result",
        Selected(3, rcopy::EncodeResult(rcopy::ResultMessage::FromStatus(Status::ResourceExhausted("disk full")))));
  Write(out, "rcopy", "query",
        Selected(4, rcopy::EncodeQuery(rcopy::QueryRequest{"dir/file.bin", rcopy::ChecksumAlgorithm::kXxh3, 1 << 20})));
  rcopy::ResumeInfo info;
  info.base = rcopy::ResumeBase::kPartial;
  info.size = 1 << 19;
  info.checksum = rcopy::ChecksumAlgorithm::kXxh3;
  info.digest = 0x0123456789abcdefull;
  info.base_id = 77;
  Write(out, "rcopy", "resume_info", Selected(5, rcopy::EncodeResumeInfo(info)));
  store->reset();
  (void)RemoveTree(store_dir);
  std::printf("make_corpus: wrote seeds under %s\n", out.c_str());
  return 0;
}
