#include "transport/connection_server.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/logging.h"

namespace canopy::transport {

ConnectionServer::ConnectionServer(std::unique_ptr<Listener> listener, Options options, Handler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      listener_(std::move(listener)),
      endpoint_(listener_->local_endpoint()),
      accept_thread_([this] { AcceptLoop(); }) {}

ConnectionServer::~ConnectionServer() { Stop(); }

void ConnectionServer::Stop() {
  std::call_once(stop_once_, [&] {
    stopping_.store(true);
    listener_->Close();
    if (accept_thread_.joinable()) accept_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, conn] : live_) conn->Close();
    }
    connection_threads_.JoinAll();
  });
}

ConnectionServer::Counts ConnectionServer::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Counts{accepted_, serving_, peak_serving_};
}

void ConnectionServer::AcceptLoop() {
  while (!stopping_.load()) {
    auto accepted = listener_->Accept(Deadline::After(std::chrono::milliseconds(500)));
    if (!accepted.ok()) {
      if (accepted.status().IsTimeout()) continue;
      if (stopping_.load() || accepted.status().code() == StatusCode::kAborted) break;
      CANOPY_LOG(kWarn, "{}: accept failed: {}", options_.name, accepted.status().ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::unique_ptr<Connection> conn = std::move(accepted).value();
    std::unique_lock<std::mutex> lock(mu_);
    ++accepted_;
    const bool refuse = serving_ >= options_.max_serving;
    if (refuse && refusing_ >= options_.max_refusing) {
      lock.unlock();
      conn->Close();
      continue;
    }
    const uint64_t id = next_id_++;
    if (refuse) {
      ++refusing_;
    } else {
      ++serving_;
      peak_serving_ = std::max(peak_serving_, serving_);
    }
    live_[id] = conn.get();
    lock.unlock();
    connection_threads_.Spawn(
        [this, id, refuse, c = std::move(conn)]() mutable { Run(id, refuse, std::move(c)); });
  }
}

void ConnectionServer::Run(uint64_t id, bool refuse, std::unique_ptr<Connection> conn) {
  handler_(*conn, refuse);
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(id);
  }
  conn.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (refuse) {
    --refusing_;
  } else {
    --serving_;
  }
}

}  // namespace canopy::transport
