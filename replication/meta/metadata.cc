// MetadataService implementation: libraft driven by a libuv loop on a thread
// of its own. Everything that touches raft or libuv handles runs on that
// thread; other threads post closures through a mutex-protected queue and a
// uv_async_t, and wait on a Completion with their Deadline.
#include "replication/meta/metadata.h"

#include <arpa/inet.h>
#include <uv.h>
// libraft 0.15's headers have no extern "C" guards of their own.
extern "C" {
#include <raft.h>
#include <raft/uv.h>
}

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "base/coding.h"
#include "base/file.h"
#include "base/logging.h"
#include "replication/meta/forward.h"

namespace canopy::replication::meta {
namespace {

using namespace std::chrono_literals;

// A one-shot result slot shared by the waiting caller and the loop thread.
// The first Set wins; later ones are ignored (a request aborted at shutdown
// may still see its raft callback).
template <typename T>
class Completion {
 public:
  void Set(Result<T> value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (value_) return;
    value_.emplace(std::move(value));
    cv_.notify_all();
  }
  Result<T> Wait(Deadline deadline, std::string_view what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return value_.has_value(); })) {
      return Status::Timeout(fmt::format("{}: deadline passed (outcome unknown)", what));
    }
    return *value_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Result<T>> value_;
};

// Result<void> stand-in.
struct Done {};

Status RaftStatus(int rv, std::string_view what, const char* errmsg = nullptr) {
  std::string msg = fmt::format("{}: {}", what, raft_strerror(rv));
  if (errmsg && *errmsg) msg += fmt::format(" ({})", errmsg);
  switch (rv) {
    case RAFT_NOTLEADER:
    case RAFT_LEADERSHIPLOST:
    case RAFT_NOCONNECTION:
    case RAFT_BUSY:
    case RAFT_CANTCHANGE:
      return Status::Unavailable(msg);
    case RAFT_SHUTDOWN:
    case RAFT_CANCELED:
      return Status::Aborted(msg);
    case RAFT_DUPLICATEID:
    case RAFT_DUPLICATEADDRESS:
      return Status::Conflict(msg);
    case RAFT_BADID:
    case RAFT_BADROLE:
    case RAFT_INVALID:
    case RAFT_MALFORMED:
    case RAFT_NAMETOOLONG:
      return Status::InvalidArgument(msg);
    case RAFT_NOTFOUND:
      return Status::NotFound(msg);
    case RAFT_NOSPACE:
      return Status::ResourceExhausted(msg);
    case RAFT_UNAUTHORIZED:
      return Status::PermissionDenied(msg);
    case RAFT_IOERR:
      return Status::IOError(msg);
    case RAFT_TOOBIG:
    case RAFT_TOOMANY:
    case RAFT_NOMEM:
      return Status::ResourceExhausted(msg);
    case RAFT_CORRUPT:
      return Status::Corruption(msg);
    default:
      return Status::Internal(msg);
  }
}

Status ValidateAddress(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument(fmt::format("raft address '{}': expected IPv4:port", address));
  }
  std::string host = address.substr(0, colon);
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1) {
    return Status::InvalidArgument(
        fmt::format("raft address '{}': '{}' is not an IPv4 dotted quad", address, host));
  }
  std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) == 0 ||
      std::stoul(port) > 65535) {
    return Status::InvalidArgument(fmt::format("raft address '{}': bad port '{}'", address, port));
  }
  return Status::Ok();
}

// libraft's on-disk log writes an entry's bytes as they are and reads them
// back assuming 8-byte alignment, so every entry is framed as
//   [u32 length][command bytes][zero padding to a multiple of 8]
std::string FrameLogEntry(std::string_view command) {
  std::string out;
  PutFixed32(&out, static_cast<uint32_t>(command.size()));
  out.append(command);
  out.resize((out.size() + 7) / 8 * 8, '\0');
  return out;
}

Result<std::string_view> UnframeLogEntry(std::string_view entry) {
  if (entry.size() < 4) return Status::Corruption("log entry shorter than its length field");
  uint32_t n = DecodeFixed32(entry.data());
  if (n > entry.size() - 4) {
    return Status::Corruption(fmt::format("log entry claims {} bytes, has {}", n, entry.size() - 4));
  }
  std::string_view padding = entry.substr(4 + n);
  if (padding.size() >= 8 || padding.find_first_not_of('\0') != std::string_view::npos) {
    return Status::Corruption("log entry has bad padding");
  }
  return entry.substr(4, n);
}

struct RaftView {
  int state = RAFT_UNAVAILABLE;
  RaftLeaderInfo leader;
  std::vector<RaftMember> members;
};

}  // namespace

class MetadataService::Impl {
 public:
  explicit Impl(MetaOptions options) : options_(std::move(options)) {
    std::random_device rd;
    next_proposal_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ NowNanos();
  }

  // Checks the options and starts the threads; raft itself starts on the
  // loop thread (StartRaft), which AwaitStarted waits for.
  Status Init();
  Status AwaitStarted();
  void Stop();

  // ---- posting work to the loop ----
  // Runs `task(true)` on the loop thread, or `task(false)` (on some thread)
  // when the service is stopping so that the task can fail its completion.
  bool Post(std::function<void(bool run)> task);

  // Propose / read here, or (when forwarding is on and the leader is known
  // with a forward address) at the leader.
  Result<ApplyOutcome> Propose(const CommandBody& body, Deadline deadline);
  Result<ClusterState> ReadLinearizable(Deadline deadline);
  // Here only; on a follower *forward_to (when given) receives the leader's
  // forward address if it is known.
  Result<ApplyOutcome> ProposeLocal(const CommandBody& body, Deadline deadline, std::string* forward_to);
  Result<ClusterState> ReadLinearizableLocal(Deadline deadline, std::string* forward_to);
  ForwardResponse HandleForward(const ForwardRequest& request);
  std::string forward_address() const { return forward_server_ ? forward_server_->address() : ""; }
  Status AddMember(uint64_t id, const std::string& address, Deadline deadline);
  Status RemoveMember(uint64_t id, Deadline deadline);
  Status TransferLeadership(uint64_t target, Deadline deadline);
  // Runs `start(done)` on the loop thread when this node is the raft leader
  // (else fails `done` with Unavailable naming the leader, or Aborted when
  // stopping) and waits for `done` until `deadline`. `start` hands a request
  // to raft, whose callback completes `done`, or completes it itself.
  Status OnLeaderAndWait(const char* what, Deadline deadline,
                         std::function<void(const std::shared_ptr<Completion<Done>>&)> start);

  ClusterState ReadLocal() const {
    std::lock_guard<std::mutex> lock(state_mu_);
    return state_;
  }
  RaftView View() const {
    std::lock_guard<std::mutex> lock(state_mu_);
    return view_;
  }
  Result<RaftLeaderInfo> WaitForRaftLeader(Deadline deadline) const;
  uint64_t ChangeCount() const {
    std::lock_guard<std::mutex> lock(state_mu_);
    return state_.change_count;
  }
  Result<ClusterState> WaitForChange(uint64_t seen, Deadline deadline) const;
  uint64_t AddWatch(WatchCallback callback);
  void RemoveWatch(uint64_t id);

  const MetaOptions& options() const { return options_; }
  bool forwarding_enabled() const { return forward_server_ != nullptr; }
  static std::string ForwardKey(uint64_t node_id) { return fmt::format("meta/forward/{}", node_id); }

 private:
  // Requests handed to raft; owned by pending_ until their callback runs, or
  // aborted when the loop has ended without running it.
  struct PendingRequest {
    virtual ~PendingRequest() = default;
    virtual void Abort(const Status& s) = 0;
  };
  struct ApplyRequest final : PendingRequest {
    struct raft_apply req {};
    Impl* impl = nullptr;
    uint64_t proposal_id = 0;
    bool registration = false;  // the leader publishing its own forward address
    std::shared_ptr<Completion<ApplyOutcome>> done;
    void Abort(const Status& s) override { done->Set(s); }
  };
  struct BarrierRequest final : PendingRequest {
    struct raft_barrier req {};
    Impl* impl = nullptr;
    std::shared_ptr<Completion<ClusterState>> done;
    void Abort(const Status& s) override { done->Set(s); }
  };
  struct ChangeRequest final : PendingRequest {
    raft_change req{};
    Impl* impl = nullptr;
    uint64_t id = 0;
    bool then_assign_voter = false;
    std::shared_ptr<Completion<Done>> done;
    void Abort(const Status& s) override { done->Set(s); }
  };

  // A leadership transfer in flight; libraft's side of it is transfer_slot_.
  struct TransferRequest final : PendingRequest {
    Impl* impl = nullptr;
    std::shared_ptr<Completion<Done>> done;
    void Abort(const Status& s) override { done->Set(s); }
  };

  // raft_fsm callbacks (loop thread).
  static int FsmApply(raft_fsm* fsm, const raft_buffer* buf, void** result);
  static int FsmSnapshot(raft_fsm* fsm, raft_buffer* bufs[], unsigned* n_bufs);
  static int FsmSnapshotFinalize(raft_fsm* fsm, raft_buffer* bufs[], unsigned* n_bufs);
  static int FsmRestore(raft_fsm* fsm, raft_buffer* buf);

  static void OnApplied(struct raft_apply* req, int status, void* result);
  static void OnBarrier(struct raft_barrier* req, int status);
  static void OnChange(raft_change* req, int status);
  static void OnTransfer(struct raft_transfer* req);
  static void OnWake(uv_async_t* handle);
  static void OnTimer(uv_timer_t* handle);
  static void OnRaftClosed(raft* r);

  Status StartRaft();      // loop thread, before the loop runs
  void StartAndRunLoop();  // the loop thread's body
  void RunLoop();
  void RunTasks();
  void RefreshView();
  Status NotLeaderStatus() const;  // loop thread
  // Loop thread: appends `body`; `done` (may be null) gets the outcome.
  void StartApply(const CommandBody& body, std::shared_ptr<Completion<ApplyOutcome>> done,
                  bool registration = false);
  std::string LeaderForwardAddress() const;  // loop thread; "" when unknown
  void MaybeRegisterForwardAddress();        // loop thread
  static uint32_t ForwardTimeoutMs(Deadline deadline);
  void NotifierMain();
  void Track(PendingRequest* p) { pending_.insert(p); }
  void Untrack(PendingRequest* p) { pending_.erase(p); }

  const MetaOptions options_;

  // Loop-thread state.
  uv_loop_t loop_{};
  uv_async_t wake_{};
  uv_timer_t timer_{};
  raft_uv_transport transport_{};
  raft_io io_{};
  raft_fsm fsm_{};
  raft raft_{};
  bool closing_ = false;  // raft_close was called
  std::set<PendingRequest*> pending_;
  // The raft_transfer given to libraft for every leadership transfer, one at
  // a time (libraft runs at most one: raft_.transfer). It lives as long as
  // raft's I/O, not as long as the transfer: libraft 0.15 sends TimeoutNow
  // with the raft_io_send inside it (no callback), and its libuv transport
  // reads that send's `cb` field again when the message leaves or is dropped,
  // which for a target it is not connected to happens when the connection is
  // made (after connect retries) or when newer messages evict it, possibly
  // long after the transfer's own callback ran. A request freed by then made
  // that read land in reused memory: a node died calling address 0x2a.
  // Upstream fixed it in canonical/raft#398; only libraft ever writes the
  // send (its cb stays null), so a stale read of this slot is harmless.
  struct raft_transfer transfer_slot_ {};
  std::map<uint64_t, ApplyOutcome> outcomes_;  // proposal id -> outcome, for our proposals in flight
  std::set<uint64_t> in_flight_;
  uint64_t next_proposal_id_ = 1;
  std::string snapshot_bytes_;  // kept alive between FsmSnapshot and FsmSnapshotFinalize
  std::thread loop_thread_;

  // Task queue (any thread).
  std::mutex queue_mu_;
  std::deque<std::function<void(bool)>> queue_;
  bool accepting_ = true;
  bool loop_running_ = false;  // raft started: wake_ may be sent to

  // The outcome of StartRaft, once it is known.
  std::mutex start_mu_;
  std::condition_variable start_cv_;
  bool start_done_ = false;
  Status start_status_;

  // State and raft view, written on the loop thread, read anywhere.
  mutable std::mutex state_mu_;
  mutable std::condition_variable state_cv_;
  ClusterState state_;
  RaftView view_;
  bool stopped_ = false;  // under state_mu_

  // Watchers.
  std::mutex watch_mu_;
  std::mutex callback_mu_;  // held while a callback runs
  struct Watcher {
    std::shared_ptr<WatchCallback> callback;
    std::optional<uint64_t> delivered;  // change_count last delivered
  };
  std::map<uint64_t, Watcher> watchers_;
  uint64_t next_watch_id_ = 1;
  bool watch_added_ = false;  // under state_mu_: wakes the notifier
  std::thread notifier_thread_;
  std::thread::id notifier_id_;
  std::once_flag stop_once_;

  // Forwarding (optional). Set in Init before the threads start, then never
  // replaced. registering_ is loop-thread only.
  std::unique_ptr<ForwardServer> forward_server_;
  bool registering_ = false;
};

// ---------------------------------------------------------------------------
// Start / stop

Status MetadataService::Impl::Init() {
  const MetaOptions& o = options_;
  if (o.node_id == 0) return Status::InvalidArgument("metadata: node id must be > 0");
  CANOPY_RETURN_IF_ERROR(ValidateAddress(o.raft_address));
  if (o.data_dir.empty()) return Status::InvalidArgument("metadata: empty data dir");
  if (!o.initial_members.empty()) {
    auto self = o.initial_members.find(o.node_id);
    if (self == o.initial_members.end()) {
      return Status::InvalidArgument(
          fmt::format("metadata: node {} is not in its own initial_members", o.node_id));
    }
    if (self->second != o.raft_address) {
      return Status::InvalidArgument(
          fmt::format("metadata: initial_members gives node {} address {} but raft_address is {}", o.node_id,
                      self->second, o.raft_address));
    }
    for (const auto& [id, addr] : o.initial_members) {
      if (id == 0) return Status::InvalidArgument("metadata: initial member id 0");
      CANOPY_RETURN_IF_ERROR(ValidateAddress(addr));
    }
  }
  if (o.election_timeout_ms == 0 || o.heartbeat_timeout_ms == 0 ||
      o.heartbeat_timeout_ms >= o.election_timeout_ms) {
    return Status::InvalidArgument("metadata: need 0 < heartbeat timeout < election timeout");
  }
  CANOPY_RETURN_IF_ERROR(CreateDirs(o.data_dir).WithContext("metadata data dir"));

  // libuv's stream writes can raise SIGPIPE on a peer that went away.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  if (!o.forward_address.empty()) {
    // Set before the threads start and never replaced: readable anywhere.
    // Requests that arrive before the loop runs simply wait in the queue.
    auto server =
        ForwardServer::Start(o.forward_address, [this](const ForwardRequest& r) { return HandleForward(r); });
    if (!server.ok()) return server.status();
    forward_server_ = std::move(server).value();
  }
  // libraft's start (its file system probe alone waits ~40 ms for an AIO
  // context's teardown on some kernels) runs on the loop thread, so that the
  // caller goes on meanwhile; AwaitStarted reports how it went.
  loop_thread_ = std::thread([this] { StartAndRunLoop(); });
  notifier_thread_ = std::thread([this] { NotifierMain(); });
  notifier_id_ = notifier_thread_.get_id();
  return Status::Ok();
}

Status MetadataService::Impl::StartRaft() {
  const MetaOptions& o = options_;
  int rv = uv_loop_init(&loop_);
  if (rv != 0) return Status::Internal(fmt::format("uv_loop_init: {}", uv_strerror(rv)));
  loop_.data = this;
  auto fail_loop = [&](Status s) {
    uv_walk(
        &loop_,
        [](uv_handle_t* h, void*) {
          if (!uv_is_closing(h)) uv_close(h, nullptr);
        },
        nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    return s;
  };
  if ((rv = uv_async_init(&loop_, &wake_, &Impl::OnWake)) != 0 ||
      (rv = uv_timer_init(&loop_, &timer_)) != 0) {
    return fail_loop(Status::Internal(fmt::format("libuv handle init: {}", uv_strerror(rv))));
  }
  wake_.data = this;
  timer_.data = this;

  rv = raft_uv_tcp_init(&transport_, &loop_);
  if (rv != 0) return fail_loop(RaftStatus(rv, "raft_uv_tcp_init"));
  rv = raft_uv_init(&io_, &loop_, o.data_dir.c_str(), &transport_);
  if (rv != 0) {
    Status s = RaftStatus(rv, fmt::format("raft_uv_init {}", o.data_dir), io_.errmsg);
    raft_uv_tcp_close(&transport_);
    return fail_loop(s);
  }
  raft_uv_set_connect_retry_delay(&io_, o.connect_retry_delay_ms);

  fsm_.version = 2;
  fsm_.data = this;
  fsm_.apply = &Impl::FsmApply;
  fsm_.snapshot = &Impl::FsmSnapshot;
  fsm_.restore = &Impl::FsmRestore;
  fsm_.snapshot_finalize = &Impl::FsmSnapshotFinalize;
  fsm_.snapshot_async = nullptr;

  rv = raft_init(&raft_, &io_, &fsm_, o.node_id, o.raft_address.c_str());
  if (rv != 0) {
    Status s = RaftStatus(rv, "raft_init", raft_.errmsg);
    raft_uv_close(&io_);
    raft_uv_tcp_close(&transport_);
    return fail_loop(s);
  }
  raft_.data = this;

  // Everything below that fails closes raft through the loop.
  auto fail_raft = [&](Status s) {
    closing_ = true;
    raft_close(&raft_, nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wake_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    raft_uv_close(&io_);
    raft_uv_tcp_close(&transport_);
    uv_loop_close(&loop_);
    return s;
  };

  if (!o.initial_members.empty()) {
    raft_configuration conf;
    raft_configuration_init(&conf);
    for (const auto& [id, addr] : o.initial_members) {
      rv = raft_configuration_add(&conf, id, addr.c_str(), RAFT_VOTER);
      if (rv != 0) {
        raft_configuration_close(&conf);
        return fail_raft(RaftStatus(rv, fmt::format("initial member {} {}", id, addr)));
      }
    }
    rv = raft_bootstrap(&raft_, &conf);
    raft_configuration_close(&conf);
    if (rv != 0 && rv != RAFT_CANTBOOTSTRAP) {  // CANTBOOTSTRAP: not the first start
      return fail_raft(RaftStatus(rv, "raft_bootstrap", raft_.errmsg));
    }
  }
  raft_set_election_timeout(&raft_, o.election_timeout_ms);
  raft_set_heartbeat_timeout(&raft_, o.heartbeat_timeout_ms);
  raft_set_snapshot_threshold(&raft_, o.snapshot_threshold);
  raft_set_snapshot_trailing(&raft_, o.snapshot_trailing);
  raft_set_install_snapshot_timeout(&raft_, o.install_snapshot_timeout_ms);
  raft_set_pre_vote(&raft_, true);  // a rejoining node does not depose a healthy leader

  rv = raft_start(&raft_);
  if (rv != 0) {
    return fail_raft(
        RaftStatus(rv, fmt::format("raft_start on {} ({})", o.raft_address, o.data_dir), raft_.errmsg));
  }
  rv = uv_timer_start(&timer_, &Impl::OnTimer, 10, 10);
  if (rv != 0) return fail_raft(Status::Internal(fmt::format("uv_timer_start: {}", uv_strerror(rv))));
  RefreshView();
  CANOPY_LOG(kInfo, "meta: node {} raft on {} (dir {})", o.node_id, o.raft_address, o.data_dir);
  return Status::Ok();
}

void MetadataService::Impl::StartAndRunLoop() {
  Status started = StartRaft();
  std::deque<std::function<void(bool)>> refused;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (started.ok()) {
      loop_running_ = true;
      // Tasks posted while raft was starting: run them now.
      if (!queue_.empty()) uv_async_send(&wake_);
    } else {
      accepting_ = false;  // later posts fail at once
      refused.swap(queue_);
    }
  }
  for (auto& task : refused) task(false);
  {
    std::lock_guard<std::mutex> lock(start_mu_);
    start_status_ = started;
    start_done_ = true;
  }
  start_cv_.notify_all();
  if (!started.ok()) {
    CANOPY_LOG(kWarn, "meta: node {} could not start raft: {}", options_.node_id, started.ToString());
    return;
  }
  RunLoop();
}

Status MetadataService::Impl::AwaitStarted() {
  std::unique_lock<std::mutex> lock(start_mu_);
  start_cv_.wait(lock, [&] { return start_done_; });
  return start_status_;
}

void MetadataService::Impl::RunLoop() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  // The loop ends only after raft closed and our handles are closed.
  for (PendingRequest* p : pending_) {
    p->Abort(Status::Aborted("metadata service stopped"));
    delete p;
  }
  pending_.clear();
  raft_uv_close(&io_);
  raft_uv_tcp_close(&transport_);
  int rv = uv_loop_close(&loop_);
  if (rv != 0) CANOPY_LOG(kWarn, "meta: uv_loop_close: {}", uv_strerror(rv));
}

void MetadataService::Impl::Stop() {
  std::call_once(stop_once_, [this] {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      accepting_ = false;
    }
    if (loop_thread_.joinable()) {
      // Raft is started (or failed to start) first: a start half done is
      // never torn down from another thread.
      if (AwaitStarted().ok()) {
        // The stop request goes through the loop like any other task.
        std::lock_guard<std::mutex> lock(queue_mu_);
        queue_.push_back([this](bool) {
          closing_ = true;
          uv_timer_stop(&timer_);
          raft_close(&raft_, &Impl::OnRaftClosed);
        });
        uv_async_send(&wake_);
      }
      loop_thread_.join();
    }
    // After raft closed: forwarded calls still waiting got Aborted.
    if (forward_server_) forward_server_->Stop();
    // Tasks posted after the stop task never ran: fail them.
    std::deque<std::function<void(bool)>> left;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      left.swap(queue_);
    }
    for (auto& task : left) task(false);
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      stopped_ = true;
      view_.state = RAFT_UNAVAILABLE;
      view_.leader = {};
    }
    state_cv_.notify_all();
    if (notifier_thread_.joinable()) notifier_thread_.join();
    CANOPY_LOG(kInfo, "meta: node {} stopped", options_.node_id);
  });
}

void MetadataService::Impl::OnRaftClosed(raft* r) {
  auto* self = static_cast<Impl*>(r->data);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->wake_), nullptr);
}

bool MetadataService::Impl::Post(std::function<void(bool)> task) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (!accepting_) {
    task(false);
    return false;
  }
  queue_.push_back(std::move(task));
  // Sent under the lock: Stop() flips accepting_ under it before the loop
  // can close wake_, so no send ever hits a closed handle. While raft is
  // still starting the task waits: the loop thread wakes itself once it is.
  if (loop_running_) uv_async_send(&wake_);
  return true;
}

void MetadataService::Impl::OnWake(uv_async_t* handle) { static_cast<Impl*>(handle->data)->RunTasks(); }

void MetadataService::Impl::OnTimer(uv_timer_t* handle) { static_cast<Impl*>(handle->data)->RefreshView(); }

void MetadataService::Impl::RunTasks() {
  std::deque<std::function<void(bool)>> batch;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    batch.swap(queue_);
  }
  for (auto& task : batch) task(!closing_);
  if (!closing_) RefreshView();
}

void MetadataService::Impl::RefreshView() {
  if (closing_) return;
  RaftView v;
  v.state = raft_state(&raft_);
  raft_id id = 0;
  const char* address = nullptr;
  raft_leader(&raft_, &id, &address);
  v.leader.id = id;
  if (address) v.leader.address = address;
  for (unsigned i = 0; i < raft_.configuration.n; ++i) {
    const raft_server& s = raft_.configuration.servers[i];
    v.members.push_back({s.id, s.address ? s.address : "", s.role == RAFT_VOTER});
  }
  uint64_t applied = raft_last_applied(&raft_);
  bool changed;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    changed = v.state != view_.state || v.leader.id != view_.leader.id;
    view_ = std::move(v);
    state_.applied_index = applied;
  }
  if (changed) state_cv_.notify_all();
  MaybeRegisterForwardAddress();
}

void MetadataService::Impl::MaybeRegisterForwardAddress() {
  if (!forwarding_enabled() || registering_ || closing_ || raft_state(&raft_) != RAFT_LEADER) return;
  std::string key = ForwardKey(options_.node_id);
  const std::string& mine = forward_server_->address();
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (state_.Get(key) == mine) return;
  }
  registering_ = true;
  StartApply(PutCmd{key, mine}, nullptr, /*registration=*/true);
}

Status MetadataService::Impl::NotLeaderStatus() const {
  raft_id id = 0;
  const char* address = nullptr;
  raft_leader(const_cast<raft*>(&raft_), &id, &address);
  if (id == 0) {
    return Status::Unavailable(fmt::format(
        "node {} is not the metadata leader; no leader known (election in progress)", options_.node_id));
  }
  return Status::Unavailable(fmt::format("node {} is not the metadata leader; leader is node {} at {}",
                                         options_.node_id, id, address ? address : "?"));
}

// ---------------------------------------------------------------------------
// State machine

int MetadataService::Impl::FsmApply(raft_fsm* fsm, const raft_buffer* buf, void** result) {
  auto* self = static_cast<Impl*>(fsm->data);
  *result = nullptr;
  auto framed = UnframeLogEntry(std::string_view(static_cast<const char*>(buf->base), buf->len));
  auto cmd = framed.ok() ? DecodeCommand(*framed) : Result<Command>(framed.status());
  if (!cmd.ok()) {
    // Cannot happen with our own encoder and raft's checksummed log; applied
    // as a no-op on every replica alike so that they stay identical.
    CANOPY_LOG(kError, "meta: node {}: skipping undecodable log entry: {}", self->options_.node_id,
               cmd.status().ToString());
    return 0;
  }
  ApplyOutcome outcome;
  uint64_t before;
  uint64_t after;
  {
    std::lock_guard<std::mutex> lock(self->state_mu_);
    before = self->state_.change_count;
    outcome = ApplyCommand(&self->state_, cmd->body);
    after = self->state_.change_count;
  }
  if (after != before) self->state_cv_.notify_all();
  if (cmd->proposer == self->options_.node_id && self->in_flight_.count(cmd->proposal_id)) {
    self->outcomes_[cmd->proposal_id] = std::move(outcome);
  }
  return 0;
}

int MetadataService::Impl::FsmSnapshot(raft_fsm* fsm, raft_buffer* bufs[], unsigned* n_bufs) {
  auto* self = static_cast<Impl*>(fsm->data);
  {
    std::lock_guard<std::mutex> lock(self->state_mu_);
    self->snapshot_bytes_ = EncodeState(self->state_);
  }
  auto* array = static_cast<raft_buffer*>(raft_malloc(sizeof(raft_buffer)));
  if (array == nullptr) return RAFT_NOMEM;
  array[0].base = self->snapshot_bytes_.data();
  array[0].len = self->snapshot_bytes_.size();
  *bufs = array;
  *n_bufs = 1;
  return 0;
}

int MetadataService::Impl::FsmSnapshotFinalize(raft_fsm* fsm, raft_buffer* bufs[], unsigned* n_bufs) {
  auto* self = static_cast<Impl*>(fsm->data);
  raft_free(*bufs);
  *bufs = nullptr;
  *n_bufs = 0;
  std::string().swap(self->snapshot_bytes_);
  return 0;
}

int MetadataService::Impl::FsmRestore(raft_fsm* fsm, raft_buffer* buf) {
  auto* self = static_cast<Impl*>(fsm->data);
  auto decoded = DecodeState(std::string_view(static_cast<const char*>(buf->base), buf->len));
  if (!decoded.ok()) {
    CANOPY_LOG(kError, "meta: node {}: refusing snapshot: {}", self->options_.node_id,
               decoded.status().ToString());
    return RAFT_MALFORMED;
  }
  {
    std::lock_guard<std::mutex> lock(self->state_mu_);
    self->state_ = std::move(decoded).value();
  }
  self->state_cv_.notify_all();
  raft_free(buf->base);  // on success the FSM owns the buffer
  return 0;
}

// ---------------------------------------------------------------------------
// Requests

Result<ApplyOutcome> MetadataService::Impl::Propose(const CommandBody& body, Deadline deadline) {
  {
    // Reject what the state machine would refuse as malformed before it
    // reaches the log (and what the decoders' limits would not accept).
    ClusterState scratch;
    ApplyOutcome check = ApplyCommand(&scratch, body);
    if (check.status.code() == StatusCode::kInvalidArgument) return check.status;
  }
  std::string forward_to;
  auto r = ProposeLocal(body, deadline, &forward_to);
  if (r.ok() || forward_to.empty() || deadline.expired()) return r;
  ForwardRequest req{ForwardKind::kPropose, ForwardTimeoutMs(deadline), EncodeCommand(Command{0, 0, body})};
  auto resp = ForwardCall(forward_to, req, deadline);
  if (!resp.ok()) return resp.status().WithContext(fmt::format("forwarding to the leader at {}", forward_to));
  if (!resp->status.ok()) return resp->status.WithContext(fmt::format("metadata leader at {}", forward_to));
  return DecodeOutcome(resp->payload);
}

Result<ApplyOutcome> MetadataService::Impl::ProposeLocal(const CommandBody& body, Deadline deadline,
                                                         std::string* forward_to) {
  auto done = std::make_shared<Completion<ApplyOutcome>>();
  auto body_copy = std::make_shared<CommandBody>(body);
  auto target = std::make_shared<std::string>();
  Post([this, done, body_copy, target](bool run) {
    if (!run) {
      done->Set(Status::Aborted("metadata service stopping"));
      return;
    }
    if (raft_state(&raft_) != RAFT_LEADER) {
      *target = LeaderForwardAddress();  // written before Set: the caller reads it after Wait
      done->Set(NotLeaderStatus());
      return;
    }
    StartApply(*body_copy, done);
  });
  auto r = done->Wait(deadline, "metadata proposal");
  if (forward_to && r.status().IsUnavailable() && forwarding_enabled()) {
    // Read only once the task has run (Set happened): Wait returned a value.
    *forward_to = *target;
  }
  return r;
}

void MetadataService::Impl::StartApply(const CommandBody& body,
                                       std::shared_ptr<Completion<ApplyOutcome>> done, bool registration) {
  Command cmd{options_.node_id, next_proposal_id_++, body};
  std::string bytes = FrameLogEntry(EncodeCommand(cmd));
  raft_buffer buf;
  buf.len = bytes.size();
  buf.base = raft_malloc(buf.len);
  if (buf.base == nullptr) {
    if (done) done->Set(Status::ResourceExhausted("raft_malloc"));
    return;
  }
  std::memcpy(buf.base, bytes.data(), bytes.size());
  auto* req = new ApplyRequest;
  req->req.data = req;
  req->impl = this;
  req->proposal_id = cmd.proposal_id;
  req->registration = registration;
  req->done = done ? std::move(done) : std::make_shared<Completion<ApplyOutcome>>();
  in_flight_.insert(cmd.proposal_id);
  int rv = raft_apply(&raft_, &req->req, &buf, 1, &Impl::OnApplied);
  if (rv != 0) {
    raft_free(buf.base);
    in_flight_.erase(cmd.proposal_id);
    req->done->Set(rv == RAFT_NOTLEADER ? NotLeaderStatus() : RaftStatus(rv, "raft_apply", raft_.errmsg));
    delete req;
    if (registration) registering_ = false;
    return;
  }
  Track(req);
}

std::string MetadataService::Impl::LeaderForwardAddress() const {
  if (!forwarding_enabled()) return {};
  raft_id id = 0;
  const char* address = nullptr;
  raft_leader(const_cast<raft*>(&raft_), &id, &address);
  if (id == 0 || id == options_.node_id) return {};
  std::lock_guard<std::mutex> lock(state_mu_);
  return state_.Get(ForwardKey(id)).value_or("");
}

uint32_t MetadataService::Impl::ForwardTimeoutMs(Deadline deadline) {
  auto ms = deadline.remaining().count();
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, 30'000));
}

ForwardResponse MetadataService::Impl::HandleForward(const ForwardRequest& request) {
  ForwardResponse resp;
  Deadline deadline =
      Deadline::After(std::chrono::milliseconds(std::min<uint32_t>(request.timeout_ms, 30'000)));
  if (request.kind == ForwardKind::kPropose) {
    auto cmd = DecodeCommand(request.payload);
    if (!cmd.ok()) {
      resp.status = cmd.status();
      return resp;
    }
    {
      ClusterState scratch;
      ApplyOutcome check = ApplyCommand(&scratch, cmd->body);
      if (check.status.code() == StatusCode::kInvalidArgument) {
        resp.status = check.status;
        return resp;
      }
    }
    auto r = ProposeLocal(cmd->body, deadline, nullptr);  // never forwarded twice
    if (!r.ok()) {
      resp.status = r.status();
    } else {
      resp.payload = EncodeOutcome(*r);
    }
  } else {
    auto r = ReadLinearizableLocal(deadline, nullptr);
    if (!r.ok()) {
      resp.status = r.status();
    } else {
      resp.payload = EncodeState(*r);
    }
  }
  return resp;
}

void MetadataService::Impl::OnApplied(struct raft_apply* r, int status, void* /*result*/) {
  auto* req = static_cast<ApplyRequest*>(r->data);
  Impl* self = req->impl;
  self->Untrack(req);
  if (req->registration) self->registering_ = false;
  self->in_flight_.erase(req->proposal_id);
  auto it = self->outcomes_.find(req->proposal_id);
  if (status != 0) {
    if (it != self->outcomes_.end()) self->outcomes_.erase(it);
    Status s = RaftStatus(status, "metadata proposal");
    if (status == RAFT_LEADERSHIPLOST || status == RAFT_NOTLEADER) {
      s =
          Status::Unavailable(fmt::format("metadata proposal: leadership lost before commit "
                                          "(outcome unknown): {}",
                                          raft_strerror(status)));
    }
    req->done->Set(s);
  } else if (it == self->outcomes_.end()) {
    req->done->Set(Status::Internal("metadata proposal applied without an outcome"));
  } else {
    req->done->Set(std::move(it->second));
    self->outcomes_.erase(it);
  }
  delete req;
}

Result<ClusterState> MetadataService::Impl::ReadLinearizable(Deadline deadline) {
  std::string forward_to;
  auto r = ReadLinearizableLocal(deadline, &forward_to);
  if (r.ok() || forward_to.empty() || deadline.expired()) return r;
  ForwardRequest req{ForwardKind::kRead, ForwardTimeoutMs(deadline), {}};
  auto resp = ForwardCall(forward_to, req, deadline);
  if (!resp.ok()) return resp.status().WithContext(fmt::format("forwarding to the leader at {}", forward_to));
  if (!resp->status.ok()) return resp->status.WithContext(fmt::format("metadata leader at {}", forward_to));
  return DecodeState(resp->payload);
}

Result<ClusterState> MetadataService::Impl::ReadLinearizableLocal(Deadline deadline,
                                                                  std::string* forward_to) {
  auto done = std::make_shared<Completion<ClusterState>>();
  auto target = std::make_shared<std::string>();
  Post([this, done, target](bool run) {
    if (!run) {
      done->Set(Status::Aborted("metadata service stopping"));
      return;
    }
    if (raft_state(&raft_) != RAFT_LEADER) {
      *target = LeaderForwardAddress();
      done->Set(NotLeaderStatus());
      return;
    }
    auto* req = new BarrierRequest;
    req->req.data = req;
    req->impl = this;
    req->done = done;
    int rv = raft_barrier(&raft_, &req->req, &Impl::OnBarrier);
    if (rv != 0) {
      done->Set(rv == RAFT_NOTLEADER ? NotLeaderStatus() : RaftStatus(rv, "raft_barrier", raft_.errmsg));
      delete req;
      return;
    }
    Track(req);
  });
  auto r = done->Wait(deadline, "linearizable metadata read");
  if (forward_to && r.status().IsUnavailable() && forwarding_enabled()) *forward_to = *target;
  return r;
}

void MetadataService::Impl::OnBarrier(struct raft_barrier* r, int status) {
  auto* req = static_cast<BarrierRequest*>(r->data);
  Impl* self = req->impl;
  self->Untrack(req);
  if (status != 0) {
    req->done->Set(RaftStatus(status, "linearizable metadata read"));
  } else {
    uint64_t applied = raft_last_applied(&self->raft_);
    std::lock_guard<std::mutex> lock(self->state_mu_);
    self->state_.applied_index = applied;
    req->done->Set(self->state_);
  }
  delete req;
}

Status MetadataService::Impl::OnLeaderAndWait(
    const char* what, Deadline deadline, std::function<void(const std::shared_ptr<Completion<Done>>&)> start) {
  auto done = std::make_shared<Completion<Done>>();
  Post([this, done, start = std::move(start)](bool run) {
    if (!run) {
      done->Set(Status::Aborted("metadata service stopping"));
      return;
    }
    if (raft_state(&raft_) != RAFT_LEADER) {
      done->Set(NotLeaderStatus());
      return;
    }
    start(done);
  });
  auto r = done->Wait(deadline, what);
  return r.ok() ? Status::Ok() : r.status();
}

Status MetadataService::Impl::AddMember(uint64_t id, const std::string& address, Deadline deadline) {
  if (id == 0) return Status::InvalidArgument("AddMember: node id 0");
  CANOPY_RETURN_IF_ERROR(ValidateAddress(address));
  return OnLeaderAndWait("AddMember", deadline, [this, id, address](const std::shared_ptr<Completion<Done>>& done) {
    // Already there (an earlier attempt got as far as raft_add)?
    const raft_server* existing = nullptr;
    for (unsigned i = 0; i < raft_.configuration.n; ++i) {
      if (raft_.configuration.servers[i].id == id) existing = &raft_.configuration.servers[i];
    }
    if (existing && std::string(existing->address) != address) {
      done->Set(Status::Conflict(
          fmt::format("AddMember: node {} is already a member at {}", id, existing->address)));
      return;
    }
    if (existing && existing->role == RAFT_VOTER) {
      RefreshView();  // RaftMembers shows the voter to the caller woken below
      done->Set(Done{});
      return;
    }
    auto* req = new ChangeRequest;
    req->req.data = req;
    req->impl = this;
    req->id = id;
    req->done = done;
    int rv;
    if (existing) {
      rv = raft_assign(&raft_, &req->req, id, RAFT_VOTER, &Impl::OnChange);
    } else {
      req->then_assign_voter = true;
      rv = raft_add(&raft_, &req->req, id, address.c_str(), &Impl::OnChange);
    }
    if (rv != 0) {
      done->Set(rv == RAFT_NOTLEADER ? NotLeaderStatus()
                                     : RaftStatus(rv, fmt::format("AddMember {}", id), raft_.errmsg));
      delete req;
      return;
    }
    Track(req);
  });
}

Status MetadataService::Impl::RemoveMember(uint64_t id, Deadline deadline) {
  if (id == 0) return Status::InvalidArgument("RemoveMember: node id 0");
  return OnLeaderAndWait("RemoveMember", deadline, [this, id](const std::shared_ptr<Completion<Done>>& done) {
    auto* req = new ChangeRequest;
    req->req.data = req;
    req->impl = this;
    req->id = id;
    req->done = done;
    int rv = raft_remove(&raft_, &req->req, id, &Impl::OnChange);
    if (rv != 0) {
      done->Set(rv == RAFT_NOTLEADER ? NotLeaderStatus()
                                     : RaftStatus(rv, fmt::format("RemoveMember {}", id), raft_.errmsg));
      delete req;
      return;
    }
    Track(req);
  });
}

Status MetadataService::Impl::TransferLeadership(uint64_t target, Deadline deadline) {
  if (target == 0 || target == options_.node_id) {
    return Status::InvalidArgument(fmt::format("TransferLeadership: {} is not another member", target));
  }
  return OnLeaderAndWait(
      "TransferLeadership", deadline, [this, target](const std::shared_ptr<Completion<Done>>& done) {
        if (raft_.transfer != nullptr) {  // the slot is in use: leave it as it is
          done->Set(Status::Unavailable(
              fmt::format("TransferLeadership to {}: a leadership transfer is already in progress", target)));
          return;
        }
        auto* req = new TransferRequest;
        req->impl = this;
        req->done = done;
        transfer_slot_.data = req;
        int rv = raft_transfer(&raft_, &transfer_slot_, target, &Impl::OnTransfer);
        if (rv != 0) {
          Status s =
              rv == RAFT_BADID
                  ? Status::InvalidArgument(fmt::format("TransferLeadership: node {} is not a voter", target))
                  : RaftStatus(rv, fmt::format("TransferLeadership to {}", target), raft_.errmsg);
          done->Set(rv == RAFT_NOTLEADER ? NotLeaderStatus() : s);
          transfer_slot_.data = nullptr;
          delete req;
          return;
        }
        Track(req);
      });
}

// raft calls this once the transfer ended: the target won (this node has
// stepped down), or one election timeout passed, or this node stopped.
void MetadataService::Impl::OnTransfer(struct raft_transfer* r) {
  auto* req = static_cast<TransferRequest*>(r->data);
  r->data = nullptr;  // r is transfer_slot_: kept, see there
  Impl* self = req->impl;
  self->Untrack(req);
  // The view first: a caller woken below must not read the old LEADER state.
  self->RefreshView();
  if (self->closing_) {
    req->done->Set(Status::Aborted("metadata service stopping"));
  } else if (raft_state(&self->raft_) == RAFT_LEADER) {
    req->done->Set(Status::Unavailable(
        fmt::format("leadership transfer to node {} did not complete; node {} is still the metadata leader",
                    r->id, self->options_.node_id)));
  } else {
    req->done->Set(Done{});
  }
  delete req;
}

void MetadataService::Impl::OnChange(raft_change* r, int status) {
  auto* req = static_cast<ChangeRequest*>(r->data);
  Impl* self = req->impl;
  if (status == 0 && req->then_assign_voter && !self->closing_) {
    // Step two of AddMember: promote the (now spare) node to voter; raft
    // first lets it catch up with the log.
    req->then_assign_voter = false;
    int rv = raft_assign(&self->raft_, &req->req, req->id, RAFT_VOTER, &Impl::OnChange);
    if (rv == 0) return;  // same request object, still tracked
    status = rv;
  }
  self->Untrack(req);
  // The view first: a caller woken below reads the new configuration
  // (RaftMembers), as OnTransfer's callers read the new raft state.
  self->RefreshView();
  if (status != 0) {
    req->done->Set(
        RaftStatus(status, fmt::format("membership change for node {}", req->id), self->raft_.errmsg));
  } else {
    req->done->Set(Done{});
  }
  delete req;
}

// ---------------------------------------------------------------------------
// Waiting and watching

Result<RaftLeaderInfo> MetadataService::Impl::WaitForRaftLeader(Deadline deadline) const {
  std::unique_lock<std::mutex> lock(state_mu_);
  bool ok = state_cv_.wait_until(lock, deadline.at(), [&] { return stopped_ || view_.leader.id != 0; });
  if (stopped_) return Status::Aborted("metadata service stopped");
  if (!ok) return Status::Timeout("no metadata leader elected before the deadline");
  return view_.leader;
}

Result<ClusterState> MetadataService::Impl::WaitForChange(uint64_t seen, Deadline deadline) const {
  std::unique_lock<std::mutex> lock(state_mu_);
  bool ok = state_cv_.wait_until(lock, deadline.at(), [&] { return stopped_ || state_.change_count > seen; });
  if (state_.change_count > seen) return state_;
  if (stopped_) return Status::Aborted("metadata service stopped");
  (void)ok;
  return Status::Timeout(fmt::format("metadata unchanged since change {}", seen));
}

uint64_t MetadataService::Impl::AddWatch(WatchCallback callback) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    id = next_watch_id_++;
    watchers_[id] = Watcher{std::make_shared<WatchCallback>(std::move(callback)), std::nullopt};
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    watch_added_ = true;
  }
  state_cv_.notify_all();
  return id;
}

void MetadataService::Impl::RemoveWatch(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watchers_.erase(id);
  }
  if (std::this_thread::get_id() != notifier_id_) {
    std::lock_guard<std::mutex> wait_for_running_callback(callback_mu_);
  }
}

void MetadataService::Impl::NotifierMain() {
  uint64_t last_seen = UINT64_MAX;
  for (;;) {
    ClusterState snapshot;
    {
      std::unique_lock<std::mutex> lock(state_mu_);
      state_cv_.wait_for(lock, 200ms,
                         [&] { return stopped_ || watch_added_ || state_.change_count != last_seen; });
      if (stopped_) return;
      watch_added_ = false;
      snapshot = state_;
      last_seen = state_.change_count;
    }
    std::vector<std::pair<uint64_t, std::shared_ptr<WatchCallback>>> due;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      for (auto& [id, w] : watchers_) {
        if (!w.delivered || *w.delivered != snapshot.change_count) {
          w.delivered = snapshot.change_count;
          due.emplace_back(id, w.callback);
        }
      }
    }
    for (auto& [id, cb] : due) {
      std::lock_guard<std::mutex> running(callback_mu_);
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        if (!watchers_.count(id)) continue;  // removed meanwhile
      }
      (*cb)(snapshot);
    }
  }
}

// ---------------------------------------------------------------------------
// Public wrapper

MetadataService::MetadataService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetadataService::~MetadataService() { Stop(); }

Result<std::unique_ptr<MetadataService>> MetadataService::Start(const MetaOptions& options) {
  CANOPY_ASSIGN_OR_RETURN(auto service, StartInBackground(options));
  CANOPY_RETURN_IF_ERROR(service->AwaitStarted());  // on failure the destructor stops the threads
  return service;
}

Result<std::unique_ptr<MetadataService>> MetadataService::StartInBackground(const MetaOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CANOPY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<MetadataService>(new MetadataService(std::move(impl)));
}

Status MetadataService::AwaitStarted() { return impl_->AwaitStarted(); }

void MetadataService::Stop() {
  if (impl_) impl_->Stop();
}

uint64_t MetadataService::node_id() const { return impl_->options().node_id; }
const std::string& MetadataService::raft_address() const { return impl_->options().raft_address; }
std::string MetadataService::forward_address() const { return impl_->forward_address(); }

bool MetadataService::IsRaftLeader() const { return impl_->View().state == RAFT_LEADER; }
RaftLeaderInfo MetadataService::RaftLeader() const { return impl_->View().leader; }
Result<RaftLeaderInfo> MetadataService::WaitForRaftLeader(Deadline deadline) const {
  return impl_->WaitForRaftLeader(deadline);
}
std::vector<RaftMember> MetadataService::RaftMembers() const { return impl_->View().members; }

Status MetadataService::AddMember(uint64_t id, const std::string& raft_address, Deadline deadline) {
  return impl_->AddMember(id, raft_address, deadline);
}
Status MetadataService::RemoveMember(uint64_t id, Deadline deadline) {
  return impl_->RemoveMember(id, deadline);
}

Status MetadataService::TransferLeadership(uint64_t target, Deadline deadline) {
  return impl_->TransferLeadership(target, deadline);
}

Result<ApplyOutcome> MetadataService::Propose(const CommandBody& command, Deadline deadline) {
  return impl_->Propose(command, deadline);
}

Result<ApplyOutcome> MetadataService::ProposeWithRetry(const CommandBody& command, Deadline deadline) {
  for (int attempt = 0;; ++attempt) {
    auto r = impl_->Propose(command, deadline);
    if (r.ok() || !r.status().IsUnavailable() || deadline.expired()) return r;
    // Wait for the election (or for the new leader to be known), briefly.
    auto pause = std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(20 + 10 * std::min(attempt, 8)), deadline.remaining());
    std::this_thread::sleep_for(pause);
    if (deadline.expired()) return r;
  }
}

namespace {
Status OutcomeStatus(const Result<ApplyOutcome>& r) { return r.ok() ? r->status : r.status(); }
}  // namespace

Status MetadataService::Put(const std::string& key, const std::string& value, Deadline deadline) {
  return OutcomeStatus(Propose(PutCmd{key, value}, deadline));
}
Status MetadataService::Delete(const std::string& key, Deadline deadline) {
  return OutcomeStatus(Propose(DeleteCmd{key}, deadline));
}
Status MetadataService::CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                      const std::optional<std::string>& desired, Deadline deadline) {
  return OutcomeStatus(Propose(CompareAndSetCmd{key, expected, desired}, deadline));
}
Status MetadataService::SetMember(const MemberInfo& member, Deadline deadline) {
  return OutcomeStatus(Propose(SetMemberCmd{member}, deadline));
}
Result<uint64_t> MetadataService::CompareAndSetLeader(const std::string& tree, uint64_t expected_epoch,
                                                      uint64_t new_leader, uint64_t leader_version,
                                                      Deadline deadline) {
  auto r = Propose(CasLeaderCmd{tree, expected_epoch, new_leader, leader_version}, deadline);
  if (!r.ok()) return r.status();
  if (!r->status.ok()) return r->status;
  return r->epoch;
}

ClusterState MetadataService::ReadLocal() const { return impl_->ReadLocal(); }
Result<ClusterState> MetadataService::ReadLinearizable(Deadline deadline) {
  return impl_->ReadLinearizable(deadline);
}
uint64_t MetadataService::ChangeCount() const { return impl_->ChangeCount(); }
Result<ClusterState> MetadataService::WaitForChange(uint64_t seen, Deadline deadline) const {
  return impl_->WaitForChange(seen, deadline);
}
uint64_t MetadataService::AddWatch(WatchCallback callback) { return impl_->AddWatch(std::move(callback)); }
void MetadataService::RemoveWatch(uint64_t watch_id) { impl_->RemoveWatch(watch_id); }

}  // namespace canopy::replication::meta
