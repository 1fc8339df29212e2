// Connection set-up between canopy peers: HELLO / CHALLENGE / AUTH / WELCOME
// with mutual HMAC-SHA256 authentication (the shared exchange of
// transport/auth.h carried by the messages of protocol.h), plus
// small helpers to send typed messages and errors on a transport Connection.
//
// A side that detects a problem (wrong cluster, wrong protocol version, bad
// proof, malformed message) sends ERROR {code, text} when it still can and
// returns the error; the caller then closes the connection.
//
// Thread safety: the functions use one connection from one thread.
#pragma once

#include <string>

#include "base/clock.h"
#include "base/result.h"
#include "replication/protocol.h"
#include "transport/transport.h"

namespace canopy::replication {

struct HandshakeConfig {
  std::string cluster;
  std::string node_id;     // our id (clients: any name)
  std::string secret;      // the shared cluster secret
  PeerRole role = PeerRole::kNode;
  std::string listen_uri;  // nodes: where we serve (sent in HELLO)
};

struct PeerIdentity {
  std::string node_id;
  PeerRole role = PeerRole::kNode;
  std::string listen_uri;  // from HELLO (listener side); empty for clients
};

// Dialer side. PermissionDenied when the listener refuses us or cannot prove
// the secret; Corruption on malformed replies; the ERROR the listener sent
// (as a Status) otherwise; transport errors as they come.
Result<PeerIdentity> DialerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                     Deadline deadline);

// Listener side: the peer's identity once it proved the secret.
Result<PeerIdentity> ListenerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                       Deadline deadline);

template <typename T>
Status SendMessage(transport::Connection& conn, const T& message) {
  return conn.Send(static_cast<uint16_t>(TypeOf(message)), Encode(message));
}

// Best-effort ERROR {status.code(), status.message()}.
void SendError(transport::Connection& conn, const Status& status);

// When `message` is an ERROR, the Status it carries (or Corruption if it does
// not decode); otherwise a Corruption naming the unexpected type.
Status UnexpectedMessage(const transport::Message& message, std::string_view expected);

}  // namespace canopy::replication
