// Copying the files of a CopyPlan (file_list.h) to one rcopy server, using
// the -P connections across files.
//
// One file (CopyBatchOptions::single_file): CopyFile with `streams`
// connections, its byte ranges sent at once (client.h).
// Several files: up to `streams` files are copied at once, each over one
// connection; workers take the files in plan order, so the first files start
// first. A failure that concerns only its file (FailureIsLocalToTheFile: the
// source is missing, the name is refused, a checksum mismatch, ...) lets the
// run go on; any other (server unreachable or busy, connection lost, disk
// full) stops it: no further file is started, the copies in flight finish,
// and the files never started are "not attempted".
//
// Thread safety: CopyBatch may run concurrently with itself; the callbacks
// are called from internal threads, never concurrently with themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "tools/rcopy/client.h"
#include "tools/rcopy/file_list.h"

namespace canopy::rcopy {

struct CopyBatchOptions {
  // Everything but source/destination/progress; `client.streams` is the -P
  // count (streams of the one file, or files at once).
  ClientOptions client;
  bool single_file = false;  // the plan is one file named by DST (not a directory)
  // Called when a file's copy ended (or its item had a problem), with its
  // index in plan.items.
  std::function<void(size_t index, const CopyReport& report)> on_file_done;
  // Called about every 200 ms while copies run, with the bytes done over the
  // whole plan (skipped + sent) and the total of the plan's file sizes known
  // so far (a file's size is known once its copy started).
  std::function<void(uint64_t bytes_done, uint64_t total_bytes)> progress;
};

struct CopyBatchResult {
  // Index-aligned with plan.items; a file not attempted has a default report
  // (attempted[i] false).
  std::vector<CopyReport> reports;
  std::vector<bool> attempted;
  size_t failed = 0;
  size_t not_attempted = 0;
  // The failure that came first in time, and the index of its item.
  Status first_failure;
  size_t first_failed_index = 0;
  size_t peak_files_at_once = 0;  // most copies that were in flight together
};

// Whether a failed copy concerns only its file (the run goes on) rather than
// the server or the connection (the run stops).
bool FailureIsLocalToTheFile(const Status& status);

CopyBatchResult CopyBatch(const CopyPlan& plan, const CopyBatchOptions& options);

}  // namespace canopy::rcopy
