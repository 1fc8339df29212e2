// Mutual authentication over a shared secret: HMAC-SHA256 challenge-response,
// one implementation for every canopy protocol (replication peers, rcopy,
// bench). It sits in transport/ so that the tools can use it without
// depending on replication/.
//
// The exchange (four messages, the dialer speaks first):
//   HELLO      dialer -> listener   realm, dialer id, dialer nonce (+ protocol fields)
//   CHALLENGE  listener -> dialer   listener id, listener nonce, listener proof
//   AUTH       dialer -> listener   dialer proof
//   WELCOME    listener -> dialer   listener id
// Both sides prove knowledge of the secret without sending it, each over a
// fresh random nonce of the other side, so a recorded handshake cannot be
// replayed and a peer without the secret learns nothing usable:
//   listener proof = HMAC(secret, "canopy-auth-v1/listener" | transcript)
//   dialer proof   = HMAC(secret, "canopy-auth-v1/dialer"   | transcript)
//   transcript     = len-prefixed realm, dialer id, listener id,
//                    dialer nonce, listener nonce
// Proofs are compared in constant time (CRYPTO_memcmp). The listener reads
// nothing but HELLO and AUTH until the dialer's proof checked out, so a
// listener that authenticates before serving accepts no data byte from a
// peer without the secret.
//
// How the four messages are typed and encoded belongs to the protocol that
// carries them (AuthWire): replication keeps its HELLO/CHALLENGE/AUTH/WELCOME
// messages (replication/protocol.h), tools use BasicAuthWire.
//
// Thread safety: the free functions are pure (RAND_bytes is thread-safe); the
// exchanges use one connection from one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/result.h"
#include "transport/transport.h"

namespace canopy::transport {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kMinSecretBytes = 8;

// kAuthNonceBytes of cryptographically random bytes; Internal if the RNG fails.
Result<std::string> RandomNonce();

enum class ProofSide { kListener, kDialer };

struct AuthTranscript {
  std::string_view realm;  // the replication cluster, or a tool's name ("rcopy")
  std::string_view dialer_id;
  std::string_view listener_id;
  std::string_view dialer_nonce;
  std::string_view listener_nonce;
};

// The 32-byte HMAC-SHA256 proof of `side`.
std::string ComputeProof(std::string_view secret, ProofSide side, const AuthTranscript& transcript);

// Constant-time equality of two proofs (false when sizes differ or empty).
bool ProofsEqual(std::string_view a, std::string_view b);

// The shared secret from --secret or --secret-file (exactly one of them
// non-empty; trailing newlines of the file are dropped). InvalidArgument when
// both or neither are given or the secret is shorter than kMinSecretBytes;
// the file's read error otherwise.
Result<std::string> LoadSharedSecret(std::string_view secret, const std::string& secret_file);
// The secret in `secret_file` alone (tools without --secret).
Result<std::string> LoadSecretFile(const std::string& secret_file);

// ----------------------------------------------------------------- exchange

struct AuthHello {
  std::string realm;
  std::string id;
  std::string nonce;  // kAuthNonceBytes
};

struct AuthChallenge {
  std::string id;
  std::string nonce;  // kAuthNonceBytes
  std::string proof;  // kAuthProofBytes
};

// How one protocol types and encodes the exchange's messages.
class AuthWire {
 public:
  enum class Step : uint8_t { kHello, kChallenge, kProof, kWelcome };
  virtual ~AuthWire() = default;

  virtual uint16_t TypeOf(Step step) const = 0;
  // Encoders of each step; the protocol may add fields of its own to HELLO.
  virtual std::string EncodeHello(const AuthHello& hello) = 0;
  virtual std::string EncodeChallenge(const AuthChallenge& challenge) = 0;
  virtual std::string EncodeProof(std::string_view proof) = 0;
  virtual std::string EncodeWelcome(std::string_view id) = 0;
  // Decoders: Corruption for malformed payloads. DecodeHello may also refuse
  // a HELLO for reasons of the protocol's own (e.g. NotSupported: version).
  virtual Result<AuthHello> DecodeHello(std::string_view payload) = 0;
  virtual Result<AuthChallenge> DecodeChallenge(std::string_view payload) = 0;
  virtual Result<std::string> DecodeProof(std::string_view payload) = 0;
  virtual Result<std::string> DecodeWelcome(std::string_view payload) = 0;
  // Best-effort: tells the peer why it is refused.
  virtual void SendRefusal(Connection& conn, const Status& why) = 0;
  // The Status that a message of another type than `expected` stands for: the
  // error a refusal carries, else Corruption naming the unexpected type.
  virtual Status Unexpected(const Message& message, Step expected) = 0;
};

struct AuthIdentity {
  std::string realm;   // both sides must use the same
  std::string id;      // our name (non-empty)
  std::string secret;  // at least kMinSecretBytes
};

// Dialer side: returns the listener's id once it proved the secret and
// accepted ours. PermissionDenied when the listener cannot prove the secret
// (we tell it so) or refuses us; Corruption on malformed replies; transport
// errors as they come.
Result<std::string> AuthenticateDialer(Connection& conn, AuthWire& wire, const AuthIdentity& self,
                                       Deadline deadline);

// Listener side: returns the dialer's HELLO once it proved the secret.
// PermissionDenied for a wrong realm or a wrong proof, Corruption for a
// malformed or unexpected message, the wire's own refusals of HELLO; each is
// sent to the dialer (when the connection still works) before returning it.
Result<AuthHello> AuthenticateListener(Connection& conn, AuthWire& wire, const AuthIdentity& self,
                                       Deadline deadline);

// A self-contained wire for protocols without handshake messages of their
// own (rcopy, bench): five message types first_type .. first_type + 4 (HELLO,
// CHALLENGE, AUTH, WELCOME, REFUSED {status code, text}), little-endian
// length-prefixed fields. HELLO carries kBasicAuthVersion. A protocol may
// derive from it to send refusals as its own error message (so that a peer
// that does not authenticate still reads a clear error) and to recognise
// that message in Unexpected.
inline constexpr uint8_t kBasicAuthVersion = 1;
class BasicAuthWire : public AuthWire {
 public:
  explicit BasicAuthWire(uint16_t first_type) : first_type_(first_type) {}
  uint16_t TypeOf(Step step) const override;
  uint16_t refusal_type() const { return static_cast<uint16_t>(first_type_ + 4); }
  std::string EncodeHello(const AuthHello& hello) override;
  std::string EncodeChallenge(const AuthChallenge& challenge) override;
  std::string EncodeProof(std::string_view proof) override;
  std::string EncodeWelcome(std::string_view id) override;
  Result<AuthHello> DecodeHello(std::string_view payload) override;
  Result<AuthChallenge> DecodeChallenge(std::string_view payload) override;
  Result<std::string> DecodeProof(std::string_view payload) override;
  Result<std::string> DecodeWelcome(std::string_view payload) override;
  void SendRefusal(Connection& conn, const Status& why) override;
  Status Unexpected(const Message& message, Step expected) override;

 private:
  uint16_t first_type_;
};

}  // namespace canopy::transport
