// rcopy's use of the shared mutual authentication (transport/auth.h): with
// a secret (--secret-file on both sides) every connection starts with the
// HMAC-SHA256 handshake before OPEN or QUERY; the server reads no other
// message, and so accepts no data byte, until the client proved the secret.
//
// Wire: BasicAuthWire with message types kMsgAuthFirst .. +4, realm "rcopy".
// Refusals travel as rcopy RESULT messages, so a client that does not
// authenticate still reads why it was refused.
//
// Thread safety: the functions use one connection from one thread.
#pragma once

#include <cstdint>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "transport/transport.h"

namespace canopy::rcopy {

inline constexpr uint16_t kMsgAuthFirst = 0x52f0;  // HELLO; CHALLENGE, AUTH, WELCOME, REFUSED follow

// Whether `type` is the HELLO that starts the handshake.
bool IsAuthHello(uint16_t type);

// Client side. PermissionDenied when the server has another secret, is open
// (no --secret-file) or refuses us; transport errors as they come.
Status AuthenticateToServer(transport::Connection& conn, const std::string& secret, Deadline deadline);

// Server side: OK once the client proved `secret`; otherwise the client was
// told why (RESULT) and the error is returned.
Status AuthenticateClient(transport::Connection& conn, const std::string& secret, Deadline deadline);

// The RESULT an open server (no secret) answers an authenticating client with.
Status OpenServerRefusal();

}  // namespace canopy::rcopy
