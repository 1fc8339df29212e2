#include "tools/rcopy/auth.h"

#include <unistd.h>

#include <string>

#include "tools/rcopy/protocol.h"
#include "transport/auth.h"

namespace canopy::rcopy {
namespace {

constexpr const char* kRealm = "rcopy";

class RcopyAuthWire final : public transport::BasicAuthWire {
 public:
  RcopyAuthWire() : BasicAuthWire(kMsgAuthFirst) {}

  void SendRefusal(transport::Connection& conn, const Status& why) override {
    (void)conn.Send(kMsgResult, EncodeResult(ResultMessage::FromStatus(why)));
  }

  Status Unexpected(const transport::Message& message, Step expected) override {
    if (message.type == kMsgResult && message.bulk_bytes == 0) {
      auto result = DecodeResult(message.payload);
      if (!result.ok()) return result.status().WithContext("bad RESULT from the server");
      if (!result->ok()) return result->ToStatus();
    }
    return BasicAuthWire::Unexpected(message, expected);
  }
};

}  // namespace

bool IsAuthHello(uint16_t type) { return type == kMsgAuthFirst; }

Status AuthenticateToServer(transport::Connection& conn, const std::string& secret, Deadline deadline) {
  RcopyAuthWire wire;
  transport::AuthIdentity self{kRealm, "rcopy-client-" + std::to_string(::getpid()), secret};
  auto server = transport::AuthenticateDialer(conn, wire, self, deadline);
  if (!server.ok()) return server.status().WithContext("authentication with --secret-file");
  return Status::Ok();
}

Status AuthenticateClient(transport::Connection& conn, const std::string& secret, Deadline deadline) {
  RcopyAuthWire wire;
  transport::AuthIdentity self{kRealm, "rcopy-server", secret};
  return transport::AuthenticateListener(conn, wire, self, deadline).status();
}

Status OpenServerRefusal() {
  return Status::PermissionDenied(
      "this rcopy server is open (started without --secret-file) and does not authenticate; "
      "give the server the same --secret-file, or drop it on the client");
}

}  // namespace canopy::rcopy
