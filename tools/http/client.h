// Client-side helpers shared by tools/get and tools/load: name resolution,
// connecting with a deadline, request building and reading a response head.
//
// Thread safety: all functions are reentrant.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/fd.h"
#include "base/result.h"
#include "tools/http/message.h"
#include "tools/http/parser.h"
#include "tools/http/url.h"

namespace canopy::http {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string ToString() const;
};

// Resolves `host` (name, IPv4 or IPv6 literal) to its first address.
// NotFound when the name does not resolve.
Result<SocketAddress> ResolveHost(const std::string& host, uint16_t port);

// Connects a TCP socket (TCP_NODELAY set) before `deadline`. The returned
// socket is blocking, with SO_RCVTIMEO/SO_SNDTIMEO set to `io_timeout` so a
// stalled peer surfaces as EAGAIN (see RecvSome/SendAll).
// Errors: Unavailable (refused/unreachable), Timeout.
Result<UniqueFd> ConnectTcp(const SocketAddress& address, Deadline deadline, std::chrono::milliseconds io_timeout);

// "METHOD target HTTP/1.1\r\nHost: ..\r\nUser-Agent: ..\r\n[Connection: close]\r\n" +
// extra headers + "\r\n".
std::string BuildRequest(std::string_view method, const Url& url, const Headers& extra, bool keep_alive,
                         std::string_view user_agent);

// Sends everything on a socket from ConnectTcp. Timeout when the send
// timeout passes without progress, Unavailable when the peer is gone.
Status SendAll(int fd, std::string_view data);
// One recv; 0 at end of stream. Timeout as above.
Result<size_t> RecvSome(int fd, char* buffer, size_t size);

// Reads from `fd` until a full response head is in *buffer (which may hold
// bytes already). On success the head is parsed and removed from *buffer;
// what follows (body bytes) stays there. Corruption for a malformed head or
// one over max_head_bytes, Unavailable/Closed if the peer closes first.
Result<ResponseHead> ReadResponseHead(int fd, std::string* buffer, size_t max_head_bytes = 65536);

}  // namespace canopy::http
