#include "replication/slice_forwarder.h"

#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <thread>
#include <utility>

#include "base/logging.h"
#include "replication/handshake.h"
#include "transport/transport.h"

namespace canopy::replication {

// Counts the reader threads still running, so that the forwarder's
// destructor can wait for them (they are detached: a failed link is dropped
// by whoever notices, and its thread ends on its own).
struct SliceForwarder::ReaderCount {
  std::mutex mu;
  std::condition_variable cv;
  size_t running = 0;
};

// One connection with SLICEs in flight, answered in order. Lock order:
// Link::mu_ only (the forwarder's mu_ is never taken while holding it).
class SliceForwarder::Link {
 public:
  Link(std::string uri, std::unique_ptr<transport::Connection> conn, std::chrono::milliseconds reply_timeout,
       size_t max_in_flight)
      : uri_(std::move(uri)), conn_(std::move(conn)), reply_timeout_(reply_timeout), max_in_flight_(max_in_flight) {}

  // Starts the reader thread, which holds `self` until it ends.
  static void Start(const std::shared_ptr<Link>& self, const std::shared_ptr<ReaderCount>& readers) {
    {
      std::lock_guard<std::mutex> lock(readers->mu);
      ++readers->running;
    }
    std::thread([self, readers] {
      self->ReadLoop();
      std::lock_guard<std::mutex> lock(readers->mu);
      --readers->running;
      readers->cv.notify_all();  // under the lock: the forwarder may be gone once it is released
    }).detach();
  }

  bool broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !broken_.ok();
  }

  size_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return flights_.size();
  }

  // Queues one encoded SLICE for the next Flush; takes `payload` and
  // `waiter` on success only (a refusal leaves both for the next link).
  bool Queue(std::string& payload, std::unique_ptr<Waiter>& waiter) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok() || flights_.size() >= max_in_flight_) return false;
    // flights_ and queued_ grow together, under mu_, so that flights_ is in
    // the order of the frames.
    queued_.push_back(std::move(payload));
    flights_.push_back(Flight{std::move(waiter), Clock::now()});
    return true;
  }

  // Sends the queued SLICEs in one batch; a failed send fails the link.
  void Flush() {
    std::lock_guard<std::mutex> sending(send_mu_);  // batches leave in the order they were taken
    std::vector<std::string> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok() || queued_.empty()) return;
      batch.swap(queued_);
    }
    std::vector<std::string_view> frames(batch.begin(), batch.end());
    Status s = conn_->SendBatch(static_cast<uint16_t>(MessageType::kSliceRequest), frames);
    if (!s.ok()) Fail(s.WithContext(uri_));
  }

  // Marks the link failed (the first reason sticks), closes the connection
  // and fails every read in flight with `why`.
  void Fail(const Status& why) {
    std::deque<Flight> failed;
    Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.ok()) broken_ = why;
      status = broken_;
      failed.swap(flights_);
      queued_.clear();
    }
    conn_->Close();
    for (auto& f : failed) f.waiter->Done(status);
  }

 private:
  struct Flight {
    std::unique_ptr<Waiter> waiter;
    Clock::time_point sent;
  };

  void ReadLoop() {
    for (;;) {
      auto m = conn_->Receive(Deadline::After(std::chrono::milliseconds(100)));
      if (!m.ok()) {
        if (m.status().IsTimeout()) {
          std::unique_lock<std::mutex> lock(mu_);
          if (!broken_.ok()) break;
          if (!flights_.empty() && Clock::now() - flights_.front().sent > reply_timeout_) {
            lock.unlock();
            Fail(Status::Timeout(fmt::format("{}: no SLICE reply within {} ms", uri_, reply_timeout_.count())));
            break;
          }
          continue;
        }
        Fail(m.status().WithContext(uri_));
        break;
      }
      if (m->type != static_cast<uint16_t>(MessageType::kSliceReply)) {
        Fail(UnexpectedMessage(*m, "SLICE_REPLY").WithContext(uri_));
        break;
      }
      auto reply = DecodeSliceReply(m->payload);
      if (!reply.ok()) {
        Fail(reply.status().WithContext(uri_));
        break;
      }
      std::unique_ptr<Waiter> waiter;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!flights_.empty()) {
          waiter = std::move(flights_.front().waiter);
          flights_.pop_front();
        }
      }
      if (!waiter) {
        Fail(Status::Corruption(fmt::format("{}: a SLICE reply with no request out", uri_)));
        break;
      }
      waiter->Done(std::move(*reply));
    }
  }

  const std::string uri_;
  const std::unique_ptr<transport::Connection> conn_;
  const std::chrono::milliseconds reply_timeout_;
  const size_t max_in_flight_;
  std::mutex send_mu_;     // held across a Flush's send
  mutable std::mutex mu_;  // guards the fields below
  std::deque<Flight> flights_;     // sent or queued, oldest first
  std::vector<std::string> queued_;  // frames of the newest flights, not sent yet
  Status broken_;
};

SliceForwarder::SliceForwarder(SliceForwarderOptions options)
    : options_(std::move(options)), readers_(std::make_shared<ReaderCount>()) {}

SliceForwarder::~SliceForwarder() { Shutdown(); }

void SliceForwarder::Shutdown() {
  std::map<std::string, Peer> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    peers.swap(peers_);
  }
  for (auto& [uri, peer] : peers) {
    for (auto& link : peer.links) link->Fail(Status::Aborted("the SLICE forwarder was shut down"));
  }
  peers.clear();
  std::unique_lock<std::mutex> lock(readers_->mu);
  readers_->cv.wait(lock, [&] { return readers_->running == 0; });
}

bool SliceForwarder::TrySend(const std::string& uri, const SliceRequest& request, std::unique_ptr<Waiter>& waiter) {
  std::vector<std::shared_ptr<Link>> candidates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    auto it = peers_.find(uri);
    if (it == peers_.end() || it->second.links.empty()) return false;
    Peer& p = it->second;
    const size_t n = p.links.size();
    const size_t first = p.next++ % n;
    for (size_t k = 0; k < n; ++k) candidates.push_back(p.links[(first + k) % n]);
  }
  std::string payload = Encode(request);
  for (auto& link : candidates) {
    if (link->Queue(payload, waiter)) return true;
  }
  return false;
}

void SliceForwarder::Flush() {
  std::vector<std::shared_ptr<Link>> links;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [uri, peer] : peers_) links.insert(links.end(), peer.links.begin(), peer.links.end());
  }
  for (auto& link : links) link->Flush();
}

Status SliceForwarder::Connect(const std::string& uri) {
  auto wanted = [&]() -> Result<size_t> {  // links still to open; mu_ held
    if (closed_) return Status::Aborted("the SLICE forwarder was shut down");
    Peer& p = peers_[uri];
    std::erase_if(p.links, [](const std::shared_ptr<Link>& l) { return l->broken(); });
    if (p.links.size() >= options_.links_per_peer) return size_t{0};
    if (p.last_failed_dial != Clock::time_point{} && Clock::now() - p.last_failed_dial < options_.redial_interval) {
      return Status::Unavailable(fmt::format("{}: the last dial failed less than {} ms ago", uri,
                                             options_.redial_interval.count()));
    }
    return options_.links_per_peer - p.links.size();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    CANOPY_ASSIGN_OR_RETURN(size_t missing, wanted());
    if (missing == 0) return Status::Ok();
  }
  // One dialer at a time; the others go on without waiting (their read takes
  // the blocking path this once).
  std::unique_lock<std::mutex> dialing(dial_mu_, std::try_to_lock);
  if (!dialing.owns_lock()) return Status::Ok();
  size_t missing = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CANOPY_ASSIGN_OR_RETURN(missing, wanted());
  }
  for (; missing > 0; --missing) {
    auto conn = DialAsClient(uri, options_.client,
                             options_.client.client_id.empty() ? "slice-forwarder" : options_.client.client_id,
                             options_.client.timeout);
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn.ok()) {
      peers_[uri].last_failed_dial = Clock::now();
      return conn.status();
    }
    if (closed_) return Status::Aborted("the SLICE forwarder was shut down");
    auto link = std::make_shared<Link>(uri, std::move(*conn), options_.reply_timeout, options_.max_in_flight);
    Link::Start(link, readers_);
    peers_[uri].links.push_back(std::move(link));
  }
  return Status::Ok();
}

size_t SliceForwarder::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [uri, peer] : peers_) {
    for (const auto& link : peer.links) n += link->in_flight();
  }
  return n;
}

}  // namespace canopy::replication
