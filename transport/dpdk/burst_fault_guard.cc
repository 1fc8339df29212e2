#include "transport/dpdk/burst_fault_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <csignal>
#include <mutex>

namespace canopy::transport::dpdk {
namespace {

// Per thread: where to jump when the burst in progress faults.
struct BurstScope {
  sigjmp_buf resume;
  bool (*link_down)(void*) = nullptr;
  void* arg = nullptr;
  volatile sig_atomic_t inside = 0;
};

thread_local BurstScope t_scope;
std::atomic<uint64_t> g_abandoned{0};
struct sigaction g_previous;
std::once_flag g_install_once;

void OnSegv(int sig, siginfo_t* info, void* context) {
  BurstScope& scope = t_scope;
  if (scope.inside != 0 && scope.link_down != nullptr && scope.link_down(scope.arg)) {
    scope.inside = 0;
    siglongjmp(scope.resume, 1);
  }
  // Not ours: hand it on as if this handler did not exist.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // Default action: restore it; returning re-runs the faulting instruction,
  // which now kills the process with SIGSEGV (and a core) as usual.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGSEGV, &dfl, nullptr);
}

void Install() {
  struct sigaction action {};
  action.sa_sigaction = OnSegv;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous);
}

}  // namespace

bool RunGuardedBurst(uint16_t (*burst)(void* arg), bool (*link_down)(void* arg), void* arg, uint16_t* count) {
  std::call_once(g_install_once, Install);
  BurstScope& scope = t_scope;
  scope.link_down = link_down;
  scope.arg = arg;
  if (sigsetjmp(scope.resume, 0) != 0) {
    // The burst faulted after its memory went away (see the header).
    g_abandoned.fetch_add(1, std::memory_order_relaxed);
    *count = 0;
    return false;
  }
  scope.inside = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const uint16_t n = burst(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  scope.inside = 0;
  *count = n;
  return true;
}

uint64_t AbandonedBursts() { return g_abandoned.load(std::memory_order_relaxed); }

}  // namespace canopy::transport::dpdk
