#include "replication/client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "transport/registry.h"

namespace canopy::replication {

// One authenticated connection to one node. There is no reader thread: a
// caller waiting for its reply receives for everyone while nobody else does
// (leader/follower), hands each reply to its waiting caller — COMMIT_REPLY
// by sequence, any other reply to the oldest waiting call (the node answers
// those in order) — and, once it has its own, passes the receiving role to
// another waiter. A lone caller thus gets its reply without a thread switch.
// Thread safety: Commit and Call from any threads; broken() any time.
Result<std::unique_ptr<transport::Connection>> DialAsClient(const std::string& uri, const ClientOptions& options,
                                                            const std::string& name,
                                                            std::chrono::milliseconds timeout) {
  transport::TransportOptions topts;
  topts.connect_timeout = timeout;
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(uri, topts));
  HandshakeConfig hs{options.cluster, name, options.secret, PeerRole::kClient, ""};
  auto id = DialerHandshake(*conn, hs, Deadline::After(timeout));
  if (!id.ok()) return id.status().WithContext(uri);
  return conn;
}

class Client::Channel {
 public:
  // Dials and authenticates within `timeout`.
  static Result<std::shared_ptr<Channel>> Open(const std::string& uri, const ClientOptions& options,
                                               const std::string& name, std::chrono::milliseconds timeout) {
    CANOPY_ASSIGN_OR_RETURN(auto conn, DialAsClient(uri, options, name, timeout));
    return std::shared_ptr<Channel>(new Channel(uri, std::move(conn)));
  }

  ~Channel() { conn_->Close(); }

  const std::string& uri() const { return uri_; }

  // True once the connection failed. While nobody receives, this looks at
  // the connection without waiting (the node may have closed it meanwhile),
  // so a caller dials a new one instead of sending into a dead one.
  bool broken() {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_.ok() && !receiving_) {
      receiving_ = true;
      lock.unlock();
      auto m = conn_->Receive(Deadline::After(std::chrono::nanoseconds(0)));
      lock.lock();
      receiving_ = false;
      Take(std::move(m));
      PassReceiving(nullptr);
    }
    return !broken_.ok();
  }

  // Sends `req` and waits for the reply with its sequence until `deadline`.
  // A missing reply leaves the connection usable for other requests.
  Result<CommitReply> Commit(const CommitRequest& req, Deadline deadline) {
    Waiter w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return broken_;
      if (!commits_.emplace(req.sequence, &w).second) {
        return Status::InvalidArgument(
            fmt::format("commit sequence {} of client {} is already in flight", req.sequence, req.client));
      }
    }
    Status s = conn_->Send(static_cast<uint16_t>(MessageType::kCommitRequest), Encode(req));
    std::unique_lock<std::mutex> lock(mu_);
    if (!s.ok()) Break(s.WithContext(uri_));
    Await(lock, w, deadline);
    commits_.erase(req.sequence);
    PassReceiving(nullptr);  // we may have been the only candidate left to receive
    if (!w.message) {
      if (!broken_.ok()) return broken_;
      return Status::Timeout(fmt::format("{}: no reply to commit {} in time", uri_, req.sequence));
    }
    return DecodeCommitReply(w.message->payload);
  }

  // Sends one non-commit request and waits for its reply (in order). A reply
  // that does not come in time breaks the connection (a late one would
  // answer the next call).
  Result<transport::Message> Call(MessageType type, const std::string& payload, MessageType reply_type,
                                  Deadline deadline) {
    std::lock_guard<std::mutex> order(call_mu_);  // one call at a time: replies match trivially
    Waiter w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return broken_;
      calls_.push_back(&w);
    }
    Status s = conn_->Send(static_cast<uint16_t>(type), payload);
    std::unique_lock<std::mutex> lock(mu_);
    if (!s.ok()) Break(s.WithContext(uri_));
    Await(lock, w, deadline);
    std::erase(calls_, &w);
    PassReceiving(nullptr);
    if (!w.message) {
      if (broken_.ok()) {
        Break(Status::Timeout(fmt::format("{}: no {} in time", uri_, MessageTypeName(static_cast<uint16_t>(reply_type)))));
      }
      return broken_;
    }
    if (w.message->type != static_cast<uint16_t>(reply_type)) {
      Status bad = UnexpectedMessage(*w.message, MessageTypeName(static_cast<uint16_t>(reply_type))).WithContext(uri_);
      Break(bad);
      return bad;
    }
    return std::move(*w.message);
  }

  // ---- Pipelined commits (Client::CommitPipelined): one thread keeps many
  // commits in flight; their waiters wake the pipeline's own cv.
  struct Flight;
  // Registers `f` and sends its request. Non-ok (and nothing registered) if
  // the channel is broken or the send failed (which breaks it).
  Status Launch(Flight& f);
  // Waits until at least one of `flights` has its reply, the channel broke,
  // or the earliest flight deadline passed, receiving for every waiter while
  // nobody else does (and, once a message came, whatever else has already
  // arrived, without waiting). Moves every flight that is done — replied,
  // or failed with the broken channel or its own deadline — to `landed`.
  void AwaitAny(std::map<uint64_t, std::unique_ptr<Flight>>& flights, std::condition_variable& cv,
                std::vector<std::unique_ptr<Flight>>* landed);

 private:
  struct Waiter {
    std::optional<transport::Message> message;
    std::condition_variable cv;  // its message arrived, the channel broke, or it may receive now
    std::condition_variable* wake = nullptr;  // notified instead of cv when set (a pipeline's flights)
    void Notify() { (wake != nullptr ? *wake : cv).notify_one(); }
  };

  Channel(std::string uri, std::unique_ptr<transport::Connection> conn)
      : uri_(std::move(uri)), conn_(std::move(conn)) {}

  // Waits (mu_ held through `lock`, released meanwhile) until `w` has its
  // message, the channel broke or `deadline`; receives for every waiter
  // while nobody else does.
  void Await(std::unique_lock<std::mutex>& lock, Waiter& w, Deadline deadline) {
    while (!w.message && broken_.ok() && !deadline.expired()) {
      if (receiving_) {
        w.cv.wait_until(lock, deadline.at());
        continue;
      }
      receiving_ = true;
      lock.unlock();
      auto m = conn_->Receive(deadline);
      lock.lock();
      receiving_ = false;
      Take(std::move(m));
    }
  }

  // Hands a received message (or the receive's failure) to its waiter.
  // REQUIRES: mu_ held.
  void Take(Result<transport::Message> m) {
    if (!m.ok()) {
      if (!m.status().IsTimeout()) Break(m.status().WithContext(uri_));
      return;
    }
    if (m->bulk_bytes != 0) {
      Break(Status::Corruption(uri_ + ": unexpected bulk bytes"));
      return;
    }
    if (m->type == static_cast<uint16_t>(MessageType::kCommitReply)) {
      auto reply = DecodeCommitReply(m->payload);
      if (!reply.ok()) {
        Break(reply.status().WithContext(uri_));
        return;
      }
      auto it = commits_.find(reply->sequence);
      if (it != commits_.end() && !it->second->message) {
        it->second->message = std::move(*m);
        it->second->Notify();
      }
      // else: its caller gave up waiting; the reply is dropped.
    } else if (!calls_.empty()) {
      calls_.front()->message = std::move(*m);
      calls_.front()->Notify();
      calls_.pop_front();
    } else {
      Break(UnexpectedMessage(*m, "a reply").WithContext(uri_));
    }
  }

  // Nobody receives now: wakes one waiter still without its reply (not
  // `self`) to take over. REQUIRES: mu_ held.
  void PassReceiving(Waiter* self) {
    if (receiving_ || !broken_.ok()) return;
    for (auto& [sequence, w] : commits_) {
      if (w != self && !w->message) {
        w->Notify();
        return;
      }
    }
    for (Waiter* w : calls_) {
      if (w != self && !w->message) {
        w->Notify();
        return;
      }
    }
  }

  // REQUIRES: mu_ held.
  void Break(Status why) {
    if (broken_.ok()) broken_ = std::move(why);
    conn_->Close();
    for (auto& [sequence, w] : commits_) w->Notify();
    for (Waiter* w : calls_) w->Notify();
  }

  const std::string uri_;
  const std::unique_ptr<transport::Connection> conn_;
  std::mutex call_mu_;
  std::mutex mu_;  // guards the fields below
  std::map<uint64_t, Waiter*> commits_;  // by sequence
  std::deque<Waiter*> calls_;
  bool receiving_ = false;  // a caller is in conn_->Receive
  Status broken_;  // non-ok once the connection failed
};

struct Client::Channel::Flight {
  CommitRequest request;
  int redirects = 0;  // times this request was redirected to another node already
  std::chrono::steady_clock::time_point sent;
  Deadline deadline = Deadline::After(std::chrono::milliseconds(0));
  Waiter waiter;
  Status failure;  // when it landed without a reply
};

Status Client::Channel::Launch(Flight& f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    if (!commits_.emplace(f.request.sequence, &f.waiter).second) {
      return Status::InvalidArgument(fmt::format("commit sequence {} of client {} is already in flight",
                                                 f.request.sequence, f.request.client));
    }
  }
  f.sent = std::chrono::steady_clock::now();
  Status s = conn_->Send(static_cast<uint16_t>(MessageType::kCommitRequest), Encode(f.request));
  if (s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  commits_.erase(f.request.sequence);
  Break(s.WithContext(uri_));
  PassReceiving(nullptr);
  return broken_;
}

void Client::Channel::AwaitAny(std::map<uint64_t, std::unique_ptr<Flight>>& flights, std::condition_variable& cv,
                               std::vector<std::unique_ptr<Flight>>* landed) {
  Deadline deadline = Deadline::After(std::chrono::hours(24));
  for (const auto& [sequence, f] : flights) {
    if (f->deadline.at() < deadline.at()) deadline = f->deadline;
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto any_replied = [&] {
    for (const auto& [sequence, f] : flights) {
      if (f->waiter.message) return true;
    }
    return false;
  };
  while (!any_replied() && broken_.ok() && !deadline.expired()) {
    if (receiving_) {
      cv.wait_until(lock, deadline.at());
      continue;
    }
    receiving_ = true;
    lock.unlock();
    auto m = conn_->Receive(deadline);
    lock.lock();
    bool got = m.ok();
    Take(std::move(m));
    // Replies come in bursts (one ACK completes many commits): take what is
    // already here before anyone sleeps again.
    while (got && broken_.ok()) {
      lock.unlock();
      auto more = conn_->Receive(Deadline::After(std::chrono::nanoseconds(0)));
      lock.lock();
      got = more.ok();
      Take(std::move(more));
    }
    receiving_ = false;
  }
  for (auto it = flights.begin(); it != flights.end();) {
    Flight& f = *it->second;
    if (!f.waiter.message && broken_.ok() && !f.deadline.expired()) {
      ++it;
      continue;
    }
    if (!f.waiter.message) {
      f.failure = !broken_.ok() ? broken_
                                : Status::Timeout(fmt::format("{}: no reply to commit {} in time", uri_, it->first));
    }
    commits_.erase(it->first);
    landed->push_back(std::move(it->second));
    it = flights.erase(it);
  }
  PassReceiving(nullptr);
}

namespace {

std::string ClientName(const ClientOptions& o) {
  std::string base = o.client_id.empty() ? "client-" + std::to_string(::getpid()) : o.client_id;
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  base = base.substr(0, kMaxRequestClientBytes - 17);
  return fmt::format("{}-{:016x}", base, r);
}

// Failures after which the commit may or may not have landed, or a node
// could not say where the leader is: worth one retry at the leader.
bool Retryable(const Result<CommitReply>& r, const std::string& target) {
  if (!r.ok()) return r.status().code() != StatusCode::kInvalidArgument && r.status().code() != StatusCode::kCorruption;
  return r->status.code == StatusCode::kUnavailable && (r->leader.empty() || r->leader == target);
}

}  // namespace

Client::Client(ClientOptions options) : options_(std::move(options)), name_(ClientName(options_)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const std::string& uri, const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  CANOPY_ASSIGN_OR_RETURN(auto ch, Channel::Open(uri, c->options_, c->name_, c->options_.timeout));
  std::lock_guard<std::mutex> lock(c->mu_);
  c->channels_[uri] = std::move(ch);
  c->uri_ = uri;
  c->known_uris_.insert(uri);
  for (const auto& n : c->options_.nodes) c->known_uris_.insert(n);
  return c;
}

std::string Client::connected_uri() const {
  std::lock_guard<std::mutex> lock(mu_);
  return uri_;
}

Result<std::shared_ptr<Client::Channel>> Client::ChannelTo(const std::string& uri,
                                                           std::chrono::milliseconds dial_timeout) {
  std::shared_ptr<Channel> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(uri);
    if (it != channels_.end()) open = it->second;
  }
  // Looked at without mu_ (it may receive): other callers need not wait.
  if (open && !open->broken()) return open;
  CANOPY_ASSIGN_OR_RETURN(auto ch, Channel::Open(uri, options_, name_,
                                                  dial_timeout.count() > 0 ? dial_timeout : options_.timeout));
  std::lock_guard<std::mutex> lock(mu_);
  known_uris_.insert(uri);
  auto& slot = channels_[uri];
  if (slot && !slot->broken()) return slot;  // another thread dialled it meanwhile; ours closes
  slot = ch;
  return ch;
}

std::shared_ptr<Client::Channel> Client::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(uri_);
  return it == channels_.end() ? nullptr : it->second;
}

void Client::SetCurrent(const std::string& uri) {
  std::lock_guard<std::mutex> lock(mu_);
  uri_ = uri;
  known_uris_.insert(uri);
}

Result<transport::Message> Client::Call(MessageType type, const std::string& payload, MessageType reply_type) {
  std::string uri = connected_uri();
  CANOPY_ASSIGN_OR_RETURN(auto ch, ChannelTo(uri));
  return ch->Call(type, payload, reply_type, Deadline::After(options_.timeout));
}

Result<CreateTreeReply> Client::CreateTree(const std::string& tree) {
  for (int hop = 0; hop < 2; ++hop) {
    CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kCreateTreeRequest, Encode(CreateTreeRequest{tree}),
                                         MessageType::kCreateTreeReply));
    CANOPY_ASSIGN_OR_RETURN(CreateTreeReply reply, DecodeCreateTreeReply(m.payload));
    if (hop == 0 && reply.status.code == StatusCode::kUnavailable && !reply.leader.empty() &&
        reply.leader != connected_uri()) {
      CANOPY_RETURN_IF_ERROR(ChannelTo(reply.leader).status());
      SetCurrent(reply.leader);
      continue;
    }
    return reply;
  }
  return Status::Unavailable("redirected twice");
}

Result<CommitReply> Client::Commit(const CommitRequest& request) {
  CommitRequest req = request;
  if (req.client.empty()) {
    req.client = name_;
    req.sequence = next_sequence_++;
  }
  const Deadline deadline = Deadline::After(options_.timeout + std::chrono::milliseconds(req.timeout_ms));
  std::string target;
  bool known_leader = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leader_of_.find(req.tree);
    known_leader = it != leader_of_.end();
    target = known_leader ? it->second : uri_;
  }
  const std::string first_target = target;
  bool retried = false;
  int redirects = 0;
  while (true) {
    Result<CommitReply> r = Status::Internal("no attempt");
    auto ch = ChannelTo(target);
    if (ch.ok()) {
      r = (*ch)->Commit(req, deadline);
    } else {
      r = ch.status();
    }
    if (r.ok() && r->status.code == StatusCode::kUnavailable && !r->leader.empty() && r->leader != target &&
        redirects < 2) {
      ++redirects;  // a redirect: nothing was applied there
      target = r->leader;
      SetCurrent(target);
      continue;
    }
    if (!options_.retry || retried || !Retryable(r, target) || deadline.expired()) {
      if (r.ok() && r->status.code == StatusCode::kOk && (!known_leader || target != first_target)) {
        std::lock_guard<std::mutex> lock(mu_);
        leader_of_[req.tree] = target;
      }
      return r;
    }
    // Failed without an answer: find the leader and send the same commit
    // (same request id) there once more.
    retried = true;
    ++retries_;
    auto leader = LocateLeader(req.tree, target, deadline);
    if (!leader.ok()) return r;
    target = *leader;
    SetCurrent(target);
    redirects = 0;
  }
}

Status Client::CommitPipelined(size_t depth, const std::function<bool(CommitRequest*)>& next,
                               const PipelinedReply& on_reply) {
  if (depth == 0) return Status::InvalidArgument("a pipeline needs a depth of at least 1");
  std::condition_variable cv;  // our flights' waiters wake this
  std::map<uint64_t, std::unique_ptr<Channel::Flight>> flights;
  std::deque<std::unique_ptr<Channel::Flight>> redirected;  // to send again at redirect_to
  std::shared_ptr<Channel> ch;
  std::string target, redirect_to;
  bool exhausted = false, learned = false;
  auto take_next = [&]() -> std::unique_ptr<Channel::Flight> {
    if (!redirected.empty()) {
      auto f = std::move(redirected.front());
      redirected.pop_front();
      f->waiter.message.reset();
      return f;
    }
    if (exhausted) return nullptr;
    auto f = std::make_unique<Channel::Flight>();
    if (!next(&f->request)) {
      exhausted = true;
      return nullptr;
    }
    if (f->request.client.empty()) {
      f->request.client = name_;
      f->request.sequence = next_sequence_++;
    }
    f->waiter.wake = &cv;
    return f;
  };
  while (true) {
    // Fill the window, unless a redirect is pending: then the flights on
    // this connection finish first.
    while (redirect_to.empty() && flights.size() < depth) {
      auto f = take_next();
      if (!f) break;
      if (!ch) {
        if (target.empty()) {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = leader_of_.find(f->request.tree);
          target = it != leader_of_.end() ? it->second : uri_;
        }
        auto c = ChannelTo(target);
        if (!c.ok()) {
          on_reply(f->request, c.status(), std::chrono::nanoseconds(0));
          return c.status();
        }
        ch = *c;
      }
      f->deadline = Deadline::After(options_.timeout + std::chrono::milliseconds(f->request.timeout_ms));
      Status launched = ch->Launch(*f);
      if (!launched.ok()) {
        on_reply(f->request, launched, std::chrono::nanoseconds(0));
        break;  // the flights already out land with the same failure below
      }
      uint64_t sequence = f->request.sequence;
      flights.emplace(sequence, std::move(f));
    }
    if (flights.empty()) {
      if (!redirect_to.empty()) {
        target = std::exchange(redirect_to, std::string());
        SetCurrent(target);
        ch.reset();
        learned = false;
        continue;
      }
      if (ch && ch->broken()) return Status::Unavailable(target + ": connection broke during a pipeline");
      if (exhausted) return Status::Ok();
      continue;
    }
    std::vector<std::unique_ptr<Channel::Flight>> landed;
    ch->AwaitAny(flights, cv, &landed);
    Status broke;
    for (auto& f : landed) {
      auto elapsed = std::chrono::steady_clock::now() - f->sent;
      Result<CommitReply> r = f->waiter.message ? DecodeCommitReply(f->waiter.message->payload)
                                                : Result<CommitReply>(f->failure);
      if (r.ok() && r->status.code == StatusCode::kUnavailable && !r->leader.empty() && r->leader != target &&
          f->redirects < 2) {
        ++f->redirects;  // refused there: nothing was applied; send it to the leader named
        redirect_to = r->leader;
        redirected.push_back(std::move(f));
        continue;
      }
      if (!learned && r.ok() && r->status.code == StatusCode::kOk) {
        learned = true;
        std::lock_guard<std::mutex> lock(mu_);
        leader_of_[f->request.tree] = target;
      }
      if (!r.ok() && !r.status().IsTimeout()) broke = r.status();
      on_reply(f->request, std::move(r), std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed));
    }
    // The connection failed: the flights still out (if any) land with it
    // next round, then the pipeline ends.
    if (!broke.ok() && flights.empty()) return broke;
  }
}

void Client::Learn(const StatusReply& status) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& n : status.nodes) {
    if (!n.uri.empty()) known_uris_.insert(n.uri);
  }
}

Result<std::string> Client::LocateLeader(const std::string& tree, const std::string& failed_uri,
                                         Deadline deadline) {
  Status last = Status::Unavailable("no node of the cluster answered");
  while (!deadline.expired()) {
    std::vector<std::string> ask;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& u : known_uris_) {
        if (u != failed_uri) ask.push_back(u);
      }
    }
    ask.push_back(failed_uri);  // last: it may only have dropped the connection
    for (const auto& uri : ask) {
      if (deadline.expired()) break;
      // A node that accepts but does not answer (stopped, overloaded) costs a second, not the request's time.
      auto ch = ChannelTo(uri, std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::seconds(1)));
      if (!ch.ok()) {
        last = ch.status();
        continue;
      }
      auto m = (*ch)->Call(MessageType::kStatusRequest, Encode(StatusRequest{}), MessageType::kStatusReply,
                           Deadline::After(std::min<std::chrono::milliseconds>(deadline.remaining(),
                                                                                std::chrono::seconds(1))));
      if (!m.ok()) {
        last = m.status();
        continue;
      }
      auto status = DecodeStatusReply(m->payload);
      if (!status.ok()) {
        last = status.status();
        continue;
      }
      Learn(*status);
      std::string leader_id;
      for (const auto& t : status->trees) {
        if (t.tree == tree) leader_id = t.leader;
      }
      std::string leader_uri;
      bool alive = false;
      for (const auto& n : status->nodes) {
        if (n.node_id == leader_id) {
          leader_uri = n.uri;
          alive = n.alive;
        }
      }
      if (leader_uri.empty()) continue;
      if (leader_uri != failed_uri && (alive || leader_id == status->node_id)) return leader_uri;
      if (leader_uri == failed_uri && uri == failed_uri) return leader_uri;  // it answers again
    }
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(deadline.remaining(),
                                                                    std::chrono::milliseconds(50)));
  }
  return last.WithContext("looking for the leader of " + tree);
}

Result<ReadReply> Client::Read(const ReadRequest& request) {
  CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kReadRequest, Encode(request), MessageType::kReadReply));
  return DecodeReadReply(m.payload);
}

Result<SliceReply> Client::Slice(const SliceRequest& request) {
  std::string payload = Encode(request);
  // LEADER and QUORUM reads may wait up to their own timeout at the node.
  auto extra = request.level == ReadLevel::kOne ? std::chrono::milliseconds(0)
                                                : std::chrono::milliseconds(request.timeout_ms);
  for (int hop = 0; hop < 2; ++hop) {
    CANOPY_ASSIGN_OR_RETURN(auto ch, ChannelTo(connected_uri()));
    CANOPY_ASSIGN_OR_RETURN(auto m, ch->Call(MessageType::kSliceRequest, payload, MessageType::kSliceReply,
                                             Deadline::After(options_.timeout + extra)));
    CANOPY_ASSIGN_OR_RETURN(SliceReply reply, DecodeSliceReply(m.payload));
    if (hop == 0 && reply.status.code == StatusCode::kUnavailable && !reply.leader.empty() &&
        reply.leader != connected_uri()) {
      CANOPY_RETURN_IF_ERROR(ChannelTo(reply.leader).status());
      SetCurrent(reply.leader);
      continue;
    }
    return reply;
  }
  return Status::Unavailable("redirected twice");
}

Result<StatusReply> Client::GetStatus() {
  CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kStatusRequest, Encode(StatusRequest{}), MessageType::kStatusReply));
  CANOPY_ASSIGN_OR_RETURN(StatusReply reply, DecodeStatusReply(m.payload));
  Learn(reply);
  return reply;
}

}  // namespace canopy::replication
