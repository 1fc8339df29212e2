// Fuzzes WAL recovery: the input is written as a segment file and scanned the
// way Store::Open does after a crash. A torn or corrupt record must end the
// scan cleanly; valid_bytes never exceeds the file.
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
  ::unlink(path.c_str());  // one file per process, gone between inputs: a run leaves nothing behind
  if (scan.ok() && scan->valid_bytes > size) std::abort();
  return 0;
}
