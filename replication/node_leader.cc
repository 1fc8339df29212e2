// Leader side of replication (node_impl.h): one stream per subscribed replica,
// a snapshot when the replica's history is not ours or the WAL no longer
// holds what it lacks, then deltas as they are committed; ACKs flow back.

#include <fmt/format.h>

#include <thread>

#include "base/logging.h"
#include "replication/node_impl.h"
#include "replication/one_sided.h"
#include "tree/snapshot.h"

namespace canopy::replication {

// Streams `sub.tree` to the subscribing replica until it goes away or we
// stop leading the tree.
Status Node::Impl::LeadStream(transport::Connection& stream, const PeerIdentity& peer, const Subscribe& sub) {
  uint64_t epoch = 0;
  bool trusted = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!LeadsLocked(sub.tree, &epoch)) {
      Leadership l = LeadershipLocked(sub.tree);
      SendError(stream,
                Status::Unavailable(fmt::format("node {} is not the leader of {}; leader is {} (epoch {})",
                                                node_id, sub.tree, l.leader, l.epoch)));
      return Status::Ok();
    }
    const auto& t = trees[sub.tree];
    // The replica's history is ours when it came from our epoch, or from
    // the epoch we took over from, up to the version we took over at.
    trusted = sub.have_version == 0 || sub.data_epoch == epoch ||
              (t.predecessor_epoch != 0 && sub.data_epoch == t.predecessor_epoch &&
               sub.have_version <= t.takeover_version);
  }
  if (!store->HasTree(sub.tree)) {
    SendError(stream, Status::NotFound("no tree " + sub.tree + " on its leader (yet)"));
    return Status::Ok();
  }
  if (sub.epoch > epoch) {
    SendError(stream,
              Status::Conflict(fmt::format("replica {} knows epoch {} of {}, newer than this leader's {}",
                                           peer.node_id, sub.epoch, sub.tree, epoch)));
    return Status::Ok();
  }
  if (sub.epoch < epoch) {
    // The replica's first ACK names its epoch, and it refuses every message
    // of ours: such a stream cannot work, so refuse it before a snapshot is
    // prepared for it (a joiner that guessed the leader from the ring, say,
    // before the metadata told it the tree's epoch).
    SendError(stream,
              Status::Conflict(fmt::format("replica {} knows epoch {} of {}, older than this leader's {}",
                                           peer.node_id, sub.epoch, sub.tree, epoch)));
    return Status::Ok();
  }
  if (!trusted) {
    std::lock_guard<std::mutex> lock(mu);
    trees[sub.tree].acked.erase(peer.node_id);  // an earlier stream's claim is void too
  }
  CANOPY_LOG(kInfo, "node {}: replica {} subscribed to {} at version {} (data epoch {}, leader epoch {}{})",
             node_id, peer.node_id, sub.tree, sub.have_version, sub.data_epoch, epoch,
             trusted ? "" : ", history not ours: resync by snapshot");
  // Asked for one-sided replication: answer, and stream over the ring when accepted.
  CANOPY_ASSIGN_OR_RETURN(auto one_sided, LeadOneSided(stream, sub, options.one_sided_replication, epoch,
                                                       options.one_sided_poll_max,
                                                       Deadline::After(options.handshake_timeout)));
  transport::Connection& conn = one_sided ? *one_sided : stream;
  std::atomic<bool> done{false};
  Status sender_status;
  std::thread sender([&] {
    sender_status = SendStream(conn, peer.node_id, sub, epoch, !trusted, done);
    done = true;
    conn.Close();
    std::lock_guard<std::mutex> lock(mu);
    cv.notify_all();
    stream_cvs[sub.tree].notify_all();
  });
  Status receive_status;
  PendingCommits satisfied;
  while (!done && !stopping) {
    auto m = conn.Receive(Deadline::After(options.failure_timeout));
    if (!m.ok()) {
      receive_status = m.status();
      if (m.status().IsTimeout()) {
        receive_status = Status::Timeout(
            fmt::format("replica {} silent for {} ms", peer.node_id, options.failure_timeout.count()));
      }
      break;
    }
    if (m->bulk_bytes != 0) {
      receive_status = Status::Corruption("unexpected bulk bytes from replica");
      break;
    }
    if (m->type == static_cast<uint16_t>(MessageType::kAck)) {
      auto ack = DecodeAck(m->payload);
      if (!ack.ok()) {
        receive_status = ack.status();
        break;
      }
      if (ack->tree != sub.tree || ack->epoch != epoch) {
        receive_status = Status::Conflict(fmt::format("ACK for {} epoch {}, streaming {} epoch {}", ack->tree,
                                                      ack->epoch, sub.tree, epoch));
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        // A replica whose history is not ours reports its own durable
        // version until our snapshot replaced it: liveness only, no claim.
        if (trusted || ack->snapshots_installed > 0) {
          trees[sub.tree].acked[peer.node_id] = ack->durable_version;
          WakeCommitWaitersLocked(sub.tree, &satisfied);
        }
        HeardLocked(peer.node_id);
      }
      // The commits this ACK completed are answered from here (no hand-off
      // to another thread); never with mu held.
      if (!satisfied.empty()) FinishCommits(satisfied);
    } else if (m->type == static_cast<uint16_t>(MessageType::kHeartbeat)) {
      auto hb = DecodeHeartbeat(m->payload);
      if (!hb.ok()) {
        receive_status = hb.status();
        break;
      }
      OnHeartbeat(*hb);
    } else {
      receive_status = UnexpectedMessage(*m, "ACK");
      break;
    }
  }
  done = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    cv.notify_all();
    stream_cvs[sub.tree].notify_all();  // our sender
  }
  conn.Close();
  sender.join();
  if (!stopping) {
    CANOPY_LOG(kInfo, "node {}: stream of {} to replica {} ended: {} / {}", node_id, sub.tree, peer.node_id,
               receive_status.ToString(), sender_status.ToString());
  }
  return Status::Ok();
}

Status Node::Impl::SendSnapshot(transport::Connection& conn, const std::string& replica,
                                const std::string& tree_name, uint64_t epoch, uint64_t* sent,
                                const ResumeOffer& resume) {
  // The snapshot is the newest checkpoint file, sent whole on the bulk path
  // (node_snapshot_file.cc); the deltas after it follow from the WAL.
  CANOPY_ASSIGN_OR_RETURN(bool file_sent, SendSnapshotFile(conn, replica, tree_name, epoch, sent, resume));
  if (file_sent) return Status::Ok();
  // No file to send: the newest checkpoint's blocks as messages (read in
  // place: nothing is encoded), or the in-memory latest version encoded when
  // there is no checkpoint, or the WAL does not reach back to it.
  CANOPY_ASSIGN_OR_RETURN(tree::Version v, store->Latest(tree_name));
  if (auto checkpoint = store->NewestCheckpoint(tree_name); checkpoint.ok() && checkpoint->number() > 0) {
    if (checkpoint->number() == v.number() || store->ReadDeltasSince(tree_name, checkpoint->number(), 1).ok()) {
      v = std::move(*checkpoint);
    }
  }
  CANOPY_LOG(kInfo, "node {}: streaming snapshot of {} at version {} to replica {} (it has version {})",
             node_id, tree_name, v.number(), replica, *sent);
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, SnapshotBegin{tree_name, epoch, v.number()}));
  tree::SnapshotWriter writer(v, options.snapshot_chunk_bytes);
  uint64_t index = 0;
  uint64_t bytes = 0;
  std::string chunk;  // one buffer for the whole stream, handed back after each send
  while (writer.NextInto(&chunk)) {
    bytes += chunk.size();
    SnapshotChunk c{tree_name, epoch, index++, std::move(chunk)};
    CANOPY_RETURN_IF_ERROR(SendMessage(conn, c));
    chunk = std::move(c.data);
  }
  CANOPY_RETURN_IF_ERROR(SendMessage(conn, SnapshotEnd{tree_name, epoch, v.number(), index}));
  *sent = v.number();
  metrics->SnapshotSent(bytes);
  std::lock_guard<std::mutex> lock(mu);
  ++trees[tree_name].snapshots_sent;
  return Status::Ok();
}

Status Node::Impl::SendStream(transport::Connection& conn, const std::string& replica, const Subscribe& sub,
                              uint64_t epoch, bool force_snapshot, const std::atomic<bool>& done) {
  const std::string& tree_name = sub.tree;
  uint64_t sent = sub.have_version;
  CANOPY_ASSIGN_OR_RETURN(uint64_t latest, store->LatestVersion(tree_name));
  if (sent > latest) force_snapshot = true;            // it holds versions we never had
  if (sent == 0 && latest > 0) force_snapshot = true;  // a new replica (node join): bulk install
  if (force_snapshot) CANOPY_RETURN_IF_ERROR(SendSnapshot(conn, replica, tree_name, epoch, &sent, sub.resume));
  auto sender = std::make_shared<StreamSender>(conn, replica, tree_name, epoch, sent);
  // A snapshot counts as a full window: committers send once it is acked.
  if (force_snapshot) sender->NoteSnapshot();
  {
    std::lock_guard<std::mutex> lock(mu);
    stream_senders[tree_name].push_back(sender);
  }
  Status s = StreamLoop(*sender, done);
  {
    std::lock_guard<std::mutex> send_lock(sender->send_mu);
    sender->open = false;  // from here on no committer uses conn
  }
  std::lock_guard<std::mutex> lock(mu);
  auto& senders = stream_senders[tree_name];
  std::erase(senders, sender);
  if (senders.empty()) stream_senders.erase(tree_name);
  return s;
}

Status Node::Impl::SendDeltasLocked(StreamSender& s, size_t max_bytes, bool* any, const uint64_t* direct_acked,
                                    bool* deferred) {
  *any = false;
  const uint64_t sent = s.sent.load();
  // Whether `bytes` more (up to version `end`) may go now: a direct send
  // defers what would overrun the replica's unacked window. If so, they
  // are counted as sent and unacked.
  auto admit = [&](uint64_t bytes, uint64_t end) {
    if (direct_acked != nullptr && s.UnackedBytes(*direct_acked) + bytes > kDirectUnackedBytes) {
      *deferred = true;
      return false;
    }
    s.bytes_sent += bytes;
    s.unacked_frames.emplace_back(end, s.bytes_sent);
    *any = true;
    return true;
  };
  // A replica behind the deltas kept in memory (joining, or catching up)
  // gets them as the WAL's own bytes on the bulk path: nothing is copied or
  // encoded here, and on TCP the bytes go by sendfile.
  CANOPY_ASSIGN_OR_RETURN(auto range, store->LocateDeltasSince(s.tree, sent, max_bytes));
  if (range && range->records == 0) return Status::Ok();
  if (range && range->length <= kMaxBlobBytes) {
    if (!admit(range->length, range->last_version)) return Status::Ok();
    DeltaRecords records{s.tree, s.epoch, sent, range->records, range->length};
    CANOPY_RETURN_IF_ERROR(
        s.conn.SendWithBulk(static_cast<uint16_t>(MessageType::kDeltaRecords), Encode(records),
                            transport::BulkSource::FromFile(range->file.get(), range->offset, range->length)));
    s.sent = range->last_version;
    metrics->DeltaRecordsSent(range->length);
    return Status::Ok();
  }
  CANOPY_ASSIGN_OR_RETURN(auto deltas, store->ReadDeltasSince(s.tree, sent, max_bytes));
  if (deltas.empty()) return Status::Ok();
  uint64_t bytes = 0;
  for (const auto& d : deltas) bytes += d.size();
  if (!admit(bytes, sent + deltas.size())) return Status::Ok();
  if (deltas.size() == 1) {
    CANOPY_RETURN_IF_ERROR(SendMessage(s.conn, Delta{s.tree, s.epoch, sent, sent + 1, std::move(deltas.front())}));
    s.sent = sent + 1;
    return Status::Ok();
  }
  // Several ready (commits arrived while the last frame was out): one
  // frame, one WAL sync and one ACK on the replica for all of them.
  // Nothing waits for earlier ACKs: the stream runs ahead of them.
  DeltaBatch batch{s.tree, s.epoch, sent, std::move(deltas)};
  CANOPY_RETURN_IF_ERROR(SendMessage(s.conn, batch));
  s.sent = sent + batch.deltas.size();
  return Status::Ok();
}

Status Node::Impl::StreamLoop(StreamSender& s, const std::atomic<bool>& done) {
  const std::string& tree_name = s.tree;
  uint64_t heartbeat_seq = 0;
  auto still_leading = [&] {
    uint64_t e = 0;
    return LeadsLocked(tree_name, &e) && e == s.epoch;
  };
  while (!done && !stopping) {
    uint64_t acked = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!still_leading())
        return Status::Conflict(fmt::format("no longer the leader of {} at epoch {}", tree_name, s.epoch));
      const auto& claims = trees[tree_name].acked;
      if (auto a = claims.find(s.replica); a != claims.end()) acked = a->second;
    }
    {
      std::lock_guard<std::mutex> send_lock(s.send_mu);
      s.UnackedBytes(acked);  // forget what the replica acked
      bool any = false;
      Status pushed = SendDeltasLocked(s, kDeltaBatchBytes, &any);
      if (pushed.IsNotFound()) {
        uint64_t sent = s.sent.load();
        CANOPY_RETURN_IF_ERROR(SendSnapshot(s.conn, s.replica, tree_name, s.epoch, &sent));
        s.sent = sent;
        s.NoteSnapshot();
        continue;
      }
      CANOPY_RETURN_IF_ERROR(pushed);
      if (any) continue;
    }
    // Idle: wait for the next commit its committer did not send, heartbeat meanwhile.
    {
      std::unique_lock<std::mutex> lock(mu);
      // Woken by such commits and by this stream's end; a stop or a
      // leadership change is seen within a heartbeat interval.
      stream_cvs[tree_name].wait_for(lock, options.heartbeat_interval, [&] {
        if (done || stopping || !still_leading()) return true;
        auto l = store->LatestVersion(tree_name);
        return l.ok() && *l > s.sent.load();
      });
    }
    std::lock_guard<std::mutex> send_lock(s.send_mu);
    auto l = store->LatestVersion(tree_name);
    if (l.ok() && *l == s.sent.load() && !done && !stopping) {
      Heartbeat hb;
      hb.node_id = node_id;
      hb.sequence = ++heartbeat_seq;
      hb.trees.push_back({tree_name, s.epoch, *l});
      CANOPY_RETURN_IF_ERROR(SendMessage(s.conn, hb));
    }
  }
  return Status::Ok();
}

std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>> Node::Impl::DirectStreamsLocked(
    const std::string& tree_name) {
  std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>> out;
  auto it = stream_senders.find(tree_name);
  if (it == stream_senders.end()) return out;
  uint64_t epoch = 0;
  if (!LeadsLocked(tree_name, &epoch)) return out;
  const auto& acked = trees[tree_name].acked;
  for (const auto& s : it->second) {
    if (s->epoch != epoch) continue;
    auto a = acked.find(s->replica);
    // No claim yet (a new or resyncing replica): 0, so its thread sends.
    out.emplace_back(s, a == acked.end() ? 0 : a->second);
  }
  return out;
}

void Node::Impl::PushCommit(const std::string& tree_name,
                            const std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>>& streams) {
  bool wake = false;
  for (const auto& [s, acked] : streams) {
    while (true) {
      if (acked == 0) {
        wake = true;  // no claim from the replica yet (new, or resyncing): its thread sends
        break;
      }
      std::unique_lock<std::mutex> send_lock(s->send_mu, std::try_to_lock);
      if (!send_lock.owns_lock()) break;  // its holder sends ours too (it checks again after unlocking)
      if (!s->open) break;
      bool any = false;
      bool deferred = false;
      Status pushed = SendDeltasLocked(*s, kDirectSendBytes, &any, &acked, &deferred);
      // A broken stream is closed here, still under send_mu: s->conn is the
      // stream's connection, alive only while s->open; once we unlock, the
      // stream may end and its connection be destroyed.
      if (!pushed.ok() && !pushed.IsNotFound()) s->conn.Close();
      send_lock.unlock();
      if (deferred) {
        wake = true;  // the replica is too far behind (stalled?), or too much at once: its thread sends
        break;
      }
      if (!pushed.ok()) {
        wake = true;  // a snapshot is needed, or the stream broke: its thread sees to it
        break;
      }
      if (!any) break;
      auto latest = store->LatestVersion(tree_name);
      if (!latest.ok() || *latest <= s->sent.load()) break;  // nothing new meanwhile
    }
  }
  if (wake) {
    std::lock_guard<std::mutex> lock(mu);
    stream_cvs[tree_name].notify_all();
  }
}

}  // namespace canopy::replication
