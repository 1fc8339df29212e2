// canopy: run a cluster node, and administer / use a cluster from scripts.
//
//   canopy node --listen tcp://127.0.0.1:7001 --data /tmp/n1 --cluster demo --secret-file s
//               [--seed tcp://127.0.0.1:7002 ...] [--http 127.0.0.1:8001 [--http-port-file F]]
//               [--metrics 127.0.0.1:9101] [--config /etc/canopy/NAME.conf]
//   canopy create-tree --node tcp://127.0.0.1:7001 --cluster demo --secret-file s --tree docs
//   canopy commit --node URI ... --tree docs --cl QUORUM --append / --put /0:title=hello
//   canopy read   --node URI ... --tree docs --path /0
//   canopy status --node URI ... [--json]
//   canopy bench  --node URI ... --tree docs --count 1000 --value-bytes 100 --cl QUORUM
//
// Exit status: 0 on success, 1 when the operation failed (the reason on
// stderr), 2 for bad command-line usage.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/file.h"
#include "base/logging.h"
#include "base/units.h"
#include "transport/auth.h"
#include "replication/client.h"
#include "replication/node.h"
#include "replication/protocol.h"
#include "tools/canopy/board.h"
#include "tools/http/metrics_endpoint.h"
#include "tools/http/server.h"
#include "transport/builtin.h"

namespace po = boost::program_options;
using namespace canopy;
using namespace canopy::replication;

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kTopUsage =
    "usage: canopy COMMAND [options]   (canopy COMMAND --help for the options of each)\n"
    "commands:\n"
    "  node         run a cluster node (serves clients, replicates trees to/from peers)\n"
    "  create-tree  create an empty tree (on its leader; any node redirects there)\n"
    "  commit       commit edits to a tree at a consistency level ONE|QUORUM|ALL\n"
    "  read         read one tree node (attributes and child count) by path\n"
    "  status       show the ring (members, liveness) and each tree's replica versions\n"
    "  bench        commit N single-attribute edits from C concurrent clients and print throughput and latency\n";

// Options shared by every client command.
struct ClientArgs {
  std::string node;
  std::string cluster;
  std::string secret;
  std::string secret_file;
  uint32_t timeout_ms = 10000;
};

void AddClientOptions(po::options_description& d, ClientArgs& a) {
  d.add_options()
      ("node", po::value(&a.node)->required(), "URI of any cluster node, e.g. tcp://127.0.0.1:7001")
      ("cluster", po::value(&a.cluster)->required(), "cluster name (must match the nodes' --cluster)")
      ("secret", po::value(&a.secret), "shared cluster secret (at least 8 bytes); prefer --secret-file")
      ("secret-file", po::value(&a.secret_file), "file holding the shared cluster secret")
      ("timeout-ms", po::value(&a.timeout_ms)->default_value(10000), "per-request timeout in milliseconds");
}

// Parses argv for one command; returns false when --help was printed. When
// `d` has a "config" option and it is given, the options are also read from
// that file (Boost's config-file syntax: "name = value" per line with the
// long option names, '#' comments); the command line wins over the file,
// repeatable options collect from both.
bool Parse(int argc, char** argv, po::options_description& d, const char* usage) {
  d.add_options()("help,h", "print this help");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(d).run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << d << "\n";
      return false;
    }
    if (d.find_nothrow("config", false) != nullptr && vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream file(path);
      if (!file) throw UsageError("--config: cannot read " + path + ": " + std::strerror(errno));
      po::store(po::parse_config_file(file, d), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return true;
}

std::unique_ptr<Client> ConnectClient(const ClientArgs& a) {
  auto secret = transport::LoadSharedSecret(a.secret, a.secret_file);
  if (!secret.ok()) throw UsageError(secret.status().message());
  ClientOptions o;
  o.cluster = a.cluster;
  o.secret = *secret;
  o.timeout = std::chrono::milliseconds(a.timeout_ms);
  auto c = Client::Connect(a.node, o);
  // Client::Connect's errors name the node already (the transport's connect
  // error, or "<uri>: <handshake error>").
  if (!c.ok()) throw std::runtime_error(c.status().ToString());
  return std::move(*c);
}

// "/", "/0", "/2/1" -> child indexes.
std::vector<uint32_t> ParsePath(const std::string& text) {
  if (text.empty() || text[0] != '/') throw UsageError("a path starts with '/': '" + text + "'");
  std::vector<uint32_t> path;
  size_t pos = 1;
  while (pos < text.size()) {
    size_t end = text.find('/', pos);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(pos, end - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9) {
      throw UsageError("bad path component '" + part + "' in '" + text + "'");
    }
    path.push_back(static_cast<uint32_t>(std::stoul(part)));
    pos = end + 1;
  }
  return path;
}

// "PATH:REST" split at the first ':'.
std::pair<std::vector<uint32_t>, std::string> SplitPathArg(const std::string& arg, const char* what) {
  size_t colon = arg.find(':');
  if (colon == std::string::npos) throw UsageError(std::string(what) + " expects PATH:..., got '" + arg + "'");
  return {ParsePath(arg.substr(0, colon)), arg.substr(colon + 1)};
}

uint32_t ParseIndex(const std::string& s, const std::string& arg) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) {
    throw UsageError("bad child index in '" + arg + "'");
  }
  return static_cast<uint32_t>(std::stoul(s));
}

// ------------------------------------------------------------------ node

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int RunNode(int argc, char** argv) {
  NodeOptions o;
  std::string secret, secret_file, fsync = "always", raft, uri_file, log_level;
  std::string http_address, http_port_file, metrics_address, metrics_port_file, config_file;
  uint32_t rf = 3, vnodes = 256;
  std::vector<std::string> raft_peers;
  uint64_t checkpoint_every = 10000, checkpoint_wal_bytes = 4 << 20, wal_retain = 10000,
           wal_segment_bytes = 64 << 20;
  uint32_t heartbeat_ms = 100, failure_ms = 1500, raft_election_ms = 150, raft_rebalance_ms = 1000,
           handshake_ms = 5000, one_sided_poll_us = 1000;
  uint64_t keep_versions = 0, keep_seconds = 0;
  std::string install_fsync = "finish";
  bool join_from_leader_only = false;
  std::string max_snapshot_bytes = "1T";
  size_t http_workers = 32;
  bool http_rpc_reads = false;
  po::options_description d("canopy node options");
  d.add_options()
      ("listen", po::value(&o.listen_uri)->required(),
       "URI to serve clients and peers on, e.g. tcp://127.0.0.1:7001 (port 0 picks a free port; the real URI "
       "is printed and written to --uri-file)")
      ("data", po::value(&o.data_dir)->required(), "data directory (tree store, node id, known members)")
      ("cluster", po::value(&o.cluster)->required(), "cluster name; peers and clients must use the same")
      ("seed", po::value(&o.seeds)->composing(),
       "URI of another cluster member to contact at start (repeatable); members learn each other by gossip")
      ("node-id", po::value(&o.node_id),
       "this node's id (decimal); default: the id stored in --data, or a random one chosen on first start")
      ("secret", po::value(&secret), "shared cluster secret (>= 8 bytes); visible in ps, prefer --secret-file")
      ("secret-file", po::value(&secret_file), "file holding the shared cluster secret")
      ("rf", po::value(&rf)->default_value(3), "replication factor: owners of each tree, leader included")
      ("vnodes", po::value(&vnodes)->default_value(256), "virtual nodes (ring tokens) per node")
      ("fsync", po::value(&fsync)->default_value("always"),
       "WAL durability: always (fsync before ACK, group commit), batch (every 10 ms), none")
      ("raft", po::value(&raft),
       "IPv4:port of this node's metadata raft (enables leader failover: tree leaders and epochs live in the "
       "raft group); without it every tree keeps its ring leader and there is no failover")
      ("raft-peer", po::value(&raft_peers)->composing(),
       "ID=IPv4:port of a founding raft member (repeatable; the same list on every founding node, read on the "
       "first start only)")
      ("checkpoint-every", po::value(&checkpoint_every)->default_value(10000),
       "write a tree checkpoint after this many commits")
      ("checkpoint-wal-bytes", po::value(&checkpoint_wal_bytes)->default_value(4 << 20),
       "also write one once the WAL since the last checkpoint reaches this many bytes, or half that "
       "checkpoint's size if more (0: off); the newest checkpoint is what a joining node is sent")
      ("wal-retain", po::value(&wal_retain)->default_value(10000),
       "after a checkpoint keep WAL deltas for this many versions (lagging replicas beyond get a snapshot)")
      ("wal-segment-bytes", po::value(&wal_segment_bytes)->default_value(64 << 20), "WAL segment file size")
      ("keep-versions", po::value(&keep_versions)->default_value(o.store.retention.keep_versions),
       "past versions readable with `canopy read --version`: the newest N of each tree (>= 1; 1 keeps only the "
       "latest); kept across restarts, and by replicas too")
      ("keep-seconds", po::value(&keep_seconds)->default_value(0),
       "also keep every version superseded less than this many seconds ago (0: off)")
      ("heartbeat-ms", po::value(&heartbeat_ms)->default_value(100),
       "membership round (one SWIM probe of one member) and leader-stream heartbeat interval")
      ("failure-ms", po::value(&failure_ms)->default_value(1500),
       "a leader stream silent this long is dead even if the phi-accrual detector has not said so (a closed or "
       "refused connection is evidence at once)")
      ("raft-election-ms", po::value(&raft_election_ms)->default_value(150),
       "metadata raft election timeout (randomized in [t, 2t); its heartbeat is t/5)")
      ("one-sided-replication", po::bool_switch(&o.one_sided_replication),
       "carry replication streams over one-sided RDMA log rings where the connection is rdma:// (deltas and "
       "ACKs as RDMA WRITEs, no SEND on the path); every node of the cluster needs a canopy that knows it")
      ("join-from-leader-only", po::bool_switch(&join_from_leader_only),
       "a joining node fetches every tree's checkpoint file from the tree's leader (default: from whichever "
       "owner, leader included, is sending it the fewest files, so that a join draws on every owner)")
      ("one-sided-poll-us", po::value(&one_sided_poll_us)->default_value(1000),
       "with --one-sided-replication: an idle stream's receiver sleeps at most this long between polls of its "
       "ring (the latency an idle stream's next message may pay; raise it on emulated machines)")
      ("handshake-ms", po::value(&handshake_ms)->default_value(5000),
       "bound on a peer's or client's HELLO/authentication exchange with this node (its own dials use 3/5 of "
       "it); raise it on slow or emulated machines")
      ("raft-rebalance-ms", po::value(&raft_rebalance_ms)->default_value(1000),
       "the metadata raft leader hands raft leadership to a live voter that leads fewer trees, at most once "
       "per this many ms (0: never), so that one crash rarely costs both a tree failover and a raft election")
      ("install-fsync", po::value(&install_fsync)->default_value("finish"),
       "snapshot installs (replica catch-up, node join): finish (one fsync per tree once it is complete) or "
       "each-chunk (fsync after every received chunk; for benchmarks)")
      ("max-snapshot-bytes", po::value(&max_snapshot_bytes)->default_value(max_snapshot_bytes),
       "largest checkpoint file a snapshot install accepts (e.g. 64G); a leader announcing more is refused "
       "before anything is written (so is one that does not fit the free space of --data)")
      ("uri-file", po::value(&uri_file), "write the served URI to this file once listening")
      ("http", po::value(&http_address),
       "serve the bulletin-board HTTP/JSON API on IPv4:port or [IPv6]:port (port 0 picks a free port; it is "
       "printed and written to --http-port-file); see tools/canopy/board.h")
      ("http-port-file", po::value(&http_port_file), "write the HTTP port to this file once listening")
      ("http-workers", po::value(&http_workers)->default_value(http_workers),
       "board threads for requests that may block (posts, LEADER reads, and reads the HTTP event thread cannot "
       "settle). Listings at ONE are answered on the event thread from this node's store or pipelined to an "
       "owner, and QUORUM listings gathered over pipelined links from it, without a worker. 0: everything on "
       "the event thread, blocking")
      ("http-rpc-reads", po::bool_switch(&http_rpc_reads),
       "the board reads its own node over the loopback RPC too, instead of in-process (for comparison)")
      ("metrics", po::value(&metrics_address),
       "serve Prometheus metrics (text format) at http://ADDR/metrics, ADDR = IPv4:port or [IPv6]:port "
       "(port 0 picks a free port; it is printed and written to --metrics-port-file): commits and commit "
       "latency by consistency level, replica acked versions and lag, snapshots, WAL fsync latency, "
       "failovers, epochs, transport connections and bytes")
      ("metrics-port-file", po::value(&metrics_port_file), "write the metrics port to this file once listening")
      ("config", po::value(&config_file),
       "read options from this file too: one NAME = VALUE per line with the long option names (listen = "
       "tcp://0.0.0.0:7001), '#' starts a comment, repeatable options (seed) on several lines; the command "
       "line wins (the systemd unit canopy-node@NAME reads /etc/canopy/NAME.conf)")
      ("log", po::value(&log_level), "log level: debug|info|warn|error (default: $CANOPY_LOG or info)");
  if (!Parse(argc, argv, d, "usage: canopy node --listen URI --data DIR --cluster NAME (--secret S | --secret-file F) "
                            "[--seed URI ...]"))
    return 0;
  if (!log_level.empty()) SetLogLevel(ParseLogLevel(log_level));
  auto s = transport::LoadSharedSecret(secret, secret_file);
  if (!s.ok()) throw UsageError(s.status().message());
  o.secret = *s;
  http::ServerOptions http_options;
  if (!http_address.empty()) {
    size_t colon = http_address.rfind(':');
    std::string host = colon == std::string::npos ? "" : http_address.substr(0, colon);
    std::string port = colon == std::string::npos ? "" : http_address.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty() || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(port) > 65535) {
      throw UsageError("--http expects IPv4:port or [IPv6]:port, got '" + http_address + "'");
    }
    http_options.bind_address = host;
    http_options.port = static_cast<uint16_t>(std::stoul(port));
    http_options.server_name = "canopy-board";
  } else if (!http_port_file.empty()) {
    throw UsageError("--http-port-file needs --http");
  }
  if (!metrics_address.empty()) {
    http::ServerOptions check;
    Status parsed = http::ParseListenAddress(metrics_address, &check);
    if (!parsed.ok()) throw UsageError("--metrics: " + parsed.message());
  } else if (!metrics_port_file.empty()) {
    throw UsageError("--metrics-port-file needs --metrics");
  }
  auto policy = tree::ParseFsyncPolicy(fsync);
  if (!policy.ok()) throw UsageError(policy.status().message());
  if (!raft.empty() && raft.find(':') == std::string::npos) throw UsageError("--raft expects IPv4:port");
  if (!raft_peers.empty() && raft.empty()) throw UsageError("--raft-peer needs --raft");
  if (!raft.empty() && o.node_id.empty()) throw UsageError("--raft needs --node-id (a decimal number > 0)");
  o.raft_address = raft;
  for (const auto& p : raft_peers) {
    size_t eq = p.find('=');
    if (eq == std::string::npos || eq == 0 || p.substr(0, eq).find_first_not_of("0123456789") != std::string::npos) {
      throw UsageError("--raft-peer expects ID=IPv4:port, got '" + p + "'");
    }
    o.raft_members[std::stoull(p.substr(0, eq))] = p.substr(eq + 1);
  }
  if (!o.node_id.empty() && o.node_id.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError("--node-id must be a decimal number");
  }
  o.store.fsync = *policy;
  o.store.checkpoint_every_commits = checkpoint_every;
  o.store.checkpoint_wal_bytes = checkpoint_wal_bytes;
  o.store.wal_retain_versions = wal_retain;
  o.store.wal_segment_bytes = wal_segment_bytes;
  if (keep_versions == 0) throw UsageError("--keep-versions must be at least 1 (the latest version)");
  if (keep_seconds > 100ull * 365 * 24 * 3600) throw UsageError("--keep-seconds is more than a century");
  o.store.retention.keep_versions = keep_versions;
  o.store.retention.keep_for = std::chrono::seconds(keep_seconds);
  if (install_fsync != "finish" && install_fsync != "each-chunk") {
    throw UsageError("--install-fsync expects finish or each-chunk, got '" + install_fsync + "'");
  }
  o.store.install_fsync_each_chunk = install_fsync == "each-chunk";
  auto max_install = ParseByteSize(max_snapshot_bytes);
  if (!max_install.ok()) throw UsageError("--max-snapshot-bytes: " + max_install.status().message());
  o.store.max_install_file_bytes = *max_install;
  o.ring.replication_factor = rf;
  o.ring.vnodes_per_node = vnodes;
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.failure_timeout = std::chrono::milliseconds(failure_ms);
  if (heartbeat_ms == 0 || failure_ms <= heartbeat_ms) throw UsageError("need 0 < --heartbeat-ms < --failure-ms");
  if (raft_election_ms < 10) throw UsageError("--raft-election-ms must be at least 10");
  o.raft_election_timeout = std::chrono::milliseconds(raft_election_ms);
  o.raft_leader_rebalance_interval = std::chrono::milliseconds(raft_rebalance_ms);
  if (handshake_ms < 10) throw UsageError("--handshake-ms must be at least 10");
  o.handshake_timeout = std::chrono::milliseconds(handshake_ms);
  if (one_sided_poll_us < 1 || one_sided_poll_us > 1000000) throw UsageError("--one-sided-poll-us must be 1..1000000");
  o.one_sided_poll_max = std::chrono::microseconds(one_sided_poll_us);
  o.join_from_every_owner = !join_from_leader_only;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // SIGINT and SIGTERM stay blocked in every thread (they inherit this mask)
  // and the main thread takes them with sigtimedwait: it sleeps until one
  // comes instead of waking 20 times a second to look at a flag, which in a
  // cluster of 50 idle nodes on one host was 1000 wake-ups a second.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto node = Node::Start(o);
  if (!node.ok()) {
    std::cerr << "canopy node: " << node.status().ToString() << "\n";
    return 1;
  }
  if (!uri_file.empty()) {
    Status w = WriteFileAtomic(uri_file, (*node)->uri() + "\n");
    if (!w.ok()) {
      std::cerr << "canopy node: " << w.ToString() << "\n";
      return 1;
    }
  }
  std::cout << "node " << (*node)->node_id() << " listening on " << (*node)->uri() << std::endl;

  std::unique_ptr<http::MetricsEndpoint> metrics_endpoint;
  if (!metrics_address.empty()) {
    auto endpoint = http::MetricsEndpoint::Start(metrics_address);
    if (!endpoint.ok()) {
      std::cerr << "canopy node: --metrics " << metrics_address << ": " << endpoint.status().ToString() << "\n";
      (*node)->Stop();
      return 1;
    }
    metrics_endpoint = std::move(*endpoint);
    if (!metrics_port_file.empty()) {
      Status w = WriteFileAtomic(metrics_port_file, std::to_string(metrics_endpoint->port()) + "\n");
      if (!w.ok()) {
        std::cerr << "canopy node: " << w.ToString() << "\n";
        (*node)->Stop();
        return 1;
      }
    }
    std::cout << "metrics on http://" << metrics_endpoint->bind_address() << ":" << metrics_endpoint->port()
              << "/metrics" << std::endl;
  }

  // The bulletin-board API: its own thread, stopped before the node.
  std::unique_ptr<board::BoardService> board_service;
  std::unique_ptr<http::Server> http_server;
  std::thread http_thread;
  if (!http_address.empty()) {
    board::BoardOptions bo;
    bo.node_uri = (*node)->uri();
    bo.client.cluster = o.cluster;
    bo.client.secret = o.secret;
    bo.client.client_id = "board-" + (*node)->node_id();
    bo.client.timeout = std::chrono::milliseconds(5000);
    bo.workers = http_workers;
    if (!http_rpc_reads) {
      replication::Node* local = node->get();
      bo.local_slice = [local](const replication::SliceRequest& r) { return local->Slice(r); };
      bo.local_slice_async = [local](const replication::SliceRequest& r,
                                     std::function<void(std::optional<replication::SliceReply>)> done) {
        return local->SliceAsync(r, std::move(done));
      };
      bo.local_flush = [local] { local->FlushSlices(); };
    }
    board_service = std::make_unique<board::BoardService>(bo);
    http_options.limits.max_body_bytes = board_service->max_body_bytes();
    auto server = http::Server::Listen(http_options, board_service.get());
    if (!server.ok()) {
      std::cerr << "canopy node: --http " << http_address << ": " << server.status().ToString() << "\n";
      (*node)->Stop();
      return 1;
    }
    http_server = std::move(*server);
    if (!http_port_file.empty()) {
      Status w = WriteFileAtomic(http_port_file, std::to_string(http_server->port()) + "\n");
      if (!w.ok()) {
        std::cerr << "canopy node: " << w.ToString() << "\n";
        (*node)->Stop();
        return 1;
      }
    }
    CANOPY_LOG(kInfo, "node {}: bulletin-board HTTP API on {} port {}", (*node)->node_id(), http_options.bind_address,
               http_server->port());
    std::cout << "http listening on " << http_options.bind_address << ":" << http_server->port() << std::endl;
    http_thread = std::thread([&http_server] {
      Status s = http_server->Run();
      if (!s.ok()) CANOPY_LOG(kError, "http server stopped: {}", s.ToString());
    });
  }
  while (!g_stop) {
    // The timeout only bounds the wait should a signal reach the handler
    // instead (a thread started with another mask).
    const timespec at_most{1, 0};
    if (sigtimedwait(&stop_signals, nullptr, &at_most) > 0) g_stop = 1;
  }
  if (http_server) {
    http_server->Stop();
    http_thread.join();
  }
  if (metrics_endpoint) metrics_endpoint->Stop();
  (*node)->Stop();
  return 0;
}

// ------------------------------------------------------------------ client commands

int ReportStatus(const StatusReplyFields& s, const char* what) {
  if (s.code == StatusCode::kOk) return 0;
  std::cerr << "canopy " << what << ": " << s.ToStatus().ToString() << "\n";
  return 1;
}

int RunCreateTree(int argc, char** argv) {
  ClientArgs a;
  std::string tree;
  po::options_description d("canopy create-tree options");
  AddClientOptions(d, a);
  d.add_options()("tree", po::value(&tree)->required(), "tree name ([A-Za-z0-9._-], 1..200 characters)");
  if (!Parse(argc, argv, d, "usage: canopy create-tree --node URI --cluster NAME --secret-file F --tree NAME")) return 0;
  auto c = ConnectClient(a);
  auto r = c->CreateTree(tree);
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  if (int rc = ReportStatus(r->status, "create-tree")) return rc;
  std::string owners;
  for (const auto& o : r->owners) owners += (owners.empty() ? "" : ",") + o;
  std::cout << "created " << tree << " on leader " << r->leader << " (owners " << owners << ")\n";
  return 0;
}

int RunCommit(int argc, char** argv) {
  ClientArgs a;
  std::string tree, cl = "QUORUM";
  uint64_t base = 0;
  std::vector<std::string> puts, appends, inserts, deletes, delete_attrs;
  po::options_description d(
      "canopy commit options (edits apply in this order: --append, --insert, --put, --delete-attr, --delete)");
  AddClientOptions(d, a);
  d.add_options()
      ("tree", po::value(&tree)->required(), "tree name")
      ("cl", po::value(&cl)->default_value("QUORUM"),
       "consistency level: ONE (leader), QUORUM (majority of owners), ALL (every owner) durable before success")
      ("base", po::value(&base)->default_value(0), "version the edits are based on (0: the latest; else stale = Conflict)")
      ("append", po::value(&appends)->composing(), "PATH: append an empty child to the node at PATH (e.g. /)")
      ("insert", po::value(&inserts)->composing(), "PATH:INDEX: insert an empty child at INDEX")
      ("put", po::value(&puts)->composing(), "PATH:KEY=VALUE: set attribute KEY of the node at PATH")
      ("delete-attr", po::value(&delete_attrs)->composing(), "PATH:KEY: delete attribute KEY")
      ("delete", po::value(&deletes)->composing(), "PATH:INDEX: delete child INDEX (with its subtree)");
  if (!Parse(argc, argv, d, "usage: canopy commit --node URI --cluster NAME --secret-file F --tree T EDITS...")) return 0;
  CommitRequest req;
  req.tree = tree;
  req.base_version = base;
  auto level = ParseConsistencyLevel(cl);
  if (!level.ok()) throw UsageError(level.status().message());
  req.level = *level;
  req.timeout_ms = a.timeout_ms;
  for (const auto& p : appends) req.edits.push_back(Edit{Edit::Kind::kAppendChild, ParsePath(p), "", "", 0});
  for (const auto& arg : inserts) {
    auto [path, rest] = SplitPathArg(arg, "--insert");
    req.edits.push_back(Edit{Edit::Kind::kInsertChild, path, "", "", ParseIndex(rest, arg)});
  }
  for (const auto& arg : puts) {
    auto [path, rest] = SplitPathArg(arg, "--put");
    size_t eq = rest.find('=');
    if (eq == std::string::npos) throw UsageError("--put expects PATH:KEY=VALUE, got '" + arg + "'");
    req.edits.push_back(Edit{Edit::Kind::kPutAttribute, path, rest.substr(0, eq), rest.substr(eq + 1), 0});
  }
  for (const auto& arg : delete_attrs) {
    auto [path, rest] = SplitPathArg(arg, "--delete-attr");
    req.edits.push_back(Edit{Edit::Kind::kDeleteAttribute, path, rest, "", 0});
  }
  for (const auto& arg : deletes) {
    auto [path, rest] = SplitPathArg(arg, "--delete");
    req.edits.push_back(Edit{Edit::Kind::kDeleteChild, path, "", "", ParseIndex(rest, arg)});
  }
  if (req.edits.empty()) throw UsageError("no edits given (--append, --insert, --put, --delete-attr, --delete)");
  auto c = ConnectClient(a);
  auto r = c->Commit(req);
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  if (int rc = ReportStatus(r->status, "commit")) return rc;
  std::cout << "committed version " << r->version << " (" << r->acks << " replicas durable, " << cl << ")\n";
  return 0;
}

int RunRead(int argc, char** argv) {
  ClientArgs a;
  std::string tree, path = "/", cl;
  uint64_t version = 0;
  uint32_t child_from = 0, child_limit = 0, timeout_ms = 2000;
  bool json = false;
  po::options_description d("canopy read options");
  AddClientOptions(d, a);
  d.add_options()
      ("tree", po::value(&tree)->required(), "tree name")
      ("path", po::value(&path)->default_value("/"), "node path: / is the root, /0/2 the root's first child's third")
      ("version", po::value(&version)->default_value(0), "version to read (0: the node's latest); a past version is readable while the node retains it "
       "(canopy node --keep-versions / --keep-seconds), else NotFound names the oldest version held")
      ("cl", po::value(&cl),
       "read consistency: ONE (the node's newest), LEADER (at the tree's leader, after it proved its leadership: "
       "read-your-writes, linearizable) or QUORUM (newest of a quorum of owners); see ReadLevel in "
       "replication/protocol.h. Without --cl, --children or --from: a plain READ at ONE")
      ("children", po::value(&child_limit)->default_value(0),
       "also list up to this many children (their attributes and child counts), in the same round trip")
      ("from", po::value(&child_from)->default_value(0), "index of the first child listed")
      ("timeout-ms", po::value(&timeout_ms)->default_value(2000), "LEADER / QUORUM: how long the node may wait")
      ("json", po::bool_switch(&json), "print JSON");
  if (!Parse(argc, argv, d, "usage: canopy read --node URI --cluster NAME --secret-file F --tree T [--path P] "
                            "[--version V] [--cl ONE|LEADER|QUORUM] [--children N [--from K]]")) {
    return 0;
  }
  if (!cl.empty() || child_limit > 0 || child_from > 0) {
    SliceRequest req;
    req.tree = tree;
    req.version = version;
    req.path = ParsePath(path);
    req.child_from = child_from;
    req.child_limit = child_limit;
    req.timeout_ms = timeout_ms;
    if (!cl.empty()) {
      auto level = ParseReadLevel(cl);
      if (!level.ok()) throw UsageError(level.status().message());
      req.level = *level;
    }
    auto c = ConnectClient(a);
    auto r = c->Slice(req);
    if (!r.ok()) throw std::runtime_error(r.status().ToString());
    if (int rc = ReportStatus(r->status, "read")) return rc;
    if (json) {
      nlohmann::json j;
      j["version"] = r->version;
      j["cl"] = ReadLevelName(req.level);
      j["answered_by"] = r->answered_by;
      j["data_epoch"] = r->data_epoch;
      j["children"] = r->child_count;
      j["attributes"] = nlohmann::json::object();
      for (const auto& [k, v] : r->attributes) j["attributes"][k] = v;
      j["listed"] = nlohmann::json::array();
      for (size_t i = 0; i < r->children.size(); ++i) {
        nlohmann::json child{{"index", r->child_start + i}, {"children", r->children[i].child_count}};
        child["attributes"] = nlohmann::json::object();
        for (const auto& [k, v] : r->children[i].attributes) child["attributes"][k] = v;
        j["listed"].push_back(std::move(child));
      }
      std::cout << j.dump() << "\n";
    } else {
      std::cout << "version " << r->version << " children " << r->child_count << " (cl " << ReadLevelName(req.level)
                << ", node " << r->answered_by << ")\n";
      for (const auto& [k, v] : r->attributes) std::cout << k << "=" << v << "\n";
      for (size_t i = 0; i < r->children.size(); ++i) {
        std::cout << "child " << r->child_start + i << " (" << r->children[i].child_count << " children)";
        for (const auto& [k, v] : r->children[i].attributes) std::cout << " " << k << "=" << v;
        std::cout << "\n";
      }
    }
    return 0;
  }
  auto c = ConnectClient(a);
  auto r = c->Read(ReadRequest{tree, version, ParsePath(path)});
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  if (int rc = ReportStatus(r->status, "read")) return rc;
  if (json) {
    nlohmann::json j;
    j["version"] = r->version;
    j["children"] = r->child_count;
    j["attributes"] = nlohmann::json::object();
    for (const auto& [k, v] : r->attributes) j["attributes"][k] = v;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "version " << r->version << " children " << r->child_count << "\n";
    for (const auto& [k, v] : r->attributes) std::cout << k << "=" << v << "\n";
  }
  return 0;
}

int RunStatus(int argc, char** argv) {
  ClientArgs a;
  bool json = false, all = false;
  po::options_description d("canopy status options");
  AddClientOptions(d, a);
  d.add_options()
      ("json", po::bool_switch(&json), "print JSON")
      ("all", po::bool_switch(&all),
       "ask every member too and print one line per tree and node: role, durable version, digest");
  if (!Parse(argc, argv, d, "usage: canopy status --node URI --cluster NAME --secret-file F [--json] [--all]")) return 0;
  auto c = ConnectClient(a);
  auto r = c->GetStatus();
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  if (all) {
    // tree -> node -> "role version digest"
    std::map<std::string, std::map<std::string, std::string>> table;
    for (const auto& n : r->nodes) {
      ClientArgs each = a;
      each.node = n.uri;
      std::unique_ptr<Client> nc;
      std::string why;
      try {
        nc = ConnectClient(each);
      } catch (const std::exception& e) {
        why = e.what();
      }
      auto s = nc ? nc->GetStatus() : Result<StatusReply>(Status::Unavailable(why));
      if (!s.ok()) {
        table[""][n.node_id] = "unreachable: " + s.status().ToString();
        continue;
      }
      for (const auto& t : s->trees) {
        table[t.tree][n.node_id] = t.role + " epoch " + std::to_string(t.epoch) + " version " +
                                   std::to_string(t.durable_version) + (t.digest.empty() ? "" : " digest " + t.digest);
      }
    }
    for (const auto& [tree, nodes] : table) {
      for (const auto& [id, text] : nodes) {
        std::cout << (tree.empty() ? "-" : tree) << " node " << id << ": " << text << "\n";
      }
    }
    return 0;
  }
  if (json) {
    nlohmann::json j;
    j["node"] = r->node_id;
    j["replication_factor"] = r->replication_factor;
    j["vnodes"] = r->vnodes;
    j["raft_leader"] = r->raft_leader;
    j["nodes"] = nlohmann::json::array();
    for (const auto& n : r->nodes) j["nodes"].push_back({{"id", n.node_id}, {"uri", n.uri}, {"alive", n.alive}});
    j["trees"] = nlohmann::json::array();
    for (const auto& t : r->trees) {
      j["trees"].push_back({{"tree", t.tree}, {"leader", t.leader}, {"epoch", t.epoch}, {"role", t.role},
                            {"durable_version", t.durable_version}, {"digest", t.digest}, {"owners", t.owners},
                            {"replica_versions", t.replica_versions}, {"snapshots_received", t.snapshots_received},
                            {"snapshots_sent", t.snapshots_sent}});
    }
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << "node " << r->node_id << " (rf " << r->replication_factor << ", vnodes " << r->vnodes
            << (r->raft_leader.empty() ? "" : ", metadata raft leader " + r->raft_leader) << ")\n";
  for (const auto& n : r->nodes) std::cout << "  member " << n.node_id << " " << n.uri << (n.alive ? " alive" : " DEAD") << "\n";
  for (const auto& t : r->trees) {
    std::cout << "  tree " << t.tree << ": leader " << t.leader << " epoch " << t.epoch << ", here " << t.role
              << " at durable version " << t.durable_version << (t.digest.empty() ? "" : " digest " + t.digest) << "\n";
    for (const auto& [id, v] : t.replica_versions) std::cout << "    replica " << id << " acked version " << v << "\n";
  }
  return 0;
}

int RunBench(int argc, char** argv) {
  ClientArgs a;
  std::string tree, cl = "QUORUM";
  uint64_t count = 1000;
  uint32_t value_bytes = 100;
  uint64_t reads = 0;
  uint32_t clients = 1, conns = 1, trees = 1;
  bool json = false;
  po::options_description d(
      "canopy bench options: N commits, each putting one attribute of a tree's root, from CLIENTS concurrent "
      "clients (each waits for its commit's reply before sending the next, as etcd's benchmark tool does: CLIENTS "
      "commits in flight at all times) multiplexed over CONNS connections per node. With one tree each connection "
      "carries its clients' commits pipelined from one thread; over several trees each client is a thread");
  AddClientOptions(d, a);
  d.add_options()
      ("tree", po::value(&tree)->required(), "tree name (created when missing); with --trees N > 1, the trees "
       "TREE-0 .. TREE-(N-1)")
      ("cl", po::value(&cl)->default_value("QUORUM"), "consistency level ONE|QUORUM|ALL")
      ("count", po::value(&count)->default_value(1000), "number of commits (all clients together)")
      ("clients,c", po::value(&clients)->default_value(1), "concurrent clients (1..4096), each one commit at a time")
      ("conns", po::value(&conns)->default_value(1),
       "connections the clients share (1..CLIENTS; client k uses connection k % CONNS)")
      ("trees", po::value(&trees)->default_value(1),
       "spread the commits over this many trees (1..4096; commit i goes to tree i % N), each with its own leader "
       "on the ring")
      ("value-bytes", po::value(&value_bytes)->default_value(100), "size of each attribute value")
      ("reads", po::value(&reads)->default_value(0),
       "after the commits, this many sequential reads of the root from --node (a read is answered by the node "
       "asked: consistency ONE); their latency is reported too")
      ("json", po::bool_switch(&json), "print one JSON object");
  if (!Parse(argc, argv, d, "usage: canopy bench --node URI --cluster NAME --secret-file F --tree T [-c CLIENTS] "
                            "[--conns N] [--trees N]"))
    return 0;
  auto level = ParseConsistencyLevel(cl);
  if (!level.ok()) throw UsageError(level.status().message());
  if (clients < 1 || clients > 4096) throw UsageError("--clients must be 1..4096");
  if (conns < 1 || conns > clients) throw UsageError("--conns must be 1..CLIENTS");
  if (trees < 1 || trees > 4096) throw UsageError("--trees must be 1..4096");
  std::vector<std::unique_ptr<Client>> connections;
  for (uint32_t i = 0; i < conns; ++i) connections.push_back(ConnectClient(a));
  std::vector<std::string> names;
  for (uint32_t t = 0; t < trees; ++t) names.push_back(trees == 1 ? tree : tree + "-" + std::to_string(t));
  for (const auto& name : names) {
    auto created = connections[0]->CreateTree(name);
    if (!created.ok()) throw std::runtime_error(created.status().ToString());
    if (created->status.code != StatusCode::kOk && created->status.code != StatusCode::kAlreadyExists) {
      return ReportStatus(created->status, "bench");
    }
  }
  const std::string value(value_bytes, 'v');
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex fail_mu;
  std::string failure;
  StatusReplyFields failed_status;
  std::vector<std::vector<double>> per_client(clients);
  // Commit i: one attribute of tree i % trees.
  auto request_for = [&](uint64_t i) {
    return CommitRequest{names[i % trees], 0, *level, a.timeout_ms,
                         {Edit{Edit::Kind::kPutAttribute, {}, "k" + std::to_string((i / trees) % 1000), value, 0}},
                         "", 0};
  };
  // The first failure is the run's; false for a reply that is not OK.
  auto succeeded = [&](const Result<CommitReply>& r) {
    if (r.ok() && r->status.code == StatusCode::kOk) return true;
    std::lock_guard<std::mutex> lock(fail_mu);
    if (!failed.exchange(true)) {
      if (!r.ok()) failure = r.status().ToString();
      else failed_status = r->status;
    }
    return false;
  };
  auto body = [&](uint32_t k) {
    Client& c = *connections[k % conns];
    auto& lat = per_client[k];
    lat.reserve(count / clients + 1);
    for (uint64_t i = next++; i < count && !failed; i = next++) {
      auto t0 = std::chrono::steady_clock::now();
      if (!succeeded(c.Commit(request_for(i)))) return;
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  // One tree: each connection carries its share of the CLIENTS commits in
  // flight from one thread (Client::CommitPipelined), as etcd's benchmark
  // runs its clients as goroutines; not a thread per client, whose
  // wake-ups would cost more CPU here than the commits themselves. Spread
  // over trees (different leaders): a thread per client.
  auto pipeline = [&](uint32_t j) {
    Client& c = *connections[j];
    const uint32_t depth = clients / conns + (j < clients % conns ? 1 : 0);
    auto& lat = per_client[j];
    lat.reserve(count / conns + 1);
    auto next_request = [&](CommitRequest* req) {
      if (failed) return false;
      uint64_t i = next++;
      if (i >= count) return false;
      *req = request_for(i);
      return true;
    };
    auto on_reply = [&](const CommitRequest&, Result<CommitReply> r, std::chrono::nanoseconds latency) {
      if (succeeded(r)) lat.push_back(std::chrono::duration<double, std::micro>(latency).count());
    };
    Status s = c.CommitPipelined(depth, next_request, on_reply);
    if (!s.ok()) (void)succeeded(s);
  };
  auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> threads;
    if (trees == 1) {
      for (uint32_t j = 0; j < conns; ++j) threads.emplace_back(pipeline, j);
    } else {
      for (uint32_t k = 0; k < clients; ++k) threads.emplace_back(body, k);
    }
    for (auto& t : threads) t.join();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) {
    if (!failure.empty()) throw std::runtime_error(failure);
    return ReportStatus(failed_status, "bench");
  }
  std::vector<double> lat_us;
  lat_us.reserve(count);
  for (auto& l : per_client) lat_us.insert(lat_us.end(), l.begin(), l.end());
  std::sort(lat_us.begin(), lat_us.end());
  auto pct = [&](double p) { return lat_us.empty() ? 0.0 : lat_us[std::min(lat_us.size() - 1, size_t(p * lat_us.size()))]; };
  double tput = secs > 0 ? count / secs : 0;
  double commit_p50 = pct(0.50), commit_p99 = pct(0.99), commit_p999 = pct(0.999);
  double commit_max = lat_us.empty() ? 0.0 : lat_us.back();
  uint64_t retries = 0;
  for (const auto& c : connections) retries += c->retries();
  lat_us.clear();
  for (uint64_t i = 0; i < reads; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = connections[0]->Read(ReadRequest{names[0], 0, {}});
    if (!r.ok()) throw std::runtime_error(r.status().ToString());
    if (int rc = ReportStatus(r->status, "bench")) return rc;
    lat_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(lat_us.begin(), lat_us.end());
  if (json) {
    nlohmann::json j{{"cl", cl}, {"count", count}, {"value_bytes", value_bytes}, {"clients", clients},
                     {"conns", conns}, {"trees", trees}, {"seconds", secs}, {"commits_per_s", tput},
                     {"p50_us", commit_p50}, {"p99_us", commit_p99}, {"p999_us", commit_p999},
                     {"max_us", commit_max}, {"retries", retries}};
    if (reads > 0) {
      j["reads"] = reads;
      j["read_p50_us"] = pct(0.50);
      j["read_p99_us"] = pct(0.99);
    }
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %lu commits of %u bytes from %u clients over %u connections to %u trees in %.3f s: "
                "%.0f commits/s, p50 %.0f us, p99 %.0f us, p99.9 %.0f us\n",
                cl.c_str(), static_cast<unsigned long>(count), value_bytes, clients, conns, trees, secs, tput,
                commit_p50, commit_p99, commit_p999);
    if (reads > 0) {
      std::printf("reads: %lu of the root, p50 %.0f us, p99 %.0f us\n", static_cast<unsigned long>(reads), pct(0.50),
                  pct(0.99));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]).empty()) {
    // No command is bad usage: the usage goes to stderr, exit status 2.
    std::cerr << "canopy: no command given\n" << kTopUsage;
    return 2;
  }
  if (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kTopUsage;
    return 0;
  }
  if (const char* lvl = std::getenv("CANOPY_LOG")) SetLogLevel(ParseLogLevel(lvl));
  transport::RegisterBuiltinTransports();
  std::string cmd = argv[1];
  try {
    if (cmd == "node") return RunNode(argc - 1, argv + 1);
    if (cmd == "create-tree") return RunCreateTree(argc - 1, argv + 1);
    if (cmd == "commit") return RunCommit(argc - 1, argv + 1);
    if (cmd == "read") return RunRead(argc - 1, argv + 1);
    if (cmd == "status") return RunStatus(argc - 1, argv + 1);
    if (cmd == "bench") return RunBench(argc - 1, argv + 1);
    std::cerr << "canopy: unknown command '" << cmd << "'\n" << kTopUsage;
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "canopy " << cmd << ": " << e.what() << " (see canopy " << cmd << " --help)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "canopy " << cmd << ": " << e.what() << "\n";
    return 1;
  }
}
