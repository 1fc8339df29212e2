#include "replication/protocol.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tree/delta.h"

namespace canopy::replication {

namespace {

// Builds header + body; Finish() appends the CRC.
class PayloadWriter {
 public:
  explicit PayloadWriter(MessageType type) {
    PutFixed8(&out_, kWireVersion);
    PutFixed16(&out_, static_cast<uint16_t>(type));
  }
  void U8(uint8_t v) { PutFixed8(&out_, v); }
  void U32(uint32_t v) { PutFixed32(&out_, v); }
  void U64(uint64_t v) { PutVarint64(&out_, v); }
  void Bytes(std::string_view b) { PutLengthPrefixed(&out_, b); }
  void Bool(bool b) { PutFixed8(&out_, b ? 1 : 0); }
  void Path(const std::vector<uint32_t>& path) {
    PutVarint64(&out_, path.size());
    for (uint32_t i : path) PutVarint64(&out_, i);
  }
  void StatusFields(const StatusReplyFields& s) {
    U8(static_cast<uint8_t>(s.code));
    Bytes(s.message);
  }
  void StringList(const std::vector<std::string>& list) {
    U64(list.size());
    for (const auto& s : list) Bytes(s);
  }
  // Room for `body` more bytes and the CRC: a payload of MiBs is then written
  // into one allocation instead of growing through every power of two (each
  // step a copy of what was written, into pages touched for the first time).
  void Reserve(size_t body) { out_.reserve(out_.size() + body + 4); }
  static size_t BytesSize(std::string_view b) { return static_cast<size_t>(VarintLength(b.size())) + b.size(); }
  std::string Finish() {
    PutFixed32(&out_, crc32c::Value(out_));
    return std::move(out_);
  }

 private:
  std::string out_;
};

// Checks header and CRC, then reads the body; Done() insists on no trailing bytes.
class PayloadReader {
 public:
  static Result<PayloadReader> Open(std::string_view payload, MessageType type) {
    const std::string name = MessageTypeName(static_cast<uint16_t>(type));
    if (payload.size() < 7) {
      return Status::Corruption(fmt::format("{} payload of {} bytes is too short", name, payload.size()));
    }
    std::string_view covered = payload.substr(0, payload.size() - 4);
    uint32_t want = DecodeFixed32(payload.data() + payload.size() - 4);
    if (crc32c::Value(covered) != want) return Status::Corruption(name + " payload CRC mismatch");
    auto version = static_cast<uint8_t>(covered[0]);
    if (version != kWireVersion) {
      return Status::Corruption(fmt::format("{}: unsupported wire version {}", name, version));
    }
    uint16_t got_type = DecodeFixed16(covered.data() + 1);
    if (got_type != static_cast<uint16_t>(type)) {
      return Status::Corruption(fmt::format("expected {}, payload is {}", name, MessageTypeName(got_type)));
    }
    return PayloadReader(covered.substr(3), name);
  }

  Result<uint8_t> U8() { return Wrap(reader_.ReadFixed8()); }
  Result<uint32_t> U32() { return Wrap(reader_.ReadFixed32()); }
  Result<uint64_t> U64() { return Wrap(reader_.ReadVarint64()); }
  Result<uint64_t> Count(std::string_view what) {
    // A list item takes at least one byte, so a count above remaining() is a lie.
    return Wrap(reader_.ReadVarintBounded(std::min<uint64_t>(kMaxListItems, reader_.remaining()), what));
  }
  Result<uint32_t> U32Varint(std::string_view what) {
    CANOPY_ASSIGN_OR_RETURN(uint64_t v, Wrap(reader_.ReadVarintBounded(UINT32_MAX, what)));
    return static_cast<uint32_t>(v);
  }
  Result<std::string> Bytes(size_t max_len) {
    CANOPY_ASSIGN_OR_RETURN(std::string_view v, BytesView(max_len));
    return std::string(v);
  }
  // A view into the payload (valid while it lives).
  Result<std::string_view> BytesView(size_t max_len) { return Wrap(reader_.ReadLengthPrefixed(max_len)); }
  Result<std::string> FixedBytes(size_t max_len, size_t exact, std::string_view what) {
    CANOPY_ASSIGN_OR_RETURN(std::string v, Bytes(max_len));
    if (v.size() != exact) {
      return Status::Corruption(fmt::format("{}: {} is {} bytes, expected {}", name_, what, v.size(), exact));
    }
    return v;
  }
  Result<bool> Bool() {
    CANOPY_ASSIGN_OR_RETURN(uint8_t v, U8());
    if (v > 1) return Status::Corruption(fmt::format("{}: boolean byte {}", name_, v));
    return v == 1;
  }
  Result<std::vector<uint32_t>> Path() {
    CANOPY_ASSIGN_OR_RETURN(uint64_t n, Count("path depth"));
    std::vector<uint32_t> path;
    path.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      CANOPY_ASSIGN_OR_RETURN(uint32_t v, U32Varint("path index"));
      path.push_back(v);
    }
    return path;
  }
  Result<StatusCode> Code() {
    CANOPY_ASSIGN_OR_RETURN(uint8_t c, U8());
    if (c > static_cast<uint8_t>(StatusCode::kClosed)) {
      return Status::Corruption(fmt::format("{}: unknown status code {}", name_, c));
    }
    return static_cast<StatusCode>(c);
  }
  Result<StatusReplyFields> StatusFields() {
    StatusReplyFields s;
    CANOPY_ASSIGN_OR_RETURN(s.code, Code());
    CANOPY_ASSIGN_OR_RETURN(s.message, Bytes(kMaxTextBytes));
    return s;
  }
  Result<std::vector<std::string>> StringList(size_t max_len) {
    CANOPY_ASSIGN_OR_RETURN(std::vector<std::string_view> views, StringViewList(max_len));
    return std::vector<std::string>(views.begin(), views.end());
  }
  // Views into the payload (valid while it lives).
  Result<std::vector<std::string_view>> StringViewList(size_t max_len) {
    CANOPY_ASSIGN_OR_RETURN(uint64_t n, Count("list length"));
    std::vector<std::string_view> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      CANOPY_ASSIGN_OR_RETURN(std::string_view s, BytesView(max_len));
      out.push_back(s);
    }
    return out;
  }
  bool AtEnd() const { return reader_.empty(); }
  Status Done() const {
    if (!reader_.empty()) {
      return Status::Corruption(fmt::format("{}: {} trailing bytes", name_, reader_.remaining()));
    }
    return Status::Ok();
  }

 private:
  PayloadReader(std::string_view body, std::string name) : reader_(body), name_(std::move(name)) {}
  template <typename T>
  Result<T> Wrap(Result<T> r) {
    if (!r.ok()) return r.status().WithContext(name_);
    return r;
  }
  ByteReader reader_;
  std::string name_;
};

#define OPEN_OR_RETURN(var, payload, type) CANOPY_ASSIGN_OR_RETURN(PayloadReader var, PayloadReader::Open(payload, type))

}  // namespace

std::string MessageTypeName(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello: return "HELLO";
    case MessageType::kChallenge: return "CHALLENGE";
    case MessageType::kAuth: return "AUTH";
    case MessageType::kWelcome: return "WELCOME";
    case MessageType::kSubscribe: return "SUBSCRIBE";
    case MessageType::kSnapshotBegin: return "SNAPSHOT_BEGIN";
    case MessageType::kSnapshotChunk: return "SNAPSHOT_CHUNK";
    case MessageType::kSnapshotEnd: return "SNAPSHOT_END";
    case MessageType::kSnapshotFile: return "SNAPSHOT_FILE";
    case MessageType::kOneSidedAnswer: return "ONE_SIDED_ANSWER";
    case MessageType::kCheckpointRequest:
      return "CHECKPOINT_REQUEST";
    case MessageType::kDelta: return "DELTA";
    case MessageType::kDeltaBatch: return "DELTA_BATCH";
    case MessageType::kDeltaRecords: return "DELTA_RECORDS";
    case MessageType::kAck: return "ACK";
    case MessageType::kHeartbeat: return "HEARTBEAT";
    case MessageType::kError: return "ERROR";
    case MessageType::kCommitRequest: return "COMMIT";
    case MessageType::kCommitReply: return "COMMIT_REPLY";
    case MessageType::kReadRequest: return "READ";
    case MessageType::kReadReply: return "READ_REPLY";
    case MessageType::kStatusRequest: return "STATUS";
    case MessageType::kStatusReply: return "STATUS_REPLY";
    case MessageType::kCreateTreeRequest: return "CREATE_TREE";
    case MessageType::kCreateTreeReply: return "CREATE_TREE_REPLY";
    case MessageType::kProbeRequest: return "PROBE_REQUEST";
    case MessageType::kTreeStateRequest: return "TREE_STATE_REQUEST";
    case MessageType::kTreeStateReply: return "TREE_STATE_REPLY";
    case MessageType::kSliceRequest: return "SLICE";
    case MessageType::kSliceReply: return "SLICE_REPLY";
  }
  return fmt::format("UNKNOWN(0x{:04x})", type);
}

Result<ConsistencyLevel> ParseConsistencyLevel(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper == "ONE") return ConsistencyLevel::kOne;
  if (upper == "QUORUM") return ConsistencyLevel::kQuorum;
  if (upper == "ALL") return ConsistencyLevel::kAll;
  return Status::InvalidArgument("consistency level must be ONE, QUORUM or ALL, not '" + std::string(text) + "'");
}

const char* ConsistencyLevelName(ConsistencyLevel level) {
  switch (level) {
    case ConsistencyLevel::kOne: return "ONE";
    case ConsistencyLevel::kQuorum: return "QUORUM";
    case ConsistencyLevel::kAll: return "ALL";
  }
  return "?";
}

Result<ReadLevel> ParseReadLevel(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper == "ONE") return ReadLevel::kOne;
  if (upper == "LEADER") return ReadLevel::kLeader;
  if (upper == "QUORUM") return ReadLevel::kQuorum;
  return Status::InvalidArgument("read consistency level must be ONE, LEADER or QUORUM, not '" + std::string(text) +
                                 "'");
}

const char* ReadLevelName(ReadLevel level) {
  switch (level) {
    case ReadLevel::kOne: return "ONE";
    case ReadLevel::kLeader: return "LEADER";
    case ReadLevel::kQuorum: return "QUORUM";
  }
  return "?";
}

uint32_t RequiredAcks(ConsistencyLevel level, uint32_t replicas) {
  if (replicas == 0) return 1;
  switch (level) {
    case ConsistencyLevel::kOne: return 1;
    case ConsistencyLevel::kQuorum: return replicas / 2 + 1;
    case ConsistencyLevel::kAll: return replicas;
  }
  return replicas;
}

#define TYPE_OF(T, K) \
  MessageType TypeOf(const T&) { return MessageType::K; }
TYPE_OF(Hello, kHello)
TYPE_OF(Challenge, kChallenge)
TYPE_OF(Auth, kAuth)
TYPE_OF(Welcome, kWelcome)
TYPE_OF(Subscribe, kSubscribe)
TYPE_OF(SnapshotBegin, kSnapshotBegin)
TYPE_OF(SnapshotChunk, kSnapshotChunk)
TYPE_OF(SnapshotEnd, kSnapshotEnd)
TYPE_OF(SnapshotFile, kSnapshotFile)
TYPE_OF(CheckpointRequest, kCheckpointRequest)
TYPE_OF(OneSidedAnswer, kOneSidedAnswer)
TYPE_OF(Delta, kDelta)
TYPE_OF(DeltaBatch, kDeltaBatch)
TYPE_OF(DeltaRecords, kDeltaRecords)
TYPE_OF(Ack, kAck)
TYPE_OF(Heartbeat, kHeartbeat)
TYPE_OF(ErrorMessage, kError)
TYPE_OF(CommitRequest, kCommitRequest)
TYPE_OF(CommitReply, kCommitReply)
TYPE_OF(ReadRequest, kReadRequest)
TYPE_OF(ReadReply, kReadReply)
TYPE_OF(StatusRequest, kStatusRequest)
TYPE_OF(StatusReply, kStatusReply)
TYPE_OF(CreateTreeRequest, kCreateTreeRequest)
TYPE_OF(CreateTreeReply, kCreateTreeReply)
TYPE_OF(ProbeRequest, kProbeRequest)
TYPE_OF(TreeStateRequest, kTreeStateRequest)
TYPE_OF(TreeStateReply, kTreeStateReply)
TYPE_OF(SliceRequest, kSliceRequest)
TYPE_OF(SliceReply, kSliceReply)
#undef TYPE_OF

// ---- HELLO / CHALLENGE / AUTH / WELCOME ----

std::string Encode(const Hello& m) {
  PayloadWriter w(MessageType::kHello);
  w.Bytes(m.cluster);
  w.Bytes(m.node_id);
  w.U8(static_cast<uint8_t>(m.role));
  w.U32(m.protocol_version);
  w.Bytes(m.nonce);
  w.Bytes(m.listen_uri);
  return w.Finish();
}
Result<Hello> DecodeHello(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kHello);
  Hello m;
  CANOPY_ASSIGN_OR_RETURN(m.cluster, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(uint8_t role, r.U8());
  if (role != static_cast<uint8_t>(PeerRole::kNode) && role != static_cast<uint8_t>(PeerRole::kClient)) {
    return Status::Corruption(fmt::format("HELLO: unknown role {}", role));
  }
  m.role = static_cast<PeerRole>(role);
  CANOPY_ASSIGN_OR_RETURN(m.protocol_version, r.U32());
  CANOPY_ASSIGN_OR_RETURN(m.nonce, r.FixedBytes(kNonceBytes, kNonceBytes, "nonce"));
  CANOPY_ASSIGN_OR_RETURN(m.listen_uri, r.Bytes(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const Challenge& m) {
  PayloadWriter w(MessageType::kChallenge);
  w.Bytes(m.node_id);
  w.Bytes(m.nonce);
  w.Bytes(m.proof);
  return w.Finish();
}
Result<Challenge> DecodeChallenge(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kChallenge);
  Challenge m;
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.nonce, r.FixedBytes(kNonceBytes, kNonceBytes, "nonce"));
  CANOPY_ASSIGN_OR_RETURN(m.proof, r.FixedBytes(kProofBytes, kProofBytes, "proof"));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const Auth& m) {
  PayloadWriter w(MessageType::kAuth);
  w.Bytes(m.proof);
  return w.Finish();
}
Result<Auth> DecodeAuth(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kAuth);
  Auth m;
  CANOPY_ASSIGN_OR_RETURN(m.proof, r.FixedBytes(kProofBytes, kProofBytes, "proof"));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const Welcome& m) {
  PayloadWriter w(MessageType::kWelcome);
  w.Bytes(m.node_id);
  return w.Finish();
}
Result<Welcome> DecodeWelcome(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kWelcome);
  Welcome m;
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

// ---- replication stream ----

namespace {

void PutResumeOffer(PayloadWriter& w, const ResumeOffer& offer) {
  w.U64(offer.version);
  w.U64(offer.bytes);
  w.U64(offer.digest);
  w.U64(offer.offset);
}
// `message` names the message in the error.
Result<ResumeOffer> ReadResumeOffer(PayloadReader& r, std::string_view message) {
  ResumeOffer offer;
  CANOPY_ASSIGN_OR_RETURN(offer.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(offer.bytes, r.U64());
  CANOPY_ASSIGN_OR_RETURN(offer.digest, r.U64());
  CANOPY_ASSIGN_OR_RETURN(offer.offset, r.U64());
  if (offer.offset > offer.bytes)
    return Status::Corruption(fmt::format("{} resume offset past the file's end", message));
  return offer;
}

}  // namespace

std::string Encode(const Subscribe& m) {
  PayloadWriter w(MessageType::kSubscribe);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.have_version);
  w.Bytes(m.node_id);
  w.U64(m.data_epoch);
  PutResumeOffer(w, m.resume);
  if (m.one_sided_ring_bytes != 0) w.U64(m.one_sided_ring_bytes);  // optional: see kProtocolVersion
  return w.Finish();
}
Result<Subscribe> DecodeSubscribe(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSubscribe);
  Subscribe m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.have_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.data_epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.resume, ReadResumeOffer(r, "SUBSCRIBE"));
  if (!r.AtEnd()) {
    CANOPY_ASSIGN_OR_RETURN(m.one_sided_ring_bytes, r.U64());
    if (m.one_sided_ring_bytes == 0) return Status::Corruption("SUBSCRIBE asks for a one-sided ring of 0 bytes");
  }
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const CheckpointRequest& m) {
  PayloadWriter w(MessageType::kCheckpointRequest);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.Bytes(m.node_id);
  PutResumeOffer(w, m.resume);
  return w.Finish();
}
Result<CheckpointRequest> DecodeCheckpointRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kCheckpointRequest);
  CheckpointRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.resume, ReadResumeOffer(r, "CHECKPOINT_REQUEST"));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const OneSidedAnswer& m) {
  PayloadWriter w(MessageType::kOneSidedAnswer);
  w.Bool(m.accepted);
  w.Bytes(m.reason);
  return w.Finish();
}
Result<OneSidedAnswer> DecodeOneSidedAnswer(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kOneSidedAnswer);
  OneSidedAnswer m;
  CANOPY_ASSIGN_OR_RETURN(m.accepted, r.Bool());
  CANOPY_ASSIGN_OR_RETURN(m.reason, r.Bytes(kMaxTextBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const SnapshotFile& m) {
  PayloadWriter w(MessageType::kSnapshotFile);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.version);
  w.U64(m.file_bytes);
  w.U64(m.digest);
  w.U64(m.offset);
  if (m.data_epoch != 0) w.U64(m.data_epoch);  // optional: only in answer to CHECKPOINT_REQUEST
  return w.Finish();
}
Result<SnapshotFile> DecodeSnapshotFile(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSnapshotFile);
  SnapshotFile m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.file_bytes, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.digest, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.offset, r.U64());
  if (m.offset > m.file_bytes) return Status::Corruption("SNAPSHOT_FILE offset past the file's end");
  if (!r.AtEnd()) {
    CANOPY_ASSIGN_OR_RETURN(m.data_epoch, r.U64());
    if (m.data_epoch == 0) return Status::Corruption("SNAPSHOT_FILE names data epoch 0");
  }
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const SnapshotBegin& m) {
  PayloadWriter w(MessageType::kSnapshotBegin);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.version);
  return w.Finish();
}
Result<SnapshotBegin> DecodeSnapshotBegin(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSnapshotBegin);
  SnapshotBegin m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const SnapshotChunk& m) {
  PayloadWriter w(MessageType::kSnapshotChunk);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.index);
  w.Bytes(m.data);
  return w.Finish();
}
Result<SnapshotChunk> DecodeSnapshotChunk(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSnapshotChunk);
  SnapshotChunk m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.index, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.data, r.Bytes(kMaxBlobBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const SnapshotEnd& m) {
  PayloadWriter w(MessageType::kSnapshotEnd);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.version);
  w.U64(m.chunks);
  return w.Finish();
}
Result<SnapshotEnd> DecodeSnapshotEnd(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSnapshotEnd);
  SnapshotEnd m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.chunks, r.U64());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const DeltaBatch& m) {
  PayloadWriter w(MessageType::kDeltaBatch);
  size_t body = PayloadWriter::BytesSize(m.tree) + 3 * 10;
  for (const auto& d : m.deltas) body += PayloadWriter::BytesSize(d);
  w.Reserve(body);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.base_version);
  w.StringList(m.deltas);
  return w.Finish();
}
Result<DeltaBatchView> DecodeDeltaBatchView(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kDeltaBatch);
  DeltaBatchView m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.base_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.deltas, r.StringViewList(kMaxBlobBytes));
  if (m.deltas.empty()) return Status::Corruption("DELTA_BATCH without deltas");
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}
Result<DeltaBatch> DecodeDeltaBatch(std::string_view payload) {
  CANOPY_ASSIGN_OR_RETURN(DeltaBatchView v, DecodeDeltaBatchView(payload));
  return DeltaBatch{std::move(v.tree), v.epoch, v.base_version, {v.deltas.begin(), v.deltas.end()}};
}

std::string Encode(const DeltaRecords& m) {
  PayloadWriter w(MessageType::kDeltaRecords);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.base_version);
  w.U64(m.count);
  w.U64(m.bytes);
  return w.Finish();
}
Result<DeltaRecords> DecodeDeltaRecords(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kDeltaRecords);
  DeltaRecords m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.base_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.count, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.bytes, r.U64());
  CANOPY_RETURN_IF_ERROR(r.Done());
  if (m.count == 0) return Status::Corruption("DELTA_RECORDS without deltas");
  if (m.bytes > kMaxBlobBytes || m.count > m.bytes / tree::kDeltaMinBytes) {
    return Status::Corruption(fmt::format("DELTA_RECORDS of {} deltas in {} bytes (at most {} bytes, and {} per delta)",
                                          m.count, m.bytes, kMaxBlobBytes, tree::kDeltaMinBytes));
  }
  if (m.base_version > UINT64_MAX - m.count) return Status::Corruption("DELTA_RECORDS versions overflow");
  return m;
}

std::string Encode(const Delta& m) {
  PayloadWriter w(MessageType::kDelta);
  w.Reserve(PayloadWriter::BytesSize(m.tree) + 3 * 10 + PayloadWriter::BytesSize(m.delta));
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.base_version);
  w.U64(m.new_version);
  w.Bytes(m.delta);
  return w.Finish();
}
Result<DeltaView> DecodeDeltaView(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kDelta);
  DeltaView m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.base_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.new_version, r.U64());
  if (m.new_version <= m.base_version) {
    return Status::Corruption(fmt::format("DELTA: new version {} is not after base {}", m.new_version, m.base_version));
  }
  CANOPY_ASSIGN_OR_RETURN(m.delta, r.BytesView(kMaxBlobBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}
Result<Delta> DecodeDelta(std::string_view payload) {
  CANOPY_ASSIGN_OR_RETURN(DeltaView v, DecodeDeltaView(payload));
  return Delta{std::move(v.tree), v.epoch, v.base_version, v.new_version, std::string(v.delta)};
}

std::string Encode(const Ack& m) {
  PayloadWriter w(MessageType::kAck);
  w.Bytes(m.tree);
  w.U64(m.epoch);
  w.U64(m.durable_version);
  w.U64(m.snapshots_installed);
  return w.Finish();
}
Result<Ack> DecodeAck(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kAck);
  Ack m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.durable_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.snapshots_installed, r.U64());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const Heartbeat& m) {
  PayloadWriter w(MessageType::kHeartbeat);
  w.Bytes(m.node_id);
  w.U64(m.sequence);
  w.U64(m.trees.size());
  for (const auto& t : m.trees) {
    w.Bytes(t.tree);
    w.U64(t.epoch);
    w.U64(t.durable_version);
  }
  w.U64(m.members.size());
  for (const auto& [id, uri] : m.members) {
    w.Bytes(id);
    w.Bytes(uri);
  }
  w.Bytes(m.raft_address);
  w.U8(static_cast<uint8_t>(m.kind));
  w.U64(m.members_digest);
  w.U64(m.trees_digest);
  w.StringList(m.tree_names);
  return w.Finish();
}
Result<Heartbeat> DecodeHeartbeat(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kHeartbeat);
  Heartbeat m;
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.sequence, r.U64());
  CANOPY_ASSIGN_OR_RETURN(uint64_t n, r.Count("tree count"));
  for (uint64_t i = 0; i < n; ++i) {
    Heartbeat::TreeState t;
    CANOPY_ASSIGN_OR_RETURN(t.tree, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(t.epoch, r.U64());
    CANOPY_ASSIGN_OR_RETURN(t.durable_version, r.U64());
    m.trees.push_back(std::move(t));
  }
  CANOPY_ASSIGN_OR_RETURN(uint64_t nm, r.Count("member count"));
  for (uint64_t i = 0; i < nm; ++i) {
    CANOPY_ASSIGN_OR_RETURN(std::string id, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(std::string uri, r.Bytes(kMaxNameBytes));
    if (!m.members.emplace(std::move(id), std::move(uri)).second) {
      return Status::Corruption("HEARTBEAT: duplicate member id");
    }
  }
  CANOPY_ASSIGN_OR_RETURN(m.raft_address, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(uint8_t kind, r.U8());
  if (kind > static_cast<uint8_t>(Heartbeat::Kind::kProbeAck)) {
    return Status::Corruption(fmt::format("HEARTBEAT: unknown kind {}", kind));
  }
  m.kind = static_cast<Heartbeat::Kind>(kind);
  CANOPY_ASSIGN_OR_RETURN(m.members_digest, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.trees_digest, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.tree_names, r.StringList(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

uint64_t GossipDigest(const std::map<std::string, std::string>& members) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x6d656d62);
  for (const auto& [id, uri] : members) {
    std::string entry = id + '\0' + uri + '\n';
    XXH64_update(st, entry.data(), entry.size());
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

uint64_t GossipDigest(const std::set<std::string>& tree_names) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x74726565);
  for (const auto& name : tree_names) {
    XXH64_update(st, name.data(), name.size());
    XXH64_update(st, "\n", 1);
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

// ---- PROBE_REQUEST / TREE_STATE_REQUEST / TREE_STATE_REPLY ----

std::string Encode(const ProbeRequest& m) {
  PayloadWriter w(MessageType::kProbeRequest);
  w.Bytes(m.target_id);
  w.Bytes(m.target_uri);
  w.U64(m.sequence);
  w.U32(m.timeout_ms);
  return w.Finish();
}
Result<ProbeRequest> DecodeProbeRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kProbeRequest);
  ProbeRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.target_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.target_uri, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.sequence, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.timeout_ms, r.U32());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const TreeStateRequest& m) {
  PayloadWriter w(MessageType::kTreeStateRequest);
  w.Bytes(m.tree);
  w.Bytes(m.leader);
  w.U64(m.epoch);
  return w.Finish();
}
Result<TreeStateRequest> DecodeTreeStateRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kTreeStateRequest);
  TreeStateRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.leader, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.epoch, r.U64());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const TreeStateReply& m) {
  PayloadWriter w(MessageType::kTreeStateReply);
  w.Bytes(m.tree);
  w.Bytes(m.node_id);
  w.U64(m.data_epoch);
  w.U64(m.version);
  w.Bool(m.leader_alive);
  return w.Finish();
}
Result<TreeStateReply> DecodeTreeStateReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kTreeStateReply);
  TreeStateReply m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.data_epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.leader_alive, r.Bool());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const ErrorMessage& m) {
  PayloadWriter w(MessageType::kError);
  w.U8(static_cast<uint8_t>(m.code));
  w.Bytes(m.text);
  return w.Finish();
}
Result<ErrorMessage> DecodeError(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kError);
  ErrorMessage m;
  CANOPY_ASSIGN_OR_RETURN(m.code, r.Code());
  CANOPY_ASSIGN_OR_RETURN(m.text, r.Bytes(kMaxTextBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

// ---- client requests ----

std::string Encode(const CommitRequest& m) {
  PayloadWriter w(MessageType::kCommitRequest);
  w.Bytes(m.tree);
  w.U64(m.base_version);
  w.U8(static_cast<uint8_t>(m.level));
  w.U32(m.timeout_ms);
  w.U64(m.edits.size());
  for (const Edit& e : m.edits) {
    w.U8(static_cast<uint8_t>(e.kind));
    w.Path(e.path);
    w.Bytes(e.key);
    w.Bytes(e.value);
    w.U64(e.index);
  }
  if (!m.client.empty() || m.sequence != 0) {
    w.Bytes(m.client);
    w.U64(m.sequence);
  }
  return w.Finish();
}
Result<CommitRequest> DecodeCommitRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kCommitRequest);
  CommitRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.base_version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(uint8_t level, r.U8());
  if (level < 1 || level > 3) return Status::Corruption(fmt::format("COMMIT: unknown consistency level {}", level));
  m.level = static_cast<ConsistencyLevel>(level);
  CANOPY_ASSIGN_OR_RETURN(m.timeout_ms, r.U32());
  CANOPY_ASSIGN_OR_RETURN(uint64_t n, r.Count("edit count"));
  m.edits.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    Edit e;
    CANOPY_ASSIGN_OR_RETURN(uint8_t kind, r.U8());
    if (kind < 1 || kind > 5) return Status::Corruption(fmt::format("COMMIT: unknown edit kind {}", kind));
    e.kind = static_cast<Edit::Kind>(kind);
    CANOPY_ASSIGN_OR_RETURN(e.path, r.Path());
    CANOPY_ASSIGN_OR_RETURN(e.key, r.Bytes(kMaxBlobBytes));
    CANOPY_ASSIGN_OR_RETURN(e.value, r.Bytes(kMaxBlobBytes));
    CANOPY_ASSIGN_OR_RETURN(e.index, r.U32Varint("edit index"));
    m.edits.push_back(std::move(e));
  }
  if (!r.AtEnd()) {  // the request id (absent from older clients' requests)
    CANOPY_ASSIGN_OR_RETURN(m.client, r.Bytes(kMaxRequestClientBytes));
    CANOPY_ASSIGN_OR_RETURN(m.sequence, r.U64());
  }
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const CommitReply& m) {
  PayloadWriter w(MessageType::kCommitReply);
  w.StatusFields(m.status);
  w.U64(m.version);
  w.U64(m.acks);
  w.Bytes(m.leader);
  if (m.sequence != 0 || m.duplicate) {
    w.U64(m.sequence);
    w.Bool(m.duplicate);
  }
  return w.Finish();
}
Result<CommitReply> DecodeCommitReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kCommitReply);
  CommitReply m;
  CANOPY_ASSIGN_OR_RETURN(m.status, r.StatusFields());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.acks, r.U32Varint("ack count"));
  CANOPY_ASSIGN_OR_RETURN(m.leader, r.Bytes(kMaxNameBytes));
  if (!r.AtEnd()) {
    CANOPY_ASSIGN_OR_RETURN(m.sequence, r.U64());
    CANOPY_ASSIGN_OR_RETURN(m.duplicate, r.Bool());
  }
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const ReadRequest& m) {
  PayloadWriter w(MessageType::kReadRequest);
  w.Bytes(m.tree);
  w.U64(m.version);
  w.Path(m.path);
  return w.Finish();
}
Result<ReadRequest> DecodeReadRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kReadRequest);
  ReadRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.path, r.Path());
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const ReadReply& m) {
  PayloadWriter w(MessageType::kReadReply);
  w.StatusFields(m.status);
  w.U64(m.version);
  w.U64(m.attributes.size());
  for (const auto& [k, v] : m.attributes) {
    w.Bytes(k);
    w.Bytes(v);
  }
  w.U64(m.child_count);
  return w.Finish();
}
Result<ReadReply> DecodeReadReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kReadReply);
  ReadReply m;
  CANOPY_ASSIGN_OR_RETURN(m.status, r.StatusFields());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(uint64_t n, r.Count("attribute count"));
  for (uint64_t i = 0; i < n; ++i) {
    CANOPY_ASSIGN_OR_RETURN(std::string k, r.Bytes(kMaxBlobBytes));
    CANOPY_ASSIGN_OR_RETURN(std::string v, r.Bytes(kMaxBlobBytes));
    if (!m.attributes.emplace(std::move(k), std::move(v)).second) {
      return Status::Corruption("READ_REPLY: duplicate attribute key");
    }
  }
  CANOPY_ASSIGN_OR_RETURN(m.child_count, r.U32Varint("child count"));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

// ---- SLICE ----

namespace {

void PutAttributes(PayloadWriter* w, const std::map<std::string, std::string>& attributes) {
  w->U64(attributes.size());
  for (const auto& [k, v] : attributes) {
    w->Bytes(k);
    w->Bytes(v);
  }
}

Result<std::map<std::string, std::string>> GetAttributes(PayloadReader* r, const char* what) {
  std::map<std::string, std::string> out;
  CANOPY_ASSIGN_OR_RETURN(uint64_t n, r->Count("attribute count"));
  for (uint64_t i = 0; i < n; ++i) {
    CANOPY_ASSIGN_OR_RETURN(std::string k, r->Bytes(kMaxBlobBytes));
    CANOPY_ASSIGN_OR_RETURN(std::string v, r->Bytes(kMaxBlobBytes));
    if (!out.emplace(std::move(k), std::move(v)).second) {
      return Status::Corruption(std::string(what) + ": duplicate attribute key");
    }
  }
  return out;
}

}  // namespace

std::string Encode(const SliceRequest& m) {
  PayloadWriter w(MessageType::kSliceRequest);
  w.Bytes(m.tree);
  w.U64(m.version);
  w.Path(m.path);
  w.U64(m.child_from);
  w.U64(m.child_limit);
  w.Bool(m.from_end);
  w.U8(static_cast<uint8_t>(m.level));
  w.U64(m.timeout_ms);
  return w.Finish();
}
Result<SliceRequest> DecodeSliceRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSliceRequest);
  SliceRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.path, r.Path());
  CANOPY_ASSIGN_OR_RETURN(m.child_from, r.U32Varint("child_from"));
  CANOPY_ASSIGN_OR_RETURN(m.child_limit, r.U32Varint("child_limit"));
  CANOPY_ASSIGN_OR_RETURN(m.from_end, r.Bool());
  CANOPY_ASSIGN_OR_RETURN(uint8_t level, r.U8());
  if (level < static_cast<uint8_t>(ReadLevel::kOne) || level > static_cast<uint8_t>(ReadLevel::kQuorum)) {
    return Status::Corruption(fmt::format("SLICE: unknown read level {}", level));
  }
  m.level = static_cast<ReadLevel>(level);
  CANOPY_ASSIGN_OR_RETURN(m.timeout_ms, r.U32Varint("timeout_ms"));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const SliceReply& m) {
  PayloadWriter w(MessageType::kSliceReply);
  w.StatusFields(m.status);
  w.U64(m.version);
  w.U64(m.data_epoch);
  PutAttributes(&w, m.attributes);
  w.U64(m.child_count);
  w.U64(m.child_start);
  w.U64(m.children.size());
  for (const auto& c : m.children) {
    PutAttributes(&w, c.attributes);
    w.U64(c.child_count);
  }
  w.Bytes(m.leader);
  w.Bytes(m.answered_by);
  return w.Finish();
}
Result<SliceReply> DecodeSliceReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kSliceReply);
  SliceReply m;
  CANOPY_ASSIGN_OR_RETURN(m.status, r.StatusFields());
  CANOPY_ASSIGN_OR_RETURN(m.version, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.data_epoch, r.U64());
  CANOPY_ASSIGN_OR_RETURN(m.attributes, GetAttributes(&r, "SLICE_REPLY"));
  CANOPY_ASSIGN_OR_RETURN(m.child_count, r.U32Varint("child count"));
  CANOPY_ASSIGN_OR_RETURN(m.child_start, r.U32Varint("child start"));
  CANOPY_ASSIGN_OR_RETURN(uint64_t n, r.Count("children"));
  m.children.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    SliceChild c;
    CANOPY_ASSIGN_OR_RETURN(c.attributes, GetAttributes(&r, "SLICE_REPLY child"));
    CANOPY_ASSIGN_OR_RETURN(c.child_count, r.U32Varint("child count"));
    m.children.push_back(std::move(c));
  }
  CANOPY_ASSIGN_OR_RETURN(m.leader, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.answered_by, r.Bytes(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const StatusRequest&) {
  PayloadWriter w(MessageType::kStatusRequest);
  return w.Finish();
}
Result<StatusRequest> DecodeStatusRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kStatusRequest);
  CANOPY_RETURN_IF_ERROR(r.Done());
  return StatusRequest{};
}

std::string Encode(const StatusReply& m) {
  PayloadWriter w(MessageType::kStatusReply);
  w.Bytes(m.node_id);
  w.U64(m.nodes.size());
  for (const auto& n : m.nodes) {
    w.Bytes(n.node_id);
    w.Bytes(n.uri);
    w.Bool(n.alive);
  }
  w.U64(m.replication_factor);
  w.U64(m.vnodes);
  w.U64(m.trees.size());
  for (const auto& t : m.trees) {
    w.Bytes(t.tree);
    w.Bytes(t.leader);
    w.U64(t.epoch);
    w.Bytes(t.role);
    w.U64(t.durable_version);
    w.Bytes(t.digest);
    w.StringList(t.owners);
    w.U64(t.replica_versions.size());
    for (const auto& [id, v] : t.replica_versions) {
      w.Bytes(id);
      w.U64(v);
    }
    w.U64(t.snapshots_received);
    w.U64(t.snapshots_sent);
  }
  w.Bytes(m.raft_leader);
  return w.Finish();
}
Result<StatusReply> DecodeStatusReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kStatusReply);
  StatusReply m;
  CANOPY_ASSIGN_OR_RETURN(m.node_id, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(uint64_t nn, r.Count("node count"));
  for (uint64_t i = 0; i < nn; ++i) {
    NodeStatus n;
    CANOPY_ASSIGN_OR_RETURN(n.node_id, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(n.uri, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(n.alive, r.Bool());
    m.nodes.push_back(std::move(n));
  }
  CANOPY_ASSIGN_OR_RETURN(m.replication_factor, r.U32Varint("replication factor"));
  CANOPY_ASSIGN_OR_RETURN(m.vnodes, r.U32Varint("vnodes"));
  CANOPY_ASSIGN_OR_RETURN(uint64_t nt, r.Count("tree count"));
  for (uint64_t i = 0; i < nt; ++i) {
    TreeStatus t;
    CANOPY_ASSIGN_OR_RETURN(t.tree, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(t.leader, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(t.epoch, r.U64());
    CANOPY_ASSIGN_OR_RETURN(t.role, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(t.durable_version, r.U64());
    CANOPY_ASSIGN_OR_RETURN(t.digest, r.Bytes(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(t.owners, r.StringList(kMaxNameBytes));
    CANOPY_ASSIGN_OR_RETURN(uint64_t nv, r.Count("replica count"));
    for (uint64_t j = 0; j < nv; ++j) {
      CANOPY_ASSIGN_OR_RETURN(std::string id, r.Bytes(kMaxNameBytes));
      CANOPY_ASSIGN_OR_RETURN(uint64_t v, r.U64());
      if (!t.replica_versions.emplace(std::move(id), v).second) {
        return Status::Corruption("STATUS_REPLY: duplicate replica id");
      }
    }
    CANOPY_ASSIGN_OR_RETURN(t.snapshots_received, r.U64());
    CANOPY_ASSIGN_OR_RETURN(t.snapshots_sent, r.U64());
    m.trees.push_back(std::move(t));
  }
  CANOPY_ASSIGN_OR_RETURN(m.raft_leader, r.Bytes(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const CreateTreeRequest& m) {
  PayloadWriter w(MessageType::kCreateTreeRequest);
  w.Bytes(m.tree);
  return w.Finish();
}
Result<CreateTreeRequest> DecodeCreateTreeRequest(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kCreateTreeRequest);
  CreateTreeRequest m;
  CANOPY_ASSIGN_OR_RETURN(m.tree, r.Bytes(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

std::string Encode(const CreateTreeReply& m) {
  PayloadWriter w(MessageType::kCreateTreeReply);
  w.StatusFields(m.status);
  w.Bytes(m.leader);
  w.StringList(m.owners);
  return w.Finish();
}
Result<CreateTreeReply> DecodeCreateTreeReply(std::string_view payload) {
  OPEN_OR_RETURN(r, payload, MessageType::kCreateTreeReply);
  CreateTreeReply m;
  CANOPY_ASSIGN_OR_RETURN(m.status, r.StatusFields());
  CANOPY_ASSIGN_OR_RETURN(m.leader, r.Bytes(kMaxNameBytes));
  CANOPY_ASSIGN_OR_RETURN(m.owners, r.StringList(kMaxNameBytes));
  CANOPY_RETURN_IF_ERROR(r.Done());
  return m;
}

}  // namespace canopy::replication
