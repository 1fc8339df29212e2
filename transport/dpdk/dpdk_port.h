// DpdkPort: one configured and started DPDK ethdev port (PCI NIC or vdev
// such as net_memif / net_af_packet) with its mbuf pool, its I/O thread and
// the connections and listeners that use it. Shared by every Transport in the
// process that names the same port; lives until the process exits.
//
// The datapath (PollOnce: an rx burst of up to 32 frames, parsing
// Ethernet/ARP/IPv4/UDP, ARP answers, dispatch to ConnStates by connection
// id, their timers, and tx bursts of what they emit) runs under the poll
// lock, by whichever thread gets it: an application thread blocked in Read or
// Write (run to completion, ConnState's poller hook) or, when none has polled
// for a while, the port's I/O thread, which busy-polls and backs off to short
// sleeps when idle (woken by application threads).
//
// Frames: jumbo where the port allows it (net_memif up to its buffer size,
// bsize=, and net_af_packet up to its ring frame size, framesz=, within the
// kernel interface's MTU, even though DPDK 22.11 reports a 1518-byte maximum
// for both; other ports up to their max MTU, scatter / multi-segment permitting; the
// reason is logged when a port refuses the requested MTU). Transmit is zero
// copy on ports whose driver copies frames with the CPU (memif, af_packet):
// a frame is a header mbuf followed by mbufs attached (as external buffers)
// to the connection's send ring, which they pin until the driver frees them.
//
// Thread safety: all public methods may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "transport/dpdk/dpdk_conn.h"

struct rte_mempool;
struct rte_mbuf;
struct rte_ipv4_hdr;

namespace canopy::transport::dpdk {

// The 16-bit one's complement sum (RFC 1071, folded, not inverted) of the
// IPv4 pseudo header of `ip` and bytes [off, off + len) of the mbuf chain m:
// 0xffff over a UDP datagram whose checksum is right. DPDK 22.11's
// rte_raw_cksum_mbuf truncates the partial sum of a segment that starts at
// an odd offset to 16 bits before byte-swapping it, losing its carries:
// frames whose payload spans two send-ring pieces (where the ring wraps) went
// out with a wrong UDP checksum, were dropped by the receiver on every
// retransmission, and the stream stalled (seen on af_packet).
uint16_t Ipv4UdpSum(const rte_mbuf* m, const rte_ipv4_hdr* ip, uint32_t off, uint32_t len);

struct PortSettings {
  uint32_t mtu = 9000;         // requested; the port's limit wins
  uint32_t mbufs = 0;          // 0: default
  uint32_t mbuf_bytes = 2048;  // data room per mbuf
  // The backend arguments (EAL ones included): memif ports read their
  // buffer size (bsize=), af_packet ports their ring frame size (framesz=,
  // which also sets the mbuf size) and interface (iface=), from the --vdev
  // that made them.
  std::vector<std::string> eal_args;
};

// Connections waiting for Accept on one UDP port (of one DPDK port, or of
// several sharing this queue: a transport listening on every port it has).
class ListenerState {
 public:
  // A connection and the DPDK port it arrived on.
  struct Pending {
    std::shared_ptr<ConnState> conn;
    uint16_t port_id = 0;
  };

  ListenerState(ConnParams templ, size_t backlog) : templ_(std::move(templ)), backlog_(backlog) {}
  const ConnParams& templ() const { return templ_; }
  // False when the backlog is full or the listener closed (the SYN is dropped).
  bool Push(std::shared_ptr<ConnState> conn, uint16_t port_id);
  // Next connection; Timeout at the deadline, Aborted once closed.
  Result<Pending> Pop(Deadline deadline);
  // Returns the connections never accepted (later calls: none).
  std::deque<std::shared_ptr<ConnState>> Close();

 private:
  const ConnParams templ_;
  const size_t backlog_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool closed_ = false;
};

class DpdkPort : private SegmentOutput {
 public:
  // Configures and starts port `port_id`. REQUIRES: EAL initialised.
  static Result<std::shared_ptr<DpdkPort>> Start(uint16_t port_id, const PortSettings& settings);
  ~DpdkPort() override;

  uint16_t port_id() const { return port_id_; }
  const std::string& name() const { return name_; }
  uint32_t mtu() const { return mtu_; }
  uint32_t mss() const { return mss_; }
  MacAddress mac() const { return mac_; }
  // The address used when dialling without ip=: the first address the port
  // was given (by Listen or ip=), else 10.0.0.(100 + port id).
  uint32_t DefaultIp();

  // Adds an IPv4 address the port answers (ARP) and accepts frames for.
  void AddAddress(uint32_t ip);

  // Registers a listener on udp_port (0: pick a free one); returns the port.
  Result<uint16_t> AddListener(uint16_t udp_port, std::shared_ptr<ListenerState> listener);
  // Unregisters it; the listener's state is closed (its pending connections
  // fail) unless `close_state` is false.
  void RemoveListener(uint16_t udp_port, bool close_state = true);

  // Registers a new dialling connection: fills local_id and local_port in
  // params and returns the ConnState (its handshake starts at once).
  Result<std::shared_ptr<ConnState>> AddClient(ConnParams params);

  // Connections the port carries now, dialled and accepted (including ones
  // closing): what a transport spreading connections over several ports
  // compares.
  size_t ConnectionCount();

  // Wakes the I/O thread if it sleeps.
  void Wake();

  // One datapath iteration in the calling thread, unless another thread holds
  // the poll lock (false then). True when any frame was received or sent.
  bool PollFromApp();

  // How UDP checksums are handled on this port (see dpdk_port.cc).
  enum class ChecksumMode { kSoftware, kOffload, kLinkGuaranteed };

 private:
  struct Delayed {
    rte_mbuf* mbuf;
    uint64_t release_at_frame;
    uint64_t held_ns;
  };
  struct SynKey {
    uint32_t ip;
    uint16_t port;
    uint32_t conn;
    bool operator<(const SynKey& o) const {
      return std::tie(ip, port, conn) < std::tie(o.ip, o.port, o.conn);
    }
  };

  DpdkPort() = default;
  void Run();
  // REQUIRES: poll_mu_ held. Returns whether any frame moved.
  bool PollOnce();
  void RefreshSnapshot();
  void HandleFrame(rte_mbuf* m, uint64_t now);
  void HandleArp(rte_mbuf* m);
  void HandleSyn(const SegmentHeader& h, uint32_t src_ip, uint16_t src_port, const MacAddress& src_mac,
                 uint32_t dst_ip, uint16_t dst_port, uint64_t now);
  void SendRst(const SegmentHeader& to, uint32_t src_ip, uint16_t src_port, const MacAddress& src_mac,
               uint32_t dst_ip, uint16_t dst_port);
  void FlushTx(uint64_t now);
  // Bursts on queue 0; on ports whose driver may unmap memory under a burst
  // (guard_bursts_), run under RunGuardedBurst. *abandoned: the burst faulted
  // and consumed an unknown part of `tx` (the caller drops them all unfreed).
  uint16_t RxBurst(rte_mbuf** rx, uint16_t count);
  uint16_t TxBurst(rte_mbuf** tx, uint16_t count, bool* abandoned);
  void NoteAbandonedBurst(const char* direction);
  void Enqueue(rte_mbuf* m);
  uint32_t NewConnIdLocked();
  Result<uint16_t> FreeUdpPortLocked();
  // Builds a frame; nullptr when out of mbufs.
  rte_mbuf* BuildFrame(const MacAddress& dst_mac, uint32_t src_ip, uint16_t src_port, uint32_t dst_ip,
                       uint16_t dst_port, const SegmentHeader& h, const ByteRing* data, uint64_t offset);

  // SegmentOutput (I/O thread).
  bool Emit(const ConnState& conn, const MacAddress& dst_mac, const SegmentHeader& h, const ByteRing* data,
            uint64_t offset) override;
  bool Neighbour(uint32_t ip, MacAddress* mac) override;
  void SendArpRequest(uint32_t local_ip, uint32_t target_ip) override;

  uint16_t port_id_ = 0;
  std::string name_;
  uint32_t mtu_ = 1500;
  uint32_t mss_ = 1352;
  bool multi_seg_ = false;
  bool zero_copy_tx_ = false;
  bool guard_bursts_ = false;  // net_memif: see burst_fault_guard.h
  ChecksumMode checksum_ = ChecksumMode::kSoftware;
  MacAddress mac_;
  rte_mempool* pool_ = nullptr;

  // Tables, guarded by table_mu_; table_gen_ bumps on every change.
  std::mutex table_mu_;
  std::unordered_map<uint32_t, std::shared_ptr<ConnState>> conns_;
  std::map<SynKey, uint32_t> syn_index_;
  std::map<uint16_t, std::shared_ptr<ListenerState>> listeners_;
  std::vector<uint32_t> addresses_;
  uint16_t next_ephemeral_ = 49152;
  uint64_t id_state_ = 0;
  std::atomic<uint64_t> table_gen_{1};

  // Everything below up to running_ is the datapath's: guarded by poll_mu_.
  std::mutex poll_mu_;
  std::atomic<uint64_t> last_app_poll_ns_{0};
  uint64_t seen_gen_ = 0;
  std::unordered_map<uint32_t, std::shared_ptr<ConnState>> io_conns_;
  std::vector<std::shared_ptr<ConnState>> io_list_;
  std::set<uint32_t> io_addresses_;
  std::unordered_map<uint32_t, MacAddress> neighbours_;
  std::vector<rte_mbuf*> tx_pending_;
  std::deque<Delayed> delayed_;
  uint64_t frames_enqueued_ = 0;
  uint64_t last_tx_progress_ns_ = 0;
  uint16_t ip_id_ = 0;
  std::map<uint32_t, uint64_t> arp_sent_ns_;

  std::atomic<bool> running_{true};
  std::atomic<bool> sleeping_{false};
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  bool wake_pending_ = false;
  std::thread thread_;
};

}  // namespace canopy::transport::dpdk
