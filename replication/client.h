// Client: talks to a canopy node as an authenticated client (role kClient):
// CREATE_TREE, COMMIT, READ, SLICE, STATUS. Used by the `canopy` CLI and the tests.
//
// CreateTree and Commit follow one redirect: a node that does not lead the
// tree answers Unavailable with the leader's URI, and the client reconnects
// there (and keeps that connection for later calls on the same leader).
//
// Errors: the transport's (Unavailable, Timeout, ...), PermissionDenied when
// the node refuses our secret or cluster name, Corruption on a malformed
// reply. A reply's own status (e.g. NotFound, Conflict, Timeout of a write
// that did not reach its consistency level) is in the reply's `status`.
//
// Thread safety: one thread at a time per Client.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "base/result.h"
#include "replication/handshake.h"
#include "replication/protocol.h"
#include "transport/transport.h"

namespace canopy::replication {

struct ClientOptions {
  std::string cluster;
  std::string secret;
  std::string client_id;  // empty: "client-<pid>"
  std::chrono::milliseconds timeout{10000};  // per request
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const std::string& uri, const ClientOptions& options);

  Result<CreateTreeReply> CreateTree(const std::string& tree);
  Result<CommitReply> Commit(const CommitRequest& request);
  Result<ReadReply> Read(const ReadRequest& request);
  // SLICE: a node and a slice of its children, at request.level. LEADER
  // follows one redirect to the tree's leader (as Commit does); the reply
  // says which node's copy it is (answered_by).
  Result<SliceReply> Slice(const SliceRequest& request);
  Result<StatusReply> GetStatus();

  // URI of the node this client is connected to now.
  const std::string& connected_uri() const { return uri_; }

 private:
  Client(ClientOptions options) : options_(std::move(options)) {}
  Status Open(const std::string& uri);
  Result<transport::Message> Call(MessageType type, const std::string& payload, MessageType reply_type,
                                  std::chrono::milliseconds extra_wait = {});

  ClientOptions options_;
  std::string uri_;
  std::unique_ptr<transport::Connection> conn_;
};

}  // namespace canopy::replication
