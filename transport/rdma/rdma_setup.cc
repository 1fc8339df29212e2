// Set-up half of the rdma backend: options, device check, librdmacm
// connection management (resolve, connect, listen, accept), verbs resources.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/logging.h"
#include "transport/rdma/rdma_connection.h"
#include "transport/rdma/rdma_transport.h"

namespace canopy::transport {

std::vector<std::string> RdmaDeviceNames() {
  std::vector<std::string> names;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return names;
  for (int i = 0; i < count; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

std::string NoRdmaDeviceMessage() {
  return "no RDMA device found (ibv_get_device_list returned none); create Soft-RoCE with: "
         "rdma link add rxe0 type rxe netdev IFACE — see hw/RDMA.md";
}

namespace rdma {
namespace {

constexpr uint32_t kCtrlDepth = 8;
constexpr uint32_t kCtrlSendSlots = 8;
constexpr uint32_t kCtrlSlotBytes = 64;
constexpr uint32_t kCreditSourceBytes = 64;
constexpr uint32_t kStagingSlots = 4;
constexpr uint32_t kStagingBytes = 256u << 10;
constexpr size_t kPage = 4096;

Result<uint64_t> ParseSize(const std::string& key, const std::string& value, uint64_t min, uint64_t max) {
  uint64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoull(value, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < min || v > max) {
    return Status::InvalidArgument(
        fmt::format("rdma: {}={} is not a number in [{}, {}]", key, value, min, max));
  }
  return v;
}

size_t RoundUpPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }

char* AllocPages(size_t bytes) {
  void* p = mmap(nullptr, RoundUpPage(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}
void FreePages(char* p, size_t bytes) {
  if (p != nullptr) munmap(p, RoundUpPage(bytes));
}

std::string SockaddrToUri(const sockaddr* sa) {
  if (sa == nullptr) return "rdma://?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return fmt::format("rdma://{}:{}", host, port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return fmt::format("rdma://[{}]:{}", host, port);
  }
  return "rdma://?";
}

Result<sockaddr_storage> ResolveHost(const Endpoint& endpoint, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  const int rc =
      getaddrinfo(endpoint.host.empty() ? nullptr : endpoint.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::InvalidArgument(
        fmt::format("rdma: cannot resolve host '{}': {}", endpoint.host, gai_strerror(rc)));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, std::min<size_t>(found->ai_addrlen, sizeof out));
  freeaddrinfo(found);
  return out;
}

Status CheckDevice(rdma_cm_id* id, const RdmaOptions& options) {
  if (id->verbs == nullptr) return Status::Unavailable("rdma: the address is not bound to an RDMA device");
  if (!options.device.empty()) {
    const char* name = ibv_get_device_name(id->verbs->device);
    if (name == nullptr || options.device != name) {
      return Status::NotSupported(fmt::format("rdma: route uses device {} but device={} was asked for",
                                              name ? name : "?", options.device));
    }
  }
  return Status::Ok();
}

Status CheckDevicesPresent(const RdmaOptions& options) {
  const std::vector<std::string> names = RdmaDeviceNames();
  if (names.empty()) return Status::NotSupported(NoRdmaDeviceMessage());
  if (!options.device.empty() && std::find(names.begin(), names.end(), options.device) == names.end()) {
    return Status::NotSupported(
        fmt::format("rdma: device {} not found; devices here: {}", options.device, fmt::join(names, ", ")));
  }
  return Status::Ok();
}

int RemainingMs(Deadline deadline) {
  const auto ms = deadline.remaining().count();
  return static_cast<int>(std::clamp<int64_t>(ms, 1, 1'000'000));
}

}  // namespace

Result<RdmaOptions> ParseRdmaOptions(const TransportOptions& options,
                                     const std::map<std::string, std::string>& params) {
  RdmaOptions out;
  out.base = options;
  std::map<std::string, std::string> kv;
  for (const std::string& arg : options.backend_args) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos)
      return Status::InvalidArgument(fmt::format("rdma: backend arg '{}' is not key=value", arg));
    kv[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  for (const auto& [k, v] : params) kv[k] = v;
  for (const auto& [key, value] : kv) {
    if (key == "device") {
      out.device = value;
    } else if (key == "cq_mode") {
      if (value == "event")
        out.cq_mode = CqMode::kEvent;
      else if (value == "poll")
        out.cq_mode = CqMode::kPoll;
      else
        return Status::InvalidArgument(fmt::format("rdma: cq_mode={} (expected event or poll)", value));
    } else if (key == "slot_bytes") {
      CANOPY_ASSIGN_OR_RETURN(uint64_t v, ParseSize(key, value, 4096, 16u << 20));
      out.slot_bytes = static_cast<uint32_t>(v);
    } else if (key == "eager_bulk") {
      CANOPY_ASSIGN_OR_RETURN(uint64_t v, ParseSize(key, value, 0, 1ull << 40));
      out.eager_bulk = v;
    } else if (key == "cert" || key == "key" || key == "ca" || key == "tls" || key == "server_name" ||
               key == "verify_host" || key == "ktls") {
      return Status::NotSupported(fmt::format(
          "rdma:// does not encrypt (RDMA moves memory in the clear, the NIC bypasses the kernel's TLS), so the "
          "TLS setting '{}' cannot apply; use tls+tcp:// to encrypt",
          key));
    } else {
      return Status::InvalidArgument(
          fmt::format("rdma: unknown option '{}' (known: device, cq_mode, slot_bytes, eager_bulk)", key));
    }
  }
  return out;
}

CmId::~CmId() {
  if (id != nullptr) {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
  if (channel != nullptr) rdma_destroy_event_channel(channel);
}

Result<rdma_event_channel*> CreateEventChannel() {
  rdma_event_channel* channel = rdma_create_event_channel();
  if (channel == nullptr) return ErrnoStatus(errno, "rdma_create_event_channel");
  const int flags = fcntl(channel->fd, F_GETFL);
  if (flags < 0 || fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    const int err = errno;
    rdma_destroy_event_channel(channel);
    return ErrnoStatus(err, "rdma: make event channel non-blocking");
  }
  return channel;
}

Result<CmEventInfo> WaitCmEvent(rdma_event_channel* channel, int wake_fd, Deadline deadline) {
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel, &event) == 0) {
      CmEventInfo info{event->event, event->status, event->id, event->listen_id};
      rdma_ack_cm_event(event);
      return info;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return ErrnoStatus(errno, "rdma_get_cm_event");
    if (deadline.expired()) return Status::Timeout("rdma: timed out waiting for a connection manager event");
    pollfd fds[2] = {{channel->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int n = poll(fds, wake_fd >= 0 ? 2 : 1,
                       std::min(deadline.poll_timeout_ms() < 0 ? 1000 : deadline.poll_timeout_ms(), 1000));
    if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "rdma: poll on event channel");
    if (wake_fd >= 0 && n > 0 && (fds[1].revents & POLLIN)) return Status::Aborted("rdma: closed");
  }
}

Status CmEventError(const CmEventInfo& event, std::string_view what) {
  std::string detail = rdma_event_str(event.type);
  if (event.status != 0) {
    // Negative errno for most errors; REJECTED carries a CM reject reason.
    if (event.type == RDMA_CM_EVENT_REJECTED) {
      detail += fmt::format(" (reject reason {})", event.status);
    } else {
      detail += fmt::format(" (status {}: {})", event.status, std::strerror(std::abs(event.status)));
    }
  }
  if (event.type == RDMA_CM_EVENT_REJECTED) {
    return Status::Unavailable(fmt::format("rdma: {}: connection refused: {}", what, detail));
  }
  if (event.status == -ETIMEDOUT || event.status == ETIMEDOUT) {
    return Status::Timeout(fmt::format("rdma: {}: {}", what, detail));
  }
  return Status::Unavailable(fmt::format("rdma: {}: {}", what, detail));
}

// ---------------------------------------------------------------------------
// RdmaConnection: resources

RdmaConnection::RdmaConnection(std::unique_ptr<CmId> cm, const RdmaOptions& options)
    : cm_(std::move(cm)), options_(options), assembler_(options.base.max_message_bytes) {}

Result<std::unique_ptr<RdmaConnection>> RdmaConnection::Create(std::unique_ptr<CmId> cm,
                                                               const RdmaOptions& options, bool active) {
  std::unique_ptr<RdmaConnection> conn(new RdmaConnection(std::move(cm), options));
  CANOPY_RETURN_IF_ERROR(conn->CreateResources(active));
  return conn;
}

char* RdmaConnection::ctrl_send_slot(uint32_t i) const {
  return send_region_ + static_cast<size_t>(data_send_slots_) * options_.slot_bytes + i * kCtrlSlotBytes;
}
char* RdmaConnection::credit_source(uint32_t i) const {
  return send_region_ + static_cast<size_t>(data_send_slots_) * options_.slot_bytes +
         ctrl_send_slots_ * kCtrlSlotBytes + i * kCreditSourceBytes;
}
char* RdmaConnection::staging_slot(uint32_t i) const {
  return send_region_ +
         RoundUpPage(static_cast<size_t>(data_send_slots_) * options_.slot_bytes +
                     ctrl_send_slots_ * kCtrlSlotBytes + 2 * kCreditSourceBytes) +
         static_cast<size_t>(i) * staging_bytes_;
}

Status RdmaConnection::CreateResources(bool active) {
  rdma_cm_id* id = cm_->id;
  CANOPY_RETURN_IF_ERROR(CheckDevice(id, options_));
  peer_uri_ = SockaddrToUri(rdma_get_peer_addr(id));
  (void)active;

  ibv_device_attr attr{};
  if (int rc = ibv_query_device(id->verbs, &attr); rc != 0) return ErrnoStatus(rc, "rdma: ibv_query_device");

  eager_bulk_ = EagerBulkFor(options_.eager_bulk, attr.vendor_id);
  accepts_unchecked_ = id->verbs->device->transport_type == IBV_TRANSPORT_IB;
  assembler_.set_required_check(PayloadCheckFor(accepts_unchecked_));
  CANOPY_LOG(kDebug, "rdma: device {} (vendor 0x{:x}): bulk transfers above {} bytes are RDMA READ",
             ibv_get_device_name(id->verbs->device), attr.vendor_id, eager_bulk_);

  const TransportOptions& base = options_.base;
  // A peer that vanishes (host powered off, link gone) must surface as Unavailable within
  // io_timeout: the keepalive probe (rdma_datapath.cc) goes out after io_timeout / 4 without a
  // completion, and the QP gives up after retry_count + 1 unacknowledged attempts of the local
  // ACK timeout each, so those together take at most io_timeout / 2.
  probe_interval_ = ProbeIntervalFor(base.io_timeout);
  uint8_t ack_timeout = AckTimeoutExponentFor(base.io_timeout);
  if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout, sizeof ack_timeout) != 0) {
    CANOPY_LOG(kDebug, "rdma: cannot set the ACK timeout ({}); the QP keeps the route's", std::strerror(errno));
  }
  const uint32_t slot = options_.slot_bytes;
  data_depth_ = static_cast<uint32_t>(std::clamp<size_t>(base.buffer_bytes / slot, 8, 512));
  ctrl_depth_ = kCtrlDepth;
  data_send_slots_ = static_cast<uint32_t>(std::clamp<size_t>(base.max_inflight_bytes / slot, 4, 64));
  ctrl_send_slots_ = kCtrlSendSlots;
  staging_slots_ = kStagingSlots;
  staging_bytes_ = kStagingBytes;
  max_reads_ = 8;
  const uint32_t max_wr = static_cast<uint32_t>(std::max(attr.max_qp_wr, 16));
  sq_depth_ = std::min(max_wr, data_send_slots_ + ctrl_send_slots_ + max_reads_ + 2 + 4 + kOneSidedWrites);
  uint32_t recv_depth = data_depth_ + ctrl_depth_;
  if (recv_depth > max_wr) {
    data_depth_ = max_wr - ctrl_depth_;
    recv_depth = max_wr;
  }
  if (sq_depth_ < ctrl_send_slots_ + 8) return Status::NotSupported("rdma: device queue pairs are too small");
  data_send_slots_ = std::min(data_send_slots_, sq_depth_ - ctrl_send_slots_ - max_reads_ - 2);
  data_credits_ = SendCredits(0);
  ctrl_credits_ = SendCredits(1);
  data_returner_ = CreditReturner(std::max<uint32_t>(1, data_depth_ / 8));
  ctrl_returner_ = CreditReturner(1);
  data_send_pool_ = SlotPool(data_send_slots_);
  ctrl_send_pool_ = SlotPool(ctrl_send_slots_);

  pd_ = ibv_alloc_pd(id->verbs);
  if (pd_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_alloc_pd");
  if (options_.cq_mode == CqMode::kEvent) {
    comp_channel_ = ibv_create_comp_channel(id->verbs);
    if (comp_channel_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_create_comp_channel");
    const int flags = fcntl(comp_channel_->fd, F_GETFL);
    if (flags < 0 || fcntl(comp_channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      return ErrnoStatus(errno, "rdma: make completion channel non-blocking");
    }
  }
  const int cqe = static_cast<int>(
      std::min<uint32_t>(sq_depth_ + recv_depth + 16, static_cast<uint32_t>(std::max(attr.max_cqe, 64))));
  cq_ = ibv_create_cq(id->verbs, cqe, this, comp_channel_, 0);
  if (cq_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_create_cq");
  if (comp_channel_ != nullptr) {
    if (int rc = ibv_req_notify_cq(cq_, 0); rc != 0) return ErrnoStatus(rc, "rdma: ibv_req_notify_cq");
  }

  // Queue pair: try generous inline data first, fall back when the device
  // refuses it.
  const uint32_t inline_tries[] = {256, 64, 0};
  int last_err = 0;
  for (uint32_t inline_bytes : inline_tries) {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = sq_depth_;
    init.cap.max_recv_wr = recv_depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = inline_bytes;
    if (rdma_create_qp(id, pd_, &init) == 0) {
      qp_ = id->qp;
      max_inline_ = init.cap.max_inline_data;
      break;
    }
    last_err = errno;
  }
  if (qp_ == nullptr) return ErrnoStatus(last_err, "rdma: rdma_create_qp");

  // Registered memory.
  recv_region_bytes_ = static_cast<size_t>(recv_depth) * slot;
  recv_region_ = AllocPages(recv_region_bytes_);
  send_region_bytes_ = RoundUpPage(static_cast<size_t>(data_send_slots_) * slot +
                                   ctrl_send_slots_ * kCtrlSlotBytes + 2 * kCreditSourceBytes) +
                       static_cast<size_t>(staging_slots_) * staging_bytes_;
  send_region_ = AllocPages(send_region_bytes_);
  credit_block_ = AllocPages(kPage);
  if (recv_region_ == nullptr || send_region_ == nullptr || credit_block_ == nullptr) {
    return Status::ResourceExhausted("rdma: cannot allocate registered buffers");
  }
  recv_mr_ = ibv_reg_mr(pd_, recv_region_, recv_region_bytes_, IBV_ACCESS_LOCAL_WRITE);
  if (recv_mr_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_reg_mr (receive ring; check ulimit -l)");
  send_mr_ = ibv_reg_mr(pd_, send_region_, send_region_bytes_, IBV_ACCESS_LOCAL_WRITE);
  if (send_mr_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_reg_mr (send ring; check ulimit -l)");
  credit_mr_ = ibv_reg_mr(pd_, credit_block_, kPage, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (credit_mr_ == nullptr) return ErrnoStatus(errno, "rdma: ibv_reg_mr (credit block)");

  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return ErrnoStatus(errno, "rdma: eventfd");
  wake_fd_.Reset(efd);

  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < recv_depth; ++i) CANOPY_RETURN_IF_ERROR(PostRecv(i));
  return Status::Ok();
}

rdma_conn_param RdmaConnection::ConnParam() const {
  rdma_conn_param param{};
  param.responder_resources = RDMA_MAX_RESP_RES;
  param.initiator_depth = RDMA_MAX_INIT_DEPTH;
  param.retry_count = kRetryCount;
  // Credits guarantee a posted receive for every SEND; a few RNR retries only
  // cover a bug or a slow peer without hanging forever.
  param.rnr_retry_count = 6;
  return param;
}

Status RdmaConnection::ApplySetupEvent(ConnEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.Apply(event);
}

Status RdmaConnection::Start(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    CANOPY_RETURN_IF_ERROR(state_.Apply(ConnEvent::kEstablished));
  }
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  char body[kHelloBodySize];
  Hello hello;
  hello.data_depth = data_depth_;
  hello.ctrl_depth = ctrl_depth_;
  hello.recv_buffer_bytes = options_.slot_bytes;
  hello.features = accepts_unchecked_ ? kHelloAcceptsUncheckedPayloads : 0;
  hello.credit_rkey = credit_mr_->rkey;
  hello.credit_addr = reinterpret_cast<uintptr_t>(credit_block_);
  EncodeHello(body, hello);
  CANOPY_RETURN_IF_ERROR(SendControl(ItemKind::kHello, std::string_view(body, sizeof body), deadline));
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(
      lock, deadline, [this] { return state_.state() == ConnState::kOpen; }, "waiting for the peer's hello",
      true);
}

void RdmaConnection::DestroyResources() {
  if (cq_ != nullptr && unacked_cq_events_ > 0) ibv_ack_cq_events(cq_, unacked_cq_events_);
  unacked_cq_events_ = 0;
  if (qp_ != nullptr) {
    rdma_destroy_qp(cm_->id);
    qp_ = nullptr;
  }
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (comp_channel_ != nullptr) ibv_destroy_comp_channel(comp_channel_);
  if (recv_mr_ != nullptr) ibv_dereg_mr(recv_mr_);
  if (send_mr_ != nullptr) ibv_dereg_mr(send_mr_);
  if (credit_mr_ != nullptr) ibv_dereg_mr(credit_mr_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  cq_ = nullptr;
  comp_channel_ = nullptr;
  recv_mr_ = send_mr_ = credit_mr_ = nullptr;
  pd_ = nullptr;
  FreePages(recv_region_, recv_region_bytes_);
  FreePages(send_region_, send_region_bytes_);
  FreePages(credit_block_, kPage);
  recv_region_ = send_region_ = credit_block_ = nullptr;
  cm_.reset();  // destroys the id and its event channel
}

RdmaConnection::~RdmaConnection() {
  bool healthy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    healthy = state_.state() == ConnState::kOpen;
  }
  if (healthy) {
    // Let what was posted reach the peer before the QP goes away.
    const auto drain =
        std::min<std::chrono::milliseconds>(options_.base.io_timeout, std::chrono::milliseconds(2000));
    (void)WaitAllSendsComplete(Deadline::After(drain));
  }
  Close();
  stop_.store(true);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof one);
  }
  if (progress_thread_.joinable()) progress_thread_.join();
  DestroyResources();
}

void RdmaConnection::SendEndOfStreamBestEffort(std::chrono::milliseconds wait) {
  // Like a TCP FIN on close(): if nothing is being sent and a credit is free
  // right now, tell the peer the stream ended in order. Never blocks long.
  std::unique_lock<std::mutex> send_lock(send_mu_, std::try_to_lock);
  if (!send_lock.owns_lock()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || state_.state() != ConnState::kOpen || state_.local_shutdown() ||
        !data_credits_.CanSend() || data_send_pool_.free_count() == 0 || sq_room() == 0) {
      return;
    }
  }
  if (!SendDataItem(ItemKind::kShutdown, [](char*, size_t) -> Result<size_t> { return size_t{0}; }).ok())
    return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.MarkLocalShutdown();
  }
  (void)WaitAllSendsComplete(Deadline::After(wait));
}

void RdmaConnection::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
  }
  SendEndOfStreamBestEffort(std::chrono::milliseconds(200));
  bool disconnect = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
    disconnect = qp_ != nullptr;
    (void)state_.Apply(ConnEvent::kClose);
  }
  cv_.notify_all();
  if (disconnect && cm_ && cm_->id != nullptr) (void)rdma_disconnect(cm_->id);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof one);
  }
}

ConnectionStats RdmaConnection::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------
// Listener and transport

namespace {

class RdmaListener final : public Listener {
 public:
  RdmaListener(std::unique_ptr<CmId> cm, RdmaOptions options, Endpoint local, UniqueFd wake)
      : cm_(std::move(cm)), options_(std::move(options)), local_(std::move(local)), wake_(std::move(wake)) {}
  ~RdmaListener() override { Close(); }

  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    std::lock_guard<std::mutex> accept_lock(accept_mu_);
    for (;;) {
      if (closed_.load() || !cm_) return Status::Aborted("rdma: listener closed");
      CANOPY_ASSIGN_OR_RETURN(CmEventInfo event, WaitCmEvent(cm_->channel, wake_.get(), deadline));
      if (event.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
        if (event.type == RDMA_CM_EVENT_DEVICE_REMOVAL) return CmEventError(event, "listener");
        CANOPY_LOG(kDebug, "rdma: listener ignores {}", rdma_event_str(event.type));
        continue;
      }
      auto accepted = AcceptOne(event.id);
      if (accepted.ok()) return accepted;
      if (accepted.status().code() == StatusCode::kAborted) return accepted.status();
      CANOPY_LOG(kWarn, "rdma: could not accept a connection on {}: {}", local_.ToUri(),
                 accepted.status().ToString());
      if (deadline.expired()) return Status::Timeout("rdma: accept deadline passed");
    }
  }

  Endpoint local_endpoint() const override { return local_; }

  void Close() override {
    if (closed_.exchange(true)) return;
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof one);
    // A blocked Accept sees the wake-up and returns; then stop listening so
    // that new connects are refused rather than left pending.
    std::lock_guard<std::mutex> accept_lock(accept_mu_);
    cm_.reset();
  }

 private:
  Result<std::unique_ptr<Connection>> AcceptOne(rdma_cm_id* child) {
    // The child's own channel; its CONNECT_REQUEST event was acked already,
    // which rdma_migrate_id waits for.
    auto cm = std::make_unique<CmId>();
    auto channel = CreateEventChannel();
    if (!channel.ok()) {
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return channel.status();
    }
    cm->channel = *channel;
    if (rdma_migrate_id(child, cm->channel) != 0) {
      const int err = errno;
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return ErrnoStatus(err, "rdma_migrate_id");
    }
    cm->id = child;
    // A request taken before `deadline` gets connect_timeout to finish its set-up (ESTABLISHED,
    // hello), even past `deadline`: servers poll Accept with short deadlines (250-500 ms), and
    // cutting a slow handshake short there (two TCG guests over Soft-RoCE take seconds) would
    // fail the peer's connect for nothing. Close() still wakes the wait.
    const Deadline until = Deadline::After(options_.base.connect_timeout);
    auto conn = RdmaConnection::Create(std::move(cm), options_, /*active=*/false);
    if (!conn.ok()) {
      // `cm` moved into the failed connection, which destroyed the id; the
      // peer sees its connect fail.
      return conn.status();
    }
    RdmaConnection& c = **conn;
    CANOPY_RETURN_IF_ERROR(c.ApplySetupEvent(ConnEvent::kConnectRequest));
    rdma_conn_param param = c.ConnParam();
    if (rdma_accept(c.cm_id(), &param) != 0) return ErrnoStatus(errno, "rdma_accept");
    for (;;) {
      CANOPY_ASSIGN_OR_RETURN(CmEventInfo event, WaitCmEvent(c.cm_id()->channel, wake_.get(), until));
      if (event.type == RDMA_CM_EVENT_ESTABLISHED) break;
      if (event.type == RDMA_CM_EVENT_TIMEWAIT_EXIT) continue;
      return CmEventError(event, "accept");
    }
    CANOPY_RETURN_IF_ERROR(c.Start(until));
    return std::unique_ptr<Connection>(std::move(*conn));
  }

  std::unique_ptr<CmId> cm_;
  RdmaOptions options_;
  Endpoint local_;
  UniqueFd wake_;
  std::atomic<bool> closed_{false};
  std::mutex accept_mu_;  // held by Accept; Close takes it before destroying cm_
};

class RdmaTransport final : public Transport {
 public:
  explicit RdmaTransport(TransportOptions options) : options_(std::move(options)) {}
  std::string_view scheme() const override { return "rdma"; }

  Result<std::unique_ptr<Listener>> Listen(const Endpoint& local) override {
    CANOPY_ASSIGN_OR_RETURN(RdmaOptions options, ParseRdmaOptions(options_, local.params));
    CANOPY_RETURN_IF_ERROR(CheckDevicesPresent(options));
    CANOPY_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveHost(local, /*passive=*/true));
    auto cm = std::make_unique<CmId>();
    CANOPY_ASSIGN_OR_RETURN(cm->channel, CreateEventChannel());
    if (rdma_create_id(cm->channel, &cm->id, nullptr, RDMA_PS_TCP) != 0)
      return ErrnoStatus(errno, "rdma_create_id");
    if (rdma_bind_addr(cm->id, reinterpret_cast<sockaddr*>(&addr)) != 0) {
      const int err = errno;
      if (err == EADDRNOTAVAIL || err == ENODEV) {
        return Status::Unavailable(
            fmt::format("rdma: cannot listen on {}: {} (is it the address of an RDMA netdev?)", local.ToUri(),
                        std::strerror(err)));
      }
      return ErrnoStatus(err, fmt::format("rdma_bind_addr {}", local.HostPort()));
    }
    if (cm->id->verbs != nullptr) CANOPY_RETURN_IF_ERROR(CheckDevice(cm->id, options));
    if (rdma_listen(cm->id, 64) != 0)
      return ErrnoStatus(errno, fmt::format("rdma_listen {}", local.HostPort()));
    Endpoint bound = local;
    bound.port = ntohs(rdma_get_src_port(cm->id));
    const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) return ErrnoStatus(errno, "rdma: eventfd");
    return std::unique_ptr<Listener>(
        new RdmaListener(std::move(cm), std::move(options), bound, UniqueFd(efd)));
  }

  Result<std::unique_ptr<Connection>> Connect(const Endpoint& remote) override {
    CANOPY_ASSIGN_OR_RETURN(RdmaOptions options, ParseRdmaOptions(options_, remote.params));
    CANOPY_RETURN_IF_ERROR(CheckDevicesPresent(options));
    if (remote.port == 0) return Status::InvalidArgument("rdma: connect needs a port");
    CANOPY_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveHost(remote, /*passive=*/false));
    const Deadline deadline = Deadline::After(options.base.connect_timeout);
    const std::string where = remote.ToUri();

    auto cm = std::make_unique<CmId>();
    CANOPY_ASSIGN_OR_RETURN(cm->channel, CreateEventChannel());
    if (rdma_create_id(cm->channel, &cm->id, nullptr, RDMA_PS_TCP) != 0)
      return ErrnoStatus(errno, "rdma_create_id");
    ConnectionStateMachine state;
    CANOPY_RETURN_IF_ERROR(state.Apply(ConnEvent::kResolveAddress));
    if (rdma_resolve_addr(cm->id, nullptr, reinterpret_cast<sockaddr*>(&addr), RemainingMs(deadline)) != 0) {
      return ErrnoStatus(errno, fmt::format("rdma_resolve_addr {}", where));
    }
    CANOPY_RETURN_IF_ERROR(ExpectEvent(cm->channel, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, where));
    CANOPY_RETURN_IF_ERROR(state.Apply(ConnEvent::kAddressResolved));
    if (rdma_resolve_route(cm->id, RemainingMs(deadline)) != 0) {
      return ErrnoStatus(errno, fmt::format("rdma_resolve_route {}", where));
    }
    CANOPY_RETURN_IF_ERROR(ExpectEvent(cm->channel, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, where));
    CANOPY_RETURN_IF_ERROR(state.Apply(ConnEvent::kRouteResolved));

    CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<RdmaConnection> conn,
                            RdmaConnection::Create(std::move(cm), options, /*active=*/true));
    CANOPY_RETURN_IF_ERROR(conn->ApplySetupEvent(ConnEvent::kResolveAddress));
    CANOPY_RETURN_IF_ERROR(conn->ApplySetupEvent(ConnEvent::kAddressResolved));
    CANOPY_RETURN_IF_ERROR(conn->ApplySetupEvent(ConnEvent::kRouteResolved));
    rdma_conn_param param = conn->ConnParam();
    if (rdma_connect(conn->cm_id(), &param) != 0)
      return ErrnoStatus(errno, fmt::format("rdma_connect {}", where));
    CANOPY_RETURN_IF_ERROR(ExpectEvent(conn->cm_id()->channel, RDMA_CM_EVENT_ESTABLISHED, deadline, where));
    CANOPY_RETURN_IF_ERROR(conn->Start(deadline));
    return std::unique_ptr<Connection>(std::move(conn));
  }

 private:
  static Status ExpectEvent(rdma_event_channel* channel, rdma_cm_event_type expected, Deadline deadline,
                            const std::string& where) {
    auto event = WaitCmEvent(channel, -1, deadline);
    if (!event.ok()) {
      if (event.status().IsTimeout()) {
        return Status::Timeout(
            fmt::format("rdma: connect to {} timed out waiting for {}", where, rdma_event_str(expected)));
      }
      return event.status();
    }
    if (event->type == expected && event->status == 0) return Status::Ok();
    return CmEventError(*event, fmt::format("connect to {}", where));
  }

  TransportOptions options_;
};

}  // namespace
}  // namespace rdma

Status RegisterRdmaTransport(TransportRegistry& registry) {
  return registry.Register(
      "rdma", "InfiniBand / RoCE / iWARP over librdmacm + libibverbs (RC queue pairs)",
      [](const TransportOptions& options) -> Result<std::shared_ptr<Transport>> {
        // Validate options now so that a typo fails at once.
        CANOPY_ASSIGN_OR_RETURN(rdma::RdmaOptions parsed, rdma::ParseRdmaOptions(options, {}));
        if (RdmaDeviceNames().empty()) return Status::NotSupported(NoRdmaDeviceMessage());
        (void)parsed;
        return std::shared_ptr<Transport>(std::make_shared<rdma::RdmaTransport>(options));
      });
}

}  // namespace canopy::transport
