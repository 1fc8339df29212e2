// TLS 1.3 for the TCP backend (OpenSSL): tls+tcp://host:port.
//
// Private to transport/tcp/. A TlsContext (one SSL_CTX) is made per
// listener and per outgoing connection from a TlsConfig; a TlsSession is one
// SSL object on a connection's (non-blocking) socket.
//
// Kernel TLS: contexts ask OpenSSL for kTLS (SSL_OP_ENABLE_KTLS). After the
// handshake, ktls_send() / ktls_recv() say which directions the kernel
// encrypts: there the datapath keeps its plain socket calls, sendfile(2) and
// splice(2) included, and the kernel makes the records. A direction without
// kTLS goes through SSL_write / SSL_read (user-space TLS, file bulk through
// a buffer); the reason is logged once per process (KtlsUnavailableReason).
// OpenSSL 3.0 offers kTLS receive for TLS 1.2 only, so under TLS 1.3 the
// receiving side is user-space there; kTLS needs the kernel's "tls" module
// (net.ipv4.tcp_available_ulp lists "tls").
//
// Thread safety: OpenSSL forbids concurrent calls on one SSL, so every
// TlsSession call takes the session's mutex for the duration of one
// non-blocking OpenSSL call (waits for the socket happen outside it).
#pragma once

#include <openssl/ssl.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/status.h"

namespace canopy::transport::tcp_internal {

// TLS settings. Sources, later ones winning: TransportOptions::backend_args
// given as "key=value" words, then the URI's query parameters:
//   cert=PATH        PEM certificate chain (required to listen; optional to
//                    connect: the client certificate for mutual TLS)
//   key=PATH         PEM private key of cert
//   ca=PATH          PEM CA certificates. Dialer: verifies the server against
//                    them (default: the system's trust store). Listener:
//                    requires and verifies a client certificate (mutual TLS).
//   verify_host=0|1  dialer: the server certificate must name the host it
//                    dialed (DNS name or IP address SAN; default 1)
//   server_name=NAME dialer: the name to expect and send as SNI instead
//   ktls=0|1         ask for kernel TLS (default 1); 0 for comparison
struct TlsConfig {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  std::string server_name;
  bool verify_host = true;
  bool ktls = true;
};

// Whether `key` is one of the TLS parameters above.
bool IsTlsParameter(const std::string& key);

// Builds the config for one endpoint and removes the TLS parameters from
// `params` (what is left goes to the TCP parser). InvalidArgument for a
// malformed value or a backend argument that is not a TLS "key=value".
Result<TlsConfig> ExtractTlsConfig(std::map<std::string, std::string>* params,
                                   const std::vector<std::string>& backend_args);

class TlsContext {
 public:
  // Loads certificates and keys. InvalidArgument when a listener has no
  // cert/key or key is given without cert; the file / OpenSSL error (e.g.
  // "key does not match the certificate") otherwise.
  static Result<std::shared_ptr<TlsContext>> Create(const TlsConfig& config, bool server);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const { return ctx_; }
  const TlsConfig& config() const { return config_; }
  bool server() const { return server_; }

 private:
  TlsContext(SSL_CTX* ctx, TlsConfig config, bool server) : ctx_(ctx), config_(std::move(config)), server_(server) {}
  SSL_CTX* ctx_;
  const TlsConfig config_;
  const bool server_;
};

// Result of one non-blocking TLS read or write.
enum class TlsIo { kDone, kWantRead, kWantWrite, kClosed, kFailed };

class TlsSession {
 public:
  // An SSL on `fd` (not owned, never closed by the session). host: what the
  // dialer dialed (for SNI and host verification); unused by listeners.
  static Result<std::unique_ptr<TlsSession>> Create(std::shared_ptr<TlsContext> context, int fd,
                                                    const std::string& host);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Runs the handshake once (later calls return the first outcome; a call
  // while another runs it waits for that one, up to `deadline`). Waits on
  // fd and wake_fd (Aborted when it fires) until `deadline` (Timeout; a
  // Timeout or Aborted outcome is not kept, the next call tries again).
  // PermissionDenied when the peer's certificate does not verify or the
  // peer refuses ours; Unavailable when it goes away; Corruption when it does
  // not speak TLS (e.g. plaintext on a TLS port).
  Status Handshake(int wake_fd, Deadline deadline, const std::string& peer_uri);
  bool handshake_done() const { return done_.load(std::memory_order_acquire); }

  // Valid after a successful Handshake().
  bool ktls_send() const { return ktls_send_; }
  bool ktls_recv() const { return ktls_recv_; }

  // One SSL_read / SSL_write of at most n bytes; *done counts the bytes on
  // kDone. kFailed sets *error (Unavailable / Corruption with OpenSSL's reason).
  TlsIo Read(char* dst, size_t n, size_t* done, Status* error, const std::string& peer_uri);
  TlsIo Write(const char* src, size_t n, size_t* done, Status* error, const std::string& peer_uri);

  // After a failed write: the refusal the peer sent before it hung up (an
  // alert already received, e.g. a client certificate it rejected), as
  // PermissionDenied; OK when there is none. Consumes nothing (SSL_peek).
  Status PeerRefusal(const std::string& peer_uri);

  // Best effort: queues close_notify (never waits).
  void SendCloseNotify();

 private:
  TlsSession(std::shared_ptr<TlsContext> context, SSL* ssl, int fd)
      : context_(std::move(context)), ssl_(ssl), fd_(fd) {}
  Status RunHandshake(int wake_fd, Deadline deadline, const std::string& peer_uri);

  const std::shared_ptr<TlsContext> context_;
  std::mutex mu_;  // every call on ssl_
  SSL* ssl_;
  const int fd_;
  std::mutex handshake_mu_;
  std::condition_variable handshake_cv_;
  bool handshake_running_ = false;  // guarded by handshake_mu_
  std::atomic<bool> done_{false};
  Status handshake_status_;  // written under handshake_mu_ before done_; constant after
  bool ktls_send_ = false;   // written once, before done_ is set
  bool ktls_recv_ = false;
};

// Why kernel TLS is not in use for a direction on this host ("" when the
// kernel offers it): e.g. "the kernel has no tls module (tcp_available_ulp:
// mptcp)".
std::string KtlsUnavailableReason();

}  // namespace canopy::transport::tcp_internal
