#include "replication/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "base/coding.h"
#include "base/file.h"
#include "replication/protocol.h"

namespace canopy::replication {

Result<std::string> RandomNonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    return Status::Internal("RAND_bytes failed to produce a nonce");
  }
  return nonce;
}

std::string ComputeProof(std::string_view secret, ProofSide side, const AuthTranscript& t) {
  std::string message = side == ProofSide::kListener ? "canopy-auth-v1/listener" : "canopy-auth-v1/dialer";
  PutLengthPrefixed(&message, t.cluster);
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

Result<std::string> LoadClusterSecret(std::string_view secret, const std::string& secret_file) {
  if (!secret.empty() && !secret_file.empty()) {
    return Status::InvalidArgument("give the cluster secret with --secret or --secret-file, not both");
  }
  std::string value;
  if (!secret_file.empty()) {
    CANOPY_ASSIGN_OR_RETURN(value, ReadFileToString(secret_file, 64 * 1024));
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
  } else {
    value = std::string(secret);
  }
  if (value.empty()) {
    return Status::InvalidArgument("a cluster secret is required: --secret TEXT or --secret-file PATH");
  }
  if (value.size() < 8) return Status::InvalidArgument("the cluster secret must be at least 8 bytes long");
  return value;
}

}  // namespace canopy::replication
