#include "transport/dpdk/dpdk_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "base/logging.h"
#include "transport/dpdk/dpdk_env.h"
#include "transport/dpdk/dpdk_port.h"
#include "transport/dpdk/dpdk_wire.h"
#include "transport/frame.h"

namespace canopy::transport {
namespace {

// dpdk:// does not encrypt: TLS settings are refused rather than ignored.
bool IsTlsSetting(const std::string& key) {
  return key == "cert" || key == "key" || key == "ca" || key == "tls" || key == "server_name" ||
         key == "verify_host" || key == "ktls";
}

Status RefuseTlsSettings(const std::map<std::string, std::string>& params, const std::vector<std::string>& args) {
  std::string found;
  for (const auto& [key, value] : params) {
    if (IsTlsSetting(key)) found = key;
  }
  for (const std::string& arg : args) {
    if (IsTlsSetting(arg.substr(0, arg.find('=')))) found = arg.substr(0, arg.find('='));
  }
  if (found.empty()) return Status::Ok();
  return Status::NotSupported("dpdk:// does not encrypt (its frames cross the wire in the clear), so the TLS "
                              "setting '" + found + "' cannot apply; use tls+tcp:// to encrypt");
}


using dpdk::CanopyArgs;
using dpdk::ConnParams;
using dpdk::ConnState;
using dpdk::DpdkEnv;
using dpdk::DpdkPort;

constexpr size_t kFileChunk = 256 << 10;

std::string PeerUri(const ConnParams& p) {
  return "dpdk://" + dpdk::FormatIpv4(p.remote_ip) + ":" + std::to_string(p.remote_port);
}

class DpdkConnection final : public Connection {
 public:
  DpdkConnection(std::shared_ptr<DpdkPort> port, std::shared_ptr<ConnState> conn,
                 const TransportOptions& options)
      : port_(std::move(port)),
        conn_(std::move(conn)),
        max_message_(options.max_message_bytes),
        io_timeout_(options.io_timeout),
        // Frame payloads go without CRC32C where both ends' links cannot
        // damage a frame (memif: dpdk_wire.h, kHandshakeAcceptsUncheckedPayloads),
        // as the segments' UDP checksum is left out there (dpdk_port.cc).
        send_check_(PayloadCheckFor(conn_->peer_accepts_unchecked_payloads())),
        required_check_(PayloadCheckFor(conn_->params().accepts_unchecked_payloads)) {}
  // A user-space stack dies with its process: after Shutdown, linger (up to
  // min(io_timeout, 2 s)) until the peer has everything, as the kernel would
  // for TCP, so that "Shutdown, then exit" delivers the data.
  ~DpdkConnection() override {
    if (shut_down_.load()) {
      (void)conn_->WaitFinAcked(
          Deadline::After(std::min<std::chrono::milliseconds>(io_timeout_, std::chrono::seconds(2))));
    }
    Close();
  }

  Status Send(uint16_t type, std::string_view payload) override {
    return SendMessage(type, payload, nullptr);
  }
  Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) override {
    return SendMessage(type, payload, &bulk);
  }

  Result<Message> Receive(Deadline deadline) override {
    if (!broken_.ok()) return broken_;
    if (bulk_pending_ > 0) {
      return Status::InvalidArgument(std::to_string(bulk_pending_) +
                                     " bulk bytes are still pending: consume them with ReceiveBulk first");
    }
    // The header and the payload come through one drainer, so that a
    // message's first frame (header and payload bytes together, arriving
    // while this thread waits for the header) is copied once, straight into
    // the payload: reading the header apart left the rest of that frame in
    // the receive ring, to be copied again (at 64 KiB messages, one frame in
    // eight, and all of a burst that arrived with it).
    // Capacity is reserved as tcp:// does (frame.h, kPayloadReserveMax): the
    // announced length up to 8 MiB, so that a peer announcing
    // max_message_bytes and sending nothing more does not make us claim that
    // much address space (refused outright under strict overcommit); a bigger
    // payload grows as it arrives. The payload is appended, never resized
    // first: zeroing it only for the copy to overwrite it was 5.6% of a
    // receiver's CPU at 1 MiB messages.
    char header[kFrameHeaderSize];
    size_t header_len = 0;
    std::optional<FrameHeader> decoded;
    Message msg;
    const ConnState::Drainer drain = [&](const char* src, size_t len) -> Result<size_t> {
      size_t used = 0;
      if (!decoded) {
        used = std::min(len, kFrameHeaderSize - header_len);
        std::memcpy(header + header_len, src, used);
        header_len += used;
        if (header_len < kFrameHeaderSize) return used;
        auto d = DecodeFrameHeader(std::string_view(header, kFrameHeaderSize), max_message_, required_check_);
        if (!d.ok()) return d.status();
        decoded = *d;
        msg.payload.reserve(std::min<size_t>(decoded->payload_len, kPayloadReserveMax));
      }
      const size_t take = std::min(len - used, decoded->payload_len - msg.payload.size());
      msg.payload.append(src + used, take);
      return used + take;  // fewer than len once the message is whole: the rest is the next one's
    };
    while (!decoded || msg.payload.size() < decoded->payload_len) {
      const size_t want =
          decoded ? decoded->payload_len - msg.payload.size() : std::numeric_limits<size_t>::max();
      auto got = conn_->ReadWith(want, drain, deadline);
      if (!got.ok()) {
        if (header_len == 0 && !decoded) return got.status();                        // at a message boundary
        if (header_len == kFrameHeaderSize && !decoded) return Break(got.status());  // a bad header
        return Break(MidMessage(got.status()));
      }
    }
    msg.type = decoded->type;
    Status verified = VerifyFramePayload(*decoded, msg.payload);
    if (!verified.ok()) return Break(verified);
    msg.bulk_bytes = decoded->bulk_len;
    bulk_pending_ = decoded->bulk_len;
    messages_received_.fetch_add(1, std::memory_order_relaxed);
    bytes_received_.fetch_add(msg.payload.size(), std::memory_order_relaxed);
    return msg;
  }

  Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) override {
    if (!broken_.ok()) return broken_;
    if (length > bulk_pending_) {
      return Status::InvalidArgument("ReceiveBulk of " + std::to_string(length) + " bytes but only " +
                                     std::to_string(bulk_pending_) + " are pending");
    }
    uint64_t done = 0;
    while (done < length) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, kFileChunk));
      if (sink.is_file()) {
        // Straight from the receive ring into the file (no buffer between).
        bool file_failed = false;
        uint64_t drained = 0;  // a ReadWith may call the drainer more than once
        auto got = conn_->ReadWith(
            want,
            [&](const char* src, size_t len) -> Result<size_t> {
              auto write_lock = sink.LockFileWrite();
              for (;;) {
                ssize_t w =
                    ::pwrite(sink.fd, src, len, static_cast<off_t>(sink.file_offset + done + drained));
                if (w < 0 && errno == EINTR) continue;
                if (w > 0) {
                  drained += static_cast<uint64_t>(w);
                  return static_cast<size_t>(w);
                }
                file_failed = true;
                return ErrnoStatus(w < 0 ? errno : EIO, "writing bulk bytes to file");
              }
            },
            deadline);
        if (!got.ok()) return Break(file_failed ? got.status() : MidMessage(got.status()));
        want = *got;
      } else {
        CANOPY_RETURN_IF_ERROR(ReadExact(sink.memory + done, want, deadline, false));
      }
      done += want;
      bulk_pending_ -= want;
      bytes_received_.fetch_add(want, std::memory_order_relaxed);
    }
    return Status::Ok();
  }

  Status Shutdown() override {
    std::lock_guard<std::mutex> lock(send_mu_);
    Status s = conn_->Shutdown();
    if (s.ok()) shut_down_ = true;
    return s;
  }

  void Close() override {
    if (!closed_.exchange(true) && conn_->params().faults.active()) {
      auto c = conn_->counters();
      // At warn level: fault injection is a test setting, and whoever set it
      // wants this account even from tools that log only warnings (bench).
      CANOPY_LOG(kWarn,
                 "dpdk: connection to {}: {} frames sent, {} retransmitted, {} dropped by fault injection "
                 "({} tail loss probes, {} retransmission timeouts; {} congestion-window cuts, {} of them halvings)",
                 PeerUri(conn_->params()), c.frames_sent, c.retransmits, c.injected_drops, c.loss_probes, c.timeouts,
                 c.window_cuts, c.congestive_cuts);
    }
    conn_->Abort();
  }

  std::string peer_uri() const override { return PeerUri(conn_->params()); }

  ConnectionStats stats() const override {
    ConnectionStats s;
    s.messages_sent = messages_sent_.load();
    s.messages_received = messages_received_.load();
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    s.retransmits = conn_->retransmits();
    s.device = port_->name();
    return s;
  }

 private:
  Status Break(const Status& s) {
    broken_ = s;
    conn_->Abort();
    return s;
  }

  Status SendMessage(uint16_t type, std::string_view payload, const BulkSource* bulk) {
    if (payload.size() > max_message_) {
      return Status::InvalidArgument("message of " + std::to_string(payload.size()) +
                                     " bytes exceeds max_message_bytes " + std::to_string(max_message_));
    }
    uint64_t bulk_len = bulk != nullptr ? bulk->size() : 0;
    char header[kFrameHeaderSize];
    EncodeFrameHeader(header, type, payload, bulk_len, send_check_);
    std::lock_guard<std::mutex> lock(send_mu_);
    // One flush per message: the header (and the payload, when bulk follows)
    // leave with what comes after them.
    CANOPY_RETURN_IF_ERROR(conn_->Write(header, kFrameHeaderSize, /*flush=*/false));
    CANOPY_RETURN_IF_ERROR(conn_->Write(payload.data(), payload.size(), /*flush=*/bulk == nullptr));
    if (bulk != nullptr && bulk->is_file()) {
      // Straight from the file into the send ring (no buffer between).
      uint64_t done = 0;
      bool file_failed = false;
      Status s = conn_->WriteWith(static_cast<size_t>(bulk_len), [&](char* dst, size_t len) -> Result<size_t> {
        for (;;) {
          ssize_t r = ::pread(bulk->fd, dst, len, static_cast<off_t>(bulk->file_offset + done));
          if (r < 0 && errno == EINTR) continue;
          if (r > 0) {
            done += static_cast<uint64_t>(r);
            return static_cast<size_t>(r);
          }
          file_failed = true;
          return r < 0 ? ErrnoStatus(errno, "reading bulk source file")
                       : Status::IOError("bulk source file ended " + std::to_string(bulk_len - done) +
                                         " bytes short of the announced length");
        }
      });
      if (!s.ok()) {
        // The peer was promised bulk_len bytes: the stream cannot continue.
        if (file_failed) conn_->Abort();
        return s;
      }
    } else if (bulk != nullptr) {
      CANOPY_RETURN_IF_ERROR(conn_->Write(bulk->memory.data(), bulk->memory.size()));
    }
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(payload.size() + bulk_len, std::memory_order_relaxed);
    return Status::Ok();
  }

  // What a failed read in the middle of a message means for the caller.
  static Status MidMessage(Status s) {
    if (s.IsClosed()) return Status::Unavailable("peer closed the connection in the middle of a message");
    if (s.IsTimeout()) return Status::Timeout("deadline passed in the middle of a message; connection unusable");
    return s;
  }

  // Reads exactly n bytes. At a message boundary, an orderly end before the
  // first byte is Closed; an end (or deadline) mid-message breaks the stream.
  Status ReadExact(char* dst, size_t n, Deadline deadline, bool at_boundary) {
    size_t done = 0;
    while (done < n) {
      auto r = conn_->Read(dst + done, n - done, deadline);
      if (!r.ok()) {
        if (done == 0 && at_boundary) return r.status();
        return Break(MidMessage(r.status()));
      }
      done += *r;
    }
    return Status::Ok();
  }

  std::shared_ptr<DpdkPort> port_;
  std::shared_ptr<ConnState> conn_;
  const uint32_t max_message_;
  const std::chrono::milliseconds io_timeout_;
  const PayloadCheck send_check_;      // how this side's frames carry their payload
  const PayloadCheck required_check_;  // what this side accepts
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> closed_{false};
  std::mutex send_mu_;
  Status broken_;
  uint64_t bulk_pending_ = 0;
  std::atomic<uint64_t> messages_sent_{0}, messages_received_{0}, bytes_sent_{0}, bytes_received_{0};
};

// Listens on the same address and UDP port on every port of its transport;
// connections from all of them come out of one Accept queue.
class DpdkListener final : public Listener {
 public:
  DpdkListener(std::vector<std::shared_ptr<DpdkPort>> ports, std::shared_ptr<dpdk::ListenerState> state,
               Endpoint local, const TransportOptions& options)
      : ports_(std::move(ports)), state_(std::move(state)), local_(std::move(local)), options_(options) {}
  ~DpdkListener() override { Close(); }

  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    CANOPY_ASSIGN_OR_RETURN(auto pending, state_->Pop(deadline));
    std::shared_ptr<DpdkPort> port = ports_.front();
    for (const auto& p : ports_) {
      if (p->port_id() == pending.port_id) port = p;
    }
    return std::unique_ptr<Connection>(
        new DpdkConnection(std::move(port), std::move(pending.conn), options_));
  }
  Endpoint local_endpoint() const override { return local_; }
  void Close() override {
    if (!closed_.exchange(true)) {
      for (const auto& p : ports_) p->RemoveListener(local_.port);
    }
  }

 private:
  std::vector<std::shared_ptr<DpdkPort>> ports_;
  std::shared_ptr<dpdk::ListenerState> state_;
  Endpoint local_;
  TransportOptions options_;
  std::atomic<bool> closed_{false};
};

class DpdkTransport final : public Transport {
 public:
  DpdkTransport(DpdkEnv* env, CanopyArgs args, const TransportOptions& options)
      : env_(env), args_(std::move(args)), options_(options) {}

  std::string_view scheme() const override { return "dpdk"; }

  Result<std::unique_ptr<Listener>> Listen(const Endpoint& local) override {
    CANOPY_ASSIGN_OR_RETURN(auto ports, PortsFor(local));
    uint32_t ip = 0;
    if (local.host == "0.0.0.0" || local.host == "*") {
      ip = ports.front()->DefaultIp();
    } else {
      CANOPY_ASSIGN_OR_RETURN(ip, dpdk::ParseIpv4(local.host));
    }
    for (const auto& port : ports) port->AddAddress(ip);
    auto state = std::make_shared<dpdk::ListenerState>(Template(local), 128);
    CANOPY_ASSIGN_OR_RETURN(uint16_t udp_port, ListenOnEvery(ports, local.port, state));
    Endpoint bound;
    bound.scheme = "dpdk";
    bound.host = dpdk::FormatIpv4(ip);
    bound.port = udp_port;
    return std::unique_ptr<Listener>(new DpdkListener(std::move(ports), state, bound, options_));
  }

  Result<std::unique_ptr<Connection>> Connect(const Endpoint& remote) override {
    CANOPY_ASSIGN_OR_RETURN(auto ports, PortsFor(remote));
    // Several ports (one per core, e.g. memif pairs): the one carrying the
    // fewest connections now, so that connections spread over the ports'
    // I/O threads and poll locks.
    std::shared_ptr<DpdkPort> port = ports.front();
    size_t fewest = port->ConnectionCount();
    for (size_t i = 1; i < ports.size() && fewest > 0; ++i) {
      size_t n = ports[i]->ConnectionCount();
      if (n < fewest) {
        fewest = n;
        port = ports[i];
      }
    }
    ConnParams params = Template(remote);
    CANOPY_ASSIGN_OR_RETURN(params.remote_ip, dpdk::ParseIpv4(remote.host));
    if (remote.port == 0)
      return Status::InvalidArgument("dpdk://" + remote.HostPort() + ": port 0 cannot be dialled");
    params.remote_port = remote.port;
    std::string ip = Param(remote, "ip", args_.ip);
    if (!ip.empty()) {
      CANOPY_ASSIGN_OR_RETURN(params.local_ip, dpdk::ParseIpv4(ip));
    } else {
      params.local_ip = port->DefaultIp();
    }
    port->AddAddress(params.local_ip);
    CANOPY_ASSIGN_OR_RETURN(auto conn, port->AddClient(params));
    Status s =
        conn->WaitEstablished(Deadline::After(options_.connect_timeout + std::chrono::milliseconds(100)));
    if (!s.ok()) {
      conn->Abort();
      return s.WithContext("dpdk://" + remote.HostPort());
    }
    return std::unique_ptr<Connection>(new DpdkConnection(port, std::move(conn), options_));
  }

  // The ports Connect would use, started (the EAL is up once this transport exists).
  Status Prepare(const Endpoint& remote) override { return PortsFor(remote).status(); }

 private:
  static std::string Param(const Endpoint& e, const std::string& key, const std::string& fallback) {
    auto it = e.params.find(key);
    return it == e.params.end() ? fallback : it->second;
  }

  // The ports named by port= ("0", "net_memif0", or several joined by '+'),
  // started, in the order named.
  Result<std::vector<std::shared_ptr<DpdkPort>>> PortsFor(const Endpoint& e) {
    CANOPY_RETURN_IF_ERROR(RefuseTlsSettings(e.params, {}));
    dpdk::PortSettings settings;
    settings.mtu = args_.mtu;
    settings.mbufs = args_.mbufs;
    settings.mbuf_bytes = args_.mbuf_bytes;
    settings.eal_args = options_.backend_args;
    CANOPY_ASSIGN_OR_RETURN(std::vector<std::string> names,
                            dpdk::SplitPortList(Param(e, "port", args_.port)));
    std::vector<std::shared_ptr<DpdkPort>> ports;
    for (const std::string& name : names) {
      CANOPY_ASSIGN_OR_RETURN(auto port, env_->Port(name, settings));
      for (const auto& p : ports) {
        if (p == port)
          return Status::InvalidArgument("port=" + Param(e, "port", args_.port) + " names port " + name +
                                         " twice");
      }
      ports.push_back(std::move(port));
    }
    return ports;
  }

  // Registers `state` on UDP port `udp_port` of every port (0: one that is
  // free on all of them), or on none.
  static Result<uint16_t> ListenOnEvery(const std::vector<std::shared_ptr<DpdkPort>>& ports,
                                        uint16_t udp_port,
                                        const std::shared_ptr<dpdk::ListenerState>& state) {
    constexpr int kTries = 16;  // an ephemeral pick free on the first port may be taken on another
    for (int attempt = 0;; ++attempt) {
      CANOPY_ASSIGN_OR_RETURN(uint16_t bound, ports.front()->AddListener(udp_port, state));
      Status s;
      size_t added = 1;
      for (; added < ports.size() && s.ok(); ++added) s = ports[added]->AddListener(bound, state).status();
      if (s.ok()) return bound;
      --added;  // the port that refused holds nothing
      for (size_t i = 0; i < added; ++i) ports[i]->RemoveListener(bound, /*close_state=*/false);
      if (udp_port != 0 || attempt + 1 == kTries) return s;
    }
  }

  ConnParams Template(const Endpoint& e) {
    ConnParams p;
    p.send_capacity = options_.max_inflight_bytes;
    p.recv_capacity = options_.buffer_bytes;
    p.connect_timeout = options_.connect_timeout;
    p.io_timeout = options_.io_timeout;
    p.faults = args_.faults;
    std::string mac = Param(e, "peer_mac", args_.peer_mac);
    if (!mac.empty()) {
      auto parsed = dpdk::ParseMac(mac);
      if (parsed.ok()) p.static_mac = *parsed;
    }
    return p;
  }

  DpdkEnv* env_;
  const CanopyArgs args_;
  const TransportOptions options_;
};

}  // namespace


Status RegisterDpdkTransport(TransportRegistry& registry) {
  return registry.Register(
      "dpdk", "canopy's reliable stream over UDP/IPv4 on DPDK ports (EAL arguments in backend_args)",
      [](const TransportOptions& options) -> Result<std::shared_ptr<Transport>> {
        CANOPY_RETURN_IF_ERROR(RefuseTlsSettings({}, options.backend_args));
        CANOPY_ASSIGN_OR_RETURN(auto split, dpdk::SplitBackendArgs(options.backend_args));
        CANOPY_ASSIGN_OR_RETURN(DpdkEnv * env, DpdkEnv::Acquire(split.eal));
        return std::shared_ptr<Transport>(new DpdkTransport(env, std::move(split.canopy), options));
      });
}

}  // namespace canopy::transport
