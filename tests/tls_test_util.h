// Test certificates for tls+tcp://, made at test time with the OpenSSL API
// (nothing checked in, nothing to expire in the repository): a CA, server and
// client certificates it signs for 127.0.0.1 / ::1 / localhost, an expired
// server certificate, and a second CA with a server certificate of its own
// (the "wrong CA").
#pragma once

#include <string>
#include <vector>

namespace canopy::testing {

struct TestPki {
  std::string dir;
  std::string ca_cert;            // the CA everyone trusts
  std::string server_cert, server_key;    // signed by ca, SAN 127.0.0.1, ::1, localhost
  std::string client_cert, client_key;    // signed by ca (mutual TLS)
  std::string expired_cert, expired_key;  // signed by ca, valid until yesterday
  std::string other_ca_cert;              // another CA
  std::string other_server_cert, other_server_key;  // signed by the other CA
  std::string other_client_cert, other_client_key;  // signed by the other CA
  std::string self_signed_cert, self_signed_key;    // its own issuer
};

// Made once per process, in a temporary directory removed at exit. Aborts
// the test program if OpenSSL fails (a broken test environment).
const TestPki& GetTestPki();

// "cert=... key=..." / "ca=..." backend arguments.
std::vector<std::string> ServerTlsArgs(const TestPki& pki, bool require_client_cert = false);
std::vector<std::string> ClientTlsArgs(const TestPki& pki, bool with_client_cert = false);

}  // namespace canopy::testing
