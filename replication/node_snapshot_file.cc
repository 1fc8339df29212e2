// Node join and catch-up on the bulk path (node_impl.h): the leader sends
// its newest checkpoint file whole with SendWithBulk (TCP: sendfile; RDMA:
// one-sided transfers from registered memory; DPDK: mbufs), the replica
// lands the bytes straight in a file of its store (TCP: splice), checks every
// block as it lands, fsyncs once, renames it into place and serves the tree
// in place. The WAL deltas after the checkpoint follow on the same stream.

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/logging.h"
#include "replication/node_impl.h"

namespace canopy::replication {
namespace {

// Bulk bytes are consumed in pieces of this size; after each piece the
// blocks now complete are checked.
constexpr uint64_t kBulkPieceBytes = 2u << 20;

}  // namespace

Result<bool> Node::Impl::SendSnapshotFile(transport::Connection& conn, const std::string& replica,
                                          const std::string& tree_name, uint64_t epoch, uint64_t* sent,
                                          const Subscribe* resume) {
  CANOPY_ASSIGN_OR_RETURN(uint64_t latest, store->LatestVersion(tree_name));
  if (latest == 0) return false;  // the empty tree: nothing worth a file
  // Usable: the WAL holds every delta after it (so the stream can continue).
  auto usable = [&](const Result<tree::CheckpointFile>& f) {
    return f.ok() && f->info.version > 0 &&
           (f->info.version == latest || store->ReadDeltasSince(tree_name, f->info.version, 1).ok());
  };
  // Stale: the deltas after it come to a quarter of its size or more. The
  // replica would replay (decode, apply, log) them all, so a fresh file
  // costs less than the tail.
  auto stale = [&](const tree::CheckpointFile& f) {
    if (f.info.version == latest) return false;
    const uint64_t quarter = f.info.bytes / 4 + 1;
    auto tail = store->ReadDeltasSince(tree_name, f.info.version, quarter);
    if (!tail.ok()) return true;
    uint64_t bytes = 0;
    for (const auto& d : *tail) bytes += d.size();
    return bytes >= quarter;
  };
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
  uint64_t offset = 0;
  if (resume && resume->partial_version == info.version && resume->partial_bytes == info.bytes &&
      resume->partial_digest == info.digest && resume->partial_offset < info.bytes) {
    offset = resume->partial_offset;
  }
  CANOPY_LOG(kInfo, "node {}: sending checkpoint file of {} at version {} ({} bytes{}) to replica {}", node_id,
             tree_name, info.version, info.bytes,
             offset > 0 ? fmt::format(", resuming at byte {}", offset) : std::string(), replica);
  SnapshotFile msg{tree_name, epoch, info.version, info.bytes, info.digest, offset};
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
  std::mutex keepalive_mu;
  std::condition_variable keepalive_cv;
  bool receiving = true;
  Status keepalive_status;
  std::thread keepalive_thread([&] {
    std::unique_lock<std::mutex> lock(keepalive_mu);
    while (!keepalive_cv.wait_for(lock, options.heartbeat_interval, [&] { return !receiving; })) {
      lock.unlock();
      Status s = keepalive();
      lock.lock();
      if (!s.ok()) {
        keepalive_status = s;
        return;
      }
    }
  });
  Status s;
  uint64_t landed = f.offset;
  while (s.ok() && landed < f.file_bytes) {
    uint64_t piece = std::min(kBulkPieceBytes, f.file_bytes - landed);
    // Bounded by the transport's own no-progress limit (io_timeout); a
    // leader that dies mid-file is seen at once (reset or close).
    s = conn.ReceiveBulk(transport::BulkSink::ToFile(in.fd(), landed), piece, Deadline::After(topts.io_timeout));
    if (!s.ok()) break;
    landed += piece;
    s = in.Landed(landed);
    if (!s.ok()) {
      CANOPY_LOG(kWarn, "node {}: snapshot of {} from {} refused: {}", node_id, tree_name, leader, s.ToString());
      break;
    }
    Heard(leader);
  }
  {
    std::lock_guard<std::mutex> lock(keepalive_mu);
    receiving = false;
  }
  keepalive_cv.notify_all();
  keepalive_thread.join();
  if (!s.ok()) return s;
  if (!keepalive_status.ok()) return keepalive_status;
  return installer;
}

void Node::Impl::OfferResume(Subscribe* sub) {
  auto partial = store->PartialCheckpointFile(sub->tree);
  if (!partial.ok()) return;
  sub->partial_version = partial->info.version;
  sub->partial_bytes = partial->info.bytes;
  sub->partial_digest = partial->info.digest;
  sub->partial_offset = partial->held;
}

}  // namespace canopy::replication
