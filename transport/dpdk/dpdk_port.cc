// DpdkPort set-up (port configuration, tables) and datapath (the I/O loop).
#include "transport/dpdk/dpdk_port.h"

#include <rte_arp.h>
#include <rte_byteorder.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_udp.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <thread>

#include "base/logging.h"
#include "transport/dpdk/burst_fault_guard.h"

namespace canopy::transport::dpdk {
namespace {

constexpr uint16_t kBurst = 32;
constexpr uint16_t kRxDesc = 512;
constexpr uint16_t kTxDesc = 512;
constexpr size_t kMaxPendingTx = 512;
constexpr int kPollBudget = 32;
constexpr uint64_t kReorderHoldNs = 1'000'000;
constexpr uint64_t kStuckTxNs = 200'000'000;
constexpr uint64_t kSpinAfterTrafficNs = 200'000;
// The I/O thread stays out of the way while an application thread polled this
// recently. It then checks back after kAppPollGraceNs, doubling the wait
// while application threads keep polling, up to kAppPollMaxSleepNs: each
// check is two context switches on the polling thread's core, and at one per
// 100 us they took a quarter of a memif sender's throughput in this VM (31 ->
// 40 Gbit/s at 1 ms). An application thread that stops waiting for want of
// traffic wakes it at once (ConnState::WaitLocked); one that returns to the
// application leaves the port to it within kAppPollMaxSleepNs.
constexpr uint64_t kAppPollGraceNs = 100'000;
constexpr uint64_t kAppPollMaxSleepNs = 1'000'000;
constexpr uint32_t kDefaultMemifBufferBytes = 2048;  // net_memif's bsize default
constexpr uint32_t kDefaultAfPacketFrameBytes = 2048;  // net_af_packet's framesz default
// Of each af_packet ring frame, the kernel's tpacket2 header and the offset
// at which it places a received frame take this much (TPACKET_V2: 66 B, with
// slack); the rest holds the Ethernet frame.
constexpr uint32_t kAfPacketRingOverhead = 96;

// The value of key= in the --vdev that created port `name` (e.g. memif's
// bsize=, af_packet's framesz= or iface=); empty when absent.
std::string VdevParam(const std::vector<std::string>& args, const std::string& name, const std::string& key) {
  std::vector<std::string> words;
  for (const std::string& a : args) {
    size_t start = 0;
    while (start <= a.size()) {
      size_t space = a.find(' ', start);
      if (space == std::string::npos) space = a.size();
      if (space > start) words.push_back(a.substr(start, space - start));
      start = space + 1;
    }
  }
  for (size_t i = 0; i < words.size(); ++i) {
    std::string vdev;
    if (words[i].rfind("--vdev=", 0) == 0) {
      vdev = words[i].substr(7);
    } else if (words[i] == "--vdev" && i + 1 < words.size()) {
      vdev = words[i + 1];
    } else {
      continue;
    }
    if (vdev != name && vdev.rfind(name + ",", 0) != 0) continue;
    const std::string needle = "," + key + "=";
    size_t at = vdev.find(needle);
    if (at == std::string::npos) return "";
    size_t from = at + needle.size();
    return vdev.substr(from, vdev.find(',', from) - from);
  }
  return "";
}

// A numeric --vdev parameter within [lo, hi], else `fallback`.
uint32_t VdevUint(const std::vector<std::string>& args, const std::string& name, const std::string& key,
                  uint32_t fallback, uint32_t lo, uint32_t hi) {
  const std::string v = VdevParam(args, name, key);
  if (v.empty()) return fallback;
  unsigned long n = std::strtoul(v.c_str(), nullptr, 0);
  return n >= lo && n <= hi ? static_cast<uint32_t>(n) : fallback;
}

// The MTU the kernel gives interface `iface` in this network namespace; 0
// when unknown.
uint32_t KernelInterfaceMtu(const std::string& iface) {
  if (iface.empty() || iface.size() >= IFNAMSIZ) return 0;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::memcpy(ifr.ifr_name, iface.data(), iface.size());
  int rc = ::ioctl(fd, SIOCGIFMTU, &ifr);
  ::close(fd);
  return rc == 0 && ifr.ifr_mtu > 0 ? static_cast<uint32_t>(ifr.ifr_mtu) : 0;
}

// Checksum policy (DpdkPort::ChecksumMode):
//  - kLinkGuaranteed on net_memif: frames go through shared memory between
//    processes of one host, copied by the CPU; no wire, no bit errors, so the
//    UDP checksum is left 0 (legal for IPv4 UDP) and not verified. The IPv4
//    header checksum (20 bytes) is still set and checked.
//  - kOffload where the port offers both IPv4 and UDP checksum offload in both
//    directions: the NIC computes them; received frames flagged bad are
//    dropped, unknown ones are checked in software.
//  - kSoftware otherwise (e.g. net_af_packet, whose interface may be a real
//    wire): computed and verified by the CPU.
// In every mode the segment header carries its own end-to-end check
// (dpdk_wire.h, header_check). In kLinkGuaranteed the connections also say
// in their handshake that they accept frames whose payload has no CRC32C
// (ConnParams::accepts_unchecked_payloads; transport/frame.h).

// In the private area of an mbuf attached to a connection's send ring: the
// shared-info block DPDK calls back through when the driver frees the mbuf,
// and the storage it keeps alive and pins.
struct TxPin {
  rte_mbuf_ext_shared_info shinfo;
  RingStorage* storage = nullptr;  // kept alive by RingStorage::AddFrame
  uint64_t from = 0;
  uint64_t to = 0;
};
constexpr uint16_t kMbufPrivSize =
    static_cast<uint16_t>((sizeof(TxPin) + RTE_MBUF_PRIV_ALIGN - 1) / RTE_MBUF_PRIV_ALIGN * RTE_MBUF_PRIV_ALIGN);

// rte_mbuf_extbuf_free_callback_t: runs where the mbuf is freed, i.e. in the
// datapath under the poll lock (tx burst, fault injection, stuck-queue drop).
void ReleasePin(void* /*addr*/, void* opaque) {
  auto* pin = static_cast<TxPin*>(opaque);
  pin->storage->Unpin(pin->from, pin->to);
  RingStorage::ReleaseFrame(pin->storage);
  pin->~TxPin();
}

// One rx or tx burst on queue 0, in the shape RunGuardedBurst calls.
struct BurstCall {
  uint16_t port;
  rte_mbuf** mbufs;
  uint16_t count;
};
uint16_t RxBurstCall(void* arg) {
  auto* c = static_cast<BurstCall*>(arg);
  return rte_eth_rx_burst(c->port, 0, c->mbufs, c->count);
}
uint16_t TxBurstCall(void* arg) {
  auto* c = static_cast<BurstCall*>(arg);
  return rte_eth_tx_burst(c->port, 0, c->mbufs, c->count);
}
// Called from the SIGSEGV handler: for net_memif (primary process) this is a
// load of the link word that memif_disconnect clears before it unmaps.
bool LinkDown(void* arg) {
  rte_eth_link link{};
  if (rte_eth_link_get_nowait(static_cast<BurstCall*>(arg)->port, &link) != 0) return false;
  return link.link_status == RTE_ETH_LINK_DOWN;
}

// Registers the calling application thread with the EAL once (an lcore id of
// its own, so mbuf allocation uses a per-thread mempool cache).
void RegisterPollingThread() {
  struct Registration {
    bool ok = rte_thread_register() == 0;
    ~Registration() {
      if (ok) rte_thread_unregister();
    }
  };
  thread_local Registration registration;
  (void)registration;
}

std::string DpdkError(int err) { return rte_strerror(err < 0 ? -err : err); }

// Reads bytes of a received frame's (possibly multi-segment) mbuf chain.
class MbufPayload final : public PayloadSource {
 public:
  MbufPayload(const rte_mbuf* m, uint32_t base) : m_(m), base_(base) {}
  void CopyOut(uint32_t offset, uint32_t len, char* dst) const override {
    const void* p = rte_pktmbuf_read(m_, base_ + offset, len, dst);
    if (p != dst && p != nullptr) std::memcpy(dst, p, len);
  }
  Span SpanAt(uint32_t offset, uint32_t len) const override {
    uint32_t off = base_ + offset;
    const rte_mbuf* seg = m_;
    while (seg->next != nullptr && off >= rte_pktmbuf_data_len(seg)) {
      off -= rte_pktmbuf_data_len(seg);
      seg = seg->next;
    }
    return Span{rte_pktmbuf_mtod_offset(seg, const char*, off),
                std::min(len, rte_pktmbuf_data_len(seg) - off)};
  }

 private:
  const rte_mbuf* m_;
  uint32_t base_;
};

}  // namespace

// Each piece is folded before it is swapped (see dpdk_port.h for why).
uint16_t Ipv4UdpSum(const rte_mbuf* m, const rte_ipv4_hdr* ip, uint32_t off, uint32_t len) {
  uint64_t sum = rte_ipv4_phdr_cksum(ip, 0);
  uint32_t done = 0;
  for (const rte_mbuf* seg = m; seg != nullptr && done < len; seg = seg->next) {
    const uint32_t seg_len = rte_pktmbuf_data_len(seg);
    if (off >= seg_len) {
      off -= seg_len;
      continue;
    }
    const uint32_t piece = std::min(seg_len - off, len - done);
    uint16_t folded = RawOnesSum(rte_pktmbuf_mtod_offset(seg, const char*, off), piece);
    if (done & 1) folded = rte_bswap16(folded);  // its bytes sit at odd positions of the whole
    sum += folded;
    done += piece;
    off = 0;
  }
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

bool ListenerState::Push(std::shared_ptr<ConnState> conn, uint16_t port_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || queue_.size() >= backlog_) return false;
  queue_.push_back(Pending{std::move(conn), port_id});
  cv_.notify_one();
  return true;
}

Result<ListenerState::Pending> ListenerState::Pop(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (closed_) return Status::Aborted("listener closed");
    if (!queue_.empty()) {
      auto c = std::move(queue_.front());
      queue_.pop_front();
      return c;
    }
    if (deadline.expired()) return Status::Timeout("no incoming connection before the deadline");
    cv_.wait_for(lock,
                 std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(50)));
  }
}

std::deque<std::shared_ptr<ConnState>> ListenerState::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
  std::deque<std::shared_ptr<ConnState>> left;
  for (Pending& p : queue_) left.push_back(std::move(p.conn));
  queue_.clear();
  return left;
}

Result<std::shared_ptr<DpdkPort>> DpdkPort::Start(uint16_t port_id, const PortSettings& settings) {
  if (!rte_eth_dev_is_valid_port(port_id)) {
    return Status::NotFound("no DPDK port " + std::to_string(port_id) + " (" +
                            std::to_string(rte_eth_dev_count_avail()) + " available)");
  }
  std::shared_ptr<DpdkPort> port(new DpdkPort());
  port->port_id_ = port_id;
  char name[RTE_ETH_NAME_MAX_LEN] = {0};
  rte_eth_dev_get_name_by_port(port_id, name);
  port->name_ = name;
  const std::string what = "DPDK port " + std::to_string(port_id) + " (" + port->name_ + ")";

  rte_eth_dev_info info;
  int rc = rte_eth_dev_info_get(port_id, &info);
  if (rc != 0) return Status::IOError(what + ": rte_eth_dev_info_get: " + DpdkError(rc));

  uint32_t mbuf_room = settings.mbuf_bytes;
  const std::string driver = info.driver_name != nullptr ? info.driver_name : "";
  const bool memif = driver == "net_memif";
  const bool af_packet = driver == "net_af_packet";
  port->multi_seg_ = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
  // Drivers that copy frames with the CPU can take mbufs pointing at any memory.
  port->zero_copy_tx_ = port->multi_seg_ && (memif || driver == "net_af_packet");
  // memif unmaps its shared memory when the peer dies, with no wait for a
  // burst in progress (burst_fault_guard.h).
  port->guard_bursts_ = memif;
  uint32_t port_max = info.max_mtu > 0 ? info.max_mtu : UINT32_MAX;
  if (info.max_rx_pktlen > RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN) {
    port_max = std::min<uint32_t>(port_max, info.max_rx_pktlen - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN);
  }
  uint32_t mtu = settings.mtu;
  std::string mtu_refusal;  // why the port runs below the requested MTU
  bool scatter = false;
  if (memif) {
    // DPDK 22.11's memif reports a fixed 1518-byte maximum frame, but it
    // takes any frame that fits one of its shared-memory buffers (bsize=):
    // only ethdev's configure check uses that figure. Configure within it and
    // send frames up to the buffer size. Frames chained over several memif
    // buffers arrived damaged in our tests (22.11), so they are not used.
    const uint32_t bsize =
        VdevUint(settings.eal_args, port->name_, "bsize", kDefaultMemifBufferBytes, 256, 65535);
    if (mtu + RTE_ETHER_HDR_LEN > bsize) {
      mtu = bsize - RTE_ETHER_HDR_LEN;
      mtu_refusal = "a frame must fit one " + std::to_string(bsize) + "-byte memif buffer (raise bsize= in --vdev=" +
                    port->name_ + ",...; 16384 allows MTU 9000)";
    }
    // One mbuf per received frame: net_memif copies a frame bigger than an
    // mbuf into a chain (five 2 KiB mbufs for a 9000-byte MTU, each
    // allocated and filled apart), which the reader then gathers. Measured
    // at MTU 9000, 1 MiB messages: 19.4 -> 23.1 Gbit/s.
    mbuf_room = std::max(mbuf_room, (mtu + RTE_ETHER_HDR_LEN + 1023) / 1024 * 1024);
  } else if (af_packet) {
    // net_af_packet also reports a 1518-byte maximum frame, but it carries
    // any frame that fits one frame of its kernel rings (framesz=, default
    // 2048) and that the kernel interface's MTU lets through. Its rx queue
    // wants mbufs that hold a whole ring frame: the mbuf size follows.
    const uint32_t framesz =
        VdevUint(settings.eal_args, port->name_, "framesz", kDefaultAfPacketFrameBytes, 512, 65024);
    const std::string iface = VdevParam(settings.eal_args, port->name_, "iface");
    const uint32_t ring_mtu = framesz - kAfPacketRingOverhead - RTE_ETHER_HDR_LEN;
    if (mtu > ring_mtu) {
      mtu = ring_mtu;
      mtu_refusal = "a frame must fit one " + std::to_string(framesz) + "-byte af_packet ring frame (raise framesz= and "
                    "blocksz= in --vdev=" + port->name_ + ",...; framesz=16384,blocksz=16384 allows MTU 9000)";
    }
    const uint32_t kernel_mtu = KernelInterfaceMtu(iface);
    if (kernel_mtu > 0 && mtu > kernel_mtu) {
      mtu = kernel_mtu;
      mtu_refusal = "interface " + iface + " has MTU " + std::to_string(kernel_mtu) + " (ip link set " + iface +
                    " mtu 9000 raises it)";
    } else if (kernel_mtu == 0 && mtu > RTE_ETHER_MTU) {
      mtu = RTE_ETHER_MTU;
      mtu_refusal = "the MTU of interface '" + iface + "' is unknown";
    }
    mbuf_room = std::max(mbuf_room, framesz);
  } else {
    if (mtu > port_max) {
      mtu = port_max;
      mtu_refusal = "the port's maximum MTU is " + std::to_string(port_max);
    }
    if (!port->multi_seg_ && mtu + RTE_ETHER_HDR_LEN > mbuf_room) {
      mtu = mbuf_room - RTE_ETHER_HDR_LEN;
      mtu_refusal = "the port has no multi-segment transmit, so a frame must fit one " + std::to_string(mbuf_room) +
                    "-byte mbuf (raise mbuf_bytes=)";
    }
    scatter = mtu + RTE_ETHER_HDR_LEN > mbuf_room;
    if (scatter && !(info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER)) {
      mtu = mbuf_room - RTE_ETHER_HDR_LEN;
      scatter = false;
      mtu_refusal = "the port has no rx scatter, so a frame must fit one " + std::to_string(mbuf_room) +
                    "-byte mbuf (raise mbuf_bytes=)";
    }
  }

  rte_eth_conf conf;
  std::memset(&conf, 0, sizeof(conf));
  if (port->multi_seg_) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  if (scatter) conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
  const uint64_t tx_csum = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  const uint64_t rx_csum = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  if (memif) {
    port->checksum_ = ChecksumMode::kLinkGuaranteed;
  } else if ((info.tx_offload_capa & tx_csum) == tx_csum && (info.rx_offload_capa & rx_csum) == rx_csum) {
    port->checksum_ = ChecksumMode::kOffload;
    conf.txmode.offloads |= tx_csum;
    conf.rxmode.offloads |= rx_csum;
  }
  // PMDs without an mtu_set op (memif) take the MTU from here.
  conf.rxmode.mtu = std::min(mtu, port_max);
  rc = rte_eth_dev_configure(port_id, 1, 1, &conf);
  if (rc != 0 && mtu != RTE_ETHER_MTU) {
    mtu_refusal = "rte_eth_dev_configure refused MTU " + std::to_string(mtu) + ": " + DpdkError(rc);
    mtu = RTE_ETHER_MTU;
    conf.rxmode.mtu = mtu;
    conf.rxmode.offloads &= ~RTE_ETH_RX_OFFLOAD_SCATTER;
    rc = rte_eth_dev_configure(port_id, 1, 1, &conf);
  }
  if (rc != 0) return Status::IOError(what + ": rte_eth_dev_configure: " + DpdkError(rc));
  uint16_t nb_rxd = kRxDesc, nb_txd = kTxDesc;
  rc = rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &nb_rxd, &nb_txd);
  if (rc != 0) return Status::IOError(what + ": adjusting descriptor counts: " + DpdkError(rc));

  uint32_t mbufs = settings.mbufs;
  if (mbufs == 0) mbufs = std::max<uint32_t>(4095, 2u * (nb_rxd + nb_txd) + kMaxPendingTx + 1024);
  int socket = rte_eth_dev_socket_id(port_id);
  if (socket < 0) socket = static_cast<int>(rte_socket_id());
  std::string pool_name = "canopy_p" + std::to_string(port_id);
  port->pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), mbufs, 256, kMbufPrivSize,
                                        static_cast<uint16_t>(mbuf_room + RTE_PKTMBUF_HEADROOM), socket);
  if (port->pool_ == nullptr) {
    return Status::ResourceExhausted(what + ": cannot create a pool of " + std::to_string(mbufs) +
                                     " mbufs: " + DpdkError(rte_errno) + " (raise -m or lower mbufs=)");
  }
  rc = rte_eth_rx_queue_setup(port_id, 0, nb_rxd, static_cast<unsigned>(socket), nullptr, port->pool_);
  if (rc != 0) return Status::IOError(what + ": rx queue setup: " + DpdkError(rc));
  rte_eth_txconf txconf = info.default_txconf;
  txconf.offloads = conf.txmode.offloads;
  rc = rte_eth_tx_queue_setup(port_id, 0, nb_txd, static_cast<unsigned>(socket), &txconf);
  if (rc != 0) return Status::IOError(what + ": tx queue setup: " + DpdkError(rc));
  if (!memif && !af_packet) {
    uint16_t current_mtu = 1500;
    int set_rc = rte_eth_dev_set_mtu(port_id, static_cast<uint16_t>(mtu));
    if (rte_eth_dev_get_mtu(port_id, &current_mtu) != 0) current_mtu = 1500;
    if (current_mtu < mtu) {
      mtu_refusal = "rte_eth_dev_set_mtu(" + std::to_string(mtu) + ") left the port at " +
                    std::to_string(current_mtu) + (set_rc != 0 ? ": " + DpdkError(set_rc) : "");
      mtu = current_mtu;
    }
  }
  rc = rte_eth_dev_start(port_id);
  if (rc != 0) return Status::IOError(what + ": rte_eth_dev_start: " + DpdkError(rc));
  (void)rte_eth_promiscuous_enable(port_id);
  std::random_device rd;
  rte_ether_addr addr;
  if (port->name_.rfind("net_memif", 0) == 0) {
    // memif gives every instance the same default MAC; two processes on one
    // socket would then look like one host. Pick a random local address.
    for (auto& b : addr.addr_bytes) b = static_cast<uint8_t>(rd());
    addr.addr_bytes[0] = static_cast<uint8_t>((addr.addr_bytes[0] & 0xfe) | 0x02);  // unicast, local
    (void)rte_eth_dev_default_mac_addr_set(port_id, &addr);
  }
  if (rte_eth_macaddr_get(port_id, &addr) == 0) std::memcpy(port->mac_.bytes, addr.addr_bytes, 6);

  port->mtu_ = mtu;
  port->mss_ = mtu - 20 - 8 - static_cast<uint32_t>(kSegmentHeaderSize + kDataSackBlocks * kSackBlockSize);
  port->id_state_ = (uint64_t{rd()} << 32) | rd();
  port->next_ephemeral_ = static_cast<uint16_t>(49152 + rd() % 16000);
  if (mtu < settings.mtu) {
    CANOPY_LOG(kInfo, "dpdk: {}: MTU {} requested, {} used: {}", what, settings.mtu, mtu, mtu_refusal);
  }
  const char* checksum = port->checksum_ == ChecksumMode::kLinkGuaranteed ? "none (memif shared memory)"
                         : port->checksum_ == ChecksumMode::kOffload      ? "offloaded"
                                                                           : "software";
  CANOPY_LOG(kInfo,
             "dpdk: {} up: mac {} mtu {} (mss {}), {} mbufs of {} bytes, {} rx / {} tx descriptors{}{}, "
             "UDP checksum {}",
             what, FormatMac(port->mac_), port->mtu_, port->mss_, mbufs, mbuf_room, nb_rxd, nb_txd,
             port->multi_seg_ ? ", multi-segment tx" : "", port->zero_copy_tx_ ? ", zero-copy tx" : "", checksum);
  DpdkPort* raw = port.get();
  port->thread_ = std::thread([raw] { raw->Run(); });
  return port;
}

DpdkPort::~DpdkPort() {
  running_ = false;
  Wake();
  if (thread_.joinable()) thread_.join();
  // Frames never handed to the driver still pin (and keep alive) send rings.
  std::lock_guard<std::mutex> lock(poll_mu_);
  for (rte_mbuf* m : tx_pending_) rte_pktmbuf_free(m);
  tx_pending_.clear();
  for (const Delayed& d : delayed_) rte_pktmbuf_free(d.mbuf);
  delayed_.clear();
}

uint32_t DpdkPort::DefaultIp() {
  std::lock_guard<std::mutex> lock(table_mu_);
  if (!addresses_.empty()) return addresses_.front();
  return (10u << 24) | (100u + port_id_);
}

void DpdkPort::AddAddress(uint32_t ip) {
  std::lock_guard<std::mutex> lock(table_mu_);
  if (std::find(addresses_.begin(), addresses_.end(), ip) == addresses_.end()) {
    addresses_.push_back(ip);
    ++table_gen_;
  }
}

Result<uint16_t> DpdkPort::FreeUdpPortLocked() {
  for (int tries = 0; tries < 16384; ++tries) {
    uint16_t p = next_ephemeral_;
    next_ephemeral_ = next_ephemeral_ >= 65535 ? 49152 : static_cast<uint16_t>(next_ephemeral_ + 1);
    if (listeners_.count(p) != 0) continue;
    bool used = false;
    for (const auto& [id, c] : conns_) {
      if (c->params().local_port == p) {
        used = true;
        break;
      }
    }
    if (!used) return p;
  }
  return Status::ResourceExhausted("no free UDP port on " + name_);
}

Result<uint16_t> DpdkPort::AddListener(uint16_t udp_port, std::shared_ptr<ListenerState> listener) {
  std::lock_guard<std::mutex> lock(table_mu_);
  if (udp_port == 0) {
    CANOPY_ASSIGN_OR_RETURN(udp_port, FreeUdpPortLocked());
  } else if (listeners_.count(udp_port) != 0) {
    return Status::AlreadyExists("UDP port " + std::to_string(udp_port) + " on " + name_ +
                                 " is already listening");
  }
  listeners_[udp_port] = std::move(listener);
  ++table_gen_;
  return udp_port;
}

size_t DpdkPort::ConnectionCount() {
  std::lock_guard<std::mutex> lock(table_mu_);
  return conns_.size();
}

void DpdkPort::RemoveListener(uint16_t udp_port, bool close_state) {
  std::shared_ptr<ListenerState> l;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    auto it = listeners_.find(udp_port);
    if (it == listeners_.end()) return;
    l = it->second;
    listeners_.erase(it);
    ++table_gen_;
  }
  if (!close_state) return;
  for (auto& c : l->Close()) {
    c->Fail(Status::Aborted("listener closed before Accept"));
    c->Abort();
  }
  Wake();
}

uint32_t DpdkPort::NewConnIdLocked() {
  for (;;) {
    id_state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = id_state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    auto id = static_cast<uint32_t>(z ^ (z >> 31));
    if (id != 0 && conns_.count(id) == 0) return id;
  }
}

Result<std::shared_ptr<ConnState>> DpdkPort::AddClient(ConnParams params) {
  std::shared_ptr<ConnState> conn;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    params.local_id = NewConnIdLocked();
    CANOPY_ASSIGN_OR_RETURN(params.local_port, FreeUdpPortLocked());
    params.mss = mss_;
    params.accepts_unchecked_payloads = checksum_ == ChecksumMode::kLinkGuaranteed;
    conn = ConnState::NewClient(params, NowNanos());
    conn->set_wakeup([this] { Wake(); });
    conn->set_poller([this] { return PollFromApp(); });
    conns_[params.local_id] = conn;
    ++table_gen_;
  }
  Wake();
  return conn;
}

void DpdkPort::Wake() {
  if (!sleeping_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(sleep_mu_);
  wake_pending_ = true;
  sleep_cv_.notify_one();
}

// ---------------------------------------------------------------- datapath

void DpdkPort::RefreshSnapshot() {
  uint64_t gen = table_gen_.load(std::memory_order_acquire);
  if (gen == seen_gen_) return;
  std::lock_guard<std::mutex> lock(table_mu_);
  seen_gen_ = table_gen_.load();
  io_conns_ = conns_;
  io_list_.clear();
  for (const auto& [id, c] : conns_) io_list_.push_back(c);
  io_addresses_ = std::set<uint32_t>(addresses_.begin(), addresses_.end());
}

bool DpdkPort::PollFromApp() {
  last_app_poll_ns_.store(NowNanos(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(poll_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Another thread is in the datapath. If it shares this core and was
    // preempted there, spinning on the lock would keep it from finishing
    // (for a whole time slice, seen as 200+ us ping-pong tails): let it run.
    std::this_thread::yield();
    return false;
  }
  RegisterPollingThread();
  return PollOnce();
}

bool DpdkPort::PollOnce() {
  rte_mbuf* rx[kBurst];
  RefreshSnapshot();
  uint64_t now = NowNanos();
  uint16_t n = RxBurst(rx, kBurst);
  for (uint16_t i = 0; i < n; ++i) {
    HandleFrame(rx[i], now);
    rte_pktmbuf_free(rx[i]);
  }
  RefreshSnapshot();
  bool finished_any = false;
  uint64_t before = frames_enqueued_;
  for (const auto& c : io_list_) {
    c->Poll(*this, now, kPollBudget);
    if (c->Finished()) finished_any = true;
  }
  if (finished_any) {
    std::lock_guard<std::mutex> lock(table_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->Finished()) {
        const ConnParams& p = it->second->params();
        auto c = it->second->counters();
        CANOPY_LOG(kDebug, "dpdk: connection {:08x} done: {} frames sent, {} retransmitted, {} dropped by fault injection",
                   p.local_id, c.frames_sent, c.retransmits, c.injected_drops);
        syn_index_.erase(SynKey{p.remote_ip, p.remote_port, it->second->remote_id()});
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    ++table_gen_;
  }
  bool had_pending = !tx_pending_.empty();
  FlushTx(now);
  return n > 0 || frames_enqueued_ != before || had_pending;
}

void DpdkPort::Run() {
  (void)rte_thread_register();
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  int idle = 0;
  uint64_t last_busy_ns = 0;
  uint64_t app_poll_sleep_ns = kAppPollGraceNs;
  while (running_.load(std::memory_order_relaxed)) {
    uint64_t now = NowNanos();
    bool app_polls = now - last_app_poll_ns_.load(std::memory_order_relaxed) < kAppPollGraceNs;
    if (!app_polls) app_poll_sleep_ns = kAppPollGraceNs;
    bool busy = false;
    if (!app_polls) {
      std::unique_lock<std::mutex> lock(poll_mu_, std::try_to_lock);
      if (lock.owns_lock()) busy = PollOnce();
    }
    if (busy) {
      idle = 0;
      last_busy_ns = now;
      continue;
    }
    // Keep polling for a while after traffic (a reply usually follows soon),
    // unless an application thread does the polling itself.
    if (!app_polls && (++idle < 200 || now - last_busy_ns < kSpinAfterTrafficNs)) continue;
    // Idle: sleep briefly (timers run at least every 200 us); Wake() cuts it
    // short. While an application thread polls (it runs every connection's
    // timers too) only check back after app_poll_sleep_ns, which grows while
    // it keeps polling: waking more often would preempt that thread when
    // both share a core.
    std::unique_lock<std::mutex> lock(sleep_mu_);
    sleeping_.store(true, std::memory_order_release);
    if (!wake_pending_) {
      sleep_cv_.wait_for(lock, app_polls     ? std::chrono::microseconds(app_poll_sleep_ns / 1000)
                               : idle < 2000 ? std::chrono::microseconds(20)
                                             : std::chrono::microseconds(200));
    }
    if (app_polls) app_poll_sleep_ns = std::min(2 * app_poll_sleep_ns, kAppPollMaxSleepNs);
    wake_pending_ = false;
    sleeping_.store(false, std::memory_order_release);
  }
}

void DpdkPort::HandleFrame(rte_mbuf* m, uint64_t now) {
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  char buf[kOuterHeaderSize + kSegmentHeaderSize + kMaxSackBlocks * kSackBlockSize + 64];
  if (len < RTE_ETHER_HDR_LEN) return;
  const auto* eth = static_cast<const rte_ether_hdr*>(rte_pktmbuf_read(m, 0, sizeof(rte_ether_hdr), buf));
  uint16_t ether_type = rte_be_to_cpu_16(eth->ether_type);
  if (ether_type == RTE_ETHER_TYPE_ARP) {
    HandleArp(m);
    return;
  }
  if (ether_type != RTE_ETHER_TYPE_IPV4) return;
  MacAddress src_mac;
  std::memcpy(src_mac.bytes, eth->src_addr.addr_bytes, 6);
  if (len < RTE_ETHER_HDR_LEN + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr)) return;
  rte_ipv4_hdr ip_copy;
  const auto* ip = static_cast<const rte_ipv4_hdr*>(
      rte_pktmbuf_read(m, RTE_ETHER_HDR_LEN, sizeof(rte_ipv4_hdr), &ip_copy));
  if ((ip->version_ihl >> 4) != 4 || (ip->version_ihl & 0xf) != 5) return;  // no IP options
  if (ip->next_proto_id != IPPROTO_UDP) return;
  if ((rte_be_to_cpu_16(ip->fragment_offset) & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK)) != 0)
    return;
  uint16_t ip_total = rte_be_to_cpu_16(ip->total_length);
  if (ip_total < 28 || ip_total > len - RTE_ETHER_HDR_LEN) return;
  if (ip != &ip_copy) std::memcpy(&ip_copy, ip, sizeof(ip_copy));
  const uint64_t ip_flags = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
  if (ip_flags == RTE_MBUF_F_RX_IP_CKSUM_BAD) return;
  if (ip_flags != RTE_MBUF_F_RX_IP_CKSUM_GOOD && rte_ipv4_cksum(&ip_copy) != 0) return;
  uint32_t dst_ip = rte_be_to_cpu_32(ip_copy.dst_addr);
  uint32_t src_ip = rte_be_to_cpu_32(ip_copy.src_addr);
  if (io_addresses_.count(dst_ip) == 0) return;
  if (src_mac == mac_ && io_addresses_.count(src_ip) != 0) return;  // our own frame looped back
  rte_udp_hdr udp_copy;
  const auto* udp = static_cast<const rte_udp_hdr*>(
      rte_pktmbuf_read(m, RTE_ETHER_HDR_LEN + sizeof(rte_ipv4_hdr), sizeof(rte_udp_hdr), &udp_copy));
  uint16_t udp_len = rte_be_to_cpu_16(udp->dgram_len);
  if (udp_len < sizeof(rte_udp_hdr) + kSegmentHeaderSize || udp_len > ip_total - sizeof(rte_ipv4_hdr)) return;
  uint16_t src_port = rte_be_to_cpu_16(udp->src_port);
  uint16_t dst_port = rte_be_to_cpu_16(udp->dst_port);
  if (udp->dgram_cksum == 0) {
    // No checksum: only acceptable where the link cannot damage frames.
    if (checksum_ != ChecksumMode::kLinkGuaranteed) return;
  } else {
    const uint64_t l4_flags = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
    if (l4_flags == RTE_MBUF_F_RX_L4_CKSUM_BAD) return;
    if (l4_flags != RTE_MBUF_F_RX_L4_CKSUM_GOOD &&
        Ipv4UdpSum(m, &ip_copy, RTE_ETHER_HDR_LEN + sizeof(rte_ipv4_hdr), udp_len) != 0xffff)
      return;
  }
  neighbours_[src_ip] = src_mac;

  const uint32_t seg_off = kOuterHeaderSize;
  const uint32_t seg_len = udp_len - sizeof(rte_udp_hdr);
  uint32_t head_len = std::min<uint32_t>(seg_len, kSegmentHeaderSize + kMaxSackBlocks * kSackBlockSize);
  const char* head = static_cast<const char*>(rte_pktmbuf_read(m, seg_off, head_len, buf));
  // Only as many bytes as the header + its SACK blocks take belong to the header view.
  size_t sack_count = static_cast<uint8_t>(head[5]);
  size_t header_bytes = std::min<size_t>(head_len, kSegmentHeaderSize + sack_count * kSackBlockSize);
  auto decoded = DecodeSegmentHeader(std::string_view(head, header_bytes), seg_len);
  if (!decoded.ok()) return;
  SegmentHeader& h = *decoded;
  if (h.kind == SegmentKind::kSyn && h.dst_conn == 0) {
    HandleSyn(h, src_ip, src_port, src_mac, dst_ip, dst_port, now);
    return;
  }
  auto it = io_conns_.find(h.dst_conn);
  if (it == io_conns_.end() || it->second->params().remote_ip != src_ip ||
      it->second->params().remote_port != src_port || it->second->params().local_port != dst_port) {
    if (h.kind != SegmentKind::kRst) SendRst(h, dst_ip, dst_port, src_mac, src_ip, src_port);
    return;
  }
  MbufPayload payload(m, seg_off + static_cast<uint32_t>(h.encoded_size()));
  it->second->OnSegment(h, payload, now);
}

void DpdkPort::HandleSyn(const SegmentHeader& h, uint32_t src_ip, uint16_t src_port,
                         const MacAddress& src_mac, uint32_t dst_ip, uint16_t dst_port, uint64_t now) {
  std::shared_ptr<ConnState> conn;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    auto existing = syn_index_.find(SynKey{src_ip, src_port, h.src_conn});
    if (existing != syn_index_.end()) {
      auto c = conns_.find(existing->second);
      if (c != conns_.end()) conn = c->second;
    }
    if (!conn) {
      auto l = listeners_.find(dst_port);
      if (l == listeners_.end()) {
        // Nothing listens: refuse.
      } else {
        ConnParams params = l->second->templ();
        params.local_id = NewConnIdLocked();
        params.local_ip = dst_ip;
        params.local_port = dst_port;
        params.remote_ip = src_ip;
        params.remote_port = src_port;
        params.mss = mss_;
        params.accepts_unchecked_payloads = checksum_ == ChecksumMode::kLinkGuaranteed;
        auto fresh = ConnState::NewServer(params, h, src_mac, now);
        fresh->set_wakeup([this] { Wake(); });
        fresh->set_poller([this] { return PollFromApp(); });
        if (!l->second->Push(fresh, port_id_)) return;  // backlog full: the dialler retries
        conns_[params.local_id] = fresh;
        syn_index_[SynKey{src_ip, src_port, h.src_conn}] = params.local_id;
        ++table_gen_;
        return;  // the next Poll sends the SYN-ACK
      }
    }
  }
  if (conn) {
    MbufPayload none(nullptr, 0);
    conn->OnSegment(h, none, now);
    return;
  }
  SendRst(h, dst_ip, dst_port, src_mac, src_ip, src_port);
}

void DpdkPort::SendRst(const SegmentHeader& to, uint32_t src_ip, uint16_t src_port, const MacAddress& dst_mac,
                       uint32_t dst_ip, uint16_t dst_port) {
  if (tx_pending_.size() >= kMaxPendingTx) return;
  SegmentHeader rst;
  rst.kind = SegmentKind::kRst;
  rst.src_conn = to.dst_conn;
  rst.dst_conn = to.src_conn;
  rst.tsval = NowNanos();
  rte_mbuf* m = BuildFrame(dst_mac, src_ip, src_port, dst_ip, dst_port, rst, nullptr, 0);
  if (m != nullptr) Enqueue(m);
}

void DpdkPort::HandleArp(rte_mbuf* m) {
  rte_arp_hdr copy;
  if (rte_pktmbuf_pkt_len(m) < RTE_ETHER_HDR_LEN + sizeof(rte_arp_hdr)) return;
  const auto* arp =
      static_cast<const rte_arp_hdr*>(rte_pktmbuf_read(m, RTE_ETHER_HDR_LEN, sizeof(copy), &copy));
  if (rte_be_to_cpu_16(arp->arp_hardware) != RTE_ARP_HRD_ETHER ||
      rte_be_to_cpu_16(arp->arp_protocol) != RTE_ETHER_TYPE_IPV4 || arp->arp_hlen != 6 ||
      arp->arp_plen != 4) {
    return;
  }
  uint32_t sip = rte_be_to_cpu_32(arp->arp_data.arp_sip);
  uint32_t tip = rte_be_to_cpu_32(arp->arp_data.arp_tip);
  MacAddress sha;
  std::memcpy(sha.bytes, arp->arp_data.arp_sha.addr_bytes, 6);
  if (sha == mac_ && io_addresses_.count(sip) != 0) return;  // our own request looped back
  if (sip != 0) neighbours_[sip] = sha;
  if (rte_be_to_cpu_16(arp->arp_opcode) != RTE_ARP_OP_REQUEST || io_addresses_.count(tip) == 0) return;
  rte_mbuf* r = rte_pktmbuf_alloc(pool_);
  if (r == nullptr) return;
  auto* e = rte_pktmbuf_mtod(r, rte_ether_hdr*);
  auto* a = reinterpret_cast<rte_arp_hdr*>(e + 1);
  std::memcpy(e->dst_addr.addr_bytes, sha.bytes, 6);
  std::memcpy(e->src_addr.addr_bytes, mac_.bytes, 6);
  e->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
  a->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
  a->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  a->arp_hlen = 6;
  a->arp_plen = 4;
  a->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
  std::memcpy(a->arp_data.arp_sha.addr_bytes, mac_.bytes, 6);
  a->arp_data.arp_sip = rte_cpu_to_be_32(tip);
  std::memcpy(a->arp_data.arp_tha.addr_bytes, sha.bytes, 6);
  a->arp_data.arp_tip = rte_cpu_to_be_32(sip);
  r->data_len = r->pkt_len = RTE_ETHER_HDR_LEN + sizeof(rte_arp_hdr);
  Enqueue(r);
}

bool DpdkPort::Neighbour(uint32_t ip, MacAddress* mac) {
  auto it = neighbours_.find(ip);
  if (it == neighbours_.end()) return false;
  *mac = it->second;
  return true;
}

void DpdkPort::SendArpRequest(uint32_t local_ip, uint32_t target_ip) {
  uint64_t now = NowNanos();
  uint64_t& last = arp_sent_ns_[target_ip];
  if (now - last < 20'000'000) return;  // one request per target per 20 ms
  last = now;
  rte_mbuf* r = rte_pktmbuf_alloc(pool_);
  if (r == nullptr) return;
  auto* e = rte_pktmbuf_mtod(r, rte_ether_hdr*);
  auto* a = reinterpret_cast<rte_arp_hdr*>(e + 1);
  std::memset(e->dst_addr.addr_bytes, 0xff, 6);
  std::memcpy(e->src_addr.addr_bytes, mac_.bytes, 6);
  e->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
  a->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
  a->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  a->arp_hlen = 6;
  a->arp_plen = 4;
  a->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REQUEST);
  std::memcpy(a->arp_data.arp_sha.addr_bytes, mac_.bytes, 6);
  a->arp_data.arp_sip = rte_cpu_to_be_32(local_ip);
  std::memset(a->arp_data.arp_tha.addr_bytes, 0, 6);
  a->arp_data.arp_tip = rte_cpu_to_be_32(target_ip);
  r->data_len = r->pkt_len = RTE_ETHER_HDR_LEN + sizeof(rte_arp_hdr);
  Enqueue(r);
}

rte_mbuf* DpdkPort::BuildFrame(const MacAddress& dst_mac, uint32_t src_ip, uint16_t src_port, uint32_t dst_ip,
                               uint16_t dst_port, const SegmentHeader& h, const ByteRing* data,
                               uint64_t offset) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool_);
  if (m == nullptr) return nullptr;
  const size_t seg_header = h.encoded_size();
  const uint32_t udp_len = static_cast<uint32_t>(sizeof(rte_udp_hdr) + seg_header + h.payload_len);
  char* p = rte_pktmbuf_append(m, static_cast<uint16_t>(kOuterHeaderSize + seg_header));
  if (p == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  auto* eth = reinterpret_cast<rte_ether_hdr*>(p);
  std::memcpy(eth->dst_addr.addr_bytes, dst_mac.bytes, 6);
  std::memcpy(eth->src_addr.addr_bytes, mac_.bytes, 6);
  eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
  ip->version_ihl = RTE_IPV4_VHL_DEF;
  ip->type_of_service = 0;
  ip->total_length = rte_cpu_to_be_16(static_cast<uint16_t>(sizeof(rte_ipv4_hdr) + udp_len));
  ip->packet_id = rte_cpu_to_be_16(ip_id_++);
  ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
  ip->time_to_live = 64;
  ip->next_proto_id = IPPROTO_UDP;
  ip->hdr_checksum = 0;
  ip->src_addr = rte_cpu_to_be_32(src_ip);
  ip->dst_addr = rte_cpu_to_be_32(dst_ip);
  ip->hdr_checksum = rte_ipv4_cksum(ip);
  auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
  udp->src_port = rte_cpu_to_be_16(src_port);
  udp->dst_port = rte_cpu_to_be_16(dst_port);
  udp->dgram_len = rte_cpu_to_be_16(static_cast<uint16_t>(udp_len));
  udp->dgram_cksum = 0;
  EncodeSegmentHeader(h, reinterpret_cast<char*>(udp + 1));
  uint32_t done = 0;
  rte_mbuf* last = m;
  while (zero_copy_tx_ && done < h.payload_len) {
    // Attach the next contiguous piece of the send ring; it stays pinned until freed.
    const uint64_t at = offset + done;
    const uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(
        {h.payload_len - done, data->ContiguousFrom(at), UINT16_MAX}));
    rte_mbuf* x = rte_pktmbuf_alloc(pool_);
    if (x == nullptr) {
      rte_pktmbuf_free(m);
      return nullptr;
    }
    auto* pin = new (rte_mbuf_to_priv(x)) TxPin();
    pin->shinfo.free_cb = ReleasePin;
    pin->shinfo.fcb_opaque = pin;
    rte_mbuf_ext_refcnt_set(&pin->shinfo, 1);
    pin->storage = data->storage().get();
    pin->storage->AddFrame(data->storage());
    pin->from = at;
    pin->to = at + chunk;
    pin->storage->Pin(pin->from, pin->to);
    char* addr = data->At(at);
    rte_iova_t iova = rte_eal_iova_mode() == RTE_IOVA_VA ? static_cast<rte_iova_t>(reinterpret_cast<uintptr_t>(addr))
                                                         : RTE_BAD_IOVA;
    rte_pktmbuf_attach_extbuf(x, addr, iova, static_cast<uint16_t>(chunk), &pin->shinfo);
    x->data_len = static_cast<uint16_t>(chunk);
    x->pkt_len = chunk;
    if (rte_pktmbuf_chain(m, x) != 0) {
      rte_pktmbuf_free(x);
      rte_pktmbuf_free(m);
      return nullptr;
    }
    done += chunk;
  }
  while (done < h.payload_len) {
    uint16_t room = rte_pktmbuf_tailroom(last);
    if (room == 0) {
      rte_mbuf* next = multi_seg_ ? rte_pktmbuf_alloc(pool_) : nullptr;
      if (next == nullptr || rte_pktmbuf_chain(m, next) != 0) {
        if (next != nullptr) rte_pktmbuf_free(next);
        rte_pktmbuf_free(m);
        return nullptr;
      }
      last = next;
      continue;
    }
    uint32_t chunk = std::min<uint32_t>(room, h.payload_len - done);
    char* dst = rte_pktmbuf_append(m, static_cast<uint16_t>(chunk));
    data->CopyOut(offset + done, chunk, dst);
    done += chunk;
  }
  switch (checksum_) {
    case ChecksumMode::kLinkGuaranteed:
      break;  // 0: no UDP checksum (see the policy at the top)
    case ChecksumMode::kOffload:
      m->l2_len = RTE_ETHER_HDR_LEN;
      m->l3_len = sizeof(rte_ipv4_hdr);
      m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
      ip->hdr_checksum = 0;
      udp->dgram_cksum = rte_ipv4_phdr_cksum(ip, m->ol_flags);
      break;
    case ChecksumMode::kSoftware:
      udp->dgram_cksum = 0;
      udp->dgram_cksum = static_cast<uint16_t>(~Ipv4UdpSum(m, ip, kOuterHeaderSize - sizeof(rte_udp_hdr), udp_len));
      if (udp->dgram_cksum == 0) udp->dgram_cksum = 0xffff;  // 0 means "no checksum" in UDP
      break;
  }
  return m;
}

bool DpdkPort::Emit(const ConnState& conn, const MacAddress& dst_mac, const SegmentHeader& h,
                    const ByteRing* data, uint64_t offset) {
  if (tx_pending_.size() >= kMaxPendingTx) return false;
  const ConnParams& p = conn.params();
  rte_mbuf* m = BuildFrame(dst_mac, p.local_ip, p.local_port, p.remote_ip, p.remote_port, h, data, offset);
  if (m == nullptr) return false;
  const FaultConfig& f = p.faults;
  if (f.active()) {
    double r = conn.NextFaultRandom();
    if (r < f.drop) {
      conn.CountInjectedDrop();
      rte_pktmbuf_free(m);
      return true;
    }
    r -= f.drop;
    if (r < f.duplicate) {
      rte_mbuf* copy = rte_pktmbuf_copy(m, pool_, 0, UINT32_MAX);
      if (copy != nullptr) Enqueue(copy);
    } else if (r - f.duplicate < f.reorder) {
      // Hold the frame back until 1..8 later frames went out (or 1 ms passed).
      uint64_t later = 1 + static_cast<uint64_t>(conn.NextFaultRandom() * 8);
      delayed_.push_back(Delayed{m, frames_enqueued_ + later, NowNanos()});
      return true;
    }
  }
  Enqueue(m);
  return true;
}

uint16_t DpdkPort::RxBurst(rte_mbuf** rx, uint16_t count) {
  if (!guard_bursts_) return rte_eth_rx_burst(port_id_, 0, rx, count);
  BurstCall call{port_id_, rx, count};
  uint16_t n = 0;
  if (!RunGuardedBurst(RxBurstCall, LinkDown, &call, &n)) NoteAbandonedBurst("rx");
  return n;
}

uint16_t DpdkPort::TxBurst(rte_mbuf** tx, uint16_t count, bool* abandoned) {
  if (!guard_bursts_) return rte_eth_tx_burst(port_id_, 0, tx, count);
  BurstCall call{port_id_, tx, count};
  uint16_t n = 0;
  *abandoned = !RunGuardedBurst(TxBurstCall, LinkDown, &call, &n);
  if (*abandoned) NoteAbandonedBurst("tx");
  return n;
}

void DpdkPort::NoteAbandonedBurst(const char* direction) {
  CANOPY_LOG(kWarn,
             "dpdk: {}: the {} burst faulted after the driver unmapped the memory shared with its peer (peer gone; "
             "{} bursts abandoned in this process); its connections fail once the peer stays silent",
             name_, direction, AbandonedBursts());
}

void DpdkPort::Enqueue(rte_mbuf* m) {
  tx_pending_.push_back(m);
  ++frames_enqueued_;
}

void DpdkPort::FlushTx(uint64_t now) {
  while (!delayed_.empty() &&
         (delayed_.front().release_at_frame <= frames_enqueued_ ||
          (now > delayed_.front().held_ns && now - delayed_.front().held_ns > kReorderHoldNs))) {
    tx_pending_.push_back(delayed_.front().mbuf);
    delayed_.pop_front();
  }
  size_t sent = 0;
  while (sent < tx_pending_.size()) {
    uint16_t want = static_cast<uint16_t>(std::min<size_t>(kBurst, tx_pending_.size() - sent));
    bool abandoned = false;
    uint16_t n = TxBurst(tx_pending_.data() + sent, want, &abandoned);
    // An abandoned burst consumed an unknown part of its mbufs: forget them
    // all (never free one twice); the connections fail on peer silence.
    sent += abandoned ? want : n;
    if (n < want) break;
  }
  if (sent > 0) {
    tx_pending_.erase(tx_pending_.begin(), tx_pending_.begin() + static_cast<long>(sent));
    last_tx_progress_ns_ = now;
  } else if (!tx_pending_.empty() && now - last_tx_progress_ns_ > kStuckTxNs) {
    // The link is down (e.g. memif peer gone): drop; retransmission recovers.
    for (rte_mbuf* m : tx_pending_) rte_pktmbuf_free(m);
    tx_pending_.clear();
    last_tx_progress_ns_ = now;
  }
  if (tx_pending_.empty()) last_tx_progress_ns_ = now;
}

}  // namespace canopy::transport::dpdk
