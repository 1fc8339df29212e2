// Node join and catch-up on the bulk path (node_impl.h): the leader sends
// its newest checkpoint file whole with SendWithBulk (TCP: sendfile; RDMA:
// one-sided transfers from registered memory; DPDK: mbufs), the replica
// lands the bytes straight in a file of its store (TCP: splice), checks every
// block as it lands, fsyncs once, renames it into place and serves the tree
// in place. The WAL deltas after the checkpoint follow on the same stream.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "base/logging.h"
#include "replication/node_impl.h"

namespace canopy::replication {
namespace {

// Calls `send` once per `interval` on a thread of its own until Stop() (or
// destruction), or until a call fails. Keeps one side of a stream audible
// while the other would hear nothing: the leader preparing a file, the
// replica landing one. The caller must not send on the connection itself
// meanwhile unless the transport allows it.
class Repeater {
 public:
  Repeater(std::chrono::milliseconds interval, std::function<Status()> send)
      : interval_(interval), send_(std::move(send)), thread_([this] { Run(); }) {}
  ~Repeater() { (void)Stop(); }
  Repeater(const Repeater&) = delete;
  Repeater& operator=(const Repeater&) = delete;

  // True once a send failed (the thread has ended).
  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !status_.ok();
  }

  // Stops and joins the thread; the first failed send's status, if any.
  Status Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [&] { return stopped_; })) {
      lock.unlock();
      Status s = send_();
      lock.lock();
      if (!s.ok()) {
        status_ = s;
        return;
      }
    }
  }

  const std::chrono::milliseconds interval_;
  const std::function<Status()> send_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  Status status_;
  std::thread thread_;  // last: starts once the rest is set up
};

// One of a node's snapshot file slots (Node::Impl::snapshot_file_slots),
// held while a checkpoint file is prepared.
class SnapshotFileSlot {
 public:
  SnapshotFileSlot(std::mutex& mu, std::condition_variable& cv, unsigned& used, unsigned slots)
      : mu_(mu), cv_(cv), used_(used), slots_(slots) {}
  ~SnapshotFileSlot() { Release(); }
  void Release() {
    if (!held_) return;
    held_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --used_;
    }
    cv_.notify_one();
  }
  SnapshotFileSlot(const SnapshotFileSlot&) = delete;
  SnapshotFileSlot& operator=(const SnapshotFileSlot&) = delete;

  // Waits for a free slot; false when `give_up` turned true first (asked
  // at least once per `poll`).
  bool Acquire(std::chrono::milliseconds poll, const std::function<bool()>& give_up) {
    std::unique_lock<std::mutex> lock(mu_);
    while (used_ >= slots_) {
      if (give_up()) return false;
      cv_.wait_for(lock, poll);
    }
    ++used_;
    held_ = true;
    return true;
  }

 private:
  std::mutex& mu_;
  std::condition_variable& cv_;
  unsigned& used_;
  const unsigned slots_;
  bool held_ = false;
};

}  // namespace

Result<bool> Node::Impl::SendSnapshotFile(transport::Connection& conn, const std::string& replica,
                                          const std::string& tree_name, uint64_t epoch, uint64_t* sent,
                                          const ResumeOffer& resume, uint64_t min_version,
                                          uint64_t data_epoch) {
  CANOPY_ASSIGN_OR_RETURN(uint64_t latest, store->LatestVersion(tree_name));
  if (latest == 0) return false;  // the empty tree: nothing worth a file
  // Usable: a file of a version after the empty tree (the WAL holds every
  // delta after the newest checkpoint, tree::CheckpointFile).
  auto usable = [&](const Result<tree::CheckpointFile>& f) { return f.ok() && f->info.version > 0; };
  // Stale: the deltas after it are worth a fresh file (tree::CheckpointIsStale,
  // the rule the store's own checkpoint trigger follows, so a file the store
  // keeps fresh by itself is sent as it is). The replica would replay
  // (decode, apply, log) them all. The store counts those bytes as it logs
  // them: no WAL is read here.
  const uint64_t floor = store->options().checkpoint_wal_bytes;
  auto stale = [&](const tree::CheckpointFile& f) {
    if (f.info.version < min_version) return true;
    if (f.info.version == latest) return false;
    return tree::CheckpointIsStale(f.info.bytes, f.wal_bytes_after, floor);
  };
  // Preparing the file can take a while: a checkpoint may have to be
  // written first, or another stream of this tree is writing one (seconds
  // on a loaded machine). Nothing else goes out on this stream meanwhile,
  // and a replica drops a leader silent for failure_timeout, subscribes
  // again and so queues yet another preparation. A HEARTBEAT of the tree
  // once per heartbeat_interval keeps the stream; it is stopped before the
  // file goes out.
  uint64_t heartbeat_seq = 0;
  Repeater heartbeats(options.heartbeat_interval, [&]() -> Status {
    Heartbeat hb;
    hb.node_id = node_id;
    hb.sequence = ++heartbeat_seq;
    hb.trees.push_back({tree_name, epoch, latest});
    return SendMessage(conn, hb);
  });
  SnapshotFileSlot slot(snapshot_slots_mu, snapshot_slots_cv, snapshot_slots_used, snapshot_file_slots);
  if (!slot.Acquire(options.heartbeat_interval, [&] { return stopping.load() || heartbeats.failed(); })) {
    if (stopping) return Status::Aborted("stopping");
    Status gone = heartbeats.Stop();  // failed: the replica is gone
    return gone.ok() ? Status::Unavailable("replica " + replica + " left while waiting for its snapshot") : gone;
  }
  auto file = store->OpenNewestCheckpointFile(tree_name);
  if (!usable(file) || stale(*file)) {
    // No checkpoint the WAL continues from, or a stale one: write one now.
    // It is also this node's next recovery base, and the file the next
    // joiner is sent. Should that fail, a stale file still serves.
    auto made = store->Checkpoint(tree_name);
    if (made.ok()) {
      file = store->OpenNewestCheckpointFile(tree_name);
    } else {
      CANOPY_LOG(kWarn, "node {}: could not write a checkpoint of {} to send: {}", node_id, tree_name,
                 made.status().ToString());
    }
    if (!usable(file)) return false;  // sent as blocks instead
  }
  const tree::CheckpointFileInfo& info = file->info;
  if (info.version < min_version) return false;
  uint64_t offset = 0;
  if (resume.version == info.version && resume.bytes == info.bytes && resume.digest == info.digest &&
      resume.offset < info.bytes) {
    offset = resume.offset;
  }
  CANOPY_LOG(kInfo, "node {}: sending checkpoint file of {} at version {} ({} bytes{}) to replica {}", node_id,
             tree_name, info.version, info.bytes,
             offset > 0 ? fmt::format(", resuming at byte {}", offset) : std::string(), replica);
  // The file is ready: the next stream may prepare one while this one goes
  // out (a send holds no more than socket buffers and a pipe).
  slot.Release();
  // A failed heartbeat means the replica is gone; SendWithBulk says so too.
  (void)heartbeats.Stop();
  SnapshotFile msg{tree_name, epoch, info.version, info.bytes, info.digest, offset, data_epoch};
  CANOPY_RETURN_IF_ERROR(conn.SendWithBulk(static_cast<uint16_t>(MessageType::kSnapshotFile), Encode(msg),
                                           transport::BulkSource::FromFile(file->fd.get(), offset,
                                                                           info.bytes - offset)));
  *sent = info.version;
  metrics->SnapshotSent(info.bytes - offset);
  std::lock_guard<std::mutex> lock(mu);
  ++trees[tree_name].snapshots_sent;
  return true;
}

Result<std::unique_ptr<tree::SnapshotFileInstaller>> Node::Impl::ReceiveSnapshotFile(
    transport::Connection& conn, const std::string& tree_name, const std::string& leader,
    const transport::Message& m, const SnapshotFile& f, const std::function<Status()>& keepalive) {
  if (f.tree != tree_name) return Status::Corruption("SNAPSHOT_FILE for another tree");
  if (m.bulk_bytes != f.file_bytes - f.offset) {
    return Status::Corruption(fmt::format("SNAPSHOT_FILE announces bytes {}..{} but carries {} bulk bytes",
                                          f.offset, f.file_bytes, m.bulk_bytes));
  }
  CANOPY_LOG(kInfo, "node {}: receiving snapshot of {} at version {} from {} (checkpoint file, {} bytes{})",
             node_id, tree_name, f.version, leader, f.file_bytes,
             f.offset > 0 ? fmt::format(", resuming at byte {}", f.offset) : std::string());
  // The announced size is checked before anything is created or written.
  auto installer = store->BeginSnapshotFileInstall(tree_name, {f.version, f.file_bytes, f.digest}, f.offset);
  if (!installer.ok()) {
    CANOPY_LOG(kWarn, "node {}: refused the snapshot of {} from {}: {}", node_id, tree_name, leader,
               installer.status().ToString());
    return installer.status();
  }
  tree::SnapshotFileInstaller& in = **installer;
  // The stream's receive loop is not running meanwhile, so nothing else
  // tells the leader we are alive: a repeated ACK (no new claim) once per
  // heartbeat, from a thread of its own so that a slow piece (a loaded
  // machine, a slow disk) cannot make the leader drop a transfer that is
  // progressing. Send may run beside ReceiveBulk (transport.h).
  std::optional<Repeater> acks;
  if (keepalive) acks.emplace(options.heartbeat_interval, keepalive);
  // After each piece, the blocks now complete are checked (Landed).
  Status s = ReceiveBulkInPieces(
      conn, f.offset, f.file_bytes, topts.io_timeout,
      [&](uint64_t at, uint64_t) { return transport::BulkSink::ToFile(in.fd(), at); },
      [&](uint64_t landed) {
        Status checked = in.Landed(landed);
        if (!checked.ok()) {
          CANOPY_LOG(kWarn, "node {}: snapshot of {} from {} refused: {}", node_id, tree_name, leader,
                     checked.ToString());
          return checked;
        }
        Heard(leader);
        return Status::Ok();
      });
  Status keepalive_status = acks ? acks->Stop() : Status::Ok();
  if (!s.ok()) return s;
  if (!keepalive_status.ok()) return keepalive_status;
  return installer;
}

ResumeOffer Node::Impl::PartialFileOffer(const std::string& tree_name) {
  auto partial = store->PartialCheckpointFile(tree_name);
  if (!partial.ok()) return {};
  return {partial->info.version, partial->info.bytes, partial->info.digest, partial->held};
}

// ---- node join from every owner ----
//
// A follower's copy of a tree tagged with data epoch D is the history of D's
// leader (node_replica.cc, tag_data: tagged once it held what that leader
// held at takeover, every later version from that leader; a copy whose
// history was not the leader's was replaced by its snapshot first), and so
// is any checkpoint file of it. The joiner installs such a file and
// subscribes to the current leader from its version offering D, which the
// leader trusts by the rule it applies to any replica (node_leader.cc: its
// own epoch, or its predecessor's up to the takeover version) or else
// resyncs by snapshot. The joiner's own tag, used by QUORUM reads and
// failover, is only set where it holds: D is the current epoch and the file
// reaches that epoch's takeover version (an owner of that epoch sends a file
// at least that new, writing one if need be).

Status Node::Impl::ServeCheckpoint(transport::Connection& conn, const PeerIdentity& peer,
                                   const CheckpointRequest& req) {
  std::string refusal;
  uint64_t data_epoch = 0;
  uint64_t min_version = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    HeardLocked(peer.node_id);
    const Leadership l = LeadershipLocked(req.tree);
    auto it = trees.find(req.tree);
    if (l.leader == node_id) {
      refusal = "leads it (subscribe instead)";
    } else if (l.epoch != req.epoch) {
      refusal = fmt::format("knows epoch {} of it, not {}", l.epoch, req.epoch);
    } else if (it == trees.end() || !it->second.following || it->second.following_epoch != req.epoch) {
      refusal = fmt::format("is not following its leader of epoch {}", req.epoch);
    } else if (it->second.data_epoch == 0) {
      refusal = "holds no data of a known epoch";
    } else {
      data_epoch = it->second.data_epoch;
      auto m = meta_trees.find(req.tree);
      if (data_epoch == req.epoch && m != meta_trees.end() && m->second.epoch == req.epoch)
        min_version = m->second.leader_version;
    }
  }
  if (refusal.empty()) {
    uint64_t sent = 0;
    CANOPY_ASSIGN_OR_RETURN(bool file_sent, SendSnapshotFile(conn, req.node_id, req.tree, req.epoch, &sent,
                                                             req.resume, min_version, data_epoch));
    if (!file_sent) refusal = fmt::format("has no checkpoint file of it at version {} or later", min_version);
  }
  if (!refusal.empty()) {
    SendError(conn, Status::Unavailable(fmt::format("node {} cannot send its checkpoint of {}: it {}",
                                                    node_id, req.tree, refusal)));
    return Status::Ok();
  }
  // The joiner closes once it has the file: closing first could cut what is
  // still on its way on some transports.
  auto m = conn.Receive(Deadline::After(options.failure_timeout));
  if (m.ok()) return UnexpectedMessage(*m, "the end of the stream");
  return Status::Ok();
}

std::string Node::Impl::PickCheckpointSourceLocked(const std::string& tree_name, const Leadership& l) {
  std::map<std::string, size_t> sending;  // owner -> files we fetch from it
  for (const auto& [tree, source] : checkpoint_sources) ++sending[source];
  std::string best = l.leader;
  for (const auto& owner : OwnersLocked(tree_name)) {
    if (owner == node_id || owner == l.leader || UriOfLocked(owner).empty() || !AliveLocked(owner)) continue;
    if (sending[owner] < sending[best]) best = owner;
  }
  checkpoint_sources[tree_name] = best;
  return best;
}

Status Node::Impl::FetchCheckpoint(const std::string& tree_name, const Leadership& l, const std::string& source) {
  CANOPY_ASSIGN_OR_RETURN(auto conn, DialOwner(source));
  Status s = [&]() -> Status {
    Heard(source);
    CheckpointRequest req{tree_name, l.epoch, node_id, PartialFileOffer(tree_name)};
    CANOPY_RETURN_IF_ERROR(SendMessage(*conn, req));
    while (!stopping) {
      // The owner heartbeats while it prepares its file (SendSnapshotFile).
      auto m = conn->Receive(Deadline::After(options.failure_timeout));
      if (!m.ok()) return m.status();
      if (m->type == static_cast<uint16_t>(MessageType::kHeartbeat) && m->bulk_bytes == 0) {
        Heard(source);
        continue;
      }
      if (m->type != static_cast<uint16_t>(MessageType::kSnapshotFile))
        return UnexpectedMessage(*m, "SNAPSHOT_FILE");
      CANOPY_ASSIGN_OR_RETURN(SnapshotFile f, DecodeSnapshotFile(m->payload));
      if (f.epoch != l.epoch) {
        return Status::Conflict(
            fmt::format("SNAPSHOT_FILE of epoch {} asked for epoch {}", f.epoch, l.epoch));
      }
      // The owner is not receiving meanwhile: nothing to keep alive.
      CANOPY_ASSIGN_OR_RETURN(auto file, ReceiveSnapshotFile(*conn, tree_name, source, *m, f, nullptr));
      CANOPY_ASSIGN_OR_RETURN(tree::Version v, file->Finish());
      if (v.number() != f.version) return Status::Corruption("installed checkpoint file version mismatch");
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = meta_trees.find(tree_name);
        const uint64_t takeover =
            it != meta_trees.end() && it->second.epoch == l.epoch ? it->second.leader_version : 0;
        if (f.data_epoch == l.epoch && v.number() >= takeover) {
          SetDataEpochLocked(tree_name, l.epoch);
        } else {
          // No claim of ours (the copy it replaced went with it); the
          // leader judges the owner's epoch when we subscribe. An owner that
          // named none (0) makes the leader resync us by snapshot.
          SetDataEpochLocked(tree_name, 0);
          trees[tree_name].fetched_data_epoch = f.data_epoch;
        }
        ++trees[tree_name].snapshots_received;
      }
      metrics->SnapshotInstalled(f.file_bytes - f.offset);
      CANOPY_LOG(
          kInfo,
          "node {}: installed snapshot of {} at version {} from owner {} (data epoch {}; its leader is {})",
          node_id, tree_name, v.number(), source, f.data_epoch, l.leader);
      return Status::Ok();
    }
    return Status::Aborted("stopping");
  }();
  conn->Close();
  Unregister(conn.get());
  return s;
}

}  // namespace canopy::replication
