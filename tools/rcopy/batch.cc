#include "tools/rcopy/batch.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace canopy::rcopy {

bool FailureIsLocalToTheFile(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound:
    case StatusCode::kInvalidArgument:
    case StatusCode::kPermissionDenied:
    case StatusCode::kAlreadyExists:
    case StatusCode::kCorruption:
    case StatusCode::kConflict: return true;
    default: return false;
  }
}

CopyBatchResult CopyBatch(const CopyPlan& plan, const CopyBatchOptions& options) {
  const size_t n = plan.items.size();
  CopyBatchResult result;
  result.reports.resize(n);
  result.attempted.assign(n, false);

  const bool one_at_a_time = options.single_file || n <= 1;
  const size_t workers =
      one_at_a_time ? 1 : std::max<size_t>(1, std::min<size_t>(options.client.streams, n));

  // Progress of every item: bytes done and file size, updated by the copies.
  struct ItemProgress {
    std::atomic<uint64_t> done{0};
    std::atomic<uint64_t> total{0};
  };
  std::unique_ptr<ItemProgress[]> item_progress(new ItemProgress[n == 0 ? 1 : n]);

  std::mutex mu;  // guards next, stopped, in_flight, result's counters, on_file_done
  size_t next = 0;
  bool stopped = false;
  size_t in_flight = 0;
  const std::string server_uri = MakeUri(options.client.scheme, options.client.host, options.client.port);

  auto worker = [&] {
    for (;;) {
      size_t index;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopped || next >= n) return;
        index = next++;
        result.attempted[index] = true;
        ++in_flight;
        result.peak_files_at_once = std::max(result.peak_files_at_once, in_flight);
      }
      const CopyItem& item = plan.items[index];
      CopyReport report;
      if (!item.problem.ok()) {
        report.status = item.problem;
        report.server_uri = server_uri;
        report.destination = item.destination;
      } else {
        ClientOptions file_options = options.client;
        if (!one_at_a_time) file_options.streams = 1;
        file_options.source = item.source;
        file_options.destination = item.destination;
        file_options.progress = nullptr;
        if (options.progress) {
          ItemProgress* p = &item_progress[index];
          file_options.progress = [p](uint64_t done, uint64_t total) {
            p->total.store(total, std::memory_order_relaxed);
            p->done.store(done, std::memory_order_relaxed);
          };
        }
        report = CopyFile(file_options);
      }
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      if (!report.status.ok()) {
        if (result.failed++ == 0) {
          result.first_failure = report.status;
          result.first_failed_index = index;
        }
        if (!FailureIsLocalToTheFile(report.status)) stopped = true;
      }
      if (options.on_file_done) options.on_file_done(index, report);
      result.reports[index] = std::move(report);
    }
  };

  std::mutex progress_mu;
  std::condition_variable progress_cv;
  bool finished = false;
  auto report_progress = [&] {
    uint64_t done = 0, total = 0;
    for (size_t i = 0; i < n; ++i) {
      done += item_progress[i].done.load(std::memory_order_relaxed);
      total += item_progress[i].total.load(std::memory_order_relaxed);
    }
    options.progress(done, total);
  };
  std::thread progress;
  if (options.progress) {
    progress = std::thread([&] {
      std::unique_lock<std::mutex> lock(progress_mu);
      while (!progress_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return finished; })) {
        report_progress();
      }
    });
  }

  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  if (progress.joinable()) {
    {
      std::lock_guard<std::mutex> lock(progress_mu);
      finished = true;
    }
    progress_cv.notify_all();
    progress.join();
    report_progress();
  }
  for (size_t i = 0; i < n; ++i) {
    if (!result.attempted[i]) ++result.not_attempted;
  }
  return result;
}

}  // namespace canopy::rcopy
