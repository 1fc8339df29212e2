#include "replication/handshake.h"

#include <fmt/format.h>

#include "transport/auth.h"

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

using Step = transport::AuthWire::Step;

// The shared exchange (transport/auth.h) carried by replication's own
// HELLO / CHALLENGE / AUTH / WELCOME / ERROR messages. HELLO adds the role,
// the protocol version and the listen URI; the listener keeps the last HELLO
// it decoded so that the caller learns the peer's identity.
class ReplicationAuthWire final : public transport::AuthWire {
 public:
  explicit ReplicationAuthWire(const HandshakeConfig& config) : config_(config) {}

  uint16_t TypeOf(Step step) const override {
    switch (step) {
      case Step::kHello: return static_cast<uint16_t>(MessageType::kHello);
      case Step::kChallenge: return static_cast<uint16_t>(MessageType::kChallenge);
      case Step::kProof: return static_cast<uint16_t>(MessageType::kAuth);
      case Step::kWelcome: return static_cast<uint16_t>(MessageType::kWelcome);
    }
    return 0;
  }
  std::string EncodeHello(const transport::AuthHello& hello) override {
    return Encode(Hello{hello.realm, hello.id, config_.role, kProtocolVersion, hello.nonce, config_.listen_uri});
  }
  std::string EncodeChallenge(const transport::AuthChallenge& c) override {
    return Encode(Challenge{c.id, c.nonce, c.proof});
  }
  std::string EncodeProof(std::string_view proof) override { return Encode(Auth{std::string(proof)}); }
  std::string EncodeWelcome(std::string_view id) override { return Encode(Welcome{std::string(id)}); }

  Result<transport::AuthHello> DecodeHello(std::string_view payload) override {
    CANOPY_ASSIGN_OR_RETURN(Hello hello, replication::DecodeHello(payload));
    if (hello.cluster == config_.cluster && hello.protocol_version != kProtocolVersion) {
      return Status::NotSupported(fmt::format("protocol version {} not supported (this node speaks {})",
                                              hello.protocol_version, kProtocolVersion));
    }
    last_hello_ = hello;
    return transport::AuthHello{hello.cluster, hello.node_id, hello.nonce};
  }
  Result<transport::AuthChallenge> DecodeChallenge(std::string_view payload) override {
    CANOPY_ASSIGN_OR_RETURN(Challenge c, replication::DecodeChallenge(payload));
    return transport::AuthChallenge{c.node_id, c.nonce, c.proof};
  }
  Result<std::string> DecodeProof(std::string_view payload) override {
    CANOPY_ASSIGN_OR_RETURN(Auth auth, DecodeAuth(payload));
    return auth.proof;
  }
  Result<std::string> DecodeWelcome(std::string_view payload) override {
    CANOPY_ASSIGN_OR_RETURN(Welcome welcome, replication::DecodeWelcome(payload));
    return welcome.node_id;
  }
  void SendRefusal(transport::Connection& conn, const Status& why) override { SendError(conn, why); }
  Status Unexpected(const transport::Message& message, Step expected) override {
    return UnexpectedMessage(message, MessageTypeName(TypeOf(expected)));
  }

  const Hello& last_hello() const { return last_hello_; }

 private:
  const HandshakeConfig& config_;
  Hello last_hello_;
};

transport::AuthIdentity IdentityOf(const HandshakeConfig& config) {
  return transport::AuthIdentity{config.cluster, config.node_id, config.secret};
}

}  // namespace

Result<PeerIdentity> DialerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                     Deadline deadline) {
  ReplicationAuthWire wire(config);
  CANOPY_ASSIGN_OR_RETURN(std::string listener_id,
                          transport::AuthenticateDialer(conn, wire, IdentityOf(config), deadline));
  return PeerIdentity{std::move(listener_id), PeerRole::kNode, ""};
}

Result<PeerIdentity> ListenerHandshake(transport::Connection& conn, const HandshakeConfig& config,
                                       Deadline deadline) {
  ReplicationAuthWire wire(config);
  CANOPY_ASSIGN_OR_RETURN(transport::AuthHello hello,
                          transport::AuthenticateListener(conn, wire, IdentityOf(config), deadline));
  const Hello& full = wire.last_hello();
  return PeerIdentity{hello.id, full.role, full.listen_uri};
}

}  // namespace canopy::replication
