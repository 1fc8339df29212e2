// TLS 1.3 over the TCP backend's sockets: configuration, contexts, the
// handshake and one-call reads and writes (see tls.h).

#include "transport/tcp/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/opensslv.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/file.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport_impl.h"

namespace canopy::transport::tcp_internal {
namespace {

// The first queued OpenSSL error as text (and the queue emptied), or `fallback`.
std::string OpenSslError(std::string_view fallback = "unknown OpenSSL error") {
  unsigned long first = ERR_get_error();
  while (ERR_get_error() != 0) {
  }
  if (first == 0) return std::string(fallback);
  const char* reason = ERR_reason_error_string(first);
  if (reason != nullptr) return reason;
  char text[256];
  ERR_error_string_n(first, text, sizeof(text));
  return text;
}

Result<bool> ParseFlag(const std::string& key, const std::string& value) {
  if (value == "1" || value == "true") return true;
  if (value == "0" || value == "false") return false;
  return Status::InvalidArgument("tls parameter " + key + " must be 0 or 1, got '" + value + "'");
}

Status SetTlsValue(TlsConfig* config, const std::string& key, const std::string& value) {
  if (key == "cert") {
    config->cert_file = value;
  } else if (key == "key") {
    config->key_file = value;
  } else if (key == "ca") {
    config->ca_file = value;
  } else if (key == "server_name") {
    config->server_name = value;
  } else if (key == "verify_host") {
    CANOPY_ASSIGN_OR_RETURN(config->verify_host, ParseFlag(key, value));
  } else if (key == "ktls") {
    CANOPY_ASSIGN_OR_RETURN(config->ktls, ParseFlag(key, value));
  } else {
    return Status::InvalidArgument("unknown tls parameter '" + key + "'");
  }
  if (value.empty()) return Status::InvalidArgument("tls parameter " + key + " needs a value");
  return Status::Ok();
}

Status CheckReadable(const std::string& path, std::string_view what) {
  if (::access(path.c_str(), R_OK) != 0) {
    return ErrnoStatus(errno, "tls+tcp: cannot read the " + std::string(what) + " file " + path);
  }
  return Status::Ok();
}

bool IsIpLiteral(const std::string& host) {
  in6_addr v6{};
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

// Handshake failure -> Status (see Handshake() in tls.h). Called with the
// session's mutex held, right after the failing call.
Status HandshakeFailure(SSL* ssl, int ssl_error, int saved_errno, const std::string& peer_uri) {
  const std::string where = "TLS handshake with " + peer_uri;
  long verify = SSL_get_verify_result(ssl);
  unsigned long first = ERR_peek_error();
  std::string reason = OpenSslError("");
  if (ssl_error == SSL_ERROR_SSL && verify != X509_V_OK) {
    ERR_clear_error();
    return Status::PermissionDenied(where + ": the peer's certificate does not verify: " +
                                    X509_verify_cert_error_string(verify));
  }
  if (ssl_error == SSL_ERROR_SSL && first != 0) {
    int code = ERR_GET_REASON(first);
    if (ERR_GET_LIB(first) == ERR_LIB_SSL && code >= SSL_AD_REASON_OFFSET) {
      return Status::PermissionDenied(where + ": the peer refused the handshake: " + reason);
    }
    if (ERR_GET_LIB(first) == ERR_LIB_SSL &&
        (code == SSL_R_WRONG_VERSION_NUMBER || code == SSL_R_HTTP_REQUEST || code == SSL_R_HTTPS_PROXY_REQUEST ||
         code == SSL_R_PACKET_LENGTH_TOO_LONG ||
         code == SSL_R_UNEXPECTED_MESSAGE)) {
      return Status::Corruption(where + ": the peer does not speak TLS (" + reason +
                                "); is it a plain tcp:// endpoint?");
    }
    return Status::PermissionDenied(where + " failed: " + (reason.empty() ? "protocol error" : reason));
  }
  if (ssl_error == SSL_ERROR_SYSCALL && saved_errno != 0) {
    return Status::Unavailable(where + ": " + std::strerror(saved_errno));
  }
  return Status::Unavailable(where + ": the peer closed the connection during the handshake (does it speak "
                             "TLS with a certificate this side accepts? a plain tcp:// server closes at once)");
}

std::once_flag ktls_note_once;

}  // namespace

bool IsTlsParameter(const std::string& key) {
  return key == "cert" || key == "key" || key == "ca" || key == "server_name" || key == "verify_host" ||
         key == "ktls";
}

Result<TlsConfig> ExtractTlsConfig(std::map<std::string, std::string>* params,
                                   const std::vector<std::string>& backend_args) {
  TlsConfig config;
  for (const std::string& arg : backend_args) {
    size_t eq = arg.find('=');
    std::string key = arg.substr(0, eq);
    if (eq == std::string::npos || !IsTlsParameter(key)) {
      return Status::InvalidArgument("tls+tcp backend argument '" + arg +
                                     "' is not a TLS setting (known: cert=, key=, ca=, verify_host=, "
                                     "server_name=, ktls=)");
    }
    CANOPY_RETURN_IF_ERROR(SetTlsValue(&config, key, arg.substr(eq + 1)));
  }
  for (auto it = params->begin(); it != params->end();) {
    if (IsTlsParameter(it->first)) {
      CANOPY_RETURN_IF_ERROR(SetTlsValue(&config, it->first, it->second));
      it = params->erase(it);
    } else {
      ++it;
    }
  }
  return config;
}

// ----------------------------------------------------------------- TlsContext

Result<std::shared_ptr<TlsContext>> TlsContext::Create(const TlsConfig& config, bool server) {
  if (server && (config.cert_file.empty() || config.key_file.empty())) {
    return Status::InvalidArgument(
        "a tls+tcp listener needs its certificate and key: cert=PATH and key=PATH (URI parameters or "
        "backend arguments)");
  }
  if (config.cert_file.empty() != config.key_file.empty()) {
    return Status::InvalidArgument("tls+tcp: cert= and key= go together");
  }
  if (!config.cert_file.empty()) {
    CANOPY_RETURN_IF_ERROR(CheckReadable(config.cert_file, "certificate"));
    CANOPY_RETURN_IF_ERROR(CheckReadable(config.key_file, "key"));
  }
  if (!config.ca_file.empty()) CANOPY_RETURN_IF_ERROR(CheckReadable(config.ca_file, "CA"));

  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return Status::Internal("SSL_CTX_new: " + OpenSslError());
  std::shared_ptr<TlsContext> context(new TlsContext(ctx, config, server));
  auto fail = [](std::string what) { return Status::InvalidArgument("tls+tcp: " + what + ": " + OpenSslError()); };

  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1) return fail("cannot require TLS 1.3");
  // AES-GCM first: what kernel TLS implements (and AES-NI makes fast).
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256") !=
      1) {
    return fail("cannot set the TLS 1.3 cipher suites");
  }
  uint64_t options = SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION;
  if (config.ktls) options |= SSL_OP_ENABLE_KTLS;
  SSL_CTX_set_options(ctx, options);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_clear_mode(ctx, SSL_MODE_AUTO_RETRY);
  // No session tickets: nothing arrives after the handshake but data and
  // close_notify (kernel TLS receive would trip over other records).
  if (server) (void)SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // User-space receive: pull several records per recv(2), not one.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 256 << 10);

  if (!config.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, config.cert_file.c_str()) != 1) {
      return fail("cannot load the certificate " + config.cert_file);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, config.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return fail("cannot load the private key " + config.key_file);
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      return fail("the key " + config.key_file + " does not match the certificate " + config.cert_file);
    }
  }
  if (!config.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, config.ca_file.c_str(), nullptr) != 1) {
      return fail("cannot load the CA certificates " + config.ca_file);
    }
  } else if (!server && SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return fail("cannot load the system's trust store");
  }
  if (server) {
    // ca= on a listener: mutual TLS, a client without a valid certificate is refused.
    SSL_CTX_set_verify(ctx, config.ca_file.empty() ? SSL_VERIFY_NONE : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  return context;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

// ----------------------------------------------------------------- TlsSession

Result<std::unique_ptr<TlsSession>> TlsSession::Create(std::shared_ptr<TlsContext> context, int fd,
                                                       const std::string& host) {
  ERR_clear_error();
  SSL* ssl = SSL_new(context->get());
  if (ssl == nullptr) return Status::Internal("SSL_new: " + OpenSslError());
  std::unique_ptr<TlsSession> session(new TlsSession(context, ssl, fd));
  if (SSL_set_fd(ssl, fd) != 1) return Status::Internal("SSL_set_fd: " + OpenSslError());
  if (context->server()) {
    SSL_set_accept_state(ssl);
    return session;
  }
  SSL_set_connect_state(ssl);
  const TlsConfig& config = context->config();
  const std::string name = config.server_name.empty() ? host : config.server_name;
  const bool ip = IsIpLiteral(name);
  if (!ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
    return Status::InvalidArgument("tls+tcp: bad server name '" + name + "': " + OpenSslError());
  }
  if (config.verify_host) {
    int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) : SSL_set1_host(ssl, name.c_str());
    if (ok != 1) return Status::InvalidArgument("tls+tcp: cannot verify against '" + name + "': " + OpenSslError());
  }
  return session;
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

Status TlsSession::Handshake(int wake_fd, Deadline deadline, const std::string& peer_uri) {
  // handshake_status_ is written once, before done_ is released.
  if (done_.load(std::memory_order_acquire)) return handshake_status_;
  std::unique_lock<std::mutex> lock(handshake_mu_);
  while (handshake_running_) {
    if (deadline.infinite()) {
      handshake_cv_.wait(lock);
    } else if (deadline.expired()) {
      return Status::Timeout("TLS handshake with " + peer_uri + ": deadline passed");
    } else {
      handshake_cv_.wait_for(lock, deadline.remaining());
    }
  }
  if (done_.load(std::memory_order_acquire)) return handshake_status_;
  handshake_running_ = true;
  lock.unlock();
  Status s = RunHandshake(wake_fd, deadline, peer_uri);
  lock.lock();
  handshake_running_ = false;
  // A Timeout or a local Close() may be retried; the peer's refusal may not.
  if (!s.IsTimeout() && s.code() != StatusCode::kAborted) {
    handshake_status_ = s;
    done_.store(true, std::memory_order_release);
  }
  handshake_cv_.notify_all();
  return s;
}

Status TlsSession::RunHandshake(int wake_fd, Deadline deadline, const std::string& peer_uri) {
  for (;;) {
    short events = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ERR_clear_error();
      errno = 0;
      int rc = SSL_do_handshake(ssl_);
      if (rc == 1) break;
      int saved_errno = errno;
      int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ) {
        events = POLLIN;
      } else if (err == SSL_ERROR_WANT_WRITE) {
        events = POLLOUT;
      } else {
        return HandshakeFailure(ssl_, err, saved_errno, peer_uri);
      }
    }
    Status waited = WaitReady(fd_, wake_fd, events, deadline.poll_timeout_ms());
    if (waited.IsTimeout()) return Status::Timeout("TLS handshake with " + peer_uri + ": deadline passed");
    if (waited.code() == StatusCode::kAborted) return Status::Aborted("connection was closed locally (Close())");
    CANOPY_RETURN_IF_ERROR(waited);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ktls_send_ = context_->config().ktls && BIO_get_ktls_send(SSL_get_wbio(ssl_));
    ktls_recv_ = context_->config().ktls && BIO_get_ktls_recv(SSL_get_rbio(ssl_));
  }
  if (context_->config().ktls && (!ktls_send_ || !ktls_recv_)) {
    std::call_once(ktls_note_once, [&] {
      std::string why = KtlsUnavailableReason();
      if (why.empty()) {
        why = std::string(OPENSSL_VERSION_TEXT) + " did not hand " +
              (!ktls_send_ && !ktls_recv_ ? "either direction" : !ktls_send_ ? "sending" : "receiving") +
              " to the kernel (under TLS 1.3, OpenSSL 3.0 offloads sending only)";
      }
      CANOPY_LOG(kWarn, "tls+tcp: kernel TLS {}: {}; {} in user space (SSL_read/SSL_write, no {})",
                 ktls_send_ || ktls_recv_ ? "in part only" : "not in use", why,
                 !ktls_send_ && !ktls_recv_ ? "both directions run" : !ktls_send_ ? "sending runs" : "receiving runs",
                 !ktls_send_ && !ktls_recv_ ? "sendfile/splice" : !ktls_send_ ? "sendfile" : "splice");
    });
  }
  CANOPY_LOG(kDebug, "tls+tcp: {} with {} ({}), kTLS send {} receive {}", SSL_get_version(ssl_), peer_uri,
             SSL_get_cipher_name(ssl_), ktls_send_, ktls_recv_);
  return Status::Ok();
}

TlsIo TlsSession::Read(char* dst, size_t n, size_t* done, Status* error, const std::string& peer_uri) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  errno = 0;
  int rc = SSL_read(ssl_, dst, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (rc > 0) {
    *done = static_cast<size_t>(rc);
    return TlsIo::kDone;
  }
  int saved_errno = errno;
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ: return TlsIo::kWantRead;
    case SSL_ERROR_WANT_WRITE: return TlsIo::kWantWrite;
    case SSL_ERROR_ZERO_RETURN: return TlsIo::kClosed;
    case SSL_ERROR_SYSCALL:
      if (saved_errno == 0) return TlsIo::kClosed;
      *error = Status::Unavailable("receive from " + peer_uri + ": " + std::strerror(saved_errno));
      return TlsIo::kFailed;
    default: {
      unsigned long first = ERR_peek_error();
      if (ERR_GET_LIB(first) == ERR_LIB_SSL && ERR_GET_REASON(first) >= SSL_AD_REASON_OFFSET) {
        // Under TLS 1.3 a server refuses a client certificate after the
        // client's handshake is over: the refusal arrives as an alert here.
        *error = Status::PermissionDenied("TLS session with " + peer_uri + " ended by the peer: " + OpenSslError());
      } else {
        *error = Status::Corruption("TLS record from " + peer_uri + ": " + OpenSslError());
      }
      return TlsIo::kFailed;
    }
  }
}

TlsIo TlsSession::Write(const char* src, size_t n, size_t* done, Status* error, const std::string& peer_uri) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  errno = 0;
  int rc = SSL_write(ssl_, src, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (rc > 0) {
    *done = static_cast<size_t>(rc);
    return TlsIo::kDone;
  }
  int saved_errno = errno;
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ: return TlsIo::kWantRead;
    case SSL_ERROR_WANT_WRITE: return TlsIo::kWantWrite;
    case SSL_ERROR_ZERO_RETURN: return TlsIo::kClosed;
    case SSL_ERROR_SYSCALL:
      *error = Status::Unavailable("send to " + peer_uri + ": " +
                                   (saved_errno != 0 ? std::strerror(saved_errno) : "connection lost"));
      return TlsIo::kFailed;
    default:
      *error = Status::Unavailable("TLS send to " + peer_uri + ": " + OpenSslError());
      return TlsIo::kFailed;
  }
}

Status TlsSession::PeerRefusal(const std::string& peer_uri) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  char byte;
  int rc = SSL_peek(ssl_, &byte, 1);
  if (rc <= 0 && SSL_get_error(ssl_, rc) == SSL_ERROR_SSL) {
    unsigned long first = ERR_peek_error();
    if (ERR_GET_LIB(first) == ERR_LIB_SSL && ERR_GET_REASON(first) >= SSL_AD_REASON_OFFSET) {
      return Status::PermissionDenied("TLS session with " + peer_uri + " ended by the peer: " + OpenSslError());
    }
  }
  ERR_clear_error();
  return Status::Ok();
}

void TlsSession::SendCloseNotify() {
  if (!done_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

std::string KtlsUnavailableReason() {
  auto ulps = ReadFileToString("/proc/sys/net/ipv4/tcp_available_ulp", 4096);
  if (!ulps.ok()) return "cannot read /proc/sys/net/ipv4/tcp_available_ulp: " + ulps.status().message();
  std::string list = *ulps;
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
  if ((" " + list + " ").find(" tls ") == std::string::npos) {
    return "the kernel has no tls module (net.ipv4.tcp_available_ulp: '" + list + "'; modprobe tls)";
  }
  return "";
}

}  // namespace canopy::transport::tcp_internal
