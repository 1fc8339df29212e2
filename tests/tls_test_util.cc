#include "tests/tls_test_util.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "tests/testing/test_util.h"

namespace canopy::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "tls_test_util: %s failed\n", what);
  std::abort();
}

struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertDeleter {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using Cert = std::unique_ptr<X509, CertDeleter>;

Key NewKey() {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  if (key == nullptr) Die("EVP_PKEY_Q_keygen");
  return Key(key);
}

void AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr || X509_add_ext(cert, ext, -1) != 1) Die("X509_add_ext");
  X509_EXTENSION_free(ext);
}

// issuer == nullptr: self-signed. Validity in seconds relative to now.
Cert MakeCert(EVP_PKEY* key, const char* common_name, X509* issuer, EVP_PKEY* issuer_key, bool ca,
              long not_before, long not_after) {
  static long serial = 1;
  Cert cert(X509_new());
  X509* x = cert.get();
  if (x == nullptr || X509_set_version(x, 2) != 1) Die("X509_new");
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), not_before);
  X509_gmtime_adj(X509_getm_notAfter(x), not_after);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name), -1, -1,
                             0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : x;
  AddExtension(x, signer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  AddExtension(x, signer, NID_subject_key_identifier, "hash");
  if (ca) {
    AddExtension(x, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    AddExtension(x, signer, NID_key_usage, "critical,digitalSignature");
    AddExtension(x, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    AddExtension(x, signer, NID_subject_alt_name, "IP:127.0.0.1,IP:::1,DNS:localhost");
  }
  if (X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) Die("X509_sign");
  return cert;
}

void WriteCert(const std::string& path, X509* cert) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || PEM_write_X509(f, cert) != 1) Die("PEM_write_X509");
  std::fclose(f);
}

void WriteKey(const std::string& path, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    Die("PEM_write_PrivateKey");
  }
  std::fclose(f);
}

constexpr long kDay = 24 * 3600;

TestPki MakePki(const std::string& dir) {
  TestPki pki;
  pki.dir = dir;
  auto file = [&](const char* name) { return dir + "/" + name; };

  Key ca_key = NewKey();
  Cert ca = MakeCert(ca_key.get(), "canopy test CA", nullptr, nullptr, true, -kDay, 30 * kDay);
  pki.ca_cert = file("ca.pem");
  WriteCert(pki.ca_cert, ca.get());

  auto leaf = [&](const char* name, X509* issuer, EVP_PKEY* issuer_key, long not_before, long not_after,
                  std::string* cert_path, std::string* key_path) {
    Key key = NewKey();
    Cert cert = MakeCert(key.get(), name, issuer, issuer_key, false, not_before, not_after);
    *cert_path = file((std::string(name) + ".pem").c_str());
    *key_path = file((std::string(name) + ".key").c_str());
    WriteCert(*cert_path, cert.get());
    WriteKey(*key_path, key.get());
  };
  leaf("server", ca.get(), ca_key.get(), -kDay, 30 * kDay, &pki.server_cert, &pki.server_key);
  leaf("client", ca.get(), ca_key.get(), -kDay, 30 * kDay, &pki.client_cert, &pki.client_key);
  leaf("expired", ca.get(), ca_key.get(), -3 * kDay, -kDay, &pki.expired_cert, &pki.expired_key);
  leaf("self-signed", nullptr, nullptr, -kDay, 30 * kDay, &pki.self_signed_cert, &pki.self_signed_key);

  Key other_key = NewKey();
  Cert other = MakeCert(other_key.get(), "another CA", nullptr, nullptr, true, -kDay, 30 * kDay);
  pki.other_ca_cert = file("other-ca.pem");
  WriteCert(pki.other_ca_cert, other.get());
  leaf("other-server", other.get(), other_key.get(), -kDay, 30 * kDay, &pki.other_server_cert,
       &pki.other_server_key);
  leaf("other-client", other.get(), other_key.get(), -kDay, 30 * kDay, &pki.other_client_cert,
       &pki.other_client_key);
  return pki;
}

}  // namespace

const TestPki& GetTestPki() {
  static TempDir* dir = new TempDir();  // removed by the atexit hook below
  static const TestPki pki = [] {
    std::atexit([] { delete dir; });
    return MakePki(dir->path());
  }();
  return pki;
}

std::vector<std::string> ServerTlsArgs(const TestPki& pki, bool require_client_cert) {
  std::vector<std::string> args{"cert=" + pki.server_cert, "key=" + pki.server_key};
  if (require_client_cert) args.push_back("ca=" + pki.ca_cert);
  return args;
}

std::vector<std::string> ClientTlsArgs(const TestPki& pki, bool with_client_cert) {
  std::vector<std::string> args{"ca=" + pki.ca_cert};
  if (with_client_cert) {
    args.push_back("cert=" + pki.client_cert);
    args.push_back("key=" + pki.client_key);
  }
  return args;
}

}  // namespace canopy::testing
