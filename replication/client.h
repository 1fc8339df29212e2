// Client: talks to a canopy node as an authenticated client (role kClient):
// CREATE_TREE, COMMIT, READ, SLICE, STATUS. Used by the `canopy` CLI, `canopy
// bench`, the board and the tests.
//
// Multiplexing: Commit may be called from many threads at once on one
// Client; their requests share one connection (per node), each carries a
// sequence number and the replies, which the node sends as each commit
// reaches its consistency level, are matched to their callers by it. A
// caller waiting for its reply never holds back another caller's request.
// There is no reader thread: one waiting caller at a time receives for all
// of them and hands each reply to its own caller (a lone caller gets its
// reply on its own thread, with no switch).
// CreateTree, Read and GetStatus are thread safe too; their replies come
// back in request order on the same connection.
//
// Redirects: a node that does not lead the tree answers Unavailable with the
// leader's URI, and the client reconnects there (and keeps that connection
// for later calls). CreateTree follows one redirect, Commit up to two; a
// Commit goes first to the node that last took a commit of the same tree
// (trees spread over the ring have different leaders).
//
// Idempotent retry: every Commit carries a request id (the client's name,
// unique per Client object, plus its sequence number). When a commit fails
// without an answer — the connection broke or no reply came in time — or a
// node answers Unavailable without naming a leader, the client finds the
// tree's current leader (asking, with STATUS, the nodes it knows: the one it
// connected to, those redirects named, ClientOptions::nodes and the members
// any STATUS reply listed; until the request's time is up) and sends the
// same commit there once more. The store remembers request ids in the
// replicated WAL (tree/store.h), so a commit that had landed before the
// failure is not applied again: the reply then has `duplicate` set and the
// version the first attempt made. A request whose `client` the caller set
// itself keeps that id (so two Client objects can retry each other's
// commits). A reply that arrived (OK, Conflict, Timeout of the consistency
// level, ...) is returned as it is, never retried.
//
// Errors: the transport's (Unavailable, Timeout, ...), PermissionDenied when
// the node refuses our secret or cluster name, Corruption on a malformed
// reply. A reply's own status (e.g. NotFound, Conflict, Timeout of a write
// that did not reach its consistency level) is in the reply's `status`.
//
// Thread safety: every method may be called from any number of threads.
// Destroying the Client (no call may be running) closes its connections.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "replication/handshake.h"
#include "replication/protocol.h"
#include "transport/transport.h"

namespace canopy::replication {

struct ClientOptions {
  std::string cluster;
  std::string secret;
  std::string client_id;  // empty: "client-<pid>"; a random part is added for request ids
  std::chrono::milliseconds timeout{10000};  // per request (a commit: plus its own timeout_ms)
  // More nodes of the cluster to ask for a tree's leader when a commit must
  // be retried (see above).
  std::vector<std::string> nodes;
  // Retry a commit that failed without an answer once (see above).
  bool retry = true;
};

// Dials `uri` and authenticates as a client named `name` (role kClient,
// options.cluster / options.secret), both within `timeout`: the connection
// every Client channel, and SliceForwarder's links, start from.
Result<std::unique_ptr<transport::Connection>> DialAsClient(const std::string& uri, const ClientOptions& options,
                                                            const std::string& name,
                                                            std::chrono::milliseconds timeout);

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const std::string& uri, const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Result<CreateTreeReply> CreateTree(const std::string& tree);
  // Fills request.client and request.sequence unless request.client is set.
  Result<CommitReply> Commit(const CommitRequest& request);
  // Pipelined commits from the calling thread: keeps up to `depth` commits
  // in flight on one connection, taking each next request from `next`
  // (false: no more), and hands each reply to `on_reply` with its request
  // and the time from its send to its reply, as replies arrive (in any
  // order), on this thread and with no lock held. Requests get a request
  // id as in Commit (unless request.client is set). The connection is the
  // one to the node that last took a commit of the first request's tree
  // (else the current node); meant for one tree's commits. A redirect (that
  // node does not lead the tree: nothing was applied) is followed as
  // Commit follows it, at most twice per request: the flights on the old
  // connection land first, then the refused requests go to the leader.
  // No retry: a commit that fails without an answer (the connection broke,
  // or no reply within options.timeout + its timeout_ms) reaches on_reply
  // with that failure, and may or may not have landed (Commit with the same
  // request id settles it). Returns Ok once `next` is exhausted and every
  // reply was handed over; the connection's failure once it broke (every
  // flight out reported first; no new request is taken after that).
  // InvalidArgument for depth 0. Thread safety: any number of pipelines and
  // other calls on one Client at once; `next` and `on_reply` are called
  // only from the calling thread.
  using PipelinedReply =
      std::function<void(const CommitRequest& request, Result<CommitReply> reply, std::chrono::nanoseconds latency)>;
  Status CommitPipelined(size_t depth, const std::function<bool(CommitRequest*)>& next,
                         const PipelinedReply& on_reply);
  Result<ReadReply> Read(const ReadRequest& request);
  // SLICE: a node and a slice of its children, at request.level. LEADER
  // follows one redirect to the tree's leader (as Commit does); the reply
  // says which node's copy it is (answered_by).
  Result<SliceReply> Slice(const SliceRequest& request);
  Result<StatusReply> GetStatus();

  // URI of the node this client sends requests to now.
  std::string connected_uri() const;
  // The `client` part of this client's request ids.
  const std::string& name() const { return name_; }
  // Commits sent a second time after a failure (see above), since Connect.
  uint64_t retries() const { return retries_.load(); }

 private:
  class Channel;
  explicit Client(ClientOptions options);

  // The open connection to `uri`, dialled (within dial_timeout; 0: the
  // request timeout) if there is none or it broke.
  Result<std::shared_ptr<Channel>> ChannelTo(const std::string& uri,
                                             std::chrono::milliseconds dial_timeout = std::chrono::milliseconds(0));
  std::shared_ptr<Channel> Current();
  void SetCurrent(const std::string& uri);
  Result<transport::Message> Call(MessageType type, const std::string& payload, MessageType reply_type);
  // Asks the known nodes for `tree`'s leader until `deadline`; returns its
  // URI once a node names a leader other than `failed_uri`, or names
  // `failed_uri` and it answers again.
  Result<std::string> LocateLeader(const std::string& tree, const std::string& failed_uri, Deadline deadline);
  void Learn(const StatusReply& status);

  const ClientOptions options_;
  const std::string name_;
  std::atomic<uint64_t> next_sequence_{1};
  std::atomic<uint64_t> retries_{0};

  mutable std::mutex mu_;  // guards the fields below
  std::string uri_;        // current node
  std::map<std::string, std::shared_ptr<Channel>> channels_;  // by URI
  std::set<std::string> known_uris_;
  std::map<std::string, std::string> leader_of_;  // tree -> URI that last took a commit of it
};

}  // namespace canopy::replication
