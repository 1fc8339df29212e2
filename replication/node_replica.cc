// Replica side of replication (node_impl.h): follow a tree's leader,
// install snapshots, apply deltas in order, ACK the durable version.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/buffer_pool.h"
#include "base/logging.h"
#include "replication/node_impl.h"
#include "replication/one_sided.h"
#include "transport/registry.h"
#include "tree/snapshot.h"

namespace canopy::replication {

namespace {

// A run of records at least this long lands in a file of its own that
// becomes a WAL segment (Store::BeginWalRun); shorter ones land in memory.
// A file per run: so not for the few KB of a replica that keeps up.
constexpr uint64_t kRecordsToWalBytes = 1u << 20;
// Room made at once for an announced run of records: a leader sends up to
// kDeltaBatchBytes plus the record that crosses it. The buffer is not
// zero-filled, so room costs address space, not pages; beyond this it
// grows as bytes arrive, never to what a header merely announces.
constexpr uint64_t kRecordReserveBytes = 8u << 20;

// Receives the `bytes` bulk bytes of a DELTA_RECORDS into the front of
// *buffer, grown as they arrive (lent by the process-wide pool: the pages of
// a buffer another stream gave back, not fresh ones).
Status ReceiveDeltaRecords(transport::Connection& conn, uint64_t bytes, std::chrono::milliseconds io_timeout,
                           PooledBuffer* buffer) {
  const auto reserve = static_cast<size_t>(std::min(bytes, kRecordReserveBytes));
  if (buffer->capacity() < reserve) buffer->Grow(reserve, 0);
  return ReceiveBulkInPieces(
      conn, 0, bytes, io_timeout,
      [&](uint64_t at, uint64_t piece) {
        if (buffer->capacity() < at + piece)
          buffer->Grow(static_cast<size_t>(at + piece), static_cast<size_t>(at));
        return transport::BulkSink::ToMemory(buffer->data() + at);
      },
      [](uint64_t) { return Status::Ok(); });
}

}  // namespace

void Node::Impl::ReplicaLoop(std::string tree_name) {
  CANOPY_LOG(kInfo, "node {}: replicating {}", node_id, tree_name);
  // Pause between failed attempts: short at first (a leader that restarts,
  // a new leader that is about to be known), up to 100 ms.
  auto pause = std::chrono::milliseconds(0);
  // A tree we do not hold yet is fetched from the owner that sends us the
  // fewest files (node join from every owner), then followed from its
  // leader; the leader sends it itself when it is that owner, or after a
  // failed fetch.
  Leadership fetch_tried_for;
  while (!stopping) {
    Leadership l;
    std::string leader_uri;
    std::string source;
    bool held = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto owners = OwnersLocked(tree_name);
      bool owner = std::find(owners.begin(), owners.end(), node_id) != owners.end();
      l = LeadershipLocked(tree_name);
      if (!owner || l.leader == node_id || l.leader.empty()) break;
      leader_uri = UriOfLocked(l.leader);
      held = HeldLocked(tree_name, l);
      // Once per leadership: an owner refuses a leadership it does not
      // share (a ring's guess the metadata then corrects, say).
      if (options.join_from_every_owner && !(fetch_tried_for == l) && !held && !leader_uri.empty() &&
          (!store->HasTree(tree_name) || store->LatestVersion(tree_name).value_or(0) == 0)) {
        fetch_tried_for = l;
        source = PickCheckpointSourceLocked(tree_name, l);
        if (source == l.leader) source.clear();
      }
    }
    if (!source.empty()) {
      Status f = FetchCheckpoint(tree_name, l, source);
      if (!f.ok() && !stopping) {
        CANOPY_LOG(kInfo, "node {}: no checkpoint of {} from owner {} ({}); asking its leader {}", node_id,
                   tree_name, source, f.ToString(), l.leader);
      }
      std::lock_guard<std::mutex> lock(mu);
      checkpoint_sources.erase(tree_name);
    }
    if (stopping) break;
    bool reached = false;
    Status s;
    if (held) {
      s = Status::Unavailable("holding off the old leader for a failover candidate");
    } else if (leader_uri.empty()) {
      s = Status::NotFound("leader URI unknown");
    } else {
      s = FollowOnce(tree_name, l, leader_uri, &reached);
    }
    if (stopping) break;
    CANOPY_LOG(kDebug, "node {}: following {} from {}: {}", node_id, tree_name, l.leader, s.ToString());
    // Refused, reset or closed before the leader answered the handshake:
    // evidence that the leader is dead, now.
    if (!held && !leader_uri.empty() && !reached && s.code() != StatusCode::kAborted) LostPeer(l.leader);
    // (Held or not: the hold keeps us off the old leader, not from taking over.)
    if (meta) MaybeFailover(tree_name, l);
    // A stream that worked and broke: redial at once (a refused redial tells
    // a dead leader from a closed stream). Otherwise wait a little, or until
    // the leadership changes.
    // A refusal (not the leader, another epoch) is answered the same until
    // the leadership changes, which ends the wait at once.
    const bool refused = s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kConflict;
    pause = reached && !refused ? std::chrono::milliseconds(0)
                    : std::min<std::chrono::milliseconds>(std::max<std::chrono::milliseconds>(2 * pause, std::chrono::milliseconds(10)),
                                                          std::chrono::milliseconds(100));
    if (pause.count() > 0) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, pause, [&] { return stopping || !(LeadershipLocked(tree_name) == l); });
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  trees[tree_name].replica_running = false;
  checkpoint_sources.erase(tree_name);
}

Status Node::Impl::SendAck(transport::Connection& conn, const std::string& tree_name, uint64_t epoch,
                           uint64_t snapshots_installed, uint64_t* last_acked) {
  uint64_t durable = store->HasTree(tree_name) ? store->DurableVersion(tree_name).value_or(0) : 0;
  *last_acked = durable;
  return SendMessage(conn, Ack{tree_name, epoch, durable, snapshots_installed});
}

Status Node::Impl::FollowOnce(const std::string& tree_name, const Leadership& l, const std::string& leader_uri,
                              bool* reached) {
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(leader_uri, topts));
  if (!Register(conn.get())) return Status::Aborted("stopping");
  Status s = FollowOn(*conn, tree_name, l, reached);
  {
    std::lock_guard<std::mutex> lock(mu);
    trees[tree_name].following = false;
  }
  conn->Close();
  Unregister(conn.get());
  return s;
}

Status Node::Impl::FollowOn(transport::Connection& stream, const std::string& tree_name, const Leadership& l,
                            bool* reached) {
  const std::string& leader = l.leader;
  const uint64_t epoch = l.epoch;
  CANOPY_ASSIGN_OR_RETURN(PeerIdentity id,
                          DialerHandshake(stream, hs, DialHandshakeDeadline()));
  *reached = true;
  Heard(id.node_id);
  if (id.node_id != leader) {
    return Status::Unavailable(
        fmt::format("{} answers as node {}, expected leader {}", stream.peer_uri(), id.node_id, leader));
  }
  uint64_t have = store->HasTree(tree_name) ? store->LatestVersion(tree_name).value_or(0) : 0;
  uint64_t data_epoch = 0;
  // The leader's version when it took this epoch over (0 without metadata,
  // or for the first epoch). Our data carries this epoch's tag only once it
  // holds at least that much (see tag_data below).
  uint64_t takeover_version = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto& t = trees[tree_name];
    // A file fetched from another owner, untagged: offer that owner's epoch
    // (FetchCheckpoint; the leader's trust rule judges it).
    data_epoch = t.data_epoch != 0 ? t.data_epoch : t.fetched_data_epoch;
    auto it = meta_trees.find(tree_name);
    if (it != meta_trees.end() && it->second.epoch == epoch) takeover_version = it->second.leader_version;
  }
  Subscribe sub{tree_name, epoch, have, node_id, data_epoch};
  // An interrupted checkpoint file transfer continues where it stopped.
  sub.resume = PartialFileOffer(tree_name);
  sub.one_sided_ring_bytes = OneSidedRingToAsk(stream, options.one_sided_replication, options.one_sided_ring_bytes);
  CANOPY_RETURN_IF_ERROR(SendMessage(stream, sub));
  // Over the one-sided ring when we asked and the leader accepted (one_sided.h).
  CANOPY_ASSIGN_OR_RETURN(auto one_sided, FollowOneSided(stream, sub, options.one_sided_poll_max,
                                                         Deadline::After(options.handshake_timeout)));
  transport::Connection& conn = one_sided ? *one_sided : stream;
  uint64_t last_acked = 0;
  uint64_t snapshots_installed = 0;  // on this stream
  CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
  std::unique_ptr<tree::SnapshotInstaller> installer;
  uint64_t expected_chunk = 0;
  uint64_t snapshot_bytes = 0;  // of the snapshot being installed (metrics)
  auto last_message = Clock::now();
  auto last_keepalive = Clock::now();
  // Under mu, before anything of this epoch is applied: the leadership is
  // still `l`, and we did not promise a failover candidate to stay off it
  // (HandleTreeStateRequest checks `following` under the same lock).
  auto check_epoch = [&](uint64_t msg_epoch) -> Status {
    if (msg_epoch != epoch) {
      return Status::Conflict(
          fmt::format("message of epoch {} on a stream of epoch {}: refused", msg_epoch, epoch));
    }
    std::lock_guard<std::mutex> lock(mu);
    HeardLocked(leader);
    if (!(LeadershipLocked(tree_name) == l)) {
      return Status::Conflict(
          fmt::format("leadership of {} moved past node {} epoch {}", tree_name, leader, epoch));
    }
    if (HeldLocked(tree_name, l)) return Status::Aborted("holding off the old leader for a failover candidate");
    auto& t = trees[tree_name];
    t.following = true;
    t.following_leader = leader;
    t.following_epoch = epoch;
    return Status::Ok();
  };
  // After data of this stream is applied, at `version`. A copy tagged with
  // epoch E is one that holds everything E's leader had when it took over,
  // which is at least every write acknowledged in earlier epochs (the new
  // leader was the most advanced copy of a quorum). A QUORUM read ranks
  // copies by (data epoch, version), so a copy still catching up from an
  // older epoch keeps that older tag until it reaches the takeover version;
  // tagged early, it would outrank a copy holding newer acknowledged writes.
  // Once tagged, the tag stays for the rest of this stream (only this loop
  // sets a follower's data epoch), so later deltas take no second lock.
  // The first data applied also ends this tree's claim on the leader as a
  // source of our join's files (checkpoint_sources).
  bool tagged = false;
  bool source_released = false;
  auto tag_data = [&](uint64_t version) {
    const bool tag = !tagged && version >= takeover_version;
    if (!tag && source_released) return;
    std::lock_guard<std::mutex> lock(mu);
    if (!source_released) {
      checkpoint_sources.erase(tree_name);
      source_released = true;
    }
    if (!tag || !(LeadershipLocked(tree_name) == l)) return;
    SetDataEpochLocked(tree_name, epoch);
    tagged = true;
  };
  // Deltas applied since the last ACK: acked once no further message is
  // already waiting (one ACK then covers several), or after kDeltasPerAck.
  uint32_t unacked = 0;
  // Applies a run of consecutive deltas taking the tree from `base` to
  // base + count (DELTA_BATCH, DELTA_RECORDS), creating the tree for a
  // first run: `commit` commits them and returns the version reached.
  // `what` and `header` name them in errors.
  auto apply_run = [&](uint64_t base, uint64_t count, const char* what, const char* header,
                       const std::function<Result<uint64_t>()>& commit) -> Status {
    if (!store->HasTree(tree_name) && base == 0) {
      Status c = store->CreateTree(tree_name);
      if (!c.ok() && c.code() != StatusCode::kAlreadyExists) return c;
    }
    auto applied = commit();
    if (!applied.ok()) return applied.status().WithContext(std::string("applying ") + what);
    if (*applied != base + count)
      return Status::Corruption(std::string("delta versions do not match ") + header);
    tag_data(*applied);
    ++unacked;
    return Status::Ok();
  };
  // Deltas in a buffer of their own, which the store may keep for the large
  // values in it (Store::ApplyEncodedDeltasInPlace).
  auto commit_in_place = [&](std::span<const std::string_view> deltas, PooledBuffer* buffer) {
    const size_t used = static_cast<size_t>(deltas.back().data() + deltas.back().size() - buffer->data());
    const size_t capacity = buffer->capacity();
    std::unique_ptr<char[]> bytes = buffer->Release();
    auto applied = store->ApplyEncodedDeltasInPlace(deltas, &bytes, used);
    *buffer = PooledBuffer::Adopt(std::move(bytes), capacity);  // empty if the store kept it
    return applied;
  };
  // `bytes` bulk bytes of records received straight into a file that becomes
  // a segment of this node's WAL (Store::BeginWalRun): on TCP spliced from
  // the socket, so neither the records nor their large values are copied
  // into memory.
  auto commit_wal_run = [&](uint64_t count, uint64_t bytes) -> Result<uint64_t> {
    CANOPY_ASSIGN_OR_RETURN(auto run, store->BeginWalRun(tree_name, bytes));
    CANOPY_RETURN_IF_ERROR(ReceiveBulkInPieces(
        conn, 0, bytes, topts.io_timeout,
        [&](uint64_t at, uint64_t) { return transport::BulkSink::ToFile(run->fd(), at); },
        [](uint64_t) { return Status::Ok(); }));
    return run->Commit(count);
  };
  while (!stopping) {
    if (unacked >= kDeltasPerAck) {
      CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
      unacked = 0;
    }
    auto m = conn.Receive(unacked > 0 ? Deadline::After(std::chrono::nanoseconds(0))
                                      : Deadline::After(options.heartbeat_interval));
    if (!m.ok()) {
      if (!m.status().IsTimeout()) return m.status();
      if (unacked > 0) {  // nothing more queued: ACK what we applied
        CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
        unacked = 0;
        continue;
      }
      if (Clock::now() - last_message > options.failure_timeout) {
        return Status::Timeout(fmt::format("leader {} of {} silent", leader, tree_name));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!(LeadershipLocked(tree_name) == l)) return Status::Conflict("leadership changed");
        // Silent longer than its own rhythm explains (phi-accrual).
        if (detector.Suspected(leader, Clock::now())) {
          return Status::Timeout(fmt::format("leader {} of {} silent for {} ms (phi {:.1f})", leader, tree_name,
                                             std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 Clock::now() - last_message)
                                                 .count(),
                                             detector.Phi(leader, Clock::now())));
        }
      }
      CANOPY_RETURN_IF_ERROR(
          SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));  // keepalive + durable progress
      continue;
    }
    last_message = Clock::now();
    if (m->bulk_bytes != 0 && m->type != static_cast<uint16_t>(MessageType::kSnapshotFile) &&
        m->type != static_cast<uint16_t>(MessageType::kDeltaRecords)) {
      return Status::Corruption("unexpected bulk bytes from leader");
    }
    switch (static_cast<MessageType>(m->type)) {
      case MessageType::kDelta: {
        CANOPY_ASSIGN_OR_RETURN(DeltaView d, DecodeDeltaView(m->payload));  // views into m's payload
        if (d.tree != tree_name) return Status::Corruption("DELTA for another tree");
        CANOPY_RETURN_IF_ERROR(check_epoch(d.epoch));
        if (!store->HasTree(tree_name) && d.base_version == 0) {
          Status c = store->CreateTree(tree_name);
          if (!c.ok() && c.code() != StatusCode::kAlreadyExists) return c;
        }
        auto applied = store->ApplyEncodedDelta(d.delta);
        if (!applied.ok())
          return applied.status().WithContext("applying delta " + std::to_string(d.new_version));
        if (applied->version != d.new_version)
          return Status::Corruption("delta version does not match its header");
        tag_data(d.new_version);
        ++unacked;
        break;
      }
      case MessageType::kDeltaBatch: {
        CANOPY_ASSIGN_OR_RETURN(DeltaBatchView b, DecodeDeltaBatchView(m->payload));  // views into m's payload
        if (b.tree != tree_name) return Status::Corruption("DELTA_BATCH for another tree");
        CANOPY_RETURN_IF_ERROR(check_epoch(b.epoch));
        CANOPY_RETURN_IF_ERROR(apply_run(b.base_version, b.deltas.size(), "a batch of deltas",
                                         "their batch header",
                                         [&] { return store->ApplyEncodedDeltas(b.deltas); }));
        break;
      }
      case MessageType::kDeltaRecords: {
        CANOPY_ASSIGN_OR_RETURN(DeltaRecords r, DecodeDeltaRecords(m->payload));
        if (r.tree != tree_name) return Status::Corruption("DELTA_RECORDS for another tree");
        if (m->bulk_bytes != r.bytes) {
          return Status::Corruption(
              fmt::format("DELTA_RECORDS announces {} bytes but carries {} bulk bytes", r.bytes, m->bulk_bytes));
        }
        CANOPY_RETURN_IF_ERROR(check_epoch(r.epoch));
        if (r.bytes >= kRecordsToWalBytes) {
          CANOPY_RETURN_IF_ERROR(apply_run(r.base_version, r.count, "WAL records from the leader",
                                           "their DELTA_RECORDS header",
                                           [&] { return commit_wal_run(r.count, r.bytes); }));
          metrics->DeltaRecordsReceived(r.bytes);
          break;
        }
        PooledBuffer buffer;
        CANOPY_RETURN_IF_ERROR(ReceiveDeltaRecords(conn, r.bytes, topts.io_timeout, &buffer));
        CANOPY_ASSIGN_OR_RETURN(
            std::vector<std::string_view> deltas,
            tree::SplitDeltaRun(std::string_view(buffer.data(), static_cast<size_t>(r.bytes))));
        if (deltas.size() != r.count) {
          return Status::Corruption(
              fmt::format("DELTA_RECORDS announces {} deltas but carries {}", r.count, deltas.size()));
        }
        CANOPY_RETURN_IF_ERROR(apply_run(r.base_version, deltas.size(), "WAL records from the leader",
                                         "their DELTA_RECORDS header",
                                         [&] { return commit_in_place(deltas, &buffer); }));
        metrics->DeltaRecordsReceived(r.bytes);
        break;
      }
      case MessageType::kSnapshotBegin: {
        CANOPY_ASSIGN_OR_RETURN(SnapshotBegin b, DecodeSnapshotBegin(m->payload));
        if (b.tree != tree_name) return Status::Corruption("SNAPSHOT_BEGIN for another tree");
        if (b.epoch != epoch) return Status::Conflict("SNAPSHOT_BEGIN of another epoch: refused");
        CANOPY_LOG(kInfo, "node {}: receiving snapshot of {} at version {} from {}", node_id, tree_name,
                   b.version, leader);
        CANOPY_ASSIGN_OR_RETURN(installer, store->BeginSnapshotInstall(tree_name));
        expected_chunk = 0;
        snapshot_bytes = 0;
        break;
      }
      case MessageType::kSnapshotChunk: {
        CANOPY_ASSIGN_OR_RETURN(SnapshotChunk c, DecodeSnapshotChunk(m->payload));
        if (!installer) return Status::Corruption("SNAPSHOT_CHUNK without SNAPSHOT_BEGIN");
        if (c.epoch != epoch) return Status::Conflict("SNAPSHOT_CHUNK of another epoch: refused");
        if (c.index != expected_chunk++) return Status::Corruption("snapshot chunk out of order");
        CANOPY_RETURN_IF_ERROR(installer->AddChunk(c.data));
        snapshot_bytes += c.data.size();
        Heard(leader);
        // While chunks keep arriving this loop never times out, so nothing
        // else tells the leader we are alive; a long snapshot would then be
        // dropped after failure_timeout and restarted from scratch. Repeat
        // the last ACK (no new durability claim) once per heartbeat.
        if (Clock::now() - last_keepalive >= options.heartbeat_interval) {
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, Ack{tree_name, epoch, last_acked, snapshots_installed}));
          last_keepalive = Clock::now();
        }
        break;
      }
      case MessageType::kSnapshotEnd: {
        CANOPY_ASSIGN_OR_RETURN(SnapshotEnd e, DecodeSnapshotEnd(m->payload));
        if (!installer) return Status::Corruption("SNAPSHOT_END without SNAPSHOT_BEGIN");
        if (e.chunks != expected_chunk) return Status::Corruption("snapshot chunk count mismatch");
        CANOPY_RETURN_IF_ERROR(check_epoch(e.epoch));
        CANOPY_ASSIGN_OR_RETURN(tree::Version v, installer->Finish());
        installer.reset();
        if (v.number() != e.version) return Status::Corruption("installed snapshot version mismatch");
        tag_data(v.number());
        {
          std::lock_guard<std::mutex> lock(mu);
          ++trees[tree_name].snapshots_received;
          trees[tree_name].fetched_data_epoch = 0;  // the leader's copy now
        }
        ++snapshots_installed;
        metrics->SnapshotInstalled(snapshot_bytes);
        CANOPY_LOG(kInfo, "node {}: installed snapshot of {} at version {}", node_id, tree_name, v.number());
        CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
        break;
      }
      case MessageType::kSnapshotFile: {
        CANOPY_ASSIGN_OR_RETURN(SnapshotFile f, DecodeSnapshotFile(m->payload));
        if (f.epoch != epoch) return Status::Conflict("SNAPSHOT_FILE of another epoch: refused");
        CANOPY_ASSIGN_OR_RETURN(auto file, ReceiveSnapshotFile(conn, tree_name, leader, *m, f, [&] {
                                  return SendMessage(conn, Ack{tree_name, epoch, last_acked, snapshots_installed});
                                }));
        CANOPY_RETURN_IF_ERROR(check_epoch(f.epoch));
        CANOPY_ASSIGN_OR_RETURN(tree::Version v, file->Finish());
        if (v.number() != f.version) return Status::Corruption("installed checkpoint file version mismatch");
        tag_data(v.number());
        {
          std::lock_guard<std::mutex> lock(mu);
          ++trees[tree_name].snapshots_received;
          trees[tree_name].fetched_data_epoch = 0;  // the leader's copy now
        }
        ++snapshots_installed;
        metrics->SnapshotInstalled(f.file_bytes - f.offset);
        CANOPY_LOG(kInfo, "node {}: installed snapshot of {} at version {}", node_id, tree_name, v.number());
        CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
        break;
      }
      case MessageType::kHeartbeat: {
        CANOPY_ASSIGN_OR_RETURN(Heartbeat hb, DecodeHeartbeat(m->payload));
        for (const auto& t : hb.trees) {
          if (t.tree == tree_name && t.epoch != epoch)
            return Status::Conflict("HEARTBEAT of another epoch: refused");
        }
        CANOPY_RETURN_IF_ERROR(check_epoch(epoch));
        uint64_t durable = store->HasTree(tree_name) ? store->DurableVersion(tree_name).value_or(0) : 0;
        // Also once per heartbeat while heartbeats keep coming (e.g. while
        // the leader prepares a checkpoint file): our receive then never
        // times out, which is when the keepalive ACK goes out otherwise.
        if (durable != last_acked || Clock::now() - last_keepalive >= options.heartbeat_interval) {
          CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
          last_keepalive = Clock::now();
        }
        break;
      }
      default:
        return UnexpectedMessage(*m, "DELTA");
    }
  }
  return Status::Aborted("stopping");
}

}  // namespace canopy::replication
