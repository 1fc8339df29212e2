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
//   GET  /boards                                   200 {"boards": ["a", ...]}
//   POST /boards {"name": N}[?cl=CL]               201 {"name", "leader", "owners"}; 409 when it exists
//   POST /boards/N/messages[?cl=CL&timeout_ms=T] {"author": A, "text": X}
//                                                  201 {"id", "version", "acks", "cl"}
//   GET  /boards/N/messages[?after=K&limit=M&version=V]
//                                                  200 {"board", "version", "count", "messages": [
//                                                  {"id", "author", "text", "time_ms"}, ...], "next_after"}
//     A listing is one consistent snapshot: every message is read at the
//     version the listing started at. version=V lists the board as it was at
//     version V (its first V messages), while the answering node retains that
//     version (canopy node --keep-versions / --keep-seconds); 404 naming the
//     oldest version held otherwise.
//   400 malformed JSON / missing or invalid fields or parameters, 404 unknown
//   board or path, 405 wrong method (with Allow), 413 field or body too large,
//   409 board exists, 503 cluster unreachable / no leader, 504 consistency
//   level not reached in time (the reason, version and acks in the body; the
//   message stays committed on the leader and reaches the replicas later).
//   CL is ONE, QUORUM (default) or ALL. Reads are at ONE: from this node when
//   it owns the tree, else from the first live owner (ring from STATUS); a
//   board not found there is looked up at its leader before answering 404
//   (replicas hold a tree only from its first commit on).
//
// Limitation: http::Server calls the handler on its single thread, so a
// write that waits for its consistency level stalls every other HTTP client
// of this node for up to timeout_ms (default 2000 ms, at most 10000). Reads
// and writes that reach their level are fast (loopback RPCs).
//
// Thread safety: Handle is called by one thread at a time (the server's).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "replication/client.h"
#include "replication/ring.h"
#include "tools/http/server.h"

namespace canopy::board {

struct BoardOptions {
  std::string node_uri;                // the local node (reads at ONE, cluster view)
  replication::ClientOptions client;   // cluster name, secret, per-request timeout
  uint32_t default_write_timeout_ms = 2000;
  uint32_t max_write_timeout_ms = 10000;
  size_t max_name_bytes = 64;          // board names: [A-Za-z0-9_-]
  size_t max_author_bytes = 128;
  size_t max_text_bytes = 4096;
  uint32_t default_list_limit = 50;
  uint32_t max_list_limit = 200;
  std::chrono::milliseconds view_refresh{1000};  // how long a cluster view (STATUS) is reused
};

// Tree names used for a board and for the registry.
std::string BoardTreeName(const std::string& board);
inline constexpr char kRegistryTree[] = "boards";
// True for 1..max_bytes characters of [A-Za-z0-9_-].
bool ValidBoardName(std::string_view name, size_t max_bytes);

class BoardService : public http::Handler {
 public:
  explicit BoardService(BoardOptions options);
  ~BoardService() override;

  http::Response Handle(const http::Request& request) override;

  // Request bodies larger than this are refused with 413 by the server
  // (set ServerOptions::limits.max_body_bytes to it).
  size_t max_body_bytes() const { return options_.max_text_bytes + options_.max_author_bytes + 1024; }

 private:
  struct View;
  http::Response ListBoards();
  http::Response CreateBoard(const http::Request& request);
  http::Response PostMessage(const std::string& board, const http::Request& request);
  http::Response ListMessages(const std::string& board, const http::Request& request);

  // A connected client for `uri` (connects on first use); null and *error set on failure.
  replication::Client* ClientFor(const std::string& uri, Status* error);
  // Drops the client of `uri` after a transport error (the next call reconnects).
  void DropClient(const std::string& uri);
  // Read at ONE of `tree` at `path`, from this node or the first live owner.
  // A root read that finds no tree there is retried at the tree's leader
  // (replicas create a tree on its first commit only).
  // *used_uri (when given) is set to the node that answered.
  // `version` 0 reads the newest version, any other that past version (if
  // the answering node still retains it).
  Result<replication::ReadReply> Read(const std::string& tree, const std::vector<uint32_t>& path,
                                      std::string* used_uri = nullptr, uint64_t version = 0);
  Result<replication::ReadReply> ReadFrom(const std::string& uri, const std::string& tree,
                                          const std::vector<uint32_t>& path, uint64_t version = 0);
  Result<replication::CommitReply> Commit(const replication::CommitRequest& request);
  Result<replication::CreateTreeReply> CreateTree(const std::string& tree);
  // URI to read `tree` from, and the tree's ring leader URI to write to.
  std::string ReadUri(const std::string& tree);
  std::string WriteUri(const std::string& tree);
  void RefreshView();
  Status EnsureRegistry();

  BoardOptions options_;
  std::map<std::string, std::unique_ptr<replication::Client>> clients_;  // by URI
  std::unique_ptr<View> view_;
  bool registry_ready_ = false;
};

}  // namespace canopy::board
