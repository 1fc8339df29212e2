// Cluster metadata held by the replicated state machine of the metadata
// service (see metadata.h), and the byte encoding of its commands and
// snapshots.
//
// The state is small: the data-plane membership (node id -> URI, alive/left),
// per-tree leadership (leader node, epoch, the leader's durable version when
// it was elected) and a generic key-value map for anything else the cluster
// wants to agree on. Every replica applies the same commands in the same order
// (raft's log), so ApplyCommand must be deterministic: it reads nothing but the
// state and the command.
//
// Encoding: explicit little-endian (base/coding.h). A command or snapshot is
//   [magic u32][format u8][body ...][crc32c(magic..body) u32]
// and the decoders never trust a length: a flipped byte or a truncated buffer
// yields Corruption, never a crash or an over-read.
//
// Thread safety: plain values and pure functions; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "base/result.h"
#include "base/status.h"

namespace canopy::replication::meta {

enum class MemberStatus : uint8_t {
  kAlive = 1,  // part of the data plane
  kLeft = 2,   // left (decommissioned); kept so that its id is not reused silently
};
const char* MemberStatusName(MemberStatus status);

// One data-plane node as the metadata knows it.
struct MemberInfo {
  uint64_t node_id = 0;
  std::string data_uri;  // e.g. "tcp://127.0.0.1:7000"
  MemberStatus status = MemberStatus::kAlive;
  bool operator==(const MemberInfo&) const = default;
};

// Who leads one tree. `epoch` starts at 1 with the first leader and grows by
// exactly one with every leader change; it never goes back (fencing token:
// a node that leads with epoch e must stop accepting writes once it sees an
// epoch > e, and replicas refuse streams from a leader with a stale epoch).
struct TreeLeader {
  std::string tree;
  uint64_t leader_node = 0;
  uint64_t epoch = 0;
  uint64_t leader_version = 0;  // the new leader's durable tree version when elected
  bool operator==(const TreeLeader&) const = default;
};

// The whole replicated state. A copy is a consistent snapshot of one point in
// the log.
struct ClusterState {
  uint64_t applied_index = 0;  // raft log index of the last applied entry (0: none)
  uint64_t change_count = 0;   // +1 for every command that changed the state
  std::map<uint64_t, MemberInfo> members;
  std::map<std::string, TreeLeader> trees;
  std::map<std::string, std::string> kv;

  // Lookups; nullptr / nullopt when absent.
  const MemberInfo* FindMember(uint64_t node_id) const;
  const TreeLeader* FindTree(std::string_view tree) const;
  std::optional<std::string> Get(std::string_view key) const;
  // Current epoch of a tree; 0 when it has never had a leader.
  uint64_t EpochOf(std::string_view tree) const;

  bool operator==(const ClusterState&) const = default;
};

// ---- Commands (one raft log entry each) ----

// kv[key] = value.
struct PutCmd {
  std::string key, value;
};
// erase kv[key] (no error when absent).
struct DeleteCmd {
  std::string key;
};
// Generic compare-and-set on kv: succeeds when the current value equals
// `expected` (nullopt: key must be absent); then sets `desired` (nullopt:
// erase). Otherwise Conflict and nothing changes.
struct CompareAndSetCmd {
  std::string key;
  std::optional<std::string> expected, desired;
};
// members[node_id] = {data_uri, status}.
struct SetMemberCmd {
  MemberInfo member;
};
// Leader change for one tree: succeeds only when the tree's current epoch
// equals expected_epoch (0: tree has no leader yet); the new epoch is
// expected_epoch + 1. Otherwise Conflict (someone else changed the leader
// first) and nothing changes.
struct CasLeaderCmd {
  std::string tree;
  uint64_t expected_epoch = 0;
  uint64_t new_leader = 0;
  uint64_t leader_version = 0;
};

using CommandBody = std::variant<PutCmd, DeleteCmd, CompareAndSetCmd, SetMemberCmd, CasLeaderCmd>;

// A command as it travels through the log. `proposer` and `proposal_id`
// identify the proposal so that the proposing node can match the applied
// outcome to its waiting caller; they never influence the state.
struct Command {
  uint64_t proposer = 0;
  uint64_t proposal_id = 0;
  CommandBody body;
};

// The result of applying one command on one replica (identical on all).
struct ApplyOutcome {
  Status status;                       // OK, Conflict (CAS lost), InvalidArgument, Corruption
  uint64_t epoch = 0;                  // CasLeaderCmd: the new epoch on success, the current one on Conflict
  std::optional<std::string> current;  // CompareAndSetCmd on Conflict: the value found
};

// Limits enforced by the encoders' callers and checked by the decoders.
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = 1 << 20;  // 1 MiB
inline constexpr size_t kMaxSnapshotEntries = 1 << 20;

std::string EncodeCommand(const Command& command);
// Corruption on any damage (bad magic, crc, unknown type, truncation, trailing bytes).
Result<Command> DecodeCommand(std::string_view bytes);

// Applies `command` to `state` (bumping change_count when it changed
// something). Does not touch applied_index: the caller (the raft FSM) sets it.
// InvalidArgument for an empty key/tree name or a zero node id; the state is
// unchanged then.
ApplyOutcome ApplyCommand(ClusterState* state, const CommandBody& command);

// Snapshot of the state (members, trees, kv, change_count, applied_index).
std::string EncodeState(const ClusterState& state);
Result<ClusterState> DecodeState(std::string_view bytes);

}  // namespace canopy::replication::meta
