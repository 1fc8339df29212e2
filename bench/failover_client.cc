// failover_client: an independent client for bench/scenarios/failover.sh.
// It commits one small attribute at a time at a consistency level (QUORUM by
// default) to a canopy cluster, for at most --seconds and --max-commits, and
// retries on its own: on any error or non-OK reply it drops its connection
// and tries the next node of --nodes (the node redirects to the tree's
// leader), pausing --retry-ms after each failure. Every commit is one line
// on --out (or stdout):
//
//   ok  START_MS END_MS VERSION      a commit acknowledged at the level
//   err START_MS END_MS REASON       a failed attempt (transport error or reply status)
//
// times in milliseconds since the Unix epoch (CLOCK_REALTIME, comparable
// with `date +%s.%N` in the scenario), so that the scenario can find, for
// each kill, the first acknowledged commit that started after it.
#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "replication/client.h"
#include "transport/auth.h"
#include "transport/builtin.h"

namespace po = boost::program_options;
using namespace canopy;

namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int Run(int argc, char** argv) {
  std::string nodes, cluster, secret_file, tree, out_path, level_name = "QUORUM", stop_file;
  double seconds = 60;
  uint64_t max_commits = 1'000'000;
  uint32_t timeout_ms = 1000, retry_ms = 5;
  po::options_description d("failover_client options");
  d.add_options()("help", "this help")
      ("nodes", po::value(&nodes)->required(), "comma-separated node URIs, tried in turn")
      ("cluster", po::value(&cluster)->required(), "cluster name")
      ("secret-file", po::value(&secret_file)->required(), "file holding the cluster secret")
      ("tree", po::value(&tree)->required(), "tree to commit to (must exist)")
      ("cl", po::value(&level_name)->default_value("QUORUM"), "consistency level: ONE, QUORUM or ALL")
      ("seconds", po::value(&seconds)->default_value(60), "stop after this long")
      ("max-commits", po::value(&max_commits)->default_value(1'000'000), "stop after this many attempts")
      ("timeout-ms", po::value(&timeout_ms)->default_value(1000), "per-commit timeout the leader waits for acks")
      ("retry-ms", po::value(&retry_ms)->default_value(5), "pause after a failed attempt")
      ("stop-file", po::value(&stop_file), "stop once this file exists")
      ("out", po::value(&out_path), "write the log here (default stdout)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, d), vm);
  if (vm.count("help")) {
    std::cout << d << "\n";
    return 0;
  }
  po::notify(vm);
  auto level = replication::ParseConsistencyLevel(level_name);
  if (!level.ok()) throw std::runtime_error(level.status().message());
  auto uris = SplitComma(nodes);
  if (uris.empty()) throw std::runtime_error("--nodes is empty");
  if (seconds <= 0 || seconds > 3600) throw std::runtime_error("--seconds must be in (0, 3600]");
  auto secret = transport::LoadSharedSecret("", secret_file);
  if (!secret.ok()) throw std::runtime_error(secret.status().ToString());
  transport::RegisterBuiltinTransports();

  std::ofstream file;
  if (!out_path.empty()) {
    file.open(out_path);
    if (!file) throw std::runtime_error("cannot write " + out_path);
  }
  std::ostream& out = out_path.empty() ? std::cout : file;

  replication::ClientOptions opts;
  opts.cluster = cluster;
  opts.secret = *secret;
  opts.client_id = "failover-client";
  opts.timeout = std::chrono::milliseconds(timeout_ms + 1000);
  // Every node, as etcdctl gets every endpoint: when the node this client
  // talks to dies, it asks the others where the leader went instead of
  // redialling the dead one until the commit's deadline.
  opts.nodes = uris;
  std::unique_ptr<replication::Client> client;
  size_t next = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (uint64_t i = 0; i < max_commits && std::chrono::steady_clock::now() < end; ++i) {
    if (!stop_file.empty() && (i % 64) == 0) {
      std::ifstream probe(stop_file);
      if (probe.good()) break;
    }
    double start = NowMs();
    std::string error;
    if (!client) {
      auto c = replication::Client::Connect(uris[next], opts);
      if (c.ok()) {
        client = std::move(*c);
      } else {
        error = "connect " + uris[next] + ": " + c.status().ToString();
      }
    }
    if (client) {
      replication::CommitRequest req;
      req.tree = tree;
      req.level = *level;
      req.timeout_ms = timeout_ms;
      req.edits.push_back(replication::Edit{replication::Edit::Kind::kPutAttribute, {}, "k" + std::to_string(i % 64),
                                            std::to_string(i), 0});
      auto r = client->Commit(req);
      if (!r.ok()) {
        error = r.status().ToString();
      } else if (r->status.code != StatusCode::kOk) {
        error = r->status.message.empty() ? "status " + std::to_string(static_cast<int>(r->status.code))
                                          : r->status.message;
      } else {
        out << fmt::format("ok {:.3f} {:.3f} {}\n", start, NowMs(), r->version);
        continue;
      }
    }
    for (auto& ch : error) {
      if (ch == '\n') ch = ' ';
    }
    out << fmt::format("err {:.3f} {:.3f} {}\n", start, NowMs(), error);
    client.reset();
    next = (next + 1) % uris.size();
    std::this_thread::sleep_for(std::chrono::milliseconds(retry_ms));
  }
  out.flush();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "failover_client: " << e.what() << "\n";
    return 2;
  }
}
