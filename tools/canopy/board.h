// BoardService: the bulletin-board HTTP/JSON API that `canopy node --http`
// serves over the replicated tree store (the benchmark application).
//
// Data model (all trees replicated like any other, placed by the ring):
//   - A board NAME is one replicated tree "board.NAME", so boards spread over
//     the cluster and each has its own leader. Every post is exactly one
//     commit that inserts a child at index 0 of the root with the attributes
//     author, text, time_ms. Hence at version V the board holds V messages,
//     the message with id K (1, 2, 3, ...; K is also the version that added
//     it) is child V - K, and listing needs no per-message id attribute.
//     Board trees must be written through this API only; a board tree whose
//     child count differs from its version is reported as 500.
//   - The registry tree "boards" lists the boards: one root attribute per
//     board (key NAME, value {"created_ms": ...}).
//
// API (bodies are JSON; errors are {"error": "..."} with the status below):
//   POST /boards {"name": N}[?cl=CL]               201 {"name", "leader", "owners"}; 409 when it exists
//   POST /boards/N/messages[?cl=CL&timeout_ms=T] {"author": A, "text": X}
//                                                  201 {"id", "version", "acks", "cl"}
//   GET  /boards/N/messages[?after=K&limit=M&version=V&cl=RL]
//                                                  200 {"board", "version", "count", "messages": [
//                                                  {"id", "author", "text", "time_ms"}, ...], "next_after",
//                                                  "cl"}
//     A listing is one SLICE read (replication/protocol.h): the board root
//     and the children holding messages after+1 .. after+limit, all of one
//     version, in one round trip (or none: see local_slice below).
//     version=V lists the board as it was at version V (its first V
//     messages), while the answering node retains that version (canopy node
//     --keep-versions / --keep-seconds); 404 naming the oldest version held
//     otherwise; V is read at ONE only.
//   GET  /boards[?cl=RL]                           200 {"boards": ["a", ...]}
//   400 malformed JSON / missing or invalid fields or parameters, 404 unknown
//   board or path, 405 wrong method (with Allow), 413 field or body too large,
//   409 board exists, 503 cluster unreachable / no leader / too many requests
//   queued (Retry-After: 1), 504 consistency level not reached in time (the
//   reason, version and acks in the body; the message stays committed on the
//   leader and reaches the replicas later).
//   CL (writes) is ONE, QUORUM (default) or ALL. RL (reads) is ONE (default),
//   LEADER or QUORUM (see ReadLevel in replication/protocol.h): at ONE a
//   read goes to this node when it owns the tree, else to the first live
//   owner (ring from STATUS); a board not found there is looked up at its
//   leader before answering 404 (replicas hold a tree only from its first
//   commit on). LEADER is answered by the board's leader (through this node,
//   which redirects), QUORUM by this node gathering a quorum of owners.
//
// Serving many clients: http::Server runs one event thread; HandleAsync
// answers there only what cannot block — a GET at ONE that this node's own
// store answers through BoardOptions::local_slice (no network) — starts the
// listings it can without blocking (below), and hands everything else
// (posts, board creation, LEADER reads, what those listings cannot settle)
// to `workers` threads through a queue of at most max_queued requests
// (beyond it: 503 at once). So a write waiting for its consistency level holds one
// worker, never the other clients. workers = 0 serves everything on the
// event thread (the old behaviour).
// A listing at QUORUM starts on the event thread too, through
// local_slice_async: the node sends the owners' SLICEs on pipelined links
// and the last answer renders the listing. A listing at ONE of a board this
// node does not own (the newest version) is forwarded from the event
// thread, without a worker, through a
// SliceForwarder (replication/slice_forwarder.h): many SLICEs in flight on
// a few connections per owner, each answered by the forwarder's reader
// thread as its reply comes. Whatever that path cannot settle — no
// connection yet (a worker then dials one for the next reads), too many
// reads out, a failed link, or a reply other than OK (e.g. NotFound at a
// replica, which the blocking path asks the leader about) — goes to the
// workers as before, so the answer is the same either way.
//
// Metrics (base/metrics.h): canopy_board_listings_total{answered="here" |
// "forwarded" | "worker"} counts listings answered 200 from this node's own
// store on the event thread, through the forwarder, or by a worker.
//
// Thread safety: Handle and HandleAsync may be called from several threads
// at once (the server's event thread and the workers).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "base/metrics.h"
#include "replication/client.h"
#include "replication/ring.h"
#include "replication/slice_forwarder.h"
#include "tools/http/server.h"

namespace canopy::board {

struct BoardOptions {
  std::string node_uri;                // the local node (reads at ONE, cluster view)
  replication::ClientOptions client;   // cluster name, secret, per-request timeout
  // In-process SLICE of the local node (replication::Node::Slice), used in
  // place of an RPC to node_uri; empty: every read is an RPC.
  std::function<replication::SliceReply(const replication::SliceRequest&)> local_slice;
  // In-process QUORUM read of the local node that does not block
  // (replication::Node::SliceAsync), and the flush that sends what it
  // queued (Node::FlushSlices); empty: every QUORUM read takes a worker.
  std::function<bool(const replication::SliceRequest&, std::function<void(std::optional<replication::SliceReply>)>)>
      local_slice_async;
  std::function<void()> local_flush;
  uint32_t default_write_timeout_ms = 2000;
  uint32_t max_write_timeout_ms = 10000;
  uint32_t read_timeout_ms = 2000;     // LEADER / QUORUM reads: how long peers may take
  size_t max_name_bytes = 64;          // board names: [A-Za-z0-9_-]
  size_t max_author_bytes = 128;
  size_t max_text_bytes = 4096;
  uint32_t default_list_limit = 50;
  uint32_t max_list_limit = 200;
  std::chrono::milliseconds view_refresh{1000};  // how long a cluster view (STATUS) is reused
  size_t workers = 32;        // threads for requests that may block (0: all on the caller's thread)
  size_t max_queued = 4096;   // requests waiting for a worker; more are answered 503
  // Forwarded listings (see above): connections per owner, SLICEs in flight
  // per connection; 0 links: every forwarded read takes a worker.
  size_t forward_links_per_peer = 2;
  size_t forward_max_in_flight = 512;
};

// Tree names used for a board and for the registry.
std::string BoardTreeName(const std::string& board);
inline constexpr char kRegistryTree[] = "boards";
// True for 1..max_bytes characters of [A-Za-z0-9_-].
bool ValidBoardName(std::string_view name, size_t max_bytes);

class BoardService : public http::Handler {
 public:
  explicit BoardService(BoardOptions options);
  // Stops the workers; queued requests are answered 503.
  ~BoardService() override;

  // Answers on the calling thread, blocking as long as the request needs.
  http::Response Handle(const http::Request& request) override;
  // Answers now when that cannot block, starts a listing that can go out
  // without blocking (forwarded: answered later), else queues for a worker.
  std::optional<http::Response> HandleAsync(const http::Request& request, http::Responder& responder) override;
  // Sends the listings forwarded in this round of events.
  void AfterEvents() override;

  // Request bodies larger than this are refused with 413 by the server
  // (set ServerOptions::limits.max_body_bytes to it).
  size_t max_body_bytes() const { return options_.max_text_bytes + options_.max_author_bytes + 1024; }

 private:
  struct View;
  struct Job {
    http::Request request;
    http::Responder responder;
  };
  class ForwardedListing;
  // A listing's parameters, parsed from the query.
  struct Listing {
    replication::SliceRequest slice;
    uint64_t after = 0;
  };
  // may_block false: std::nullopt when answering would block (the caller
  // then queues the request for a worker) or when the request was
  // forwarded: then `*responder` was taken (left empty) and answers later.
  std::optional<http::Response> Route(const http::Request& request, bool may_block, http::Responder* responder);
  std::optional<http::Response> ListBoards(const http::Request& request, bool may_block);
  http::Response CreateBoard(const http::Request& request);
  http::Response PostMessage(const std::string& board, const http::Request& request);
  std::optional<http::Response> ListMessages(const std::string& board, const http::Request& request,
                                             bool may_block, http::Responder* responder);
  // The listing's parameters, or the 400 that answers a malformed query.
  std::variant<Listing, http::Response> ParseListing(const std::string& board, const http::Request& request) const;
  // Answers a listing from an OK SLICE reply (200, or 500 for a board tree
  // written outside the board API).
  http::Response RenderListing(const std::string& board, const Listing& listing,
                               const replication::SliceReply& reply) const;
  // Forwards a listing at ONE to the owner that ReadUri picks, when this
  // node does not own the board and a forwarder link is open, or starts a
  // QUORUM listing through local_slice_async; true when sent (`*responder`
  // taken).
  bool TryForwardListing(const std::string& board, const Listing& listing, const http::Request& request,
                         http::Responder* responder);
  // Queues `request` for a worker (or answers 503: too many queued, or stopping).
  void Enqueue(http::Request request, http::Responder responder);
  void WorkerLoop();

  // Pooled clients by URI: taken by one thread, given back after a call.
  std::unique_ptr<replication::Client> TakeClient(const std::string& uri, Status* error);
  void GiveClient(std::unique_ptr<replication::Client> client);
  // A SLICE routed by its level (see the API above); std::nullopt only when
  // !may_block and answering would block.
  std::optional<Result<replication::SliceReply>> SliceRead(const replication::SliceRequest& request, bool may_block);
  Result<replication::SliceReply> SliceFrom(const std::string& uri, const replication::SliceRequest& request);
  Result<replication::CommitReply> Commit(const replication::CommitRequest& request);
  Result<replication::CreateTreeReply> CreateTree(const std::string& tree);
  // The cluster view; refreshed (STATUS of the local node) when older than
  // view_refresh and may_block; possibly invalid (never fetched).
  std::shared_ptr<const View> CurrentView(bool may_block);
  // Whether the event thread may route by `view`: younger than view_refresh,
  // or younger than twice that while a worker refreshes it. The first
  // request that finds it stale goes to a worker, which refreshes; those
  // after it need not queue behind that STATUS round trip. (A route from an
  // old view that is wrong fails over to a worker like any refused read.)
  bool RoutableFromEventThread(const View& view) const;
  std::string ReadUri(const View& view, const std::string& tree) const;
  std::string WriteUri(const View& view, const std::string& tree) const;
  Status EnsureRegistry();

  BoardOptions options_;
  std::mutex clients_mu_;
  std::map<std::string, std::vector<std::unique_ptr<replication::Client>>> idle_clients_;  // by URI
  std::mutex view_mu_;
  std::shared_ptr<const View> view_;
  std::atomic<bool> refreshing_{false};
  std::atomic<bool> registry_ready_{false};
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;  // (jobs_mu_)
  std::vector<std::thread> workers_;
  std::unique_ptr<replication::SliceForwarder> forwarder_;  // null when workers or forward_links_per_peer is 0
  // canopy_board_listings_total by how the listing was answered.
  prometheus::Counter& listings_here_;
  prometheus::Counter& listings_forwarded_;
  prometheus::Counter& listings_by_worker_;
};

}  // namespace canopy::board
