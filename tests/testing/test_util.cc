#include "tests/testing/test_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace canopy::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/canopy-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::string out(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

pid_t ForkChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 111;
    try {
      rc = body();
    } catch (...) {
      rc = 112;
    }
    ::_exit(rc);
  }
  return pid;
}

double TestTimeScale() {
  static const double scale = [] {
    const char* env = std::getenv("CANOPY_TEST_TIME_SCALE");
    if (env == nullptr || *env == '\0') return 1.0;
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    return end != env && *end == '\0' && v >= 1.0 && v <= 1000.0 ? v : 1.0;
  }();
  return scale;
}

std::chrono::milliseconds ScaledBound(std::chrono::milliseconds bound) {
  return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(bound.count()) * TestTimeScale()));
}

int WaitChild(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string BinaryPath(const std::string& relative) {
#ifdef CANOPY_BINARY_DIR
  return std::string(CANOPY_BINARY_DIR) + "/" + relative;
#else
  return relative;
#endif
}

int RunCommand(const std::string& command, std::string* output) {
  std::string cmd = command + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) {
    if (output) output->append(buf, n);
  }
  int status = ::pclose(pipe);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace canopy::testing
