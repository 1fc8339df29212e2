// Test harness for multi-process canopy clusters on 127.0.0.1: spawns the
// built `canopy node` binary (tests/testing/test_util.h BinaryPath), one
// process per node, each with its own data dir and log file in a TempDir, and
// talks to the nodes with replication::Client. Every wait is bounded.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/file.h"
#include "replication/client.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"

namespace canopy::testing {

inline constexpr char kClusterName[] = "test-cluster";
inline constexpr char kClusterSecret[] = "correct horse battery staple";

// Polls `done` every 25 ms until it is true or `timeout` passes (scaled under emulation:
// CANOPY_TEST_TIME_SCALE, test_util.h).
inline bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + ScaledBound(timeout);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return done();
}

// A TCP port on 127.0.0.1 that was free a moment ago (for the raft
// addresses, which every founding member must know before it starts).
inline uint16_t PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  uint16_t port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

class TestCluster {
 public:
  struct NodeProcess {
    std::string dir;
    std::string log;
    std::string uri;  // known after the first start; reused on restart
    std::string node_id;
    std::vector<std::string> seeds;
    std::vector<std::string> extra_args;
    std::string secret_file;
    pid_t pid = -1;
  };

  TestCluster() {
    transport::RegisterBuiltinTransports();
    secret_file_ = tmp_.File("secret");
    EXPECT_TRUE(WriteFileAtomic(secret_file_, std::string(kClusterSecret) + "\n").ok());
  }
  ~TestCluster() {
    for (size_t i = 0; i < nodes_.size(); ++i) Stop(i);
  }

  const std::string& dir() const { return tmp_.path(); }
  const std::string& secret_file() const { return secret_file_; }
  size_t size() const { return nodes_.size(); }
  NodeProcess& node(size_t i) { return nodes_.at(i); }

  // Gives the first `founders` nodes a metadata raft (leader failover).
  // Call before AddNode.
  void EnableRaft(size_t founders) {
    for (size_t i = 0; i < founders; ++i) {
      raft_addresses_.push_back("127.0.0.1:" + std::to_string(PickFreePort()));
    }
  }

  // Where nodes listen on their first start (default FirstListenUri()),
  // e.g. a tls+tcp:// URI with cert=, key=, ca= parameters. Call before Start.
  void SetListenUri(std::string uri) { listen_uri_ = std::move(uri); }

  // Adds node i (ids 1, 2, ...) seeded with every node added before it.
  size_t AddNode(std::vector<std::string> extra_args = {}, std::string secret_file = "") {
    NodeProcess n;
    size_t i = nodes_.size();
    n.node_id = std::to_string(i + 1);
    n.dir = tmp_.File("node" + n.node_id);
    n.log = tmp_.File("node" + n.node_id + ".log");
    for (const auto& other : nodes_) n.seeds.push_back(other.uri);
    n.extra_args = std::move(extra_args);
    n.secret_file = secret_file.empty() ? secret_file_ : secret_file;
    if (i < raft_addresses_.size()) {
      n.extra_args.push_back("--raft");
      n.extra_args.push_back(raft_addresses_[i]);
      for (size_t k = 0; k < raft_addresses_.size(); ++k) {
        n.extra_args.push_back("--raft-peer");
        n.extra_args.push_back(std::to_string(k + 1) + "=" + raft_addresses_[k]);
      }
    }
    nodes_.push_back(std::move(n));
    return i;
  }

  // Where nodes listen on their first start: $CANOPY_TEST_CLUSTER_LISTEN if set (e.g.
  // rdma://10.77.0.1:0 inside a Soft-RoCE guest, see hw/rdma-vm.sh), else tcp://127.0.0.1:0.
  static std::string FirstListenUri() {
    const char* env = std::getenv("CANOPY_TEST_CLUSTER_LISTEN");
    return env != nullptr && *env != '\0' ? env : "tcp://127.0.0.1:0";
  }

  // Starts (or restarts) node i and waits until it serves.
  bool Start(size_t i) {
    NodeProcess& n = nodes_.at(i);
    std::string uri_file = n.dir + ".uri";
    (void)RemoveFile(uri_file);
    std::vector<std::string> args = {BinaryPath("tools/canopy/canopy"), "node",
                                     "--listen", n.uri.empty() ? listen_uri_ : n.uri,
                                     "--data", n.dir, "--cluster", kClusterName, "--secret-file", n.secret_file,
                                     "--node-id", n.node_id, "--uri-file", uri_file, "--heartbeat-ms", "50",
                                     // Not scaled in the guests: rdma_vm passed with 800 ms there,
                                     // and the failover test failed once with 8 s (d9054e5).
                                     "--failure-ms", "800"};
    for (const auto& s : n.seeds) {
      args.push_back("--seed");
      args.push_back(s);
    }
    // Handshakes get the same slack as every other bound of the tests
    // (CANOPY_TEST_TIME_SCALE: 10 in emulated guests).
    args.push_back("--handshake-ms");
    args.push_back(std::to_string(ScaledBound(std::chrono::milliseconds(5000)).count()));
    for (const auto& a : n.extra_args) args.push_back(a);
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(n.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    n.pid = pid;
    bool up = WaitUntil([&] { return PathExists(uri_file); }, std::chrono::seconds(15));
    if (!up) {
      ADD_FAILURE() << "node " << n.node_id << " did not start; log:\n" << Log(i);
      return false;
    }
    auto text = ReadFileToString(uri_file);
    if (!text.ok()) return false;
    n.uri = *text;
    while (!n.uri.empty() && n.uri.back() == '\n') n.uri.pop_back();
    return true;
  }

  bool Running(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return false;
    int status = 0;
    return ::waitpid(n.pid, &status, WNOHANG) == 0;
  }

  void Kill(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return;
    ::kill(n.pid, SIGKILL);
    int status = 0;
    ::waitpid(n.pid, &status, 0);
    n.pid = -1;
  }

  void Stop(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return;
    ::kill(n.pid, SIGTERM);
    if (WaitChild(n.pid, std::chrono::seconds(10)) == -1) ADD_FAILURE() << "node " << n.node_id << " ignored SIGTERM";
    n.pid = -1;
  }

  std::string Log(size_t i) { return ReadFileToString(nodes_.at(i).log).value_or("(no log)"); }

  replication::ClientOptions ClientOpts(std::string secret = kClusterSecret) const {
    replication::ClientOptions o;
    o.cluster = kClusterName;
    o.secret = std::move(secret);
    o.timeout = ScaledBound(std::chrono::seconds(10));
    return o;
  }

  std::unique_ptr<replication::Client> Connect(size_t i) {
    auto c = replication::Client::Connect(nodes_.at(i).uri, ClientOpts());
    if (!c.ok()) {
      ADD_FAILURE() << "connect to node " << i + 1 << ": " << c.status().ToString();
      return nullptr;
    }
    return std::move(*c);
  }

  std::optional<replication::StatusReply> GetStatus(size_t i) {
    auto c = replication::Client::Connect(nodes_.at(i).uri, ClientOpts());
    if (!c.ok()) return std::nullopt;
    auto s = (*c)->GetStatus();
    if (!s.ok()) return std::nullopt;
    return *s;
  }

  std::optional<replication::TreeStatus> TreeState(size_t i, const std::string& tree) {
    auto s = GetStatus(i);
    if (!s) return std::nullopt;
    for (const auto& t : s->trees) {
      if (t.tree == tree) return t;
    }
    return std::nullopt;
  }

  // Adds `count` nodes (the first EnableRaft() ones with the metadata raft),
  // each with `extra_args`, starts each and waits until every one lists all
  // of them. False when a node does not start or the membership does not
  // settle (a test failure says which).
  bool StartNodes(size_t count, const std::vector<std::string>& extra_args = {}) {
    for (size_t i = 0; i < count; ++i) {
      size_t index = AddNode(extra_args);
      if (!Start(index)) {
        ADD_FAILURE() << "node " << index + 1 << " did not start: " << Log(index);
        return false;
      }
    }
    if (WaitForMembers(nodes_.size())) return true;
    ADD_FAILURE() << "membership did not settle at " << nodes_.size() << " nodes: " << Log(0);
    return false;
  }

  // Waits until every running node lists `count` members.
  bool WaitForMembers(size_t count, std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    return WaitUntil(
        [&] {
          for (size_t i = 0; i < nodes_.size(); ++i) {
            if (nodes_[i].pid <= 0) continue;
            auto s = GetStatus(i);
            if (!s || s->nodes.size() != count) return false;
          }
          return true;
        },
        timeout);
  }

  // Index of the node whose URI is `uri`, or size() when none.
  size_t IndexOfUri(const std::string& uri) const {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].uri == uri) return i;
    }
    return nodes_.size();
  }
  size_t IndexOfId(const std::string& id) const {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].node_id == id) return i;
    }
    return nodes_.size();
  }

 private:
  TempDir tmp_;
  std::string listen_uri_ = FirstListenUri();  // SetListenUri overrides
  std::string secret_file_;
  std::vector<NodeProcess> nodes_;
  std::vector<std::string> raft_addresses_;
};

}  // namespace canopy::testing
