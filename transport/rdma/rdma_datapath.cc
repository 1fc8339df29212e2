// Datapath half of the rdma backend: progress thread, SEND / RDMA READ /
// RDMA WRITE (credits) posting, message and bulk paths.
#include <endian.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "base/coding.h"
#include "base/file.h"
#include "base/logging.h"
#include "transport/frame.h"
#include "transport/rdma/rdma_connection.h"
#include "transport/transport_metrics.h"

namespace canopy::transport::rdma {
namespace {

constexpr int kPollBatch = 32;
constexpr uint64_t kRegisterSinkMin = 256u << 10;  // smaller sinks go through staging slots
constexpr uint32_t kReadChunk = 1u << 20;
constexpr size_t kPage = 4096;

const char* WrKindName(uint64_t kind) {
  switch (kind) {
    case 1:
      return "receive";
    case 2:
      return "send";
    case 3:
      return "control send";
    case 4:
      return "credit write";
    case 5:
      return "RDMA read";
    case 6:
      return "one-sided RDMA write";
  }
  return "work request";
}

}  // namespace

// ---------------------------------------------------------------------------
// Progress

void RdmaConnection::ProgressLoop() {
  ibv_wc wcs[kPollBatch];
  unsigned idle = 0;
  auto last_completion = std::chrono::steady_clock::now();
  // Keepalive (rdma_connection.h, ProbeIntervalFor): nothing completed for a probe interval.
  auto probe_if_quiet = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_completion < probe_interval_) return;
    last_completion = now;
    std::lock_guard<std::mutex> lock(mu_);
    MaybeWriteCredits(/*force=*/true);
  };
  while (!stop_.load(std::memory_order_relaxed)) {
    int n = ibv_poll_cq(cq_, kPollBatch, wcs);
    if (n < 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        FailLocked(Status::Unavailable("rdma: ibv_poll_cq failed"));
      }
      cv_.notify_all();
      break;
    }
    if (n == 0 && comp_channel_ != nullptr) {
      // Arm, then poll again so a completion that raced the arming is seen.
      if (int rc = ibv_req_notify_cq(cq_, 0); rc != 0) {
        std::lock_guard<std::mutex> lock(mu_);
        FailLocked(ErrnoStatus(rc, "rdma: ibv_req_notify_cq"));
      }
      n = ibv_poll_cq(cq_, kPollBatch, wcs);
      if (n < 0) n = 0;
    }
    if (n > 0) {
      idle = 0;
      last_completion = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int i = 0; i < n; ++i) HandleCompletion(wcs[i]);
        MaybeWriteCredits();
      }
      cv_.notify_all();
      continue;
    }
    if (comp_channel_ == nullptr) {
      // Busy-poll mode: look at the CM channel now and then; yield when idle
      // for a while so a shared core is not starved.
      if ((++idle & 1023) == 0) {
        HandleCmEvents();
        probe_if_quiet();
        sched_yield();
      }
      continue;
    }
    pollfd fds[3] = {
        {comp_channel_->fd, POLLIN, 0}, {cm_->channel->fd, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int ready = poll(fds, 3, 100);
    if (ready < 0 && errno != EINTR) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(ErrnoStatus(errno, "rdma: poll in progress thread"));
      continue;
    }
    if (fds[0].revents & POLLIN) {
      ibv_cq* event_cq = nullptr;
      void* event_ctx = nullptr;
      if (ibv_get_cq_event(comp_channel_, &event_cq, &event_ctx) == 0) {
        if (++unacked_cq_events_ >= 64) {
          ibv_ack_cq_events(cq_, unacked_cq_events_);
          unacked_cq_events_ = 0;
        }
      }
    }
    if (fds[1].revents & POLLIN) HandleCmEvents();
    probe_if_quiet();
    if (fds[2].revents & POLLIN) {
      uint64_t value = 0;
      (void)!read(wake_fd_.get(), &value, sizeof value);
    }
  }
}

void RdmaConnection::DrainCompletionsLocked() {
  ibv_wc wcs[kPollBatch];
  int n = 0;
  while ((n = ibv_poll_cq(cq_, kPollBatch, wcs)) > 0) {
    for (int i = 0; i < n; ++i) HandleCompletion(wcs[i]);
  }
}

void RdmaConnection::HandleCmEvents() {
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(cm_->channel, &event) != 0) return;  // EAGAIN: none pending
    const rdma_cm_event_type type = event->event;
    rdma_ack_cm_event(event);
    bool disconnect = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      switch (type) {
        case RDMA_CM_EVENT_DISCONNECTED:
          // Completions that arrived before the disconnect say why it came first (e.g. a
          // one-sided write the peer refused: PermissionDenied, not "peer disconnected").
          DrainCompletionsLocked();
          (void)state_.Apply(ConnEvent::kDisconnected);
          disconnect = true;
          break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          FailLocked(Status::Unavailable("rdma: the RDMA device was removed"));
          break;
        default:
          CANOPY_LOG(kDebug, "rdma: {} ignores {}", peer_uri_, rdma_event_str(type));
          break;
      }
    }
    // Answer the peer's disconnect so both sides leave the connected state.
    if (disconnect) (void)rdma_disconnect(cm_->id);
    cv_.notify_all();
  }
}

void RdmaConnection::FailLocked(const Status& status) {
  if (state_.state() == ConnState::kClosed || state_.state() == ConnState::kFailed) return;
  CANOPY_LOG(kDebug, "rdma: connection {} failed: {}", peer_uri_, status.ToString());
  state_.Fail(status);
  // Move the QP to the error state: outstanding work is flushed and the peer
  // can no longer read our registered bulk memory.
  if (cm_ && cm_->id != nullptr) (void)rdma_disconnect(cm_->id);
  cv_.notify_all();
}

void RdmaConnection::HandleCompletion(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id >> 56;
  const auto index = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  if (kind != kWrRecv) --sq_outstanding_;
  if (wc.status != IBV_WC_SUCCESS) {
    // Only wr_id and status are valid here. Return what the request held.
    switch (kind) {
      case kWrSendData:
        (void)data_send_pool_.Release(index);
        break;
      case kWrSendCtrl:
        (void)ctrl_send_pool_.Release(index);
        break;
      case kWrCreditWrite:
        --credit_writes_outstanding_;
        break;
      case kWrRead:
        ++reads_completed_;
        break;
      case kWrOneSidedWrite:
        ++one_sided_completed_;
        break;
      default:
        break;
    }
    if (kind == kWrOneSidedWrite && wc.status == IBV_WC_REM_ACCESS_ERR) {
      // The receiver's NIC refused the rkey: its ring was revoked (a newer epoch fenced this writer).
      FailLocked(Status::PermissionDenied(fmt::format(
          "rdma: one-sided write to {} refused (remote access error): the receiver revoked this writer's "
          "access to its ring, so a newer epoch has fenced it",
          peer_uri_)));
      return;
    }
    const bool expected_flush =
        wc.status == IBV_WC_WR_FLUSH_ERR &&
        (closing_ || state_.state() == ConnState::kFailed || state_.state() == ConnState::kClosed);
    if (!expected_flush) {
      // Retries exhausted: the peer stopped acknowledging (powered off, unplugged, its port down).
      const char* why = wc.status == IBV_WC_RETRY_EXC_ERR ? "the peer stopped answering: " : "";
      FailLocked(Status::Unavailable(fmt::format("rdma: {}{} to {} failed: {} (status {}, vendor error {:#x})", why,
                                                 WrKindName(kind), peer_uri_, ibv_wc_status_str(wc.status),
                                                 static_cast<int>(wc.status), wc.vendor_err)));
    }
    return;
  }
  switch (kind) {
    case kWrRecv:
      if (wc.opcode != IBV_WC_RECV) {
        FailLocked(Status::Corruption(
            fmt::format("rdma: unexpected receive completion opcode {}", static_cast<int>(wc.opcode))));
        return;
      }
      HandleReceive(index, wc.byte_len);
      break;
    case kWrSendData:
      if (Status s = data_send_pool_.Release(index); !s.ok()) FailLocked(s);
      break;
    case kWrSendCtrl:
      if (Status s = ctrl_send_pool_.Release(index); !s.ok()) FailLocked(s);
      break;
    case kWrCreditWrite:
      --credit_writes_outstanding_;
      break;
    case kWrRead:
      ++reads_completed_;
      break;
    case kWrOneSidedWrite:
      ++one_sided_completed_;
      break;
    default:
      FailLocked(Status::Internal(fmt::format("rdma: completion with unknown wr_id {:#x}", wc.wr_id)));
  }
}

void RdmaConnection::HandleReceive(uint32_t slot, uint32_t bytes) {
  if (bytes > options_.slot_bytes) {
    FailLocked(Status::Corruption("rdma: received more bytes than a slot holds"));
    return;
  }
  const std::string_view item(recv_slot(slot), bytes);
  auto header = DecodeItemHeader(item);
  if (!header.ok()) {
    FailLocked(header.status());
    return;
  }
  if (Status s = data_credits_.OnPeerReport(header->data_reposted); !s.ok()) return FailLocked(s);
  if (Status s = ctrl_credits_.OnPeerReport(header->ctrl_reposted); !s.ok()) return FailLocked(s);
  const std::string_view body = item.substr(kItemHeaderSize);

  if (IsControlItem(header->kind)) {
    if (header->kind == ItemKind::kHello) {
      auto hello = DecodeHello(body);
      if (!hello.ok()) return FailLocked(hello.status());
      if (state_.state() != ConnState::kAwaitingHello) {
        return FailLocked(Status::Corruption("rdma: unexpected second hello"));
      }
      data_credits_.SetDepth(hello->data_depth);
      ctrl_credits_.SetDepth(hello->ctrl_depth);
      peer_slot_bytes_ = hello->recv_buffer_bytes;
      peer_accepts_unchecked_ = (hello->features & kHelloAcceptsUncheckedPayloads) != 0;
      peer_credit_addr_ = hello->credit_addr;
      peer_credit_rkey_ = hello->credit_rkey;
      if (Status s = state_.Apply(ConnEvent::kHelloReceived); !s.ok()) return FailLocked(s);
    } else {
      auto id = DecodeBulkDone(body);
      if (!id.ok()) return FailLocked(id.status());
      bulk_done_.insert(*id);
    }
    if (Status s = PostRecv(slot); !s.ok()) return FailLocked(s);
    ctrl_returner_.OnReposted(1);
    return;
  }

  if (state_.state() == ConnState::kAwaitingHello) {
    return FailLocked(Status::Corruption("rdma: data arrived before the peer's hello"));
  }
  InboundItem inbound;
  inbound.kind = header->kind;
  inbound.slot = slot;
  if (header->kind == ItemKind::kData) {
    inbound.data = body;
  } else if (header->kind == ItemKind::kBulkSegment) {
    auto segment = DecodeBulkSegment(body);
    if (!segment.ok()) return FailLocked(segment.status());
    inbound.segment = *segment;
  }
  inbound_.Push(inbound);
}

void RdmaConnection::RefreshCreditsFromBlock() {
  uint32_t words[2];
  for (int i = 0; i < 2; ++i) {
    words[i] = le32toh(std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(credit_block_)[i])
                           .load(std::memory_order_acquire));
  }
  if (Status s = data_credits_.OnPeerReport(words[0]); !s.ok()) return FailLocked(s);
  if (Status s = ctrl_credits_.OnPeerReport(words[1]); !s.ok()) return FailLocked(s);
}

Status RdmaConnection::PostRecv(uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(recv_slot(slot));
  sge.length = options_.slot_bytes;
  sge.lkey = recv_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = MakeWrId(kWrRecv, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) return ErrnoStatus(rc, "rdma: ibv_post_recv");
  return Status::Ok();
}

void RdmaConnection::RepostReleased(const std::vector<uint32_t>& slots) {
  for (uint32_t slot : slots) {
    if (Status s = PostRecv(slot); !s.ok()) {
      FailLocked(s);
      return;
    }
    data_returner_.OnReposted(1);
  }
  if (!slots.empty()) MaybeWriteCredits();
}

void RdmaConnection::MaybeWriteCredits(bool force) {
  if (peer_credit_addr_ == 0 || !state_.CheckAlive().ok()) return;
  if (!force && !data_returner_.ReportDue() && ctrl_returner_.unreported() == 0) return;
  // Retried on the next completion. A forced write (keepalive) is not needed while one is
  // outstanding: that one's retries notice a vanished peer just as well.
  if (credit_writes_outstanding_ >= 2 || sq_room() == 0) return;
  if (force && credit_writes_outstanding_ > 0) return;
  const uint32_t source = next_credit_source_;
  next_credit_source_ ^= 1;
  char* src = credit_source(source);
  EncodeFixed32(src, data_returner_.TakeForPiggyback());
  EncodeFixed32(src + 4, ctrl_returner_.TakeForPiggyback());
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(src);
  sge.length = 8;
  sge.lkey = send_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrCreditWrite, source);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | (max_inline_ >= 8 ? IBV_SEND_INLINE : 0);
  wr.wr.rdma.remote_addr = peer_credit_addr_;
  wr.wr.rdma.rkey = peer_credit_rkey_;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    FailLocked(ErrnoStatus(rc, "rdma: ibv_post_send (credit write)").WithContext(peer_uri_));
    return;
  }
  ++credit_writes_outstanding_;
  ++sq_outstanding_;
}

// ---------------------------------------------------------------------------
// Waiting

Status RdmaConnection::WaitLocked(std::unique_lock<std::mutex>& lock, Deadline deadline,
                                  const std::function<bool()>& pred, std::string_view what,
                                  bool allow_after_local_shutdown) {
  // Credits can arrive by RDMA WRITE, which raises no completion here, so a
  // waiter re-reads the credit block in short slices.
  const auto slice =
      comp_channel_ == nullptr ? std::chrono::microseconds(20) : std::chrono::microseconds(100);
  for (;;) {
    Status alive = allow_after_local_shutdown ? state_.CheckAlive() : state_.CheckSend();
    if (!alive.ok()) return alive;
    if (pred()) return Status::Ok();
    RefreshCreditsFromBlock();
    if (pred()) return Status::Ok();
    if (deadline.expired()) return Status::Timeout(fmt::format("rdma: timed out {} ({})", what, peer_uri_));
    cv_.wait_for(lock, slice);
  }
}

Status RdmaConnection::WaitAllSendsComplete(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(
      lock, deadline, [this] { return data_send_pool_.all_free() && ctrl_send_pool_.all_free(); },
      "waiting for sends to complete", true);
}

// ---------------------------------------------------------------------------
// Sending

Status RdmaConnection::SendDataItem(ItemKind kind, const BodyFill& fill) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!data_credits_.CanSend()) {
    static const SchemeCounters& counters = CountersForScheme("rdma");
    counters.credit_stalls->Increment();
  }
  CANOPY_RETURN_IF_ERROR(WaitLocked(
      lock, Deadline::After(options_.base.io_timeout),
      [this] { return data_credits_.CanSend() && data_send_pool_.free_count() > 0 && sq_room() > 0; },
      "sending: the peer returned no credits (not receiving?)", /*allow_after_local_shutdown=*/false));
  const uint32_t slot = *data_send_pool_.Acquire();
  data_credits_.Consume();
  ++sq_outstanding_;
  const size_t capacity = std::min(options_.slot_bytes, peer_slot_bytes_) - kItemHeaderSize;
  lock.unlock();

  char* buf = data_send_slot(slot);
  Result<size_t> body = fill(buf + kItemHeaderSize, capacity);

  lock.lock();
  if (!body.ok()) {
    // A credit is spent and a message is half sent: the stream is broken.
    --sq_outstanding_;
    (void)data_send_pool_.Release(slot);
    FailLocked(body.status());
    return body.status();
  }
  ItemHeader header;
  header.kind = kind;
  header.data_reposted = data_returner_.TakeForPiggyback();
  header.ctrl_reposted = ctrl_returner_.TakeForPiggyback();
  header.body_len = static_cast<uint32_t>(*body);
  EncodeItemHeader(buf, header);
  const uint32_t length = static_cast<uint32_t>(kItemHeaderSize + *body);
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = length;
  sge.lkey = send_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrSendData, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | (length <= max_inline_ ? IBV_SEND_INLINE : 0);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    --sq_outstanding_;
    (void)data_send_pool_.Release(slot);
    Status s = ErrnoStatus(rc, fmt::format("rdma: ibv_post_send to {}", peer_uri_));
    FailLocked(Status::Unavailable(s.message()));
    return state_.failure();
  }
  return Status::Ok();
}

Status RdmaConnection::SendControl(ItemKind kind, std::string_view body, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  CANOPY_RETURN_IF_ERROR(WaitLocked(
      lock, deadline,
      [this] { return ctrl_credits_.CanSend() && ctrl_send_pool_.free_count() > 0 && sq_room() > 0; },
      "sending a control item", /*allow_after_local_shutdown=*/true));
  const uint32_t slot = *ctrl_send_pool_.Acquire();
  ctrl_credits_.Consume();
  char* buf = ctrl_send_slot(slot);
  ItemHeader header;
  header.kind = kind;
  header.data_reposted = data_returner_.TakeForPiggyback();
  header.ctrl_reposted = ctrl_returner_.TakeForPiggyback();
  header.body_len = static_cast<uint32_t>(body.size());
  EncodeItemHeader(buf, header);
  std::memcpy(buf + kItemHeaderSize, body.data(), body.size());
  const uint32_t length = static_cast<uint32_t>(kItemHeaderSize + body.size());
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = length;
  sge.lkey = send_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrSendCtrl, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | (length <= max_inline_ ? IBV_SEND_INLINE : 0);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    (void)ctrl_send_pool_.Release(slot);
    Status s = ErrnoStatus(rc, fmt::format("rdma: ibv_post_send (control) to {}", peer_uri_));
    FailLocked(Status::Unavailable(s.message()));
    return state_.failure();
  }
  ++sq_outstanding_;
  return Status::Ok();
}

Status RdmaConnection::SendStream(StreamPacker& packer) {
  while (!packer.done()) {
    CANOPY_RETURN_IF_ERROR(SendDataItem(
        ItemKind::kData,
        [&packer](char* dst, size_t capacity) -> Result<size_t> { return packer.Fill(dst, capacity); }));
  }
  return Status::Ok();
}

Status RdmaConnection::Send(uint16_t type, std::string_view payload) {
  if (payload.size() > options_.base.max_message_bytes) {
    return Status::InvalidArgument(fmt::format("rdma: message of {} bytes exceeds max_message_bytes {}",
                                               payload.size(), options_.base.max_message_bytes));
  }
  std::lock_guard<std::mutex> send_lock(send_mu_);
  char header[kFrameHeaderSize];
  EncodeFrameHeader(header, type, payload, 0, FramePayloadCheck());
  StreamPacker packer;
  packer.Append(std::string_view(header, sizeof header));
  packer.Append(payload);
  CANOPY_RETURN_IF_ERROR(SendStream(packer));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.messages_sent;
  stats_.bytes_sent += payload.size();
  return Status::Ok();
}

Status RdmaConnection::SendFileEager(int fd, uint64_t offset, uint64_t length) {
  uint64_t sent = 0;
  while (sent < length) {
    CANOPY_RETURN_IF_ERROR(SendDataItem(ItemKind::kData, [&](char* dst, size_t capacity) -> Result<size_t> {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(capacity, length - sent));
      size_t got = 0;
      while (got < want) {
        const ssize_t n = pread(fd, dst + got, want - got, static_cast<off_t>(offset + sent + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ErrnoStatus(errno, "rdma: read bulk source file");
        if (n == 0) return Status::IOError("rdma: bulk source file is shorter than announced");
        got += static_cast<size_t>(n);
      }
      sent += got;
      return got;
    }));
  }
  return Status::Ok();
}

Status RdmaConnection::SendRendezvous(const BulkSource& bulk) {
  struct Segment {
    ibv_mr* mr = nullptr;
    void* map = nullptr;
    size_t map_len = 0;
    uint64_t id = 0;
  };
  auto release = [](Segment& s) {
    if (s.mr != nullptr) ibv_dereg_mr(s.mr);
    if (s.map != nullptr) munmap(s.map, s.map_len);
    s = Segment{};
  };
  const uint64_t segment_max =
      std::clamp<uint64_t>(options_.base.max_inflight_bytes, uint64_t{1} << 20, uint64_t{256} << 20);
  const uint64_t total = bulk.size();
  std::deque<Segment> outstanding;
  uint64_t offset = 0;
  Status result;
  bool eager_rest = false;  // registration failed: copy the rest through slots
  while ((offset < total && !eager_rest) || !outstanding.empty()) {
    if (offset < total && !eager_rest && outstanding.size() < 2) {
      const uint64_t len = std::min(segment_max, total - offset);
      Segment s;
      char* ptr = nullptr;
      if (bulk.is_file()) {
        const uint64_t absolute = bulk.file_offset + offset;
        const uint64_t aligned = absolute & ~static_cast<uint64_t>(kPage - 1);
        s.map_len = static_cast<size_t>(len + (absolute - aligned));
        s.map = mmap(nullptr, s.map_len, PROT_READ, MAP_SHARED, bulk.fd, static_cast<off_t>(aligned));
        if (s.map == MAP_FAILED) {
          s.map = nullptr;
          CANOPY_LOG(kDebug, "rdma: mmap of the bulk source failed ({}); copying it through slots",
                     std::strerror(errno));
          eager_rest = true;
          continue;
        }
        ptr = static_cast<char*>(s.map) + (absolute - aligned);
      } else {
        ptr = const_cast<char*>(bulk.memory.data()) + offset;
      }
      s.mr = ibv_reg_mr(pd_, ptr, len, IBV_ACCESS_REMOTE_READ);
      if (s.mr == nullptr) {
        CANOPY_LOG(kDebug,
                   "rdma: cannot register {} bulk bytes ({}; check ulimit -l); copying them through slots",
                   len, std::strerror(errno));
        release(s);
        eager_rest = true;
        continue;
      }
      s.id = next_segment_id_++;
      BulkSegment segment{reinterpret_cast<uintptr_t>(ptr), s.mr->rkey, len, s.id};
      outstanding.push_back(s);
      result = SendDataItem(ItemKind::kBulkSegment, [&segment](char* dst, size_t) -> Result<size_t> {
        EncodeBulkSegment(dst, segment);
        return kBulkSegmentBodySize;
      });
      if (!result.ok()) break;
      offset += len;
      continue;
    }
    const uint64_t id = outstanding.front().id;
    std::unique_lock<std::mutex> lock(mu_);
    result = WaitLocked(
        lock, Deadline::After(options_.base.io_timeout), [&] { return bulk_done_.count(id) > 0; },
        "waiting for the peer to read bulk data", /*allow_after_local_shutdown=*/true);
    if (!result.ok()) break;
    bulk_done_.erase(id);
    lock.unlock();
    release(outstanding.front());
    outstanding.pop_front();
  }
  if (result.ok() && eager_rest && offset < total) {
    // The receiver takes data items and segments in any mix.
    if (bulk.is_file()) {
      result = SendFileEager(bulk.fd, bulk.file_offset + offset, total - offset);
    } else {
      StreamPacker packer;
      packer.Append(bulk.memory.substr(offset));
      result = SendStream(packer);
    }
    if (!result.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(result);
    }
    return result;
  }
  if (!result.ok()) {
    // The message is cut short; break the connection before unpinning memory
    // the peer may still be reading.
    {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(result);
    }
    for (Segment& s : outstanding) release(s);
  }
  return result;
}

Status RdmaConnection::SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) {
  if (payload.size() > options_.base.max_message_bytes) {
    return Status::InvalidArgument(fmt::format("rdma: message of {} bytes exceeds max_message_bytes {}",
                                               payload.size(), options_.base.max_message_bytes));
  }
  const uint64_t size = bulk.size();
  bool regular_file = false;
  if (bulk.is_file() && size > 0) {
    struct stat st {};
    if (fstat(bulk.fd, &st) != 0) return ErrnoStatus(errno, "rdma: fstat bulk source");
    regular_file = S_ISREG(st.st_mode);
    if (regular_file && bulk.file_offset + size > static_cast<uint64_t>(st.st_size)) {
      return Status::InvalidArgument(
          fmt::format("rdma: bulk range [{}, {}) is past the end of the {}-byte file", bulk.file_offset,
                      bulk.file_offset + size, st.st_size));
    }
  }
  const bool rendezvous = size > eager_bulk_ && (!bulk.is_file() || regular_file);

  std::lock_guard<std::mutex> send_lock(send_mu_);
  char header[kFrameHeaderSize];
  EncodeFrameHeader(header, type, payload, size, FramePayloadCheck());
  StreamPacker packer;
  packer.Append(std::string_view(header, sizeof header));
  packer.Append(payload);
  if (!rendezvous && !bulk.is_file()) packer.Append(bulk.memory);
  CANOPY_RETURN_IF_ERROR(SendStream(packer));
  if (rendezvous) {
    CANOPY_RETURN_IF_ERROR(SendRendezvous(bulk));
  } else if (bulk.is_file() && size > 0) {
    CANOPY_RETURN_IF_ERROR(SendFileEager(bulk.fd, bulk.file_offset, size));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.messages_sent;
  stats_.bytes_sent += payload.size() + size;
  return Status::Ok();
}

Status RdmaConnection::Shutdown() {
  std::lock_guard<std::mutex> send_lock(send_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.local_shutdown()) return Status::Ok();
  }
  CANOPY_RETURN_IF_ERROR(
      SendDataItem(ItemKind::kShutdown, [](char*, size_t) -> Result<size_t> { return size_t{0}; }));
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.MarkLocalShutdown();
  }
  return WaitAllSendsComplete(Deadline::After(options_.base.io_timeout));
}

// ---------------------------------------------------------------------------
// Receiving

Result<Message> RdmaConnection::Receive(Deadline deadline) {
  std::lock_guard<std::mutex> recv_lock(recv_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (bulk_pending_ > 0) {
    if (state_.state() == ConnState::kFailed || state_.state() == ConnState::kClosed)
      return state_.CheckAlive();
    return Status::InvalidArgument(fmt::format(
        "rdma: Receive called with {} bulk bytes of the last message still pending", bulk_pending_));
  }
  std::vector<uint32_t> released;
  for (;;) {
    if (state_.state() == ConnState::kClosed) return Status::Aborted("rdma: connection closed");
    released.clear();
    auto step = assembler_.Step(inbound_, &released);
    RepostReleased(released);
    if (!step.ok()) {
      if (!step.status().IsClosed()) FailLocked(step.status());
      return step.status();
    }
    if (step->has_value()) {
      Message message = std::move(**step);
      ++stats_.messages_received;
      stats_.bytes_received += message.payload.size();
      bulk_pending_ = message.bulk_bytes;
      return message;
    }
    Status end = state_.ReceiveEndStatus();
    if (!end.ok()) return end;
    if (deadline.expired())
      return Status::Timeout(fmt::format("rdma: receive deadline passed ({})", peer_uri_));
    if (deadline.infinite()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, deadline.at());
    }
  }
}

Status RdmaConnection::PostRead(uint64_t local_addr, uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                                uint32_t length) {
  ibv_sge sge{};
  sge.addr = local_addr;
  sge.length = length;
  sge.lkey = lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrRead, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    Status s = ErrnoStatus(rc, fmt::format("rdma: ibv_post_send (RDMA READ) to {}", peer_uri_));
    FailLocked(Status::Unavailable(s.message()));
    return state_.failure();
  }
  ++reads_posted_;
  ++sq_outstanding_;
  return Status::Ok();
}

Status RdmaConnection::WaitReads(uint64_t target, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(
      lock, deadline, [&] { return reads_completed_ >= target; }, "waiting for RDMA READ completions", true);
}

Status RdmaConnection::ReadRegistered(char* dst, ibv_mr* mr, uint64_t remote, uint32_t rkey, uint64_t length,
                                      Deadline until) {
  Status result;
  uint64_t posted = 0;
  uint64_t target = 0;
  while (posted < length && result.ok()) {
    const auto chunk = static_cast<uint32_t>(std::min<uint64_t>(kReadChunk, length - posted));
    std::unique_lock<std::mutex> lock(mu_);
    result = WaitLocked(
        lock, until, [this] { return CanPostRead(); }, "waiting for a free RDMA READ slot", true);
    if (!result.ok()) break;
    result = PostRead(reinterpret_cast<uintptr_t>(dst + posted), mr->lkey, remote + posted, rkey, chunk);
    target = reads_posted_;
    posted += chunk;
  }
  if (result.ok()) result = WaitReads(target, until);
  if (!result.ok()) {
    // Reads may still be in flight into dst: break the connection first
    // (flushes them), then the caller unregisters.
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(result);
  }
  return result;
}

Status RdmaConnection::ReadSegment(const BulkSegment& segment, uint64_t segment_offset, uint64_t length,
                                   const BulkSink& sink, uint64_t sink_offset, Deadline deadline) {
  const Deadline io = Deadline::After(options_.base.io_timeout);
  const Deadline until = io.at() < deadline.at() ? io : deadline;
  const uint64_t remote = segment.remote_addr + segment_offset;

  if (!sink.is_file() && length >= kRegisterSinkMin) {
    ibv_mr* mr = ibv_reg_mr(pd_, sink.memory + sink_offset, length, IBV_ACCESS_LOCAL_WRITE);
    if (mr != nullptr) {
      Status result = ReadRegistered(sink.memory + sink_offset, mr, remote, segment.rkey, length, until);
      ibv_dereg_mr(mr);
      return result;
    }
    CANOPY_LOG(kDebug, "rdma: cannot register the sink ({}); reading through staging buffers",
               std::strerror(errno));
  }
  if (sink.is_file() && length >= kRegisterSinkMin) {
    // A file on tmpfs whose size already covers the range: its pages are
    // memory, so READ straight into them (mapped and registered), sparing
    // the copy from a staging slot. The file's size is left as it is, as a
    // pwrite inside it would. Not on disk file systems: pages under DMA that
    // the file system did not see dirtied through a fault confuse its
    // write-back (the kernel's known problem with pinned file pages).
    const uint64_t absolute = sink.file_offset + sink_offset;
    struct statfs fs;
    struct stat st;
    if (::fstatfs(sink.fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC && ::fstat(sink.fd, &st) == 0 &&
        static_cast<uint64_t>(st.st_size) >= absolute + length) {
      const uint64_t aligned = absolute & ~static_cast<uint64_t>(kPage - 1);
      const size_t map_len = static_cast<size_t>(length + (absolute - aligned));
      void* map =
          mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, sink.fd, static_cast<off_t>(aligned));
      if (map != MAP_FAILED) {
        char* dst = static_cast<char*>(map) + (absolute - aligned);
        ibv_mr* mr = ibv_reg_mr(pd_, dst, length, IBV_ACCESS_LOCAL_WRITE);
        if (mr != nullptr) {
          Status result = ReadRegistered(dst, mr, remote, segment.rkey, length, until);
          ibv_dereg_mr(mr);
          ::munmap(map, map_len);
          if (result.ok()) {
            static const SchemeCounters& counters = CountersForScheme("rdma");
            counters.bulk_direct_bytes->Increment(static_cast<double>(length));
          }
          return result;
        }
        ::munmap(map, map_len);
      }
      CANOPY_LOG(kDebug, "rdma: cannot map and register the sink file ({}); reading through staging buffers",
                 std::strerror(errno));
    }
  }

  // Through the registered staging slots, pipelined.
  struct Pending {
    uint64_t seq;
    uint32_t slot;
    uint64_t offset;
    uint32_t length;
  };
  std::deque<Pending> pending;
  std::vector<uint32_t> free_slots;
  for (uint32_t i = 0; i < staging_slots_; ++i) free_slots.push_back(i);
  uint64_t posted = 0;
  Status result;
  while (result.ok() && (posted < length || !pending.empty())) {
    if (posted < length && !free_slots.empty()) {
      const auto chunk = static_cast<uint32_t>(std::min<uint64_t>(staging_bytes_, length - posted));
      const uint32_t slot = free_slots.back();
      std::unique_lock<std::mutex> lock(mu_);
      result = WaitLocked(
          lock, until, [this] { return CanPostRead(); }, "waiting for a free RDMA READ slot", true);
      if (!result.ok()) break;
      result = PostRead(reinterpret_cast<uintptr_t>(staging_slot(slot)), send_mr_->lkey, remote + posted,
                        segment.rkey, chunk);
      if (!result.ok()) break;
      free_slots.pop_back();
      pending.push_back(Pending{reads_posted_, slot, posted, chunk});
      posted += chunk;
      continue;
    }
    const Pending done = pending.front();
    result = WaitReads(done.seq, until);
    if (!result.ok()) break;
    const char* data = staging_slot(done.slot);
    if (sink.is_file()) {
      auto write_lock = sink.LockFileWrite();
      result = PwriteAll(sink.fd, data, done.length, sink.file_offset + sink_offset + done.offset,
                         "rdma: write bulk data");
    } else {
      std::memcpy(sink.memory + sink_offset + done.offset, data, done.length);
    }
    pending.pop_front();
    free_slots.push_back(done.slot);
  }
  if (!result.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(result);
  }
  return result;
}

Status RdmaConnection::ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) {
  std::lock_guard<std::mutex> recv_lock(recv_mu_);
  if (length > bulk_pending_) {
    return Status::InvalidArgument(fmt::format(
        "rdma: ReceiveBulk of {} bytes but only {} bulk bytes are pending", length, bulk_pending_));
  }
  if (!sink.is_file() && sink.memory == nullptr && length > 0) {
    return Status::InvalidArgument("rdma: ReceiveBulk into a null memory sink");
  }
  uint64_t done = 0;
  std::vector<uint32_t> released;
  while (done < length) {
    std::unique_lock<std::mutex> lock(mu_);
    if (state_.state() == ConnState::kClosed) return Status::Aborted("rdma: connection closed");
    InboundItem* item = inbound_.front();
    if (item == nullptr) {
      Status end = state_.ReceiveEndStatus();
      if (end.IsClosed()) return Status::Corruption("rdma: stream ended inside a bulk transfer");
      if (!end.ok()) return end;
      if (deadline.expired())
        return Status::Timeout(fmt::format("rdma: bulk receive deadline passed ({})", peer_uri_));
      if (deadline.infinite()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, deadline.at());
      }
      continue;
    }
    if (item->kind == ItemKind::kShutdown) {
      Status s = Status::Corruption("rdma: peer shut down inside a bulk transfer");
      FailLocked(s);
      return s;
    }
    if (item->kind == ItemKind::kData) {
      const std::string_view piece =
          inbound_.PeekData(static_cast<size_t>(std::min<uint64_t>(length - done, SIZE_MAX)));
      lock.unlock();
      Status written;
      if (sink.is_file()) {
        auto write_lock = sink.LockFileWrite();
        written =
            PwriteAll(sink.fd, piece.data(), piece.size(), sink.file_offset + done, "rdma: write bulk data");
      } else {
        std::memcpy(sink.memory + done, piece.data(), piece.size());
      }
      lock.lock();
      if (!written.ok()) return written;
      released.clear();
      inbound_.AdvanceData(piece.size(), &released);
      RepostReleased(released);
      done += piece.size();
      bulk_pending_ -= piece.size();
      stats_.bytes_received += piece.size();
      continue;
    }
    // A bulk segment: RDMA READ it from the sender's registered memory.
    const BulkSegment segment = item->segment;
    const uint64_t segment_left = segment.length - item->consumed;
    if (segment_left > bulk_pending_) {
      Status s = Status::Corruption("rdma: bulk segment runs past the announced bulk length");
      FailLocked(s);
      return s;
    }
    const uint64_t n = std::min(length - done, segment_left);
    const uint64_t segment_offset = item->consumed;
    lock.unlock();
    CANOPY_RETURN_IF_ERROR(ReadSegment(segment, segment_offset, n, sink, done, deadline));
    lock.lock();
    released.clear();
    const bool completed = inbound_.AdvanceSegment(n, &released);
    RepostReleased(released);
    done += n;
    bulk_pending_ -= n;
    stats_.bytes_received += n;
    lock.unlock();
    if (completed) {
      char body[kBulkDoneBodySize];
      EncodeBulkDone(body, segment.segment_id);
      CANOPY_RETURN_IF_ERROR(SendControl(ItemKind::kBulkDone, std::string_view(body, sizeof body),
                                         Deadline::After(options_.base.io_timeout)));
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// One-sided writes (log_ring.cc)

Result<ibv_mr*> RdmaConnection::RegisterOneSided(void* addr, size_t bytes, bool remote_write) {
  const int access = IBV_ACCESS_LOCAL_WRITE | (remote_write ? IBV_ACCESS_REMOTE_WRITE : 0);
  ibv_mr* mr = ibv_reg_mr(pd_, addr, bytes, access);
  if (mr == nullptr) {
    return ErrnoStatus(errno, fmt::format("rdma: register {} bytes for one-sided access ({})", bytes, peer_uri_));
  }
  return mr;
}

Result<uint64_t> RdmaConnection::PostOneSidedWrite(const void* local, uint32_t lkey, uint32_t length,
                                                   uint64_t remote_addr, uint32_t rkey, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  CANOPY_RETURN_IF_ERROR(WaitLocked(
      lock, deadline,
      [this] { return one_sided_posted_ - one_sided_completed_ < kOneSidedWrites && sq_room() > 0; },
      "waiting for room to post a one-sided write", /*allow_after_local_shutdown=*/true));
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(local);
  sge.length = length;
  sge.lkey = lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrOneSidedWrite, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | (length <= max_inline_ ? IBV_SEND_INLINE : 0);
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    Status s = ErrnoStatus(rc, fmt::format("rdma: ibv_post_send (one-sided RDMA WRITE) to {}", peer_uri_));
    FailLocked(Status::Unavailable(s.message()));
    return state_.failure();
  }
  ++sq_outstanding_;
  return ++one_sided_posted_;
}

Status RdmaConnection::WaitOneSidedWrite(uint64_t seq, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  Status waited = WaitLocked(
      lock, deadline, [&] { return one_sided_completed_ >= seq; }, "waiting for one-sided writes to complete", true);
  // A refused write fails the connection; report why even when it completed late.
  if (!waited.ok() || one_sided_completed_ < seq) return waited;
  return state_.CheckAlive();
}

Status RdmaConnection::OneSidedHealth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.CheckAlive();
}

}  // namespace canopy::transport::rdma
