// Shared-secret mutual authentication: proofs, secrets, the exchange, and
// the basic wire used by the tools.

#include "transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <string>

#include <fmt/format.h>

#include "base/coding.h"
#include "base/file.h"

namespace canopy::transport {

Result<std::string> RandomNonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    return Status::Internal("RAND_bytes failed to produce a nonce");
  }
  return nonce;
}

std::string ComputeProof(std::string_view secret, ProofSide side, const AuthTranscript& t) {
  std::string message = side == ProofSide::kListener ? "canopy-auth-v1/listener" : "canopy-auth-v1/dialer";
  PutLengthPrefixed(&message, t.realm);
  PutLengthPrefixed(&message, t.dialer_id);
  PutLengthPrefixed(&message, t.listener_id);
  PutLengthPrefixed(&message, t.dialer_nonce);
  PutLengthPrefixed(&message, t.listener_nonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &out_len);
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

bool ProofsEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size() || a.empty()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::string> LoadSharedSecret(std::string_view secret, const std::string& secret_file) {
  if (!secret.empty() && !secret_file.empty()) {
    return Status::InvalidArgument("give the secret with --secret or --secret-file, not both");
  }
  std::string value;
  if (!secret_file.empty()) {
    CANOPY_ASSIGN_OR_RETURN(value, ReadFileToString(secret_file, 64 * 1024));
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
    if (value.empty()) return Status::InvalidArgument("the secret file " + secret_file + " is empty");
  } else {
    value = std::string(secret);
  }
  if (value.empty()) {
    return Status::InvalidArgument("a shared secret is required: --secret TEXT or --secret-file PATH");
  }
  if (value.size() < kMinSecretBytes) {
    return Status::InvalidArgument("the shared secret must be at least " + std::to_string(kMinSecretBytes) +
                                   " bytes long");
  }
  return value;
}

Result<std::string> LoadSecretFile(const std::string& secret_file) {
  if (secret_file.empty()) return Status::InvalidArgument("--secret-file needs a path");
  return LoadSharedSecret("", secret_file);
}

// ----------------------------------------------------------------- exchange

namespace {

using Step = AuthWire::Step;

Result<Message> ReceiveStep(Connection& conn, AuthWire& wire, Step step, Deadline deadline) {
  CANOPY_ASSIGN_OR_RETURN(Message m, conn.Receive(deadline));
  if (m.type != wire.TypeOf(step)) return wire.Unexpected(m, step);
  if (m.bulk_bytes != 0) return Status::Corruption("handshake message with bulk bytes");
  return m;
}

// Sends the refusal to the peer and returns it.
Status Refuse(Connection& conn, AuthWire& wire, Status status) {
  wire.SendRefusal(conn, status);
  return status;
}

// A receive failure on the listener side: protocol violations and refusals
// are told to the dialer; transport errors (it went away, timed out, we were
// closed) are just returned.
Status RefuseIfMalformed(Connection& conn, AuthWire& wire, Status status) {
  if (status.IsClosed() || status.IsUnavailable() || status.IsTimeout() || status.code() == StatusCode::kAborted) {
    return status;
  }
  return Refuse(conn, wire, std::move(status));
}

}  // namespace

Result<std::string> AuthenticateDialer(Connection& conn, AuthWire& wire, const AuthIdentity& self,
                                       Deadline deadline) {
  AuthHello hello;
  hello.realm = self.realm;
  hello.id = self.id;
  CANOPY_ASSIGN_OR_RETURN(hello.nonce, RandomNonce());
  CANOPY_RETURN_IF_ERROR(conn.Send(wire.TypeOf(Step::kHello), wire.EncodeHello(hello)));

  CANOPY_ASSIGN_OR_RETURN(Message m, ReceiveStep(conn, wire, Step::kChallenge, deadline));
  auto challenge = wire.DecodeChallenge(m.payload);
  if (!challenge.ok()) return Refuse(conn, wire, challenge.status());
  AuthTranscript t{self.realm, self.id, challenge->id, hello.nonce, challenge->nonce};
  if (!ProofsEqual(challenge->proof, ComputeProof(self.secret, ProofSide::kListener, t))) {
    return Refuse(conn, wire,
                  Status::PermissionDenied(conn.peer_uri() + " (" + challenge->id +
                                           ") failed to prove the shared secret: wrong secret on one side"));
  }
  CANOPY_RETURN_IF_ERROR(
      conn.Send(wire.TypeOf(Step::kProof), wire.EncodeProof(ComputeProof(self.secret, ProofSide::kDialer, t))));
  CANOPY_ASSIGN_OR_RETURN(Message w, ReceiveStep(conn, wire, Step::kWelcome, deadline));
  CANOPY_ASSIGN_OR_RETURN(std::string welcome_id, wire.DecodeWelcome(w.payload));
  if (welcome_id != challenge->id) return Status::Corruption("WELCOME names another peer than CHALLENGE");
  return welcome_id;
}

Result<AuthHello> AuthenticateListener(Connection& conn, AuthWire& wire, const AuthIdentity& self,
                                       Deadline deadline) {
  auto m = ReceiveStep(conn, wire, Step::kHello, deadline);
  if (!m.ok()) return RefuseIfMalformed(conn, wire, m.status());
  auto hello = wire.DecodeHello(m->payload);
  if (!hello.ok()) return Refuse(conn, wire, hello.status());
  if (hello->realm != self.realm) {
    return Refuse(conn, wire,
                  Status::PermissionDenied("wrong cluster '" + hello->realm + "': this side belongs to '" +
                                           self.realm + "'"));
  }
  if (hello->id.empty()) return Refuse(conn, wire, Status::InvalidArgument("HELLO without a peer id"));
  AuthChallenge challenge;
  challenge.id = self.id;
  CANOPY_ASSIGN_OR_RETURN(challenge.nonce, RandomNonce());
  AuthTranscript t{self.realm, hello->id, self.id, hello->nonce, challenge.nonce};
  challenge.proof = ComputeProof(self.secret, ProofSide::kListener, t);
  CANOPY_RETURN_IF_ERROR(conn.Send(wire.TypeOf(Step::kChallenge), wire.EncodeChallenge(challenge)));

  auto a = ReceiveStep(conn, wire, Step::kProof, deadline);
  if (!a.ok()) return RefuseIfMalformed(conn, wire, a.status());
  auto proof = wire.DecodeProof(a->payload);
  if (!proof.ok()) return Refuse(conn, wire, proof.status());
  if (!ProofsEqual(*proof, ComputeProof(self.secret, ProofSide::kDialer, t))) {
    return Refuse(conn, wire,
                  Status::PermissionDenied("authentication failed for " + conn.peer_uri() + " (" + hello->id +
                                           "): wrong shared secret"));
  }
  CANOPY_RETURN_IF_ERROR(conn.Send(wire.TypeOf(Step::kWelcome), wire.EncodeWelcome(self.id)));
  return std::move(hello).value();
}

// ------------------------------------------------------------ BasicAuthWire

namespace {

constexpr size_t kMaxIdBytes = 1024;
constexpr size_t kMaxRefusalText = 16 * 1024;

Result<std::string> ReadField(ByteReader& r, size_t max, const char* what) {
  auto bytes = r.ReadLengthPrefixed(max);
  if (!bytes.ok()) return Status::Corruption(std::string("handshake field ") + what + ": " + bytes.status().message());
  return std::string(*bytes);
}

Result<std::string> ReadFixedField(ByteReader& r, size_t size, const char* what) {
  CANOPY_ASSIGN_OR_RETURN(std::string value, ReadField(r, size, what));
  if (value.size() != size) {
    return Status::Corruption(std::string("handshake field ") + what + " has " + std::to_string(value.size()) +
                              " bytes, expected " + std::to_string(size));
  }
  return value;
}

Status ExpectEnd(const ByteReader& r, const char* message) {
  if (!r.empty()) return Status::Corruption(std::string(message) + " has trailing bytes");
  return Status::Ok();
}

const char* StepName(Step step) {
  switch (step) {
    case Step::kHello: return "HELLO";
    case Step::kChallenge: return "CHALLENGE";
    case Step::kProof: return "AUTH";
    case Step::kWelcome: return "WELCOME";
  }
  return "?";
}

}  // namespace

uint16_t BasicAuthWire::TypeOf(Step step) const {
  return static_cast<uint16_t>(first_type_ + static_cast<uint16_t>(step));
}

std::string BasicAuthWire::EncodeHello(const AuthHello& hello) {
  std::string out;
  PutFixed8(&out, kBasicAuthVersion);
  PutLengthPrefixed(&out, hello.realm);
  PutLengthPrefixed(&out, hello.id);
  PutLengthPrefixed(&out, hello.nonce);
  return out;
}

std::string BasicAuthWire::EncodeChallenge(const AuthChallenge& challenge) {
  std::string out;
  PutLengthPrefixed(&out, challenge.id);
  PutLengthPrefixed(&out, challenge.nonce);
  PutLengthPrefixed(&out, challenge.proof);
  return out;
}

std::string BasicAuthWire::EncodeProof(std::string_view proof) {
  std::string out;
  PutLengthPrefixed(&out, proof);
  return out;
}

std::string BasicAuthWire::EncodeWelcome(std::string_view id) {
  std::string out;
  PutLengthPrefixed(&out, id);
  return out;
}

Result<AuthHello> BasicAuthWire::DecodeHello(std::string_view payload) {
  ByteReader r(payload);
  auto version = r.ReadFixed8();
  if (!version.ok()) return Status::Corruption("empty HELLO");
  if (*version != kBasicAuthVersion) {
    return Status::NotSupported("authentication version " + std::to_string(*version) +
                                " not supported (this side speaks " + std::to_string(kBasicAuthVersion) + ")");
  }
  AuthHello hello;
  CANOPY_ASSIGN_OR_RETURN(hello.realm, ReadField(r, kMaxIdBytes, "realm"));
  CANOPY_ASSIGN_OR_RETURN(hello.id, ReadField(r, kMaxIdBytes, "id"));
  CANOPY_ASSIGN_OR_RETURN(hello.nonce, ReadFixedField(r, kAuthNonceBytes, "nonce"));
  CANOPY_RETURN_IF_ERROR(ExpectEnd(r, "HELLO"));
  return hello;
}

Result<AuthChallenge> BasicAuthWire::DecodeChallenge(std::string_view payload) {
  ByteReader r(payload);
  AuthChallenge challenge;
  CANOPY_ASSIGN_OR_RETURN(challenge.id, ReadField(r, kMaxIdBytes, "id"));
  CANOPY_ASSIGN_OR_RETURN(challenge.nonce, ReadFixedField(r, kAuthNonceBytes, "nonce"));
  CANOPY_ASSIGN_OR_RETURN(challenge.proof, ReadFixedField(r, kAuthProofBytes, "proof"));
  CANOPY_RETURN_IF_ERROR(ExpectEnd(r, "CHALLENGE"));
  return challenge;
}

Result<std::string> BasicAuthWire::DecodeProof(std::string_view payload) {
  ByteReader r(payload);
  CANOPY_ASSIGN_OR_RETURN(std::string proof, ReadFixedField(r, kAuthProofBytes, "proof"));
  CANOPY_RETURN_IF_ERROR(ExpectEnd(r, "AUTH"));
  return proof;
}

Result<std::string> BasicAuthWire::DecodeWelcome(std::string_view payload) {
  ByteReader r(payload);
  CANOPY_ASSIGN_OR_RETURN(std::string id, ReadField(r, kMaxIdBytes, "id"));
  CANOPY_RETURN_IF_ERROR(ExpectEnd(r, "WELCOME"));
  return id;
}

void BasicAuthWire::SendRefusal(Connection& conn, const Status& why) {
  std::string out;
  PutFixed8(&out, static_cast<uint8_t>(why.ok() ? StatusCode::kInternal : why.code()));
  PutLengthPrefixed(&out, std::string_view(why.message()).substr(0, kMaxRefusalText));
  (void)conn.Send(refusal_type(), out);
}

Status BasicAuthWire::Unexpected(const Message& message, Step expected) {
  if (message.type == refusal_type()) {
    ByteReader r(message.payload);
    auto code = r.ReadFixed8();
    if (!code.ok() || *code == 0 || *code > static_cast<uint8_t>(StatusCode::kClosed)) {
      return Status::Corruption("malformed authentication refusal from the peer");
    }
    auto text = r.ReadLengthPrefixed(kMaxRefusalText);
    if (!text.ok()) return Status::Corruption("malformed authentication refusal from the peer");
    return Status(static_cast<StatusCode>(*code), "refused by the peer: " + std::string(*text));
  }
  if (expected == Step::kHello) {
    return Status::PermissionDenied(fmt::format(
        "authentication required: the peer sent message type 0x{:04x} instead of the HELLO of the shared-secret "
        "handshake (it runs without the secret?)",
        message.type));
  }
  return Status::Corruption(fmt::format("expected {} in the authentication handshake, got message type 0x{:04x}",
                                        StepName(expected), message.type));
}

}  // namespace canopy::transport
