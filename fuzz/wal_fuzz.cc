// Fuzzes WAL recovery: the input is written as a segment file and scanned the
// way Store::Open does after a crash. A torn or corrupt record must end the
// scan cleanly; valid_bytes never exceeds the file. The same file is also
// scanned as a replica stream's read does (headers only, passing over the
// records at or before a version unread): every record it hands on must
// still be whole and pass its check.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/file.h"
#include "tree/wal_impl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy;
  static const std::string path = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/canopy-fuzz-wal-" + std::to_string(getpid()) + ".log";
  }();
  if (!WriteFileAtomic(path, std::string_view(reinterpret_cast<const char*>(data), size)).ok()) return 0;
  auto scan = tree::ScanSegment(path, UINT64_MAX,
                                [](const tree::Delta&, std::string_view) { return Status::Ok(); });
  if (scan.ok() && scan->valid_bytes > size) std::abort();
  // The version passed over: taken from the input's last byte, so that the
  // fuzzer steers it (records of the seed corpus have small versions).
  const uint64_t skip_through = size > 0 ? data[size - 1] % 8 : 0;
  uint64_t end = 0;
  auto skipping = tree::ScanSegment(
      path, UINT64_MAX,
      [&](const tree::Delta&, std::string_view record) {
        if (!tree::DecodeDeltaHeader(record).ok()) std::abort();  // handed on unchecked
        // It is the file's bytes that end where the scan says.
        if (end > size || record.size() > end ||
            std::string_view(reinterpret_cast<const char*>(data) + (end - record.size()), record.size()) != record) {
          std::abort();
        }
        return Status::Ok();
      },
      0, /*headers_only=*/true, skip_through, &end);
  ::unlink(path.c_str());  // one file per process, gone between inputs: a run leaves nothing behind
  if (skipping.ok() && skipping->valid_bytes > size) std::abort();
  return 0;
}
