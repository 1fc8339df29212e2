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
// Unknown parameters are refused with InvalidArgument.
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

}  // namespace canopy::transport
