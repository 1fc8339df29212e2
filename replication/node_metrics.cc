#include "replication/node_metrics.h"

namespace canopy::replication {
namespace {

int LevelIndex(ConsistencyLevel level) {
  switch (level) {
    case ConsistencyLevel::kOne: return 0;
    case ConsistencyLevel::kQuorum: return 1;
    case ConsistencyLevel::kAll: return 2;
  }
  return 1;
}

// Index into NodeMetrics::commits_[level][...] and its label value.
constexpr const char* kOutcomes[] = {"ok", "timeout", "conflict", "error"};
int OutcomeIndex(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 0;
    case StatusCode::kTimeout: return 1;
    case StatusCode::kConflict: return 2;
    default: return 3;
  }
}

constexpr char kSnapshotStreams[] = "canopy_snapshot_streams_total";
constexpr char kSnapshotStreamsHelp[] = "Tree snapshots streamed to replicas (sent) or installed from the leader.";
constexpr char kSnapshotBytes[] = "canopy_snapshot_bytes_total";
constexpr char kSnapshotBytesHelp[] = "Bytes of snapshot chunks sent to replicas or installed from the leader.";
constexpr char kDeltaRecordsBytes[] = "canopy_delta_records_bytes_total";
constexpr char kDeltaRecordsBytesHelp[] =
    "Bytes of WAL records sent to replicas, or received from the leader, on the bulk path (DELTA_RECORDS).";
constexpr char kMembership[] = "canopy_membership_messages_total";
constexpr char kMembershipHelp[] = "Membership messages (SWIM probes, acks, ping-reqs, gossip), leader streams excluded.";
constexpr char kMembershipBytes[] = "canopy_membership_bytes_total";
constexpr char kMembershipBytesHelp[] = "Payload bytes of membership messages.";

}  // namespace

NodeMetrics::NodeMetrics(const std::string& node_id)
    : node_id_(node_id),
      snapshots_sent_(metrics::GetCounter(kSnapshotStreams, kSnapshotStreamsHelp,
                                          {{"node", node_id}, {"direction", "sent"}})),
      snapshot_bytes_sent_(metrics::GetCounter(kSnapshotBytes, kSnapshotBytesHelp,
                                               {{"node", node_id}, {"direction", "sent"}})),
      snapshots_installed_(metrics::GetCounter(kSnapshotStreams, kSnapshotStreamsHelp,
                                               {{"node", node_id}, {"direction", "installed"}})),
      snapshot_bytes_installed_(metrics::GetCounter(kSnapshotBytes, kSnapshotBytesHelp,
                                                    {{"node", node_id}, {"direction", "installed"}})),
      delta_records_bytes_sent_(metrics::GetCounter(kDeltaRecordsBytes, kDeltaRecordsBytesHelp,
                                                    {{"node", node_id}, {"direction", "sent"}})),
      delta_records_bytes_received_(metrics::GetCounter(kDeltaRecordsBytes, kDeltaRecordsBytesHelp,
                                                        {{"node", node_id}, {"direction", "received"}})),
      failovers_(metrics::GetCounter("canopy_failovers_total", "Leader takeovers this node won.",
                                     {{"node", node_id}})),
      membership_sent_(metrics::GetCounter(kMembership, kMembershipHelp, {{"node", node_id}, {"direction", "sent"}})),
      membership_received_(
          metrics::GetCounter(kMembership, kMembershipHelp, {{"node", node_id}, {"direction", "received"}})),
      membership_bytes_sent_(
          metrics::GetCounter(kMembershipBytes, kMembershipBytesHelp, {{"node", node_id}, {"direction", "sent"}})),
      membership_bytes_received_(metrics::GetCounter(kMembershipBytes, kMembershipBytesHelp,
                                                     {{"node", node_id}, {"direction", "received"}})) {
  for (ConsistencyLevel level : {ConsistencyLevel::kOne, ConsistencyLevel::kQuorum, ConsistencyLevel::kAll}) {
    for (int outcome = 0; outcome < 4; ++outcome) {
      commits_[LevelIndex(level)][outcome] = &metrics::GetCounter(
          "canopy_commits_total", "Commits answered by this node as leader.",
          {{"node", node_id}, {"consistency", ConsistencyLevelName(level)}, {"outcome", kOutcomes[outcome]}});
    }
    latency_[LevelIndex(level)] = &metrics::GetHistogram(
        "canopy_commit_latency_seconds", "Commit latency on the leader, request to answer, by consistency level.",
        metrics::LatencyBuckets(), {{"node", node_id}, {"consistency", ConsistencyLevelName(level)}});
  }
}

void NodeMetrics::Commit(ConsistencyLevel level, StatusCode outcome, std::chrono::duration<double> latency) {
  commits_[LevelIndex(level)][OutcomeIndex(outcome)]->Increment();
  latency_[LevelIndex(level)]->Observe(latency.count());
}

void NodeMetrics::SnapshotSent(uint64_t bytes) {
  snapshots_sent_.Increment();
  snapshot_bytes_sent_.Increment(static_cast<double>(bytes));
}

void NodeMetrics::SnapshotInstalled(uint64_t bytes) {
  snapshots_installed_.Increment();
  snapshot_bytes_installed_.Increment(static_cast<double>(bytes));
}

void NodeMetrics::DeltaRecordsSent(uint64_t bytes) {
  delta_records_bytes_sent_.Increment(static_cast<double>(bytes));
}

void NodeMetrics::DeltaRecordsReceived(uint64_t bytes) {
  delta_records_bytes_received_.Increment(static_cast<double>(bytes));
}

void NodeMetrics::Failover() { failovers_.Increment(); }

void NodeMetrics::SetReplica(const std::string& tree, const std::string& replica, uint64_t acked, uint64_t latest) {
  prometheus::Labels labels{{"node", node_id_}, {"tree", tree}, {"replica", replica}};
  metrics::GetGauge("canopy_replica_acked_version", "Durable version each replica acknowledged to this leader.",
                    labels)
      .Set(static_cast<double>(acked));
  metrics::GetGauge("canopy_replica_lag_versions", "Versions the replica is behind this leader's latest.", labels)
      .Set(static_cast<double>(latest > acked ? latest - acked : 0));
}

void NodeMetrics::SetTree(const std::string& tree, uint64_t epoch, uint64_t version) {
  prometheus::Labels labels{{"node", node_id_}, {"tree", tree}};
  metrics::GetGauge("canopy_tree_epoch", "Epoch of the tree's leader as this node knows it.", labels)
      .Set(static_cast<double>(epoch));
  metrics::GetGauge("canopy_tree_version", "Latest version of the tree on this node.", labels)
      .Set(static_cast<double>(version));
}

void NodeMetrics::MembershipSent(size_t bytes) {
  membership_sent_.Increment();
  membership_bytes_sent_.Increment(static_cast<double>(bytes));
}

void NodeMetrics::MembershipReceived(size_t bytes) {
  membership_received_.Increment();
  membership_bytes_received_.Increment(static_cast<double>(bytes));
}

}  // namespace canopy::replication
