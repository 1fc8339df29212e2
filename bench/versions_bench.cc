// versions_bench: memory of retained past versions (StoreOptions::retention).
//
// Builds a tree of FANOUT x FANOUT2 nodes below a root through ordinary
// commits (one commit per top-level child and its leaves; every node but the
// root carries an 8-byte attribute "id"), then makes EDITS
// commits that each change one node (an 8-byte attribute on a random leaf)
// with the store retaining the newest KEEP versions, and reports the growth
// of the process's RSS over the whole run. Run it twice, with --keep 1 (the
// latest version alone) and --keep EDITS, in separate processes (memory
// freed by one run would otherwise be reused by the other) and compare:
// bench/scenarios/versions_memory.sh does.
//
//   versions_bench --dir /dev/shm --fanout 1000 --fanout2 1000 --edits 10000 --keep 10000 --json
//
// The store's WAL lives in --dir (tmpfs pages are not in the RSS); no
// checkpoints are written. After the edits the oldest retained version is
// read back and checked, so the figure is for versions that really are held.
#include <fcntl.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "base/file.h"
#include "bench/bench_util.h"
#include "tree/store.h"

namespace po = boost::program_options;
using namespace canopy;
using namespace canopy::tree;
using Seconds = std::chrono::duration<double>;

namespace {

[[noreturn]] void Die(const std::string& what, const Status& s) { bench::Die("versions_bench", what, s); }
using bench::RssBytes;

std::string EditValue(uint64_t edit) {
  std::string v = std::to_string(edit);
  return std::string(8 - std::min<size_t>(8, v.size()), '0') + v;  // 8 bytes
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  uint64_t fanout, fanout2, edits, keep;
  po::options_description desc("versions_bench options");
  desc.add_options()("help,h", "show this help")(
      "dir", po::value(&dir)->default_value("/dev/shm"), "directory for the store (its WAL)")(
      "fanout", po::value(&fanout)->default_value(1000), "children of the root")(
      "fanout2", po::value(&fanout2)->default_value(1000), "children of each of the root's children")(
      "edits", po::value(&edits)->default_value(10000), "commits after the build, each changing one leaf")(
      "keep", po::value(&keep)->default_value(10000), "retention.keep_versions (1: the latest version alone)")(
      "seed", po::value<uint64_t>()->default_value(1), "which leaves the edits change")(
      "json", "print one JSON object instead of text");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "versions_bench: %s\ntry --help\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (!PathExists(dir)) {
    std::fprintf(stderr, "versions_bench: --dir %s does not exist\n", dir.c_str());
    return 2;
  }
  if (fanout == 0 || fanout2 == 0 || keep == 0 || fanout > 100000 || fanout2 > 100000 || edits > 100000000) {
    std::fprintf(stderr, "versions_bench: --fanout, --fanout2 (1..100000) and --keep (>= 1) out of range\n");
    return 2;
  }
  std::string store_dir = JoinPath(dir, "versions_bench." + std::to_string(::getpid()));
  (void)RemoveTree(store_dir);

  StoreOptions o;
  o.fsync = FsyncPolicy::kNone;
  o.checkpoint_every_commits = 0;
  o.retention.keep_versions = keep;
  nlohmann::json out;
  {
    auto opened = Store::Open(store_dir, o);
    if (!opened.ok()) Die("open " + store_dir, opened.status());
    Store& store = **opened;
    if (Status s = store.CreateTree("bench"); !s.ok()) Die("create tree", s);
    const uint64_t rss_before = RssBytes();

    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < fanout; ++i) {
      Transaction txn = *store.Begin("bench");
      auto child = txn.AppendChild({});
      if (!child.ok()) Die("build", child.status());
      if (Status s = txn.PutAttribute(*child, "id", EditValue(i)); !s.ok()) Die("build", s);
      for (uint64_t j = 0; j < fanout2; ++j) {
        // Every node carries its own 8-byte attribute, so no two leaves are one shared empty node.
        auto leaf = txn.AppendChild(*child);
        if (!leaf.ok()) Die("build", leaf.status());
        if (Status s = txn.PutAttribute(*leaf, "id", EditValue(j)); !s.ok()) Die("build", s);
      }
      if (auto r = store.Commit(std::move(txn)); !r.ok()) Die("build commit", r.status());
    }
    const double build_s = Seconds(std::chrono::steady_clock::now() - t0).count();
    const uint64_t rss_built = RssBytes();

    std::mt19937_64 rng(vm["seed"].as<uint64_t>());
    t0 = std::chrono::steady_clock::now();
    for (uint64_t e = 0; e < edits; ++e) {
      Transaction txn = *store.Begin("bench");
      NodePath leaf{rng() % fanout, rng() % fanout2};
      if (Status s = txn.PutAttribute(leaf, "v", EditValue(e)); !s.ok()) Die("edit", s);
      if (auto r = store.Commit(std::move(txn)); !r.ok()) Die("edit commit", r.status());
    }
    const double edit_s = Seconds(std::chrono::steady_clock::now() - t0).count();
    const uint64_t rss_edited = RssBytes();

    // The window really holds what it claims: the oldest retained version
    // lacks the edits made after it.
    auto window = store.Retained("bench");
    if (!window.ok()) Die("retained", window.status());
    auto oldest = store.At("bench", window->oldest);
    if (!oldest.ok()) Die("read the oldest retained version", oldest.status());
    auto newest = store.Latest("bench");
    if (!newest.ok()) Die("latest", newest.status());
    if (window->oldest < newest->number()) {
      // Replay the edit sequence to find the last edit's leaf: it must differ.
      std::mt19937_64 replay(vm["seed"].as<uint64_t>());
      NodePath last;
      for (uint64_t e = 0; e < edits; ++e) last = {replay() % fanout, replay() % fanout2};
      auto then = oldest->Find(last);
      auto now = newest->Find(last);
      if (!then.ok() || !now.ok()) Die("find", then.ok() ? now.status() : then.status());
      auto v_now = (*now)->attribute("v");
      auto v_then = (*then)->attribute("v");
      if (!v_now || *v_now != EditValue(edits - 1) || (v_then && *v_then == *v_now)) {
        Die("check", Status::Internal("the oldest retained version shows the newest edit"));
      }
    }
    const uint64_t nodes = 1 + fanout + fanout * fanout2;
    out = {{"shape", std::to_string(fanout) + " x " + std::to_string(fanout2)},
           {"fanout", fanout},
           {"fanout2", fanout2},
           {"nodes", nodes},
           {"edits", edits},
           {"keep_versions", keep},
           {"retained_oldest", window->oldest},
           {"retained_newest", window->newest},
           {"retained_count", window->newest - window->oldest + 1},
           {"rss_before_bytes", rss_before},
           {"rss_built_bytes", rss_built},
           {"rss_edited_bytes", rss_edited},
           {"rss_growth_bytes", rss_edited - rss_before},
           {"build_s", build_s},
           {"edit_s", edit_s},
           {"edits_per_s", edit_s > 0 ? static_cast<double>(edits) / edit_s : 0.0}};
  }
  (void)RemoveTree(store_dir);
  if (vm.count("json")) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("tree %s (%llu nodes), %llu one-leaf edits, keep %llu versions (held %llu..%llu): RSS +%.1f MiB "
              "(+%.1f MiB after the build), %.0f edits/s\n",
              out["shape"].get<std::string>().c_str(), static_cast<unsigned long long>(out["nodes"].get<uint64_t>()),
              static_cast<unsigned long long>(edits), static_cast<unsigned long long>(keep),
              static_cast<unsigned long long>(out["retained_oldest"].get<uint64_t>()),
              static_cast<unsigned long long>(out["retained_newest"].get<uint64_t>()),
              static_cast<double>(out["rss_growth_bytes"].get<uint64_t>()) / (1 << 20),
              static_cast<double>(out["rss_built_bytes"].get<uint64_t>() - out["rss_before_bytes"].get<uint64_t>()) /
                  (1 << 20),
              out["edits_per_s"].get<double>());
  return 0;
}
