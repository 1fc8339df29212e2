// ConnectionServer: the accept side of a tool's server (rcopy --server,
// bench --server). It accepts connections on a Listener and runs a handler
// for each on a thread of its own, up to a cap of connections served at once.
//
// At the cap, a new connection still gets a thread, with `refuse` set, so
// that the handler can answer "busy" in its protocol without holding up the
// accept loop; beyond max_refusing such connections at once, the next ones
// are closed without a word (a flood costs no threads).
//
// Ownership: the server owns the listener, the accept thread and every
// connection thread (base/thread_set.h); a connection is owned by its thread
// and destroyed when the handler returns. The handler must stay valid until
// Stop() has returned.
// Thread safety: local_endpoint() and counts() from any thread; Stop() from
// any thread but a handler's (it joins them). Stop() closes the listener and
// every open connection (their blocked calls return Aborted), then waits for
// every handler to return; it is idempotent, and the destructor calls it.
// Errors: Accept failures other than a timeout or Stop() are logged (with the
// server's name) and retried after 100 ms.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/thread_set.h"
#include "transport/transport.h"

namespace canopy::transport {

class ConnectionServer {
 public:
  struct Options {
    std::string name = "server";  // in log lines: "<name>: accept failed: ..."
    size_t max_serving = 64;      // connections handled (refuse == false) at once
    size_t max_refusing = 16;     // connections being refused at once
  };
  // Runs on the connection's own thread. `refuse`: the server is at its cap;
  // answer busy and return.
  using Handler = std::function<void(Connection& conn, bool refuse)>;

  // Starts the accept thread at once.
  ConnectionServer(std::unique_ptr<Listener> listener, Options options, Handler handler);
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  Endpoint local_endpoint() const { return endpoint_; }
  void Stop();

  struct Counts {
    uint64_t accepted = 0;    // every connection accepted so far
    size_t serving = 0;       // handled now (not refusing)
    size_t peak_serving = 0;  // the most handled at once so far
  };
  Counts counts() const;

 private:
  void AcceptLoop();
  void Run(uint64_t id, bool refuse, std::unique_ptr<Connection> conn);

  const Options options_;
  const Handler handler_;
  std::unique_ptr<Listener> listener_;
  const Endpoint endpoint_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;

  mutable std::mutex mu_;
  std::map<uint64_t, Connection*> live_;  // open connections, for Stop() to close
  uint64_t next_id_ = 1;
  uint64_t accepted_ = 0;
  size_t serving_ = 0;
  size_t refusing_ = 0;
  size_t peak_serving_ = 0;

  ThreadSet connection_threads_;
  std::thread accept_thread_;  // last: starts once everything above is built
};

}  // namespace canopy::transport
