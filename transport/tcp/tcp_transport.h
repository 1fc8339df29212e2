// The kernel-TCP backend: tcp://host:port (IPv4, IPv6 in brackets, hostnames).
//
// Non-blocking sockets; every wait is a poll(2) on the socket plus an eventfd
// that Close() signals, so a Close() from another thread wakes blocked calls
// (they return Aborted). TCP_NODELAY is on by default, socket buffers are
// sized from TransportOptions::buffer_bytes (0 leaves the kernel's
// autotuning alone). Frames follow transport/frame.h; Send writes header and
// payload with one sendmsg (no concatenation), file bulk goes out with
// sendfile(2) and is received into files with splice(2) through a pipe
// (falling back to pread/send and read/pwrite where the file cannot be
// spliced); memory bulk is read straight into the caller's buffer.
//
// URI parameters (tcp://h:p?nodelay=0):
//   nodelay=0|1   TCP_NODELAY on the connection's sockets (default 1)
//   zerocopy=0|1  file bulk via sendfile/splice (default 1); 0 copies through
//                 a user-space buffer (pread+send, recv+pwrite), for comparison
//                 and for file systems where splice is slow
// Unknown parameters are refused with InvalidArgument; TLS settings (cert=,
// ca=, ...) on tcp:// are refused with a pointer to tls+tcp:// below.
//
// Close semantics: Shutdown() sends FIN after all queued data (the peer's
// Receive returns Closed once it has read everything). Close() and the
// destructor close the socket; the peer then reads what was already queued
// and sees the end of the stream (Closed at a message boundary, Unavailable
// in the middle of a message). A connection reset is Unavailable.
//
// Process-wide side effect: creating a TCP transport sets SIGPIPE to SIG_IGN
// if it still has its default action (sendfile(2) cannot suppress SIGPIPE
// per call the way send(MSG_NOSIGNAL) does; a dead peer is reported as
// Unavailable instead of killing the process).
#pragma once

#include <memory>

#include "base/result.h"
#include "base/status.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace canopy::transport {

// A TCP transport with the given options.
Result<std::shared_ptr<Transport>> CreateTcpTransport(const TransportOptions& options);

// Registers scheme "tcp" with CreateTcpTransport as factory. AlreadyExists
// if "tcp" is registered already.
Status RegisterTcpTransport(TransportRegistry& registry);

// tls+tcp://host:port: the same backend with TLS 1.3 (OpenSSL) on every
// connection. The TLS settings (tls.h: cert=, key=, ca=, verify_host=,
// server_name=, ktls=) come from TransportOptions::backend_args as
// "key=value" words and from the URI's parameters (which win); the TCP
// parameters above work too. A listener needs cert and key; with ca it
// demands a client certificate signed by that CA (mutual TLS). A dialer
// verifies the server against ca (default: the system trust store) and, with
// verify_host=1 (default), that the certificate names the host dialed.
// TLS 1.3 only; no session tickets, no renegotiation.
//
// Handshakes: Connect runs the client's within connect_timeout and fails
// with its error. Accept returns at once; the server's handshake runs on a
// short-lived thread of the connection (at most max(io_timeout,
// connect_timeout)), so an accept loop never waits on a client; the
// connection's first Send/Receive waits for it (within its own deadline) and
// fails with its error, and so does every later call. Under TLS 1.3 a server
// checks a client certificate after the client's handshake is over: a
// refused client learns it on its first Receive (PermissionDenied).
// Errors: PermissionDenied when a certificate does not verify (expired,
// unknown CA, wrong host, missing client certificate) or the peer refuses
// ours; Corruption when the peer does not speak TLS (plaintext on a TLS
// port); Unavailable when the peer hangs up mid-handshake (e.g. a plain
// tcp:// server). After the handshake, the error table of transport.h holds.
//
// Kernel TLS: where OpenSSL and the kernel hand a direction to the kernel,
// that direction keeps sendfile/splice and plain socket calls; otherwise it
// runs in user space (file bulk through a buffer) and the reason is logged
// once per process (warn).
Result<std::shared_ptr<Transport>> CreateTlsTcpTransport(const TransportOptions& options);
Status RegisterTlsTcpTransport(TransportRegistry& registry);

}  // namespace canopy::transport
