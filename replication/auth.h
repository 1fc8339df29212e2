// Cluster authentication: HMAC-SHA256 challenge-response over a shared secret.
//
// Both sides prove knowledge of the secret without sending it, each over a
// fresh random nonce of the other side, so a recorded handshake cannot be
// replayed and a node without the secret learns nothing usable:
//   listener proof = HMAC(secret, "canopy-auth-v1/listener" | transcript)
//   dialer proof   = HMAC(secret, "canopy-auth-v1/dialer"   | transcript)
//   transcript     = len-prefixed cluster, dialer id, listener id,
//                    dialer nonce, listener nonce
// Proofs are compared in constant time (CRYPTO_memcmp).
//
// Thread safety: pure functions (OpenSSL's RAND_bytes is thread-safe).
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy::replication {

// kNonceBytes of cryptographically random bytes; Internal if the RNG fails.
Result<std::string> RandomNonce();

enum class ProofSide { kListener, kDialer };

struct AuthTranscript {
  std::string_view cluster;
  std::string_view dialer_id;
  std::string_view listener_id;
  std::string_view dialer_nonce;
  std::string_view listener_nonce;
};

// The 32-byte HMAC-SHA256 proof of `side`.
std::string ComputeProof(std::string_view secret, ProofSide side, const AuthTranscript& transcript);

// Constant-time equality of two proofs (false when sizes differ).
bool ProofsEqual(std::string_view a, std::string_view b);

// The cluster secret from --secret or --secret-file (exactly one of them
// non-empty; a trailing newline of the file is dropped). InvalidArgument when
// both or neither are given or the secret is shorter than 8 bytes; the file's
// read error otherwise.
Result<std::string> LoadClusterSecret(std::string_view secret, const std::string& secret_file);

}  // namespace canopy::replication
