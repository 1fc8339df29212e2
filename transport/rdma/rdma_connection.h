// Private to the rdma backend: the verbs resources of one connection and the
// Connection implementation over them.
//
// Set-up (rdma_setup.cc): librdmacm resolves address and route (active side)
// or hands over a connect request (passive side); CreateResources makes a
// protection domain, a completion queue (with a completion channel in event
// mode), an RC queue pair, and registers:
//   recv region   data_depth + ctrl_depth receive slots (all posted before the
//                 connection is accepted / connected)
//   send region   data send slots, control send slots, staging slots for RDMA
//                 READ into files / small sinks, two credit-source words
//   credit block  8 bytes the peer RDMA-WRITEs its re-post counters into
// After ESTABLISHED each side SENDs a hello (depths, slot size, credit block
// address + rkey) and waits for the peer's.
//
// Datapath (rdma_datapath.cc): one progress thread per connection polls the
// CQ (event or busy mode) and the connection's own CM event channel; it
// handles control items, queues data items, and wakes waiters. Application
// threads post SENDs / READs themselves under mu_.
//
// Thread safety: as transport.h says for Connection. mu_ guards all mutable
// state below it; send_mu_ serialises whole messages; recv_mu_ serialises
// Receive / ReceiveBulk.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "transport/rdma/bulk_policy.h"
#include "transport/rdma/connection_state.h"
#include "transport/rdma/credits.h"
#include "transport/rdma/keepalive.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/rdma/slot_pool.h"
#include "transport/rdma/stream.h"
#include "transport/transport.h"

namespace canopy::transport::rdma {

enum class CqMode { kEvent, kPoll };

// Parsed backend options (see rdma_transport.h).
struct RdmaOptions {
  TransportOptions base;
  std::string device;  // empty: any
  CqMode cq_mode = CqMode::kEvent;
  uint32_t slot_bytes = 64u << 10;
  // Unset: chosen per device when the connection is made (EagerBulkFor, bulk_policy.h).
  std::optional<uint64_t> eager_bulk;
};

// InvalidArgument for unknown keys or bad values. `params` are URI query
// parameters; they override backend_args.
Result<RdmaOptions> ParseRdmaOptions(const TransportOptions& options,
                                     const std::map<std::string, std::string>& params);

// Owns an rdma_cm_id and the event channel it reports on.
struct CmId {
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  CmId() = default;
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;
  ~CmId();  // destroys QP (if any), id, channel
};

// A copy of what matters in an rdma_cm_event (the event itself is acked at once).
struct CmEventInfo {
  rdma_cm_event_type type;
  int status = 0;
  rdma_cm_id* id = nullptr;  // the event's id (a new child for CONNECT_REQUEST)
  rdma_cm_id* listen_id = nullptr;
};

// Waits for the next event on `channel` (its fd non-blocking) until the
// deadline, also returning Aborted when `wake_fd` (>= 0) becomes readable.
Result<CmEventInfo> WaitCmEvent(rdma_event_channel* channel, int wake_fd, Deadline deadline);

// Creates a non-blocking event channel.
Result<rdma_event_channel*> CreateEventChannel();

// "Unavailable: rdma: <what>: <event> (status N: strerror)" etc.
Status CmEventError(const CmEventInfo& event, std::string_view what);

class RdmaConnection final : public Connection {
 public:
  // Takes ownership of `cm` (whose id has resolved its route or came from a
  // connect request). Creates all verbs resources and posts the receive ring.
  // The caller then runs rdma_connect / rdma_accept on cm_id() with
  // ConnParam(), waits for ESTABLISHED, and calls Start().
  static Result<std::unique_ptr<RdmaConnection>> Create(std::unique_ptr<CmId> cm, const RdmaOptions& options,
                                                        bool active);
  ~RdmaConnection() override;

  rdma_cm_id* cm_id() const { return cm_->id; }
  rdma_conn_param ConnParam() const;
  // After ESTABLISHED: starts the progress thread, sends the hello and waits
  // for the peer's until the deadline.
  Status Start(Deadline deadline);
  // For state-machine bookkeeping during set-up.
  Status ApplySetupEvent(ConnEvent event);

  Status Send(uint16_t type, std::string_view payload) override;
  Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) override;
  Result<Message> Receive(Deadline deadline) override;
  Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) override;
  Status Shutdown() override;
  void Close() override;
  std::string peer_uri() const override { return peer_uri_; }
  ConnectionStats stats() const override;

  // --- one-sided access, for log_ring.cc ---
  // Registers [addr, addr + bytes) in this connection's protection domain for
  // local write and, with remote_write, for the peer's RDMA WRITE. The caller
  // deregisters it (ibv_dereg_mr) before this connection is destroyed.
  Result<ibv_mr*> RegisterOneSided(void* addr, size_t bytes, bool remote_write);
  // Posts a signalled RDMA WRITE of local[0, length) (registered under lkey)
  // to remote_addr / rkey, inline when it fits; waits until the deadline for
  // room (at most kOneSidedWrites outstanding). Returns its number among this
  // connection's one-sided writes, 1, 2, ...: they complete in that order. A
  // failed completion fails the connection (PermissionDenied when the peer
  // refused the rkey, i.e. revoked it).
  Result<uint64_t> PostOneSidedWrite(const void* local, uint32_t lkey, uint32_t length, uint64_t remote_addr,
                                     uint32_t rkey, Deadline deadline);
  // Waits until one-sided write number `seq` has completed.
  Status WaitOneSidedWrite(uint64_t seq, Deadline deadline);
  // Ok while the connection works; its failure otherwise.
  Status OneSidedHealth() const;
  std::chrono::milliseconds io_timeout() const { return options_.base.io_timeout; }
  static constexpr uint32_t kOneSidedWrites = 16;

 private:
  enum WrKind : uint64_t {
    kWrRecv = 1,
    kWrSendData = 2,
    kWrSendCtrl = 3,
    kWrCreditWrite = 4,
    kWrRead = 5,
    kWrOneSidedWrite = 6
  };
  static uint64_t MakeWrId(WrKind kind, uint32_t index) {
    return (static_cast<uint64_t>(kind) << 56) | index;
  }

  RdmaConnection(std::unique_ptr<CmId> cm, const RdmaOptions& options);
  Status CreateResources(bool active);
  void DestroyResources();

  char* recv_slot(uint32_t i) const { return recv_region_ + static_cast<size_t>(i) * options_.slot_bytes; }
  char* data_send_slot(uint32_t i) const {
    return send_region_ + static_cast<size_t>(i) * options_.slot_bytes;
  }
  char* ctrl_send_slot(uint32_t i) const;
  char* staging_slot(uint32_t i) const;
  char* credit_source(uint32_t i) const;

  // --- datapath (rdma_datapath.cc) ---
  void ProgressLoop();
  void HandleCompletion(const ibv_wc& wc);            // REQUIRES: mu_
  void HandleReceive(uint32_t slot, uint32_t bytes);  // REQUIRES: mu_
  void HandleCmEvents();
  void DrainCompletionsLocked();  // REQUIRES: mu_; progress thread only (it is the CQ's poller)
  void RefreshCreditsFromBlock();                           // REQUIRES: mu_
  Status PostRecv(uint32_t slot);                           // REQUIRES: mu_
  void RepostReleased(const std::vector<uint32_t>& slots);  // REQUIRES: mu_ (data slots)
  // Writes the credit counters when a report is due, or (force) whenever one can be posted.
  void MaybeWriteCredits(bool force = false);               // REQUIRES: mu_
  void FailLocked(const Status& status);                    // REQUIRES: mu_
  uint32_t sq_room() const { return sq_depth_ - sq_outstanding_; }
  // Whether another RDMA READ may be posted now (mu_ held): under the READ
  // depth the peer allows, and with room on the send queue.
  bool CanPostRead() const { return reads_posted_ - reads_completed_ < max_reads_ && sq_room() > 0; }

  // Sends one data item whose body is filled by `fill` (called without mu_,
  // returns the body length or an error). REQUIRES: send_mu_ held.
  using BodyFill = std::function<Result<size_t>(char* dst, size_t capacity)>;
  Status SendDataItem(ItemKind kind, const BodyFill& fill);
  Status SendStream(StreamPacker& packer);                         // REQUIRES: send_mu_
  // How this side's frames carry their payload: unchecked once the peer's
  // hello said it accepts that (see accepts_unchecked_), else with a CRC.
  PayloadCheck FramePayloadCheck() const {
    return PayloadCheckFor(peer_accepts_unchecked_.load(std::memory_order_acquire));
  }
  Status SendFileEager(int fd, uint64_t offset, uint64_t length);  // REQUIRES: send_mu_
  Status SendRendezvous(const BulkSource& bulk);                   // REQUIRES: send_mu_
  Status SendControl(ItemKind kind, std::string_view body, Deadline deadline);
  Status WaitAllSendsComplete(Deadline deadline);
  void SendEndOfStreamBestEffort(std::chrono::milliseconds wait);
  // Waits on cv_ until pred() or the deadline / failure; mu_ held by `lock`.
  Status WaitLocked(std::unique_lock<std::mutex>& lock, Deadline deadline, const std::function<bool()>& pred,
                    std::string_view what, bool allow_after_local_shutdown);

  Status ReadSegment(const BulkSegment& segment, uint64_t segment_offset, uint64_t length,
                     const BulkSink& sink, uint64_t sink_offset, Deadline deadline);
  // RDMA READs of `length` bytes at (remote, rkey) straight into dst, which
  // `mr` covers, pipelined; returns once all have completed. On failure the
  // connection is failed first (flushing reads still in flight into dst), so
  // the caller may then unregister mr.
  Status ReadRegistered(char* dst, ibv_mr* mr, uint64_t remote, uint32_t rkey, uint64_t length,
                        Deadline until);
  Status PostRead(uint64_t local_addr, uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                  uint32_t length);  // mu_
  Status WaitReads(uint64_t target, Deadline deadline);

  std::unique_ptr<CmId> cm_;
  RdmaOptions options_;
  std::string peer_uri_;

  // Verbs resources (created once, destroyed in the destructor).
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  char* recv_region_ = nullptr;
  size_t recv_region_bytes_ = 0;
  char* send_region_ = nullptr;
  size_t send_region_bytes_ = 0;
  char* credit_block_ = nullptr;  // 8 bytes, own page
  ibv_mr* recv_mr_ = nullptr;
  ibv_mr* send_mr_ = nullptr;
  ibv_mr* credit_mr_ = nullptr;
  uint32_t max_inline_ = 0;
  UniqueFd wake_fd_;  // eventfd: wakes the progress thread
  unsigned unacked_cq_events_ = 0;

  // Geometry.
  uint32_t data_depth_ = 0;  // our data receive slots
  uint32_t ctrl_depth_ = 0;  // our control receive slots
  uint32_t data_send_slots_ = 0;
  uint32_t ctrl_send_slots_ = 0;
  uint32_t staging_slots_ = 0;
  uint32_t staging_bytes_ = 0;
  uint32_t sq_depth_ = 0;
  uint32_t max_reads_ = 0;
  uint64_t eager_bulk_ = kHardwareEagerBulk;  // set by CreateResources (EagerBulkFor)

  std::chrono::milliseconds probe_interval_{10000};
  std::thread progress_thread_;
  std::atomic<bool> stop_{false};

  std::mutex send_mu_;
  std::mutex recv_mu_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  ConnectionStateMachine state_;
  SendCredits data_credits_;
  SendCredits ctrl_credits_{1};
  CreditReturner data_returner_;
  CreditReturner ctrl_returner_;
  SlotPool data_send_pool_;
  SlotPool ctrl_send_pool_;
  uint32_t sq_outstanding_ = 0;
  uint32_t credit_writes_outstanding_ = 0;
  uint32_t next_credit_source_ = 0;
  uint32_t peer_slot_bytes_ = 0;
  // Whether this side accepts frames with an unchecked payload (its device is
  // InfiniBand or RoCE: every packet's CRC is checked by the adapter; not
  // iWARP, whose MPA CRC is optional), and whether the peer's hello said it
  // does (then this side's frames carry no payload CRC: frame.h).
  bool accepts_unchecked_ = false;
  std::atomic<bool> peer_accepts_unchecked_{false};
  uint64_t peer_credit_addr_ = 0;
  uint32_t peer_credit_rkey_ = 0;
  InboundStream inbound_;
  uint64_t reads_posted_ = 0;
  uint64_t reads_completed_ = 0;
  uint64_t one_sided_posted_ = 0;
  uint64_t one_sided_completed_ = 0;
  std::set<uint64_t> bulk_done_;  // segment ids the peer finished reading
  uint64_t next_segment_id_ = 1;
  bool closing_ = false;
  ConnectionStats stats_;

  // Receive side (recv_mu_).
  FrameAssembler assembler_;
  uint64_t bulk_pending_ = 0;
};

}  // namespace canopy::transport::rdma
