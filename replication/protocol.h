// The replication wire protocol: message types and their payload codecs.
//
// Every message travels as one transport frame (transport/frame.h) whose
// type is a MessageType. Its payload is versioned and self-checking:
//
//   off size field
//    0   1   wire version   kWireVersion (1)
//    1   2   message type   the same MessageType as the frame (LE)
//    3   ..  body           fields below, little-endian, varint lengths
//   end  4   crc            CRC32C of every byte before it
//
// Decoders never trust lengths: every count and length is bounded by the
// remaining bytes and by the limits below; a wrong version, type, CRC,
// a truncated body or trailing bytes yield Corruption. So any flipped byte or
// any truncation of an encoded message is an error, never a wrong value.
//
// Connection set-up (both peers and clients), mutual HMAC-SHA256 auth over
// the shared cluster secret (see transport/auth.h):
//   dialer   -> HELLO      {cluster, node id, role, protocol version, dialer nonce}
//   listener -> CHALLENGE  {listener node id, listener nonce, listener proof}
//   dialer   -> AUTH       {dialer proof}
//   listener -> WELCOME    {listener node id, epoch of nothing}   or ERROR + close
// Replication (dialer = replica, listener = leader of the tree):
//   replica -> SUBSCRIBE {tree, epoch, have version}
//   leader  -> SNAPSHOT_BEGIN / SNAPSHOT_CHUNK* / SNAPSHOT_END  when its WAL
//              no longer holds what the replica needs, then DELTA*, or
//              DELTA_BATCH {tree, epoch, base, deltas} when several are ready
//   replica -> ACK {tree, epoch, durable version} after each durable step
//   both    -> HEARTBEAT periodically; ERROR {code, text} then close on fault
// Every replication message carries the tree's leader epoch; a receiver
// refuses one lower than the highest it has seen (fencing).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/status.h"
#include "transport/auth.h"

namespace canopy::replication {

inline constexpr uint8_t kWireVersion = 1;
// Version of the replication protocol negotiated in HELLO.
// 2: ACK carries snapshots_installed; 3: HEARTBEAT probes (SWIM) and gossip
// digests, PROBE_REQUEST, TREE_STATE_REQUEST / REPLY, DELTA_BATCH, request ids;
// 4: SNAPSHOT_FILE (checkpoint files on the bulk path), SUBSCRIBE resume offer,
// STATUS_REPLY names the metadata raft leader. Still 4, as an extension only
// used when asked for: SUBSCRIBE may end with one_sided_ring_bytes (written
// only when non-zero, so a SUBSCRIBE without it is byte for byte the one
// before), answered by ONE_SIDED_ANSWER (replication/one_sided.h). A node
// older than that refuses such a SUBSCRIBE as Corruption: turn
// --one-sided-replication on once every node knows it.
// 5: DELTA_RECORDS. Still 5, as an extension a joiner falls back from:
// CHECKPOINT_REQUEST (a checkpoint file from an owner that is not the
// leader); a node older than that closes the connection on it (unexpected
// message), and the joiner asks the leader instead.
inline constexpr uint32_t kProtocolVersion = 5;
inline constexpr size_t kNonceBytes = transport::kAuthNonceBytes;
inline constexpr size_t kProofBytes = transport::kAuthProofBytes;  // HMAC-SHA256

// Decoder limits (a peer cannot make us allocate more than this per field).
inline constexpr size_t kMaxNameBytes = 1024;          // cluster, node ids, tree names, URIs
inline constexpr size_t kMaxTextBytes = 64 * 1024;     // error texts
inline constexpr size_t kMaxBlobBytes = 256u << 20;    // deltas, chunks, attribute values
inline constexpr size_t kMaxListItems = 1u << 20;      // edits, path depth, list lengths
inline constexpr size_t kMaxRequestClientBytes = 256;  // CommitRequest::client (as tree::kMaxRequestClientBytes)

enum class MessageType : uint16_t {
  kHello = 0x0101,
  kChallenge = 0x0102,
  kAuth = 0x0103,
  kWelcome = 0x0104,
  kSubscribe = 0x0110,
  kSnapshotBegin = 0x0111,
  kSnapshotChunk = 0x0112,
  kSnapshotEnd = 0x0113,
  kDelta = 0x0114,
  kAck = 0x0115,
  kHeartbeat = 0x0116,
  kSnapshotFile = 0x0117,
  kOneSidedAnswer = 0x0118,
  kCheckpointRequest = 0x0119,
  kError = 0x011f,
  kCommitRequest = 0x0120,
  kCommitReply = 0x0121,
  kReadRequest = 0x0122,
  kReadReply = 0x0123,
  kStatusRequest = 0x0124,
  kStatusReply = 0x0125,
  kCreateTreeRequest = 0x0126,
  kCreateTreeReply = 0x0127,
  // Membership and failover (0x0130-0x013f).
  kProbeRequest = 0x0130,
  kTreeStateRequest = 0x0131,
  kTreeStateReply = 0x0132,
  // Commit path (0x0140-0x014f).
  kDeltaBatch = 0x0140,
  kDeltaRecords = 0x0141,
  kSliceRequest = 0x0128,
  kSliceReply = 0x0129,
};

// "HELLO", "DELTA", ... or "UNKNOWN(0x....)".
std::string MessageTypeName(uint16_t type);

enum class PeerRole : uint8_t { kNode = 1, kClient = 2 };

enum class ConsistencyLevel : uint8_t { kOne = 1, kQuorum = 2, kAll = 3 };
// "ONE" / "QUORUM" / "ALL" (case-insensitive) or InvalidArgument.
Result<ConsistencyLevel> ParseConsistencyLevel(std::string_view text);
const char* ConsistencyLevelName(ConsistencyLevel level);
// Replicas (leader included) that must hold a write durably before it is
// acknowledged, for `replicas` owners of the tree: 1, replicas/2+1, replicas.
uint32_t RequiredAcks(ConsistencyLevel level, uint32_t replicas);

struct Hello {
  std::string cluster;
  std::string node_id;  // clients use a name of their own, e.g. "client-<pid>"
  PeerRole role = PeerRole::kNode;
  uint32_t protocol_version = kProtocolVersion;
  std::string nonce;  // kNonceBytes
  std::string listen_uri;  // nodes: the URI they serve on (empty for clients)
  bool operator==(const Hello&) const = default;
};

struct Challenge {
  std::string node_id;  // the listener's id
  std::string nonce;    // kNonceBytes
  std::string proof;    // kProofBytes: listener proves it knows the secret
  bool operator==(const Challenge&) const = default;
};

struct Auth {
  std::string proof;  // kProofBytes
  bool operator==(const Auth&) const = default;
};

struct Welcome {
  std::string node_id;
  bool operator==(const Welcome&) const = default;
};

// A replica's offer to resume a checkpoint file transfer that broke off
// (SNAPSHOT_FILE): it holds the first `offset` bytes, checked, of the file
// named by (version, bytes, digest). All 0: no offer. On the wire it is four
// u64 in that order (version, bytes, digest, offset) inside SUBSCRIBE and
// CHECKPOINT_REQUEST; offset > bytes is Corruption.
struct ResumeOffer {
  uint64_t version = 0;
  uint64_t bytes = 0;
  uint64_t digest = 0;
  uint64_t offset = 0;
  bool operator==(const ResumeOffer&) const = default;
};

struct Subscribe {
  std::string tree;
  uint64_t epoch = 0;         // highest epoch the replica has seen for the tree
  uint64_t have_version = 0;  // its durable version (0 = nothing)
  std::string node_id;        // the subscribing replica
  // Epoch of the leader the replica's data came from (0: no data). The
  // leader trusts the replica's history only when it is its own epoch, or
  // its predecessor's up to the version it took over at; otherwise it sends
  // a snapshot, which replaces any divergent suffix the replica may hold.
  uint64_t data_epoch = 0;
  ResumeOffer resume{};
  // Non-zero: the replica asks to receive this stream over a one-sided log
  // ring of this many bytes (rdma:// only; replication/one_sided.h). The
  // leader answers with ONE_SIDED_ANSWER before anything else.
  uint64_t one_sided_ring_bytes = 0;
  bool operator==(const Subscribe&) const = default;
};

// The leader's answer to a SUBSCRIBE with one_sided_ring_bytes: accepted
// (both ends then set the one-sided stream up, transport/rdma/
// one_sided_stream.h), or declined with the reason (the stream goes on as
// messages on the connection).
struct OneSidedAnswer {
  bool accepted = false;
  std::string reason;  // why not, when declined
  bool operator==(const OneSidedAnswer&) const = default;
};

struct SnapshotBegin {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t version = 0;  // the snapshot's version
  bool operator==(const SnapshotBegin&) const = default;
};

// Chunk bytes are either in `data` or (when bulk) in the frame's bulk bytes.
struct SnapshotChunk {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t index = 0;
  std::string data;
  bool operator==(const SnapshotChunk&) const = default;
};

struct SnapshotEnd {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t version = 0;
  uint64_t chunks = 0;
  bool operator==(const SnapshotEnd&) const = default;
};

// A checkpoint file sent whole on the bulk path (node join, catch-up): the
// frame's bulk bytes are bytes [offset, file_bytes) of the leader's newest
// checkpoint of `tree` (CBK1 blocks, tree/snapshot.h), whose identity the
// message names; the replica writes them straight into a file, checks every
// block and uses the file in place. The deltas after `version` follow on
// the stream. `offset` is the replica's resume offer from its Subscribe when
// the leader's file is the one offered, else 0.
struct SnapshotFile {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t version = 0;
  uint64_t file_bytes = 0;
  uint64_t digest = 0;  // Version::Digest of the tree at `version`
  uint64_t offset = 0;
  // In answer to a CHECKPOINT_REQUEST only (else 0, and not on the wire):
  // the data epoch of the sending owner's copy, whose history the file is.
  uint64_t data_epoch = 0;
  bool operator==(const SnapshotFile&) const = default;
};

// A joiner asks an owner of `tree` that is not its leader for the owner's
// checkpoint file (node join from every owner, node_snapshot_file.cc). The
// owner answers with SNAPSHOT_FILE (naming its copy's data epoch) and its
// bulk bytes, then waits for the joiner to close; or with ERROR
// (Unavailable) when it is not following the leader of `epoch` or holds no
// data of a known epoch. The joiner then subscribes to the leader from the
// file's version with that data epoch, which the leader trusts or not by
// its usual rule (SUBSCRIBE).
struct CheckpointRequest {
  std::string tree;
  uint64_t epoch = 0;
  std::string node_id;  // the asking joiner
  ResumeOffer resume{};
  bool operator==(const CheckpointRequest&) const = default;
};

struct Delta {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::string delta;  // the tree module's encoded delta (it has its own CRC)
  bool operator==(const Delta&) const = default;
};

// Leader -> replica: consecutive deltas in one frame, sent instead of DELTAs
// when several are ready at once (the replica applies them with one WAL sync
// and one ACK). deltas[i] takes the tree from base_version + i to
// base_version + i + 1. At least one delta.
struct DeltaBatch {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t base_version = 0;
  std::vector<std::string> deltas;  // the tree module's encoded deltas
  bool operator==(const DeltaBatch&) const = default;
};

// Leader -> replica: `count` consecutive deltas as they lie in the leader's
// WAL, carried as the message's `bytes` bulk bytes (sent from the segment
// file: sendfile on TCP, an RDMA READ of its mapping), not in the payload.
// The records are the tree module's encodings laid end to end (each
// delimited by its own length field and checked by its own CRC); they take
// the tree from base_version to base_version + count. A catching-up or
// joining replica gets the WAL tail this way, and the leader copies none of
// it. Since protocol version 5.
struct DeltaRecords {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t base_version = 0;
  uint64_t count = 0;  // at least 1
  uint64_t bytes = 0;  // at least count * tree::kDeltaMinBytes, at most kMaxBlobBytes
  bool operator==(const DeltaRecords&) const = default;
};

// DELTA and DELTA_BATCH as a replica decodes them: the encoded deltas are
// views into the received payload (valid while it lives), not copies. A
// delta of MiB-sized attributes is otherwise copied once more here, on top
// of the copies that applying and logging it take.
struct DeltaView {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::string_view delta;
};
struct DeltaBatchView {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t base_version = 0;
  std::vector<std::string_view> deltas;
};

// Replica -> leader on a stream: how far the replica's copy of `tree` is
// durable. `snapshots_installed` counts the snapshots this stream has
// installed so far: a leader that found the replica's history divergent at
// SUBSCRIBE must not count durable_version toward a consistency level until
// it is non-zero (before that the number describes the replica's own,
// discarded history, not the leader's).
struct Ack {
  std::string tree;
  uint64_t epoch = 0;
  uint64_t durable_version = 0;
  uint64_t snapshots_installed = 0;
  bool operator==(const Ack&) const = default;
};

// HEARTBEAT: liveness plus piggybacked state. Three kinds travel with the
// same layout:
//   kOneWay    on a leader stream (trees = the streamed tree at the stream's
//              epoch) or as a hint to an owner that has not subscribed yet;
//              no reply.
//   kProbe     a SWIM probe (ping) on a membership link; the receiver answers
//              on the same connection with a kProbeAck of the same sequence.
//   kProbeAck  the answer to a probe.
// Gossip is digest-first: members_digest / trees_digest summarise the
// sender's member map and known tree names (GossipDigest), and the full
// `members` / `tree_names` are included only when the receiver's digest is
// known to differ (a probe carries digests only; its ack carries the full
// sets the prober lacks), so that an idle node's bytes do not grow with N.
struct Heartbeat {
  enum class Kind : uint8_t { kOneWay = 0, kProbe = 1, kProbeAck = 2 };
  std::string node_id;
  uint64_t sequence = 0;
  // Per tree: the sender's data epoch (see Subscribe) and latest version.
  struct TreeState {
    std::string tree;
    uint64_t epoch = 0;
    uint64_t durable_version = 0;
    bool operator==(const TreeState&) const = default;
  };
  std::vector<TreeState> trees;
  // Cluster members the sender knows (gossip): node id -> URI.
  std::map<std::string, std::string> members;
  // The sender's metadata raft address (empty without one): the raft leader
  // adds members it does not have yet to the raft group.
  std::string raft_address;
  Kind kind = Kind::kOneWay;
  uint64_t members_digest = 0;
  uint64_t trees_digest = 0;
  std::vector<std::string> tree_names;  // known tree names (gossip), see above
  bool operator==(const Heartbeat&) const = default;
};

// XXH64 over the sorted entries: the digest HEARTBEAT gossip compares.
uint64_t GossipDigest(const std::map<std::string, std::string>& members);
uint64_t GossipDigest(const std::set<std::string>& tree_names);

// PROBE_REQUEST (SWIM ping-req): the receiver probes `target` itself and
// answers with the target's kProbeAck HEARTBEAT, or ERROR Unavailable when
// the target did not answer within timeout_ms.
struct ProbeRequest {
  std::string target_id;
  std::string target_uri;
  uint64_t sequence = 0;
  uint32_t timeout_ms = 0;
  bool operator==(const ProbeRequest&) const = default;
};

// TREE_STATE_REQUEST: a candidate for taking over `tree` (whose leader
// `leader` at `epoch` it finds dead) asks another owner for its state.
// TREE_STATE_REPLY: the owner's data epoch and latest version of the tree,
// and whether it still follows that leader at that epoch (leader_alive). An
// owner that answers leader_alive = false also stops following that leader
// at that epoch for a while (see node_failover.cc), so that the version it
// reported stays its last one from that epoch while the candidate decides.
struct TreeStateRequest {
  std::string tree;
  std::string leader;
  uint64_t epoch = 0;
  bool operator==(const TreeStateRequest&) const = default;
};
struct TreeStateReply {
  std::string tree;
  std::string node_id;
  uint64_t data_epoch = 0;
  uint64_t version = 0;
  bool leader_alive = false;
  bool operator==(const TreeStateReply&) const = default;
};

struct ErrorMessage {
  StatusCode code = StatusCode::kInternal;
  std::string text;
  Status ToStatus() const { return Status(code == StatusCode::kOk ? StatusCode::kInternal : code, text); }
  bool operator==(const ErrorMessage&) const = default;
};

// One edit of a client commit.
struct Edit {
  enum class Kind : uint8_t {
    kPutAttribute = 1,     // path, key, value
    kDeleteAttribute = 2,  // path, key
    kAppendChild = 3,      // path (the parent)
    kInsertChild = 4,      // path (the parent), index
    kDeleteChild = 5,      // path (the parent), index
  };
  Kind kind = Kind::kPutAttribute;
  std::vector<uint32_t> path;  // child indexes from the root
  std::string key;
  std::string value;
  uint32_t index = 0;
  bool operator==(const Edit&) const = default;
};

// A client may have many COMMITs outstanding on one connection; the node
// serves them concurrently and replies in any order, each COMMIT_REPLY
// echoing its request's `sequence`. `client` + `sequence` (both optional,
// trailing on the wire so that older peers' messages still decode) name the
// commit for idempotent retries: the id travels in the replicated delta, and
// a leader — this one or a replica that took over — that already committed
// it answers with that version (`duplicate`) instead of applying it again
// (tree/store.h says how long ids are remembered).
struct CommitRequest {
  std::string tree;
  uint64_t base_version = 0;  // 0: the leader's latest version
  ConsistencyLevel level = ConsistencyLevel::kQuorum;
  uint32_t timeout_ms = 10000;
  std::vector<Edit> edits;
  std::string client;     // empty: no request id (no duplicate detection)
  uint64_t sequence = 0;  // the client's number for this commit; echoed in the reply
  bool operator==(const CommitRequest&) const = default;
};

struct StatusReplyFields {
  StatusCode code = StatusCode::kOk;
  std::string message;
  Status ToStatus() const { return code == StatusCode::kOk ? Status::Ok() : Status(code, message); }
  static StatusReplyFields From(const Status& s) { return {s.code(), s.message()}; }
  bool operator==(const StatusReplyFields&) const = default;
};

struct CommitReply {
  StatusReplyFields status;
  uint64_t version = 0;  // the committed version
  uint32_t acks = 0;     // replicas holding it durably when the reply left
  std::string leader;    // set when the request went to a non-leader
  uint64_t sequence = 0;   // the request's sequence
  bool duplicate = false;  // the request id had been committed before (as `version`); nothing applied now
  bool operator==(const CommitReply&) const = default;
};

struct ReadRequest {
  std::string tree;
  uint64_t version = 0;  // 0: the newest; else a past version the node retains (NotFound if not)
  std::vector<uint32_t> path;
  bool operator==(const ReadRequest&) const = default;
};

struct ReadReply {
  StatusReplyFields status;
  uint64_t version = 0;
  std::map<std::string, std::string> attributes;
  uint32_t child_count = 0;
  bool operator==(const ReadReply&) const = default;
};

// How fresh a read must be (SLICE). See node_client.cc for what each costs.
//   ONE     the answering node's newest version (any owner; may lag).
//   LEADER  at the tree's leader (a non-leader redirects): the newest version
//           held durably by a quorum of owners once every version the leader
//           had when the read arrived is (read-your-writes for writes at any
//           level; linearizable: with the metadata raft the leader first
//           proves by a raft read that it still leads at its epoch).
//   QUORUM  the answering node gathers the copies of a quorum of owners and
//           answers the newest (data epoch, version): sees every write
//           acknowledged at QUORUM or ALL before the read began (R + W > N),
//           without the leader; may return a write not acknowledged yet.
enum class ReadLevel : uint8_t { kOne = 1, kLeader = 2, kQuorum = 3 };
// "ONE" / "LEADER" / "QUORUM" (case-insensitive) or InvalidArgument.
Result<ReadLevel> ParseReadLevel(std::string_view text);
const char* ReadLevelName(ReadLevel level);

// Reads one node of a tree and a slice of its children, each with its
// attributes and child count, in one round trip: a listing of M children
// costs one request instead of M + 1 READs.
struct SliceRequest {
  std::string tree;
  uint64_t version = 0;  // 0: the newest the level allows; else that retained version (ONE only)
  std::vector<uint32_t> path;
  uint32_t child_from = 0;   // first child returned
  uint32_t child_limit = 0;  // children returned at most (0: none, only the node itself)
  // Count child_from from the end: the slice is children
  // [n - child_from - child_limit, n - child_from) of the n, clamped at 0
  // (the oldest children of a list that grows at index 0).
  bool from_end = false;
  ReadLevel level = ReadLevel::kOne;
  uint32_t timeout_ms = 2000;  // LEADER / QUORUM: how long the node may wait for peers
  bool operator==(const SliceRequest&) const = default;
};

struct SliceChild {
  std::map<std::string, std::string> attributes;
  uint32_t child_count = 0;
  bool operator==(const SliceChild&) const = default;
};

struct SliceReply {
  StatusReplyFields status;
  uint64_t version = 0;     // the version read
  uint64_t data_epoch = 0;  // epoch of the leader the answering copy's data came from (0: unknown)
  std::map<std::string, std::string> attributes;
  uint32_t child_count = 0;
  uint32_t child_start = 0;          // index of children[0] among the node's children
  std::vector<SliceChild> children;  // children [child_start, child_start + children.size())
  std::string leader;                // LEADER at a non-leader: Unavailable + the leader's URI
  std::string answered_by;           // node id whose copy was read
  bool operator==(const SliceReply&) const = default;
};

struct StatusRequest {
  bool operator==(const StatusRequest&) const = default;
};

struct NodeStatus {
  std::string node_id;
  std::string uri;
  bool alive = false;
  bool operator==(const NodeStatus&) const = default;
};

struct TreeStatus {
  std::string tree;
  std::string leader;
  uint64_t epoch = 0;
  std::string role;             // "leader" / "replica" / "none" on the answering node
  uint64_t durable_version = 0; // on the answering node
  std::string digest;           // hex digest of that version, or empty
  // As known by the answering node (the leader knows every replica's ack).
  std::vector<std::string> owners;
  std::map<std::string, uint64_t> replica_versions;
  uint64_t snapshots_received = 0;  // snapshot installs of this tree on the answering node
  uint64_t snapshots_sent = 0;      // snapshots this node streamed to replicas
  bool operator==(const TreeStatus&) const = default;
};

struct StatusReply {
  std::string node_id;
  std::vector<NodeStatus> nodes;
  uint32_t replication_factor = 0;
  uint32_t vnodes = 0;
  std::vector<TreeStatus> trees;
  // The metadata raft leader's node id as the answering node knows it;
  // empty without a metadata raft or while it elects.
  std::string raft_leader;
  bool operator==(const StatusReply&) const = default;
};

struct CreateTreeRequest {
  std::string tree;
  bool operator==(const CreateTreeRequest&) const = default;
};

struct CreateTreeReply {
  StatusReplyFields status;
  std::string leader;
  std::vector<std::string> owners;
  bool operator==(const CreateTreeReply&) const = default;
};

// Encoders return the whole payload (header, body, CRC).
std::string Encode(const Hello& m);
std::string Encode(const Challenge& m);
std::string Encode(const Auth& m);
std::string Encode(const Welcome& m);
std::string Encode(const Subscribe& m);
std::string Encode(const SnapshotBegin& m);
std::string Encode(const SnapshotChunk& m);
std::string Encode(const SnapshotEnd& m);
std::string Encode(const SnapshotFile& m);
std::string Encode(const CheckpointRequest& m);
std::string Encode(const OneSidedAnswer& m);
std::string Encode(const Delta& m);
std::string Encode(const DeltaBatch& m);
std::string Encode(const DeltaRecords& m);
std::string Encode(const Ack& m);
std::string Encode(const Heartbeat& m);
std::string Encode(const ErrorMessage& m);
std::string Encode(const CommitRequest& m);
std::string Encode(const CommitReply& m);
std::string Encode(const ReadRequest& m);
std::string Encode(const ReadReply& m);
std::string Encode(const StatusRequest& m);
std::string Encode(const StatusReply& m);
std::string Encode(const CreateTreeRequest& m);
std::string Encode(const CreateTreeReply& m);
std::string Encode(const ProbeRequest& m);
std::string Encode(const TreeStateRequest& m);
std::string Encode(const TreeStateReply& m);
std::string Encode(const SliceRequest& m);
std::string Encode(const SliceReply& m);

// The frame type each message travels with.
MessageType TypeOf(const Hello&);
MessageType TypeOf(const Challenge&);
MessageType TypeOf(const Auth&);
MessageType TypeOf(const Welcome&);
MessageType TypeOf(const Subscribe&);
MessageType TypeOf(const SnapshotBegin&);
MessageType TypeOf(const SnapshotChunk&);
MessageType TypeOf(const SnapshotEnd&);
MessageType TypeOf(const SnapshotFile&);
MessageType TypeOf(const CheckpointRequest&);
MessageType TypeOf(const OneSidedAnswer&);
MessageType TypeOf(const Delta&);
MessageType TypeOf(const DeltaBatch&);
MessageType TypeOf(const DeltaRecords&);
MessageType TypeOf(const Ack&);
MessageType TypeOf(const Heartbeat&);
MessageType TypeOf(const ErrorMessage&);
MessageType TypeOf(const CommitRequest&);
MessageType TypeOf(const CommitReply&);
MessageType TypeOf(const ReadRequest&);
MessageType TypeOf(const ReadReply&);
MessageType TypeOf(const StatusRequest&);
MessageType TypeOf(const StatusReply&);
MessageType TypeOf(const CreateTreeRequest&);
MessageType TypeOf(const CreateTreeReply&);
MessageType TypeOf(const ProbeRequest&);
MessageType TypeOf(const TreeStateRequest&);
MessageType TypeOf(const TreeStateReply&);
MessageType TypeOf(const SliceRequest&);
MessageType TypeOf(const SliceReply&);

// Decoders: Corruption (with the reason) on anything malformed.
Result<Hello> DecodeHello(std::string_view payload);
Result<Challenge> DecodeChallenge(std::string_view payload);
Result<Auth> DecodeAuth(std::string_view payload);
Result<Welcome> DecodeWelcome(std::string_view payload);
Result<Subscribe> DecodeSubscribe(std::string_view payload);
Result<SnapshotBegin> DecodeSnapshotBegin(std::string_view payload);
Result<SnapshotChunk> DecodeSnapshotChunk(std::string_view payload);
Result<SnapshotEnd> DecodeSnapshotEnd(std::string_view payload);
Result<SnapshotFile> DecodeSnapshotFile(std::string_view payload);
Result<CheckpointRequest> DecodeCheckpointRequest(std::string_view payload);
Result<OneSidedAnswer> DecodeOneSidedAnswer(std::string_view payload);
Result<Delta> DecodeDelta(std::string_view payload);
Result<DeltaBatch> DecodeDeltaBatch(std::string_view payload);
Result<DeltaRecords> DecodeDeltaRecords(std::string_view payload);
// The same checks as DecodeDelta / DecodeDeltaBatch, without copying the deltas.
Result<DeltaView> DecodeDeltaView(std::string_view payload);
Result<DeltaBatchView> DecodeDeltaBatchView(std::string_view payload);
Result<Ack> DecodeAck(std::string_view payload);
Result<Heartbeat> DecodeHeartbeat(std::string_view payload);
Result<ErrorMessage> DecodeError(std::string_view payload);
Result<CommitRequest> DecodeCommitRequest(std::string_view payload);
Result<CommitReply> DecodeCommitReply(std::string_view payload);
Result<ReadRequest> DecodeReadRequest(std::string_view payload);
Result<ReadReply> DecodeReadReply(std::string_view payload);
Result<StatusRequest> DecodeStatusRequest(std::string_view payload);
Result<StatusReply> DecodeStatusReply(std::string_view payload);
Result<CreateTreeRequest> DecodeCreateTreeRequest(std::string_view payload);
Result<CreateTreeReply> DecodeCreateTreeReply(std::string_view payload);
Result<ProbeRequest> DecodeProbeRequest(std::string_view payload);
Result<TreeStateRequest> DecodeTreeStateRequest(std::string_view payload);
Result<TreeStateReply> DecodeTreeStateReply(std::string_view payload);
Result<SliceRequest> DecodeSliceRequest(std::string_view payload);
Result<SliceReply> DecodeSliceReply(std::string_view payload);

}  // namespace canopy::replication
