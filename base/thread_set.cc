#include "base/thread_set.h"

namespace canopy {

void ThreadSet::MarkFinished(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_.push_back(id);
}

size_t ThreadSet::Reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;  // JoinAll() took it already
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  // Their tasks have returned; join waits out the rest of thread exit.
  for (std::thread& t : done) t.join();
  return done.size();
}

void ThreadSet::JoinAll() {
  for (;;) {
    std::map<uint64_t, std::thread> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (threads_.empty()) {
        finished_.clear();
        return;
      }
      all.swap(threads_);
    }
    for (auto& [id, t] : all) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();  // contract breach (a task joining its own set): do not deadlock
        continue;
      }
      t.join();
    }
  }
}

size_t ThreadSet::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

}  // namespace canopy
