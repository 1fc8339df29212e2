// ChaosProxy: a TCP forwarder on loopback that injects faults in user space
// (this kernel has no netem). Used by the reliability tests to cut links,
// delay, corrupt and partition traffic between canopy nodes.
//
// For each accepted connection it opens one to the target and copies bytes
// both ways through bounded buffers (a slow side applies backpressure; the
// proxy never buffers more than kMaxQueuedBytes per direction). Faults:
//   delay         every chunk is held for delay_ms before it is forwarded
//   corrupt_prob  each forwarded chunk has one random byte flipped with this
//                 probability (the frame CRCs above must catch it)
//   cut_after     a connection is reset after this many bytes (both ways)
//   CutAll()      resets every open connection now (returns once they are reset)
//   SetPartitioned(true)  black-holes: new connections are reset at once and
//                 bytes of open ones are discarded instead of forwarded
//
// Only loopback addresses are accepted for listen and target (tests never
// send traffic anywhere else).
//
// Thread safety: Run() is called by one thread; CutAll, SetPartitioned and
// Stop may be called from any thread (including a signal-driven one) and take
// effect at the next loop turn.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/fd.h"
#include "base/result.h"

namespace canopy::chaos {

struct ChaosOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: ephemeral
  std::string target_host = "127.0.0.1";
  uint16_t target_port = 0;
  uint32_t delay_ms = 0;
  double corrupt_prob = 0.0;
  uint64_t cut_after_bytes = 0;  // 0: never
  uint64_t seed = 1;
};

struct ChaosCounters {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> bytes_forwarded{0};
  std::atomic<uint64_t> corruptions{0};
  std::atomic<uint64_t> cuts{0};
  std::atomic<uint64_t> discarded_bytes{0};
};

class ChaosProxy {
 public:
  // Binds the listening socket; InvalidArgument for non-loopback addresses.
  static Result<std::unique_ptr<ChaosProxy>> Create(const ChaosOptions& options);
  ~ChaosProxy();

  uint16_t port() const { return port_; }
  // Forwards until Stop(). Returns the first fatal error (e.g. epoll failure).
  Status Run();
  void Stop();
  void CutAll();
  void SetPartitioned(bool on);
  const ChaosCounters& counters() const { return counters_; }

 private:
  explicit ChaosProxy(const ChaosOptions& options) : options_(options) {}
  struct Impl;
  ChaosOptions options_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: wakes Run() for Stop/CutAll/partition changes
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_all_{false};
  // CutAll() returns once Run() has reset the links open when it was called.
  std::mutex cut_mu_;
  std::condition_variable cut_cv_;
  uint64_t cuts_requested_ = 0;  // (cut_mu_)
  uint64_t cuts_done_ = 0;       // (cut_mu_)
  std::atomic<bool> partitioned_{false};
  ChaosCounters counters_;
};

}  // namespace canopy::chaos
