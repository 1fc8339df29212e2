// ThreadSet: runs tasks on their own threads and joins every one of them, so
// that a server's per-connection threads never outlive the server.
//
// A detached thread can still be running its thread-local destructors (an
// OpenSSL per-thread random generator, say) after the server that started it
// has returned from Stop(); if the process exits then, that state is lost
// mid-teardown (LeakSanitizer reports it) and anything the thread still
// touches may already be gone. ThreadSet keeps each std::thread and joins it:
// finished threads are joined (reaped) by the next Spawn(), the rest by
// JoinAll(), which returns only when every thread has fully terminated.
//
// Ownership: the set owns its threads; a task owns what it captured.
// Thread safety: Spawn() and Reap() may be called from any thread at once;
// JoinAll() waits for the tasks running when it is called and for any that
// are spawned while it waits, so stop spawning first for it to return
// promptly. A task must not call JoinAll() on its own set (it would wait for
// itself). The destructor calls JoinAll().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace canopy {

class ThreadSet {
 public:
  ThreadSet() = default;
  ~ThreadSet() { JoinAll(); }
  ThreadSet(const ThreadSet&) = delete;
  ThreadSet& operator=(const ThreadSet&) = delete;

  // Runs task() on a new thread (task is moved into it; move-only captures are
  // fine). Joins the threads that have already finished first.
  template <typename Task>
  void Spawn(Task&& task) {
    Reap();
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_id_++;
    // The new thread's MarkFinished() takes mu_, so it cannot run before the
    // thread is in threads_.
    threads_.emplace(id, std::thread([this, id, t = std::forward<Task>(task)]() mutable {
                       t();
                       MarkFinished(id);
                     }));
  }

  // Joins the threads whose tasks have returned; returns how many.
  size_t Reap();

  // Joins every thread, waiting for running tasks to return.
  void JoinAll();

  // Threads not yet joined (running, or finished and not yet reaped).
  size_t size() const;

 private:
  void MarkFinished(uint64_t id);

  mutable std::mutex mu_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> finished_;
};

}  // namespace canopy
