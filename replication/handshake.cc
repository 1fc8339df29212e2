#include "replication/handshake.h"

#include <fmt/format.h>

#include "replication/auth.h"

namespace canopy::replication {

void SendError(transport::Connection& conn, const Status& status) {
  ErrorMessage e;
  e.code = status.ok() ? StatusCode::kInternal : status.code();
  e.text = status.message().substr(0, kMaxTextBytes);
  (void)SendMessage(conn, e);
}

Status UnexpectedMessage(const transport::Message& message, std::string_view expected) {
  if (message.type == static_cast<uint16_t>(MessageType::kError)) {
    auto e = DecodeError(message.payload);
    if (!e.ok()) return e.status();
    return e->ToStatus().WithContext("peer reported");
  }
  return Status::Corruption(fmt::format("expected {}, got {}", expected, MessageTypeName(message.type)));
}

namespace {

Result<transport::Message> ReceiveExpecting(transport::Connection& conn, MessageType type, Deadline deadline) {
  CANOPY_ASSIGN_OR_RETURN(transport::Message m, conn.Receive(deadline));
  if (m.bulk_bytes != 0) return Status::Corruption("handshake message with bulk bytes");
  if (m.type != static_cast<uint16_t>(type)) {
    return UnexpectedMessage(m, MessageTypeName(static_cast<uint16_t>(type)));
  }
  return m;
}

// Sends the error to the peer and returns it.
Status Refuse(transport::Connection& conn, Status status) {
  SendError(conn, status);
  return status;
}

}  // namespace

Result<PeerIdentity> DialerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                     Deadline deadline) {
  Hello hello;
  hello.cluster = config.cluster;
  hello.node_id = config.node_id;
  hello.role = config.role;
  hello.protocol_version = kProtocolVersion;
  CANOPY_ASSIGN_OR_RETURN(hello.nonce, RandomNonce());
  hello.listen_uri = config.listen_uri;
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, hello));

  CANOPY_ASSIGN_OR_RETURN(transport::Message m, ReceiveExpecting(conn, MessageType::kChallenge, deadline));
  auto challenge = DecodeChallenge(m.payload);
  if (!challenge.ok()) return Refuse(conn, challenge.status());
  AuthTranscript t{config.cluster, config.node_id, challenge->node_id, hello.nonce, challenge->nonce};
  if (!ProofsEqual(challenge->proof, ComputeProof(config.secret, ProofSide::kListener, t))) {
    return Refuse(conn, Status::PermissionDenied(
                            fmt::format("{} (node {}) failed to prove the cluster secret", conn.peer_uri(),
                                        challenge->node_id)));
  }
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, Auth{ComputeProof(config.secret, ProofSide::kDialer, t)}));
  CANOPY_ASSIGN_OR_RETURN(transport::Message w, ReceiveExpecting(conn, MessageType::kWelcome, deadline));
  CANOPY_ASSIGN_OR_RETURN(Welcome welcome, DecodeWelcome(w.payload));
  if (welcome.node_id != challenge->node_id) {
    return Status::Corruption("WELCOME names another node than CHALLENGE");
  }
  return PeerIdentity{welcome.node_id, PeerRole::kNode, ""};
}

Result<PeerIdentity> ListenerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                       Deadline deadline) {
  auto m = ReceiveExpecting(conn, MessageType::kHello, deadline);
  if (!m.ok()) {
    if (m.status().IsCorruption()) return Refuse(conn, m.status());
    return m.status();
  }
  auto hello = DecodeHello(m->payload);
  if (!hello.ok()) return Refuse(conn, hello.status());
  if (hello->cluster != config.cluster) {
    return Refuse(conn, Status::PermissionDenied(fmt::format("wrong cluster '{}': this node belongs to '{}'",
                                                             hello->cluster, config.cluster)));
  }
  if (hello->protocol_version != kProtocolVersion) {
    return Refuse(conn, Status::NotSupported(fmt::format("protocol version {} not supported (this node speaks {})",
                                                         hello->protocol_version, kProtocolVersion)));
  }
  if (hello->node_id.empty()) return Refuse(conn, Status::InvalidArgument("HELLO without a node id"));
  Challenge challenge;
  challenge.node_id = config.node_id;
  CANOPY_ASSIGN_OR_RETURN(challenge.nonce, RandomNonce());
  AuthTranscript t{config.cluster, hello->node_id, config.node_id, hello->nonce, challenge.nonce};
  challenge.proof = ComputeProof(config.secret, ProofSide::kListener, t);
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, challenge));

  auto a = ReceiveExpecting(conn, MessageType::kAuth, deadline);
  if (!a.ok()) {
    if (a.status().IsCorruption()) return Refuse(conn, a.status());
    return a.status();
  }
  auto auth = DecodeAuth(a->payload);
  if (!auth.ok()) return Refuse(conn, auth.status());
  if (!ProofsEqual(auth->proof, ComputeProof(config.secret, ProofSide::kDialer, t))) {
    return Refuse(conn, Status::PermissionDenied(fmt::format(
                            "authentication failed for {} (node {}): wrong cluster secret", conn.peer_uri(),
                            hello->node_id)));
  }
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, Welcome{config.node_id}));
  return PeerIdentity{hello->node_id, hello->role, hello->listen_uri};
}

}  // namespace canopy::replication
