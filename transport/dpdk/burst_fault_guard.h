// BurstFaultGuard: survives a driver unmapping its shared memory under an
// rx/tx burst when the peer at the other end of that memory dies.
//
// Why: DPDK's net_memif (22.11, and upstream since) maps its rings and
// buffers from memory shared with the peer process. When the peer dies, the
// EAL interrupt thread runs memif_disconnect: it marks the link down, then
// unmaps every region and frees their descriptors, with nothing that waits
// for a burst running on another thread. A burst that checked "connected"
// just before (or was preempted inside) then touches unmapped memory and the
// whole process dies of SIGSEGV, where canopy promises that the connection
// fails with Unavailable after io_timeout. Seen about once in 40-100 runs of
// DpdkTwoProcesses.ReceiverKilledMidTransferFailsTheSenderWithinIoTimeout on
// a busy 2-core machine.
//
// What: RunGuardedBurst runs one burst with the calling thread marked as
// inside it. A SIGSEGV that hits that thread while it is marked, and while
// the caller's link_down(arg) is true (memif sets link down before it
// unmaps), jumps back out of the burst: RunGuardedBurst returns false
// ("abandoned"). Any other SIGSEGV goes to the handler installed before
// (ASan's, or the default action: the process dies as it would have).
//
// The contract for `burst`: plain C-like code (a driver's burst function);
// nothing between RunGuardedBurst and the fault may own a resource that a
// destructor would release, since the jump skips those frames. An abandoned
// burst has consumed an unknown part of its mbufs: the caller must neither
// free nor resend any of them (they leak, a few per dead peer) and must treat
// received mbufs as absent.
//
// Thread safety: any thread may call RunGuardedBurst; the state is per thread.
// The first call installs the process-wide SIGSEGV handler (SA_NODEFER, so an
// abandoned burst leaves SIGSEGV unblocked), once.
#pragma once

#include <cstdint>

namespace canopy::transport::dpdk {

// Runs *count = burst(arg). Returns true when the burst completed, false when
// it faulted on memory that went away while link_down(arg) held (then *count
// is 0).
bool RunGuardedBurst(uint16_t (*burst)(void* arg), bool (*link_down)(void* arg), void* arg, uint16_t* count);

// Bursts abandoned so far in this process (for logs and tests).
uint64_t AbandonedBursts();

}  // namespace canopy::transport::dpdk
