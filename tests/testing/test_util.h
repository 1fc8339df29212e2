// Helpers shared by canopy's tests. Not part of any library a tool links.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace canopy::testing {

// A fresh directory under $TMPDIR (default /tmp), removed with its contents
// on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic pseudo-random bytes (xorshift), for reproducible tests.
std::string RandomBytes(size_t n, uint64_t seed);

// Runs `body` in a forked child. The child exits with body's return value
// (exceptions and crashes are reported through the exit status).
pid_t ForkChild(const std::function<int()>& body);

// Waits for the child up to `timeout`; returns the raw wait status, or -1 on
// timeout (the child is then SIGKILLed and reaped).
int WaitChild(pid_t pid, std::chrono::milliseconds timeout);

// Factor for a test's hang bounds (never for what a test measures or asserts about speed):
// $CANOPY_TEST_TIME_SCALE, a number >= 1 (the rdma_vm tests set it in emulated guests, where
// everything runs 10-50x slower), else 1. Values below 1 or unparsable ones count as 1.
double TestTimeScale();
// `bound` * TestTimeScale().
std::chrono::milliseconds ScaledBound(std::chrono::milliseconds bound);

// Path of a built binary next to the test binaries (CANOPY_BINARY_DIR/<rel>),
// e.g. BinaryPath("tools/rcopy/rcopy").
std::string BinaryPath(const std::string& relative);

// Runs a shell command, returning its exit status (WEXITSTATUS, or 128+signal)
// and appending its combined stdout+stderr to *output when given.
int RunCommand(const std::string& command, std::string* output = nullptr);

}  // namespace canopy::testing
