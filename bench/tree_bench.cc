// tree_bench: commit throughput per fsync policy, snapshot (block format)
// throughput next to memcpy of the same bytes, and memory per node.
// Snapshot figures: "send" (the checkpoint file's bytes into a send buffer:
// what a source sends), "usable" (received bytes checked and opened in
// place until the first read is served), and, for information, encode from
// memory (a checkpoint write), re-encode of an opened tree and decoding
// every node of an opened tree.
//
//   tree_bench --dir /dev/shm --seconds 2 --json
//   tree_bench --codec-only --snapshot-nodes 20000 --memory-nodes 20000 --json
//     (only the memory figure and the two codec-vs-memcpy measurements: no
//      install, no commit runs; what bench/scenarios/codec_memcpy.sh runs)
//
// Each figure is measured in this run on this machine; compare the snapshot
// GB/s with the memcpy GB/s printed beside it, not with other machines.
#include <fcntl.h>
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/file.h"
#include "bench/bench_util.h"
#include "tree/snapshot.h"
#include "tree/store.h"

namespace po = boost::program_options;
using namespace canopy;
using namespace canopy::tree;
using Seconds = std::chrono::duration<double>;

namespace {

[[noreturn]] void Die(const std::string& what, const Status& s) { bench::Die("tree_bench", what, s); }
using bench::RssBytes;

nlohmann::json CommitRun(const std::string& base_dir, FsyncPolicy policy, int threads, double seconds,
                         size_t payload) {
  std::string dir = JoinPath(base_dir, "tree_bench." + std::to_string(::getpid()) + "." +
                                           FsyncPolicyName(policy) + "." + std::to_string(threads));
  (void)RemoveTree(dir);
  StoreOptions o;
  o.fsync = policy;
  o.checkpoint_every_commits = 0;
  uint64_t commits = 0, conflicts = 0;
  double elapsed = 0;
  {
    auto store_r = Store::Open(dir, o);
    if (!store_r.ok()) Die("open " + dir, store_r.status());
    Store& store = **store_r;
    if (Status s = store.CreateTree("bench"); !s.ok()) Die("create tree", s);
    {  // 32 x 32 leaves to spread the edits over (each commit copies a root-to-leaf path)
      Transaction txn = *store.Begin("bench");
      for (int i = 0; i < 32; ++i) {
        NodePath c = *txn.AppendChild({});
        for (int j = 0; j < 32; ++j) (void)txn.AppendChild(c);
      }
      if (auto r = store.Commit(std::move(txn)); !r.ok()) Die("commit", r.status());
    }
    std::string value(payload, 'v');
    std::atomic<uint64_t> total{0}, total_conflicts{0};
    auto start = std::chrono::steady_clock::now();
    auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(Seconds(seconds));
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        uint64_t i = static_cast<uint64_t>(t);
        while (std::chrono::steady_clock::now() < end) {
          Transaction txn = *store.Begin("bench");
          (void)txn.PutAttribute({i % 32, (i / 32) % 32}, "k", value);
          auto r = store.Commit(std::move(txn));
          if (r.ok()) {
            ++total;
            i += static_cast<uint64_t>(threads);
          } else if (r.status().IsConflict()) {
            ++total_conflicts;
          } else {
            Die("commit", r.status());
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    elapsed = Seconds(std::chrono::steady_clock::now() - start).count();
    commits = total;
    conflicts = total_conflicts;
  }
  (void)RemoveTree(dir);
  return {{"policy", FsyncPolicyName(policy)},
          {"threads", threads},
          {"commits", commits},
          {"conflicts_retried", conflicts},
          {"seconds", elapsed},
          {"commits_per_s", static_cast<double>(commits) / elapsed},
          {"payload_bytes", payload}};
}

// Thread CPU time in seconds: the codec runs on one thread, and on a shared
// machine CPU time is far steadier than wall time (wall time counts the
// slices other processes get).
double ThreadCpuSeconds() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

struct CodecFigures {
  uint64_t bytes = 0, chunks = 0, nodes = 0;
  double encode_s = 0;     // SnapshotWriter over the tree as built in memory (a checkpoint write)
  double send_s = 0;       // the stream of a tree opened from its checkpoint file: its blocks, copied out
  double usable_s = 0;     // received bytes -> the first read served (CRCs, structure, digest, lazy root)
  double touch_all_s = 0;  // then decoding every node (a full walk of the opened tree)
  double reencode_s = 0;   // SnapshotWriter over an opened, untouched tree (copies the image)
  double memcpy_s = 0;         // the same bytes in one copy, into one pre-faulted buffer
  double memcpy_pieces_s = 0;  // the same bytes copied chunk_bytes at a time into one reused, pre-faulted buffer
};

// Room beyond chunk_bytes that a block may take (header, CRC): the send
// buffer and the memcpy-in-pieces buffer are made this much bigger.
constexpr size_t kChunkSlack = 4096;

CodecFigures MeasureCodec(const Version& v, size_t chunk_bytes, const std::string& dir) {
  CodecFigures f;
  f.nodes = CountNodes(v.root());
  // Encode from the in-memory tree (blocks discarded as produced: the streaming case).
  double t0 = ThreadCpuSeconds();
  {
    SnapshotWriter w(v, chunk_bytes);
    std::string c;
    while (w.NextInto(&c)) {  // one buffer, handed back each time (as a sender that is done with it)
      f.bytes += c.size();
      ++f.chunks;
    }
    if (!w.status().ok()) Die("encode", w.status());
  }
  f.encode_s = ThreadCpuSeconds() - t0;
  std::string image;
  image.reserve(f.bytes);
  for (const auto& c : EncodeSnapshotChunks(v, chunk_bytes)) image += c;

  // What a source sends is its checkpoint: the tree it serves was opened
  // in place from that file (at start-up, or when it wrote it), and the
  // stream is the file's blocks. Producing the bytes to send is copying
  // them into the send buffer (one buffer, handed back each time).
  std::string path = JoinPath(dir, "tree_bench." + std::to_string(::getpid()) + ".codec.snap");
  if (Status s = WriteFileAtomic(path, image); !s.ok()) Die("write checkpoint", s);
  {
    auto source = OpenSnapshotFile(path);
    if (!source.ok()) Die("open checkpoint", source.status());
    // Untimed, first: the stream is the checkpoint's bytes. This pass is
    // also the first touch of the file's mapping: OpenSnapshotFile checks
    // the file by pread and leaves the mapping untouched, so a tree's pages
    // are first touched when read (on this kind of VM ~1.7 GB/s the first
    // time, page faults), a cost neither the codec's nor memcpy's peer
    // below has; a server that has served its tree has paid it.
    std::string sent;
    for (const auto& c : EncodeSnapshotChunks(*source, chunk_bytes)) sent += c;
    if (sent != image) Die("send", Status::Internal("sent bytes differ from the checkpoint"));
    {
      SnapshotWriter w(*source, chunk_bytes);
      // The send buffer's pages are faulted in before the clock starts, as
      // memcpy's destinations are below: a sender reuses its buffer, and the
      // first touch of fresh pages (on this kind of VM ~10 us each, more than
      // copying them) is not the codec's cost.
      std::string c(chunk_bytes + kChunkSlack, '\1');
      uint64_t bytes = 0;
      t0 = ThreadCpuSeconds();
      while (w.NextInto(&c)) bytes += c.size();  // the transport would take c here
      f.send_s = ThreadCpuSeconds() - t0;
      if (bytes != image.size()) Die("send", Status::Internal("sent bytes differ from the checkpoint"));
    }
  }
  ::unlink(path.c_str());

  // Received bytes (one buffer, as they landed) made usable: every block
  // CRC, every record and child reference, the digest; then the first read.
  Version opened;  // destroyed after the clocks stop
  {
    std::string received = image;
    t0 = ThreadCpuSeconds();
    auto back = OpenSnapshotImage(std::move(received));
    if (!back.ok()) Die("open", back.status());
    volatile size_t first_read = back->root()->attribute_count() + back->root()->child_count();
    (void)first_read;
    f.usable_s = ThreadCpuSeconds() - t0;
    opened = std::move(*back);
  }
  {
    auto fresh = OpenSnapshotImage(image);
    if (!fresh.ok()) Die("open", fresh.status());
    t0 = ThreadCpuSeconds();
    SnapshotWriter w(*fresh, chunk_bytes);
    std::string c;
    uint64_t bytes = 0;
    while (w.NextInto(&c)) bytes += c.size();
    f.reencode_s = ThreadCpuSeconds() - t0;
    if (!w.status().ok() || bytes != f.bytes) Die("re-encode", Status::Internal("re-encoded stream differs"));
  }
  t0 = ThreadCpuSeconds();
  uint64_t walked = CountNodes(opened.root());
  f.touch_all_s = ThreadCpuSeconds() - t0;
  if (walked != f.nodes || opened.Digest() != v.Digest()) Die("open", Status::Internal("opened tree differs"));
  // memcpy of the same bytes into a pre-faulted buffer.
  std::string dst(f.bytes, '\0');
  std::memset(dst.data(), 1, dst.size());
  t0 = ThreadCpuSeconds();
  std::memcpy(dst.data(), image.data(), image.size());
  f.memcpy_s = ThreadCpuSeconds() - t0;
  if (dst[dst.size() / 2] == 0x7f && dst[0] == 0x7f) std::puts("");  // keep the copy observable
  // memcpy of the same bytes in the pieces a sender copies them in (what
  // "send" does, minus the codec): chunk_bytes at a time into one reused,
  // pre-faulted buffer. The peer of "send".
  std::string piece(chunk_bytes + kChunkSlack, '\1');
  t0 = ThreadCpuSeconds();
  for (size_t off = 0; off < image.size(); off += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, image.size() - off);
    std::memcpy(piece.data(), image.data() + off, n);
    asm volatile("" : : "r"(piece.data()) : "memory");  // each piece is "sent": the copy stays
  }
  f.memcpy_pieces_s = ThreadCpuSeconds() - t0;
  return f;
}

nlohmann::json CodecJson(const CodecFigures& f) {
  auto gbps = [&](double s) { return static_cast<double>(f.bytes) / s / 1e9; };
  return {{"bytes", f.bytes},
          {"chunks", f.chunks},
          {"timing", "thread CPU time"},
          {"nodes", f.nodes},
          {"send_gbps", gbps(f.send_s)},
          {"usable_gbps", gbps(f.usable_s)},
          {"encode_gbps", gbps(f.encode_s)},
          {"reencode_gbps", gbps(f.reencode_s)},
          {"touch_all_gbps", gbps(f.touch_all_s)},
          {"memcpy_gbps", gbps(f.memcpy_s)},
          {"memcpy_pieces_gbps", gbps(f.memcpy_pieces_s)},
          {"encode_mnodes_per_s", static_cast<double>(f.nodes) / f.encode_s / 1e6},
          {"touch_all_mnodes_per_s", static_cast<double>(f.nodes) / f.touch_all_s / 1e6}};
}

// Bulk install of a snapshot into a store on `base_dir` (chunks from memory,
// as a replica receives them), next to writing the same bytes to one file
// with 1 MiB writes and a single fsync (what `dd bs=1M conv=fsync` does).
nlohmann::json InstallRun(const std::string& base_dir, const Version& v, size_t chunk_bytes) {
  std::vector<std::string> chunks = EncodeSnapshotChunks(v, chunk_bytes);
  uint64_t bytes = 0;
  for (const auto& c : chunks) bytes += c.size();
  std::string dir = JoinPath(base_dir, "tree_bench." + std::to_string(::getpid()) + ".install");
  (void)RemoveTree(dir);
  double install_s = 0, raw_s = 0;
  {
    auto store = Store::Open(dir, StoreOptions{});
    if (!store.ok()) Die("open " + dir, store.status());
    auto t0 = std::chrono::steady_clock::now();
    auto inst = (*store)->BeginSnapshotInstall("bench");
    if (!inst.ok()) Die("install", inst.status());
    for (const auto& c : chunks) {
      if (Status s = (*inst)->AddChunk(c); !s.ok()) Die("install", s);
    }
    auto done = (*inst)->Finish();
    if (!done.ok()) Die("install", done.status());
    install_s = Seconds(std::chrono::steady_clock::now() - t0).count();
  }
  {
    std::string path = JoinPath(dir, "raw-write");
    auto t0 = std::chrono::steady_clock::now();
    auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!fd.ok()) Die("open " + path, fd.status());
    for (const auto& c : chunks) {
      if (Status s = WriteAll(fd->get(), c.data(), c.size(), path); !s.ok()) Die("write", s);
    }
    if (Status s = FsyncFd(fd->get(), path); !s.ok()) Die("fsync", s);
    raw_s = Seconds(std::chrono::steady_clock::now() - t0).count();
  }
  (void)RemoveTree(dir);
  return {{"bytes", bytes},
          {"install_gbps", static_cast<double>(bytes) / install_s / 1e9},
          {"raw_write_fsync_gbps", static_cast<double>(bytes) / raw_s / 1e9}};
}

// A tree of `fanout` children each with `fanout2` children; every node
// except the root carries one attribute "id" of `value_bytes`. Built bottom-up
// from nodes (as a snapshot install builds it), so that nothing but the tree
// itself is allocated while memory is measured.
Version BuildTree(uint64_t fanout, uint64_t fanout2, size_t value_bytes) {
  std::string value(value_bytes, 'x');
  std::vector<NodePtr> children;
  children.reserve(fanout);
  for (uint64_t i = 0; i < fanout; ++i) {
    std::vector<NodePtr> leaves;
    leaves.reserve(fanout2);
    for (uint64_t j = 0; j < fanout2; ++j) {
      leaves.push_back(Node::Make(Node::Attributes{{"id", value}}, std::vector<NodePtr>{}));
    }
    children.push_back(Node::Make(Node::Attributes{{"id", value}}, std::move(leaves)));
  }
  return Version("bench", 1, Node::Make(Node::Attributes{}, std::move(children)));
}

// p50 of a sample of microsecond latencies.
double P50(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return us.empty() ? 0 : us[us.size() / 2];
}

// Commit latency against the size of the node a commit touches: a store
// (fsync none, on `base_dir`) holds a tree whose node /0 has `n` children and
// `n` attributes; each timed commit is one op on /0 (insert a child at 0,
// append a child, delete child 0, put an existing attribute; every child is a
// distinct node with an attribute of its own), through
// Store::Commit, so WAL encoding and publication are included.
nlohmann::json CommitScalingRun(const std::string& base_dir, uint64_t n, int commits) {
  std::string dir = JoinPath(base_dir, "tree_bench." + std::to_string(::getpid()) + ".scaling");
  (void)RemoveTree(dir);
  StoreOptions o;
  o.fsync = FsyncPolicy::kNone;
  o.checkpoint_every_commits = 0;
  nlohmann::json out = {{"children", n}, {"attributes", n}, {"commits_per_op", commits}};
  {
    auto store_r = Store::Open(dir, o);
    if (!store_r.ok()) Die("open " + dir, store_r.status());
    Store& store = **store_r;
    if (Status s = store.CreateTree("scaling"); !s.ok()) Die("create tree", s);
    // Build /0 with n children and n attributes in batches of commits (a
    // realistic history, and it keeps each WAL record small).
    {
      Transaction txn = *store.Begin("scaling");
      (void)txn.AppendChild({});
      if (auto r = store.Commit(std::move(txn)); !r.ok()) Die("commit", r.status());
    }
    char key[32];
    for (uint64_t done = 0; done < n;) {
      Transaction txn = *store.Begin("scaling");
      uint64_t batch = std::min<uint64_t>(n - done, 50000);
      for (uint64_t i = 0; i < batch; ++i) {
        // Every child is a node of its own (one attribute), as a board's posts are.
        std::snprintf(key, sizeof key, "k%09llu", static_cast<unsigned long long>(done + i));
        NodePath child = *txn.AppendChild({0});
        (void)txn.PutAttribute(child, "id", key);
        (void)txn.PutAttribute({0}, key, "v");
      }
      done += batch;
      if (auto r = store.Commit(std::move(txn)); !r.ok()) Die("commit", r.status());
    }
    auto timed = [&](const char* name, auto&& edit) {
      std::vector<double> us;
      us.reserve(static_cast<size_t>(commits));
      for (int i = 0; i < commits; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        Transaction txn = *store.Begin("scaling");
        if (Status s = edit(txn, i); !s.ok()) Die(name, s);
        if (auto r = store.Commit(std::move(txn)); !r.ok()) Die(name, r.status());
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      out[std::string(name) + "_p50_us"] = P50(us);
    };
    timed("insert_at_0", [](Transaction& t, int) { return t.InsertChild({0}, 0); });
    timed("append", [](Transaction& t, int) { return t.AppendChild({0}).status(); });
    timed("delete_at_0", [](Transaction& t, int) { return t.DeleteChild({0}, 0); });
    timed("put_attribute", [&](Transaction& t, int i) {
      std::snprintf(key, sizeof key, "k%09llu", static_cast<unsigned long long>((uint64_t(i) * 7919) % n));
      return t.PutAttribute({0}, key, "w" + std::to_string(i));
    });
  }
  (void)RemoveTree(dir);
  return out;
}

// Memory per node of a tree without attributes, built as a replica builds
// it: by applying a delta of AppendChild ops (`fanout` children of the root,
// each with `fanout2` children). The ops exist before the first RSS reading
// and until after the second, so only the tree is measured. The tree is left
// in *keep so that what is measured next starts from a heap with no freed
// memory to reuse.
nlohmann::json MemoryNoAttributes(uint64_t fanout, uint64_t fanout2, Version* keep) {
  std::vector<Op> ops;
  ops.reserve(fanout * (fanout2 + 1));
  for (uint64_t i = 0; i < fanout; ++i) {
    ops.push_back(Op::AppendChild({}));
    for (uint64_t j = 0; j < fanout2; ++j) ops.push_back(Op::AppendChild({i}));
  }
  ::malloc_trim(0);
  uint64_t before = RssBytes();
  auto root = ApplyOps(Node::Empty(), ops);
  if (!root.ok()) Die("apply", root.status());
  uint64_t after = RssBytes();
  Version v("bench", 1, *root);
  uint64_t nodes = CountNodes(v.root());
  *keep = v;
  return {{"nodes", nodes},
          {"shape", std::to_string(fanout) + " x " + std::to_string(fanout2)},
          {"rss_delta_bytes", after - before},
          {"bytes_per_node", static_cast<double>(after - before) / static_cast<double>(nodes)}};
}

// The same tree as a plain mutable pointer tree (no versions, no sharing):
// the peer for the memory figure.
nlohmann::json MemoryPlainTree(uint64_t fanout, uint64_t fanout2) {
  struct PlainNode {
    std::vector<std::pair<std::string, std::string>> attributes;
    std::vector<std::unique_ptr<PlainNode>> children;
  };
  ::malloc_trim(0);
  uint64_t before = RssBytes();
  auto root = std::make_unique<PlainNode>();
  for (uint64_t i = 0; i < fanout; ++i) {
    root->children.push_back(std::make_unique<PlainNode>());
    for (uint64_t j = 0; j < fanout2; ++j) root->children.back()->children.push_back(std::make_unique<PlainNode>());
  }
  uint64_t after = RssBytes();
  uint64_t nodes = 1 + fanout + fanout * fanout2;
  static std::unique_ptr<PlainNode> keep;  // kept to the end, as the canopy tree is
  keep = std::move(root);
  return {{"nodes", nodes},
          {"rss_delta_bytes", after - before},
          {"bytes_per_node", static_cast<double>(after - before) / static_cast<double>(nodes)}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double seconds;
  size_t payload, value_bytes, chunk_bytes;
  uint64_t memory_nodes, snapshot_nodes;
  po::options_description desc("tree_bench options");
  desc.add_options()("help,h", "show this help")("dir", po::value(&dir)->default_value("/dev/shm"),
                                                 "directory for the commit benchmark's store")(
      "seconds", po::value(&seconds)->default_value(2.0), "duration of each commit run")(
      "payload", po::value(&payload)->default_value(100), "attribute bytes per commit")(
      "memory-nodes", po::value(&memory_nodes)->default_value(1000000), "nodes in the memory-per-node tree")(
      "snapshot-nodes", po::value(&snapshot_nodes)->default_value(200000), "nodes in the snapshot tree")(
      "value-bytes", po::value(&value_bytes)->default_value(1024), "attribute bytes per snapshot-tree node")(
      "chunk-bytes", po::value(&chunk_bytes)->default_value(kDefaultSnapshotChunkBytes),
      "snapshot chunk size")("codec-only", "measure memory and the snapshot codec only (no install, no commits)")(
      "json", "print one JSON object instead of text")(
      "commit-scaling", "measure commit latency against node size, and memory per node without attributes, only")(
      "scaling-sizes", po::value<std::string>()->default_value("100,10000,1000000"),
      "children (and attributes) of the touched node, comma-separated, with --commit-scaling")(
      "scaling-commits", po::value<int>()->default_value(200), "timed commits per op and size, with --commit-scaling");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tree_bench: %s\n%s", e.what(), "try --help\n");
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (!PathExists(dir)) {
    std::fprintf(stderr, "tree_bench: --dir %s does not exist\n", dir.c_str());
    return 2;
  }
  if (seconds <= 0 || memory_nodes < 2 || snapshot_nodes < 2) {
    std::fprintf(stderr, "tree_bench: --seconds, --memory-nodes and --snapshot-nodes must be positive\n");
    return 2;
  }
  const bool codec_only = vm.count("codec-only") > 0;
  nlohmann::json out;
  out["dir"] = dir;

  if (vm.count("commit-scaling")) {
    const int commits = vm["scaling-commits"].as<int>();
    if (commits < 1) {
      std::fprintf(stderr, "tree_bench: --scaling-commits must be positive\n");
      return 2;
    }
    std::vector<uint64_t> sizes;
    std::string list = vm["scaling-sizes"].as<std::string>();
    for (size_t pos = 0; pos <= list.size();) {
      size_t comma = list.find(',', pos);
      if (comma == std::string::npos) comma = list.size();
      try {
        sizes.push_back(std::stoull(list.substr(pos, comma - pos)));
      } catch (const std::exception&) {
        std::fprintf(stderr, "tree_bench: --scaling-sizes: '%s' is not a list of numbers\n", list.c_str());
        return 2;
      }
      if (sizes.back() < 1) {
        std::fprintf(stderr, "tree_bench: --scaling-sizes: sizes must be positive\n");
        return 2;
      }
      pos = comma + 1;
    }
    uint64_t fan2 = memory_nodes / 1000 > 0 ? memory_nodes / 1000 - 1 : 1;
    Version kept;
    out["memory_no_attributes"] = MemoryNoAttributes(1000, fan2, &kept);
    out["memory_plain_tree"] = MemoryPlainTree(1000, fan2);
    out["scaling"] = nlohmann::json::array();
    for (uint64_t n : sizes) out["scaling"].push_back(CommitScalingRun(dir, n, commits));
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  // Memory per node: RSS growth while building a tree of memory_nodes nodes
  // (8-byte attribute each), divided by the node count.
  {
    uint64_t fan = 1000, fan2 = (memory_nodes - 1) / 1001;
    uint64_t before = RssBytes();
    Version v = BuildTree(fan, fan2 > 0 ? fan2 : 1, 8);
    uint64_t after = RssBytes();
    uint64_t nodes = CountNodes(v.root());
    out["memory"] = {{"nodes", nodes},
                     {"attribute_bytes", 8},
                     {"rss_delta_bytes", after - before},
                     {"bytes_per_node", static_cast<double>(after - before) / static_cast<double>(nodes)}};
    out["snapshot_small_nodes"] = CodecJson(MeasureCodec(v, chunk_bytes, dir));
  }
  {
    uint64_t fan = 100, fan2 = (snapshot_nodes - 1) / 101;
    Version v = BuildTree(fan, fan2 > 0 ? fan2 : 1, value_bytes);
    out["snapshot"] = CodecJson(MeasureCodec(v, chunk_bytes, dir));
    out["snapshot"]["value_bytes"] = value_bytes;
    if (!codec_only) out["install"] = InstallRun(dir, v, chunk_bytes);
  }
  nlohmann::json commits = nlohmann::json::array();
  if (!codec_only) {
    for (FsyncPolicy p : {FsyncPolicy::kAlways, FsyncPolicy::kBatch, FsyncPolicy::kNone}) {
      for (int threads : {1, 4}) commits.push_back(CommitRun(dir, p, threads, seconds, payload));
    }
  }
  out["commit"] = commits;

  if (vm.count("json")) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("memory: %.1f bytes/node (%llu nodes, RSS +%.1f MiB)\n",
              out["memory"]["bytes_per_node"].get<double>(),
              static_cast<unsigned long long>(out["memory"]["nodes"].get<uint64_t>()),
              out["memory"]["rss_delta_bytes"].get<double>() / (1 << 20));
  for (const char* k : {"snapshot", "snapshot_small_nodes"}) {
    const auto& s = out[k];
    std::printf("%s: %.0f MB, send %.2f GB/s (memcpy in the same pieces %.2f), usable %.2f GB/s, memcpy %.2f GB/s"
                " (encode %.2f, re-encode %.2f, decode every node %.2f GB/s)\n", k,
                s["bytes"].get<double>() / 1e6, s["send_gbps"].get<double>(), s["memcpy_pieces_gbps"].get<double>(),
                s["usable_gbps"].get<double>(), s["memcpy_gbps"].get<double>(), s["encode_gbps"].get<double>(), s["reencode_gbps"].get<double>(),
                s["touch_all_gbps"].get<double>());
  }
  if (out.contains("install")) {
    std::printf("install: %.2f GB/s, raw write + one fsync %.2f GB/s\n",
                out["install"]["install_gbps"].get<double>(),
                out["install"]["raw_write_fsync_gbps"].get<double>());
  }
  for (const auto& c : commits) {
    std::printf("commit fsync=%-6s threads=%d: %.0f commits/s\n", c["policy"].get<std::string>().c_str(),
                c["threads"].get<int>(), c["commits_per_s"].get<double>());
  }
  return 0;
}
