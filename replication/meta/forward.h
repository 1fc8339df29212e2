// Private to canopy_meta: forwarding of proposals and linearizable reads from
// a raft follower to the raft leader over a small TCP request/response
// protocol on a second port of each node (MetaOptions::forward_address).
//
// A connection carries requests one after another; each message is
//   [u32 length][magic u32][format u8][fields...][crc32c u32]
// (length counts everything after itself, at most kMaxForwardMessage).
// Request fields:  [kind u8][timeout_ms u32][payload (length-prefixed)]
//   kind 1 = propose (payload: EncodeCommand), 2 = linearizable read (empty).
// Response fields: [status code u8][message (lp)][payload (lp)]
//   propose payload: EncodeOutcome; read payload: EncodeState.
// Decoders never trust lengths: damage yields Corruption.
//
// Thread safety: ForwardServer's methods may be called from any thread;
// ForwardCall is reentrant.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/clock.h"
#include "base/fd.h"
#include "base/result.h"
#include "base/status.h"
#include "replication/meta/cluster_state.h"

namespace canopy::replication::meta {

inline constexpr size_t kMaxForwardMessage = 256u << 20;

enum class ForwardKind : uint8_t { kPropose = 1, kRead = 2 };

struct ForwardRequest {
  ForwardKind kind = ForwardKind::kPropose;
  uint32_t timeout_ms = 0;
  std::string payload;
};

struct ForwardResponse {
  Status status;        // the leader's answer (OK, Unavailable, Timeout, ...)
  std::string payload;  // meaningful when status is OK
};

std::string EncodeForwardRequest(const ForwardRequest& request);
Result<ForwardRequest> DecodeForwardRequest(std::string_view bytes);
std::string EncodeForwardResponse(const ForwardResponse& response);
Result<ForwardResponse> DecodeForwardResponse(std::string_view bytes);
std::string EncodeOutcome(const ApplyOutcome& outcome);
Result<ApplyOutcome> DecodeOutcome(std::string_view bytes);

// Sends one request to `address` ("IPv4:port") and waits for the response,
// all bounded by `deadline`. Errors: Unavailable (connect/IO), Timeout,
// Corruption (bad response).
Result<ForwardResponse> ForwardCall(const std::string& address, const ForwardRequest& request,
                                    Deadline deadline);

// Accepts connections and answers each request with `handler` (called on a
// per-connection thread; at most kMaxConnections at once, more are refused).
class ForwardServer {
 public:
  using Handler = std::function<ForwardResponse(const ForwardRequest&)>;
  static constexpr int kMaxConnections = 32;

  // Binds `address` (port 0: ephemeral) and starts the accept thread.
  static Result<std::unique_ptr<ForwardServer>> Start(const std::string& address, Handler handler);
  ~ForwardServer();  // Stop()
  // Closes the listener and every connection, joins all threads. Idempotent.
  void Stop();
  // "IPv4:port" actually bound.
  const std::string& address() const { return address_; }

 private:
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  ForwardServer(UniqueFd listener, UniqueFd wake, std::string address, Handler handler);
  void AcceptLoop();
  void Serve(Connection* c);
  void ReapFinished(bool all);

  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: Stop() wakes every poll
  std::string address_;
  Handler handler_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Connection> connections_;
  std::once_flag stop_once_;
};

}  // namespace canopy::replication::meta
