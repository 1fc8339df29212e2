#include "replication/meta/cluster_state.h"

#include <fmt/format.h>

#include <limits>

#include "base/coding.h"
#include "base/crc32c.h"

namespace canopy::replication::meta {
namespace {

constexpr uint32_t kCommandMagic = 0x444D4D43;   // "CMMD" little-endian
constexpr uint32_t kSnapshotMagic = 0x504E5343;  // "CSNP"
constexpr uint8_t kFormatVersion = 1;

enum CommandType : uint8_t {
  kTypePut = 1,
  kTypeDelete = 2,
  kTypeCompareAndSet = 3,
  kTypeSetMember = 4,
  kTypeCasLeader = 5,
};

constexpr uint8_t kHasExpected = 1;
constexpr uint8_t kHasDesired = 2;

void PutString(std::string* out, std::string_view s) { PutLengthPrefixed(out, s); }

void SealWithCrc(std::string* out) { PutFixed32(out, crc32c::Value(*out)); }

// Checks magic, format and trailing CRC; returns the body between header and CRC.
Result<std::string_view> Unseal(std::string_view bytes, uint32_t magic, std::string_view what) {
  if (bytes.size() < 4 + 1 + 4) {
    return Status::Corruption(fmt::format("{}: {} bytes is too short", what, bytes.size()));
  }
  std::string_view covered = bytes.substr(0, bytes.size() - 4);
  uint32_t stored = DecodeFixed32(bytes.data() + bytes.size() - 4);
  if (DecodeFixed32(bytes.data()) != magic) {
    return Status::Corruption(fmt::format("{}: bad magic", what));
  }
  if (crc32c::Value(covered) != stored) {
    return Status::Corruption(fmt::format("{}: checksum mismatch", what));
  }
  if (static_cast<uint8_t>(bytes[4]) != kFormatVersion) {
    return Status::Corruption(fmt::format("{}: unknown format version {}", what, static_cast<int>(bytes[4])));
  }
  return covered.substr(5);
}

Result<std::string> ReadString(ByteReader* r, size_t max, std::string_view what) {
  auto s = r->ReadLengthPrefixed(max);
  if (!s.ok()) return s.status().WithContext(what);
  return std::string(*s);
}

Result<MemberStatus> ReadMemberStatus(ByteReader* r) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t raw, r->ReadFixed8());
  if (raw != static_cast<uint8_t>(MemberStatus::kAlive) && raw != static_cast<uint8_t>(MemberStatus::kLeft)) {
    return Status::Corruption(fmt::format("unknown member status {}", raw));
  }
  return static_cast<MemberStatus>(raw);
}

Status CheckKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument(fmt::format("key of {} bytes exceeds {}", key.size(), kMaxKeyBytes));
  }
  return Status::Ok();
}

Status CheckValue(std::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return Status::InvalidArgument(fmt::format("value of {} bytes exceeds {}", value.size(), kMaxValueBytes));
  }
  return Status::Ok();
}

struct Encoder {
  std::string* out;
  void operator()(const PutCmd& c) const {
    PutFixed8(out, kTypePut);
    PutString(out, c.key);
    PutString(out, c.value);
  }
  void operator()(const DeleteCmd& c) const {
    PutFixed8(out, kTypeDelete);
    PutString(out, c.key);
  }
  void operator()(const CompareAndSetCmd& c) const {
    PutFixed8(out, kTypeCompareAndSet);
    PutString(out, c.key);
    PutFixed8(out, static_cast<uint8_t>((c.expected ? kHasExpected : 0) | (c.desired ? kHasDesired : 0)));
    if (c.expected) PutString(out, *c.expected);
    if (c.desired) PutString(out, *c.desired);
  }
  void operator()(const SetMemberCmd& c) const {
    PutFixed8(out, kTypeSetMember);
    PutVarint64(out, c.member.node_id);
    PutString(out, c.member.data_uri);
    PutFixed8(out, static_cast<uint8_t>(c.member.status));
  }
  void operator()(const CasLeaderCmd& c) const {
    PutFixed8(out, kTypeCasLeader);
    PutString(out, c.tree);
    PutVarint64(out, c.expected_epoch);
    PutVarint64(out, c.new_leader);
    PutVarint64(out, c.leader_version);
  }
};

Result<CommandBody> DecodeBody(ByteReader* r) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t type, r->ReadFixed8());
  switch (type) {
    case kTypePut: {
      PutCmd c;
      CANOPY_ASSIGN_OR_RETURN(c.key, ReadString(r, kMaxKeyBytes, "put key"));
      CANOPY_ASSIGN_OR_RETURN(c.value, ReadString(r, kMaxValueBytes, "put value"));
      return CommandBody(std::move(c));
    }
    case kTypeDelete: {
      DeleteCmd c;
      CANOPY_ASSIGN_OR_RETURN(c.key, ReadString(r, kMaxKeyBytes, "delete key"));
      return CommandBody(std::move(c));
    }
    case kTypeCompareAndSet: {
      CompareAndSetCmd c;
      CANOPY_ASSIGN_OR_RETURN(c.key, ReadString(r, kMaxKeyBytes, "cas key"));
      CANOPY_ASSIGN_OR_RETURN(uint8_t flags, r->ReadFixed8());
      if ((flags & ~(kHasExpected | kHasDesired)) != 0) {
        return Status::Corruption(fmt::format("cas: unknown flags {:#x}", flags));
      }
      if (flags & kHasExpected) {
        CANOPY_ASSIGN_OR_RETURN(c.expected, ReadString(r, kMaxValueBytes, "cas expected"));
      }
      if (flags & kHasDesired) {
        CANOPY_ASSIGN_OR_RETURN(c.desired, ReadString(r, kMaxValueBytes, "cas desired"));
      }
      return CommandBody(std::move(c));
    }
    case kTypeSetMember: {
      SetMemberCmd c;
      CANOPY_ASSIGN_OR_RETURN(c.member.node_id, r->ReadVarint64());
      CANOPY_ASSIGN_OR_RETURN(c.member.data_uri, ReadString(r, kMaxKeyBytes, "member uri"));
      CANOPY_ASSIGN_OR_RETURN(c.member.status, ReadMemberStatus(r));
      return CommandBody(std::move(c));
    }
    case kTypeCasLeader: {
      CasLeaderCmd c;
      CANOPY_ASSIGN_OR_RETURN(c.tree, ReadString(r, kMaxKeyBytes, "tree name"));
      CANOPY_ASSIGN_OR_RETURN(c.expected_epoch, r->ReadVarint64());
      CANOPY_ASSIGN_OR_RETURN(c.new_leader, r->ReadVarint64());
      CANOPY_ASSIGN_OR_RETURN(c.leader_version, r->ReadVarint64());
      return CommandBody(std::move(c));
    }
    default:
      return Status::Corruption(fmt::format("unknown command type {}", type));
  }
}

struct Applier {
  ClusterState* s;
  ApplyOutcome operator()(const PutCmd& c) const {
    ApplyOutcome out;
    out.status = CheckKey(c.key);
    if (out.status.ok()) out.status = CheckValue(c.value);
    if (!out.status.ok()) return out;
    auto [it, inserted] = s->kv.try_emplace(c.key, c.value);
    if (inserted || it->second != c.value) {
      it->second = c.value;
      ++s->change_count;
    }
    return out;
  }
  ApplyOutcome operator()(const DeleteCmd& c) const {
    ApplyOutcome out;
    out.status = CheckKey(c.key);
    if (out.status.ok() && s->kv.erase(c.key) > 0) ++s->change_count;
    return out;
  }
  ApplyOutcome operator()(const CompareAndSetCmd& c) const {
    ApplyOutcome out;
    out.status = CheckKey(c.key);
    if (out.status.ok() && c.desired) out.status = CheckValue(*c.desired);
    if (out.status.ok() && c.expected) out.status = CheckValue(*c.expected);
    if (!out.status.ok()) return out;
    auto it = s->kv.find(c.key);
    std::optional<std::string> current;
    if (it != s->kv.end()) current = it->second;
    if (current != c.expected) {
      out.status = Status::Conflict(fmt::format("compare-and-set {}: current value {} the expected one",
                                                c.key, current ? "differs from" : "is absent, unlike"));
      out.current = std::move(current);
      return out;
    }
    if (c.desired) {
      if (!current || *current != *c.desired) {
        s->kv[c.key] = *c.desired;
        ++s->change_count;
      }
    } else if (current) {
      s->kv.erase(it);
      ++s->change_count;
    }
    return out;
  }
  ApplyOutcome operator()(const SetMemberCmd& c) const {
    ApplyOutcome out;
    if (c.member.node_id == 0) {
      out.status = Status::InvalidArgument("member node id 0");
      return out;
    }
    if (c.member.status == MemberStatus::kAlive && c.member.data_uri.empty()) {
      out.status = Status::InvalidArgument(fmt::format("member {}: empty data URI", c.member.node_id));
      return out;
    }
    if (c.member.data_uri.size() > kMaxKeyBytes) {
      out.status = Status::InvalidArgument("member data URI too long");
      return out;
    }
    auto it = s->members.find(c.member.node_id);
    if (it == s->members.end() || !(it->second == c.member)) {
      s->members[c.member.node_id] = c.member;
      ++s->change_count;
    }
    return out;
  }
  ApplyOutcome operator()(const CasLeaderCmd& c) const {
    ApplyOutcome out;
    out.status = CheckKey(c.tree);
    if (!out.status.ok()) return out;
    if (c.new_leader == 0) {
      out.status = Status::InvalidArgument(fmt::format("tree {}: leader node id 0", c.tree));
      return out;
    }
    uint64_t current = s->EpochOf(c.tree);
    out.epoch = current;
    if (current != c.expected_epoch) {
      out.status = Status::Conflict(
          fmt::format("tree {}: expected epoch {} but the current epoch is {} (leader changed)", c.tree,
                      c.expected_epoch, current));
      return out;
    }
    if (current == std::numeric_limits<uint64_t>::max()) {
      out.status = Status::InvalidArgument(fmt::format("tree {}: epoch exhausted", c.tree));
      return out;
    }
    TreeLeader& t = s->trees[c.tree];
    t.tree = c.tree;
    t.leader_node = c.new_leader;
    t.epoch = current + 1;
    t.leader_version = c.leader_version;
    out.epoch = t.epoch;
    ++s->change_count;
    return out;
  }
};

}  // namespace

const char* MemberStatusName(MemberStatus status) {
  switch (status) {
    case MemberStatus::kAlive:
      return "alive";
    case MemberStatus::kLeft:
      return "left";
  }
  return "unknown";
}

const MemberInfo* ClusterState::FindMember(uint64_t node_id) const {
  auto it = members.find(node_id);
  return it == members.end() ? nullptr : &it->second;
}

const TreeLeader* ClusterState::FindTree(std::string_view tree) const {
  auto it = trees.find(std::string(tree));
  return it == trees.end() ? nullptr : &it->second;
}

std::optional<std::string> ClusterState::Get(std::string_view key) const {
  auto it = kv.find(std::string(key));
  if (it == kv.end()) return std::nullopt;
  return it->second;
}

uint64_t ClusterState::EpochOf(std::string_view tree) const {
  const TreeLeader* t = FindTree(tree);
  return t ? t->epoch : 0;
}

std::string EncodeCommand(const Command& command) {
  std::string out;
  PutFixed32(&out, kCommandMagic);
  PutFixed8(&out, kFormatVersion);
  PutVarint64(&out, command.proposer);
  PutVarint64(&out, command.proposal_id);
  std::visit(Encoder{&out}, command.body);
  SealWithCrc(&out);
  return out;
}

Result<Command> DecodeCommand(std::string_view bytes) {
  CANOPY_ASSIGN_OR_RETURN(std::string_view body, Unseal(bytes, kCommandMagic, "metadata command"));
  ByteReader r(body);
  Command c;
  CANOPY_ASSIGN_OR_RETURN(c.proposer, r.ReadVarint64());
  CANOPY_ASSIGN_OR_RETURN(c.proposal_id, r.ReadVarint64());
  auto decoded = DecodeBody(&r);
  if (!decoded.ok()) return decoded.status().WithContext("metadata command");
  c.body = std::move(decoded).value();
  if (!r.empty()) {
    return Status::Corruption(fmt::format("metadata command: {} trailing bytes", r.remaining()));
  }
  return c;
}

ApplyOutcome ApplyCommand(ClusterState* state, const CommandBody& command) {
  return std::visit(Applier{state}, command);
}

std::string EncodeState(const ClusterState& state) {
  std::string out;
  PutFixed32(&out, kSnapshotMagic);
  PutFixed8(&out, kFormatVersion);
  PutVarint64(&out, state.applied_index);
  PutVarint64(&out, state.change_count);
  PutVarint64(&out, state.members.size());
  for (const auto& [id, m] : state.members) {
    PutVarint64(&out, id);
    PutString(&out, m.data_uri);
    PutFixed8(&out, static_cast<uint8_t>(m.status));
  }
  PutVarint64(&out, state.trees.size());
  for (const auto& [name, t] : state.trees) {
    PutString(&out, name);
    PutVarint64(&out, t.leader_node);
    PutVarint64(&out, t.epoch);
    PutVarint64(&out, t.leader_version);
  }
  PutVarint64(&out, state.kv.size());
  for (const auto& [k, v] : state.kv) {
    PutString(&out, k);
    PutString(&out, v);
  }
  SealWithCrc(&out);
  return out;
}

Result<ClusterState> DecodeState(std::string_view bytes) {
  CANOPY_ASSIGN_OR_RETURN(std::string_view body, Unseal(bytes, kSnapshotMagic, "metadata snapshot"));
  ByteReader r(body);
  ClusterState s;
  CANOPY_ASSIGN_OR_RETURN(s.applied_index, r.ReadVarint64());
  CANOPY_ASSIGN_OR_RETURN(s.change_count, r.ReadVarint64());
  CANOPY_ASSIGN_OR_RETURN(uint64_t n_members, r.ReadVarintBounded(kMaxSnapshotEntries, "member count"));
  for (uint64_t i = 0; i < n_members; ++i) {
    MemberInfo m;
    CANOPY_ASSIGN_OR_RETURN(m.node_id, r.ReadVarint64());
    CANOPY_ASSIGN_OR_RETURN(m.data_uri, ReadString(&r, kMaxKeyBytes, "member uri"));
    CANOPY_ASSIGN_OR_RETURN(m.status, ReadMemberStatus(&r));
    if (m.node_id == 0 || !s.members.emplace(m.node_id, m).second) {
      return Status::Corruption(fmt::format("metadata snapshot: bad or duplicate member id {}", m.node_id));
    }
  }
  CANOPY_ASSIGN_OR_RETURN(uint64_t n_trees, r.ReadVarintBounded(kMaxSnapshotEntries, "tree count"));
  for (uint64_t i = 0; i < n_trees; ++i) {
    TreeLeader t;
    CANOPY_ASSIGN_OR_RETURN(t.tree, ReadString(&r, kMaxKeyBytes, "tree name"));
    CANOPY_ASSIGN_OR_RETURN(t.leader_node, r.ReadVarint64());
    CANOPY_ASSIGN_OR_RETURN(t.epoch, r.ReadVarint64());
    CANOPY_ASSIGN_OR_RETURN(t.leader_version, r.ReadVarint64());
    std::string name = t.tree;
    if (name.empty() || !s.trees.emplace(std::move(name), std::move(t)).second) {
      return Status::Corruption("metadata snapshot: empty or duplicate tree name");
    }
  }
  CANOPY_ASSIGN_OR_RETURN(uint64_t n_kv, r.ReadVarintBounded(kMaxSnapshotEntries, "key count"));
  for (uint64_t i = 0; i < n_kv; ++i) {
    CANOPY_ASSIGN_OR_RETURN(std::string k, ReadString(&r, kMaxKeyBytes, "key"));
    CANOPY_ASSIGN_OR_RETURN(std::string v, ReadString(&r, kMaxValueBytes, "value"));
    if (k.empty() || !s.kv.emplace(std::move(k), std::move(v)).second) {
      return Status::Corruption("metadata snapshot: empty or duplicate key");
    }
  }
  if (!r.empty()) {
    return Status::Corruption(fmt::format("metadata snapshot: {} trailing bytes", r.remaining()));
  }
  return s;
}

}  // namespace canopy::replication::meta
