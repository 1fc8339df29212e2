// NodeMetrics: the Prometheus series of one replication Node (base/metrics.h),
// labelled node="<id>" so that the nodes of an in-process test cluster stay
// apart. The node calls these hooks where things happen; the per-replica and
// per-tree state (acked versions, lag, epochs) is set by the node's refresher
// when the metrics are scraped.
//
//   canopy_commits_total{node, consistency, outcome}        commits answered (outcome: ok, timeout, conflict, error)
//   canopy_commit_latency_seconds{node, consistency}         histogram, request to answer
//   canopy_replica_acked_version{node, tree, replica}        leader's view of each replica's durable version
//   canopy_replica_lag_versions{node, tree, replica}         leader's latest version minus that
//   canopy_tree_epoch{node, tree}                            epoch of the tree's leader as this node knows it
//   canopy_tree_version{node, tree}                          latest version on this node
//   canopy_snapshot_streams_total{node, direction}           snapshots sent / installed
//   canopy_snapshot_bytes_total{node, direction}
//   canopy_delta_records_bytes_total{node, direction}        WAL records sent / received on the bulk path (DELTA_RECORDS)
//   canopy_failovers_total{node}                             takeovers this node won
//   canopy_membership_messages_total{node, direction}        membership probes, acks, ping-reqs and
//   canopy_membership_bytes_total{node, direction}           gossip (sent / received), leader streams excluded
//
// Thread safety: every hook may be called from any thread (lock-free).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/clock.h"
#include "base/metrics.h"
#include "base/status.h"
#include "replication/protocol.h"

namespace canopy::replication {

class NodeMetrics {
 public:
  explicit NodeMetrics(const std::string& node_id);

  void Commit(ConsistencyLevel level, StatusCode outcome, std::chrono::duration<double> latency);
  void SnapshotSent(uint64_t bytes);
  void SnapshotInstalled(uint64_t bytes);
  void DeltaRecordsSent(uint64_t bytes);
  void DeltaRecordsReceived(uint64_t bytes);
  void Failover();
  // One membership message (probe, ack, ping-req, gossip) of `bytes` payload bytes.
  void MembershipSent(size_t bytes);
  void MembershipReceived(size_t bytes);

  // Refresher helpers (see the list above).
  void SetReplica(const std::string& tree, const std::string& replica, uint64_t acked, uint64_t latest);
  void SetTree(const std::string& tree, uint64_t epoch, uint64_t version);

  // Records one commit when it goes out of scope, with the outcome in *reply.
  class ScopedCommit {
   public:
    ScopedCommit(NodeMetrics& metrics, ConsistencyLevel level, const StatusReplyFields* outcome)
        : metrics_(metrics), level_(level), outcome_(outcome), start_(Clock::now()) {}
    ~ScopedCommit() { metrics_.Commit(level_, outcome_->code, Clock::now() - start_); }
    ScopedCommit(const ScopedCommit&) = delete;
    ScopedCommit& operator=(const ScopedCommit&) = delete;

   private:
    NodeMetrics& metrics_;
    ConsistencyLevel level_;
    const StatusReplyFields* outcome_;
    Clock::time_point start_;
  };

 private:
  const std::string node_id_;
  prometheus::Counter* commits_[3][4];  // [level: ONE, QUORUM, ALL][outcome: ok, timeout, conflict, error]
  prometheus::Histogram* latency_[3];
  prometheus::Counter& snapshots_sent_;
  prometheus::Counter& snapshot_bytes_sent_;
  prometheus::Counter& snapshots_installed_;
  prometheus::Counter& snapshot_bytes_installed_;
  prometheus::Counter& delta_records_bytes_sent_;
  prometheus::Counter& delta_records_bytes_received_;
  prometheus::Counter& failovers_;
  prometheus::Counter& membership_sent_;
  prometheus::Counter& membership_received_;
  prometheus::Counter& membership_bytes_sent_;
  prometheus::Counter& membership_bytes_received_;
};

}  // namespace canopy::replication
