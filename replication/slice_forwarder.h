// SliceForwarder: pipelined, asynchronous SLICE reads to other nodes, for
// the board's HTTP event thread (tools/canopy/board.h) and a node's QUORUM
// reads started from it (Node::SliceAsync).
//
// A board read at ONE that this node cannot answer from its own store goes
// to an owner of the tree. Done the blocking way, every such read costs a
// hand-off to a worker thread, one round trip on a pooled connection of its
// own, and the wake-ups on both nodes that go with it. The forwarder instead
// keeps a few long-lived connections per peer and puts many SLICEs in flight
// on each: TrySend queues a SLICE and returns at once, Flush sends what was
// queued, one batch of frames per connection (the board flushes after each
// round of HTTP events); a reader thread per connection takes the replies
// (the node answers a connection's SLICEs in request order) and hands each
// to its Waiter. So a burst of reads becomes a burst of frames each way, and
// neither side wakes per read.
//
// Connections: at most `links_per_peer` per URI, dialled and authenticated
// (as a client, PeerRole::kClient) only by Connect, which may block; TrySend
// never dials. A link that fails (transport error, unexpected message, or its
// oldest read waited longer than `reply_timeout`) is closed, and every read
// in flight on it is failed with that status; the next Connect dials anew
// (at most once per `redial_interval` per URI while dials fail).
//
// Ownership: the forwarder owns its connections and threads; a Waiter handed
// to TrySend is owned by the forwarder until Done, which is called exactly
// once (also when the forwarder is destroyed: Aborted), on a reader thread
// or inside the destructor, with no lock of the forwarder held.
//
// Thread safety: every method may be called from any thread. Done may call
// TrySend and Connect.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "replication/client.h"
#include "replication/protocol.h"

namespace canopy::replication {

struct SliceForwarderOptions {
  ClientOptions client;  // cluster, secret, client_id ("slice-forwarder" if empty); timeout bounds a dial + handshake
  size_t links_per_peer = 2;          // connections per URI, used in turn
  size_t max_in_flight = 512;         // per connection; beyond it TrySend refuses
  std::chrono::milliseconds reply_timeout{5000};
  std::chrono::milliseconds redial_interval{1000};
};

class SliceForwarder {
 public:
  class Waiter {
   public:
    virtual ~Waiter() = default;
    // The node's reply (its own status inside), or why there is none.
    virtual void Done(Result<SliceReply> reply) = 0;
  };

  explicit SliceForwarder(SliceForwarderOptions options);
  // Shutdown().
  ~SliceForwarder();
  // Closes every connection (reads in flight are Done with Aborted) and
  // waits for the reader threads; later TrySend and Connect refuse.
  // Idempotent.
  void Shutdown();
  SliceForwarder(const SliceForwarder&) = delete;
  SliceForwarder& operator=(const SliceForwarder&) = delete;

  // Queues `request` for `uri` on an open connection and returns true: the
  // forwarder then owns `waiter` and calls its Done once (the reply timeout
  // counts from now, so Flush soon). Returns false and leaves `waiter` with
  // the caller when there is no open connection to `uri` or every
  // connection has max_in_flight reads out. Never blocks on the network.
  bool TrySend(const std::string& uri, const SliceRequest& request, std::unique_ptr<Waiter>& waiter);
  // Sends every queued SLICE (one batch per connection). A send that fails
  // fails its link (its waiters are Done with the error).
  void Flush();

  // Opens links to `uri` until it has links_per_peer (blocking: dial and
  // handshake); a no-op when they are open, or when a dial to `uri` failed
  // less than redial_interval ago. Returns the dial's failure, else Ok.
  Status Connect(const std::string& uri);

  // Reads sent and not yet Done, over every link (for tests and metrics).
  size_t in_flight() const;

 private:
  class Link;
  struct ReaderCount;
  struct Peer {
    std::vector<std::shared_ptr<Link>> links;
    size_t next = 0;  // round robin
    Clock::time_point last_failed_dial{};
  };

  const SliceForwarderOptions options_;
  mutable std::mutex mu_;  // guards peers_ and closed_; never held while calling Done
  std::map<std::string, Peer> peers_;
  bool closed_ = false;
  std::mutex dial_mu_;  // one Connect dials at a time
  const std::shared_ptr<ReaderCount> readers_;
};

}  // namespace canopy::replication
