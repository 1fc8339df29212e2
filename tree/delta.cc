#include "tree/delta.h"

#include <algorithm>
#include <utility>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tree/node_impl.h"

namespace canopy::tree {

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::kInsertChild:
      return "InsertChild";
    case OpType::kAppendChild:
      return "AppendChild";
    case OpType::kDeleteChild:
      return "DeleteChild";
    case OpType::kPutAttribute:
      return "PutAttribute";
    case OpType::kDeleteAttribute:
      return "DeleteAttribute";
  }
  return "UnknownOp";
}

Op Op::InsertChild(NodePath parent, uint64_t index) {
  Op op;
  op.type = OpType::kInsertChild;
  op.path = std::move(parent);
  op.index = index;
  return op;
}
Op Op::AppendChild(NodePath parent) {
  Op op;
  op.type = OpType::kAppendChild;
  op.path = std::move(parent);
  return op;
}
Op Op::DeleteChild(NodePath parent, uint64_t index) {
  Op op;
  op.type = OpType::kDeleteChild;
  op.path = std::move(parent);
  op.index = index;
  return op;
}
Op Op::PutAttribute(NodePath node, std::string key, std::string value) {
  Op op;
  op.type = OpType::kPutAttribute;
  op.path = std::move(node);
  op.key = std::move(key);
  op.value = std::move(value);
  return op;
}
Op Op::DeleteAttribute(NodePath node, std::string key) {
  Op op;
  op.type = OpType::kDeleteAttribute;
  op.path = std::move(node);
  op.key = std::move(key);
  return op;
}

namespace {

bool HasIndex(OpType t) { return t == OpType::kInsertChild || t == OpType::kDeleteChild; }
bool HasKey(OpType t) { return t == OpType::kPutAttribute || t == OpType::kDeleteAttribute; }
bool ValidType(uint8_t t) { return t >= 1 && t <= 5; }

template <class AnyOp>
Status BadOp(const AnyOp& op, std::string_view why) {
  return Status::InvalidArgument(std::string(OpTypeName(op.type)) + " at " + NodePathToString(op.path) +
                                 ": " + std::string(why));
}

}  // namespace

std::string EncodeDelta(const Delta& delta) {
  std::string out;
  const bool with_request = !delta.request.empty();
  PutFixed32(&out, with_request ? kDeltaWithRequestMagic : kDeltaMagic);
  PutFixed32(&out, 0);  // total length, patched below
  PutLengthPrefixed(&out, delta.tree);
  PutFixed64(&out, delta.base_version);
  PutFixed64(&out, delta.new_version);
  if (with_request) {
    PutLengthPrefixed(&out, delta.request.client);
    PutVarint64(&out, delta.request.sequence);
  }
  PutVarint64(&out, delta.ops.size());
  for (const Op& op : delta.ops) {
    PutFixed8(&out, static_cast<uint8_t>(op.type));
    PutVarint64(&out, op.path.size());
    for (uint64_t i : op.path) PutVarint64(&out, i);
    if (HasIndex(op.type)) PutVarint64(&out, op.index);
    if (HasKey(op.type)) PutLengthPrefixed(&out, op.key);
    if (op.type == OpType::kPutAttribute) PutLengthPrefixed(&out, op.value);
  }
  EncodeFixed32(out.data() + 4, static_cast<uint32_t>(out.size() + 4));
  PutFixed32(&out, crc32c::Value(out));
  return out;
}

namespace {
// The checked body of a delta (after magic and length, before the CRC);
// sets *magic.
Result<std::string_view> CheckedDeltaBody(std::string_view encoded, uint32_t* magic_out) {
  if (encoded.size() < kDeltaMinBytes) {
    return Status::Corruption("delta of " + std::to_string(encoded.size()) + " bytes is too short");
  }
  const uint32_t magic = DecodeFixed32(encoded.data());
  if (magic != kDeltaMagic && magic != kDeltaWithRequestMagic) return Status::Corruption("delta: bad magic");
  uint32_t total = DecodeFixed32(encoded.data() + 4);
  if (total != encoded.size()) {
    return Status::Corruption("delta: length field says " + std::to_string(total) + " bytes, have " +
                              std::to_string(encoded.size()));
  }
  uint32_t want_crc = DecodeFixed32(encoded.data() + encoded.size() - 4);
  uint32_t have_crc = crc32c::Value(encoded.data(), encoded.size() - 4);
  if (want_crc != have_crc) return Status::Corruption("delta: CRC32C mismatch");
  *magic_out = magic;
  return encoded.substr(8, encoded.size() - 12);
}
}  // namespace

Result<DeltaHeader> DecodeDeltaHeader(std::string_view encoded) {
  uint32_t magic = 0;
  CANOPY_RETURN_IF_ERROR(CheckedDeltaBody(encoded, &magic).status());
  // Checked: the fields are read as PeekDeltaHeader reads them, bounded by
  // the body (the CRC after it is not part of any field).
  return PeekDeltaHeader(encoded.substr(0, encoded.size() - 4));
}

Result<std::vector<std::string_view>> SplitDeltaRun(std::string_view run) {
  if (run.empty()) return Status::Corruption("an empty run of deltas");
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < run.size()) {
    const size_t left = run.size() - at;
    if (left < kDeltaMinBytes) {
      return Status::Corruption("delta run: " + std::to_string(left) + " bytes at offset " + std::to_string(at) +
                                " are too few for a delta");
    }
    const uint32_t magic = DecodeFixed32(run.data() + at);
    if (magic != kDeltaMagic && magic != kDeltaWithRequestMagic) {
      return Status::Corruption("delta run: bad magic at offset " + std::to_string(at));
    }
    const uint32_t total = DecodeFixed32(run.data() + at + 4);
    if (total < kDeltaMinBytes || total > left) {
      return Status::Corruption("delta run: the delta at offset " + std::to_string(at) + " claims " +
                                std::to_string(total) + " bytes, " + std::to_string(left) + " remain");
    }
    out.push_back(run.substr(at, total));
    at += total;
  }
  return out;
}

Result<DeltaHeader> PeekDeltaHeader(std::string_view prefix) {
  if (prefix.size() < 8) return Status::Corruption("delta header of " + std::to_string(prefix.size()) + " bytes");
  const uint32_t magic = DecodeFixed32(prefix.data());
  if (magic != kDeltaMagic && magic != kDeltaWithRequestMagic) return Status::Corruption("delta: bad magic");
  ByteReader r(prefix.substr(8));
  DeltaHeader h;
  CANOPY_ASSIGN_OR_RETURN(h.tree, r.ReadLengthPrefixed());
  CANOPY_ASSIGN_OR_RETURN(h.base_version, r.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(h.new_version, r.ReadFixed64());
  return h;
}

Result<DeltaView> DecodeDeltaView(std::string_view encoded) {
  uint32_t magic = 0;
  CANOPY_ASSIGN_OR_RETURN(std::string_view body, CheckedDeltaBody(encoded, &magic));
  ByteReader r(body);
  DeltaView d;
  CANOPY_ASSIGN_OR_RETURN(d.tree, r.ReadLengthPrefixed());
  CANOPY_ASSIGN_OR_RETURN(d.base_version, r.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(d.new_version, r.ReadFixed64());
  if (magic == kDeltaWithRequestMagic) {
    CANOPY_ASSIGN_OR_RETURN(d.request_client, r.ReadLengthPrefixed());
    if (d.request_client.empty() || d.request_client.size() > kMaxRequestClientBytes) {
      return Status::Corruption("delta: request client id of " + std::to_string(d.request_client.size()) +
                                " bytes");
    }
    CANOPY_ASSIGN_OR_RETURN(d.request_sequence, r.ReadVarint64());
  }
  // Every op takes at least two bytes (type, path length).
  CANOPY_ASSIGN_OR_RETURN(uint64_t count, r.ReadVarintBounded(r.remaining() / 2, "delta op count"));
  d.ops.reserve(static_cast<size_t>(count));
  for (uint64_t n = 0; n < count; ++n) {
    OpView op;
    CANOPY_ASSIGN_OR_RETURN(uint8_t type, r.ReadFixed8());
    if (!ValidType(type)) return Status::Corruption("delta: unknown op type " + std::to_string(type));
    op.type = static_cast<OpType>(type);
    CANOPY_ASSIGN_OR_RETURN(uint64_t depth, r.ReadVarintBounded(r.remaining(), "delta path length"));
    op.path.reserve(static_cast<size_t>(depth));
    for (uint64_t i = 0; i < depth; ++i) {
      CANOPY_ASSIGN_OR_RETURN(uint64_t idx, r.ReadVarint64());
      op.path.push_back(idx);
    }
    if (HasIndex(op.type)) {
      CANOPY_ASSIGN_OR_RETURN(op.index, r.ReadVarint64());
    }
    if (HasKey(op.type)) {
      CANOPY_ASSIGN_OR_RETURN(op.key, r.ReadLengthPrefixed());
    }
    if (op.type == OpType::kPutAttribute) {
      CANOPY_ASSIGN_OR_RETURN(op.value, r.ReadLengthPrefixed());
    }
    d.ops.push_back(std::move(op));
  }
  if (!r.empty()) {
    return Status::Corruption("delta: " + std::to_string(r.remaining()) + " trailing bytes");
  }
  return d;
}

Result<Delta> DecodeDelta(std::string_view encoded) {
  CANOPY_ASSIGN_OR_RETURN(DeltaView v, DecodeDeltaView(encoded));
  Delta d;
  d.tree = std::string(v.tree);
  d.base_version = v.base_version;
  d.new_version = v.new_version;
  if (!v.request_client.empty()) {
    d.request.client = std::string(v.request_client);
    d.request.sequence = v.request_sequence;
  }
  d.ops.reserve(v.ops.size());
  for (OpView& o : v.ops) {
    Op op;
    op.type = o.type;
    op.path = std::move(o.path);
    op.index = o.index;
    op.key = std::string(o.key);
    op.value = std::string(o.value);
    d.ops.push_back(std::move(op));
  }
  return d;
}

namespace {

// ApplyOpInPlace for Op and OpView alike.
template <class AnyOp>
Status ApplyOneInPlace(NodePtr* root, const AnyOp& op, const NodeImage* owner) {
  // 1. Validate without touching anything.
  const Node* target = root->get();
  for (size_t depth = 0; depth < op.path.size(); ++depth) {
    if (op.path[depth] >= target->child_count()) {
      return BadOp(op, "no such node (index " + std::to_string(op.path[depth]) + " at depth " +
                           std::to_string(depth) + " is out of range)");
    }
    target = target->child(static_cast<size_t>(op.path[depth])).get();
  }
  switch (op.type) {
    case OpType::kInsertChild:
      if (op.index > target->child_count()) {
        return BadOp(op, "insert index " + std::to_string(op.index) + " > child count " +
                             std::to_string(target->child_count()));
      }
      break;
    case OpType::kDeleteChild:
      if (op.index >= target->child_count()) {
        return BadOp(op, "delete index " + std::to_string(op.index) + " >= child count " +
                             std::to_string(target->child_count()));
      }
      break;
    case OpType::kDeleteAttribute:
      if (!target->attribute(op.key)) return BadOp(op, "no attribute '" + std::string(op.key) + "'");
      break;
    case OpType::kAppendChild:
    case OpType::kPutAttribute:
      break;
    default:
      return BadOp(op, "unknown op type");
  }

  // 2. Path copying: make every node from the root to the target uniquely
  // ours. Each step copies one Node (24 bytes; it shares both sequences) if it
  // is shared, and the child-sequence chunks on the way to the next index.
  NodePtr* slot = root;
  for (uint64_t index : op.path) {
    slot = &NodeBuilderAccess::children(NodeBuilderAccess::Unique(slot)).MutableAt(static_cast<size_t>(index));
  }

  // 3. Edit the (now private) target: O(log n) in its child or attribute count.
  Node& node = NodeBuilderAccess::Unique(slot);
  auto& kids = NodeBuilderAccess::children(node);
  auto& attrs = NodeBuilderAccess::attributes(node);
  switch (op.type) {
    case OpType::kInsertChild:
      kids.Insert(static_cast<size_t>(op.index), Node::Empty());
      break;
    case OpType::kAppendChild:
      kids.PushBack(Node::Empty());
      break;
    case OpType::kDeleteChild:
      kids.Erase(static_cast<size_t>(op.index));
      break;
    case OpType::kPutAttribute:
    case OpType::kDeleteAttribute: {
      std::string_view key = op.key;
      size_t lo = AttributeLowerBound(attrs, key);
      bool found = lo < attrs.size() && attrs[lo].key() == op.key;
      if (op.type == OpType::kDeleteAttribute) {
        attrs.Erase(lo);
      } else {
        auto blob = [&] {
          return owner != nullptr && op.value.size() >= kReferencedValueBytes
                     ? AttributeSlot::Of(AttributeBlob::InImage(owner, op.key, op.value))
                     : AttributeSlot::Make(op.key, op.value);
        };
        if (!found) {
          attrs.Insert(lo, blob());
        } else if (attrs[lo].value() != op.value) {
          attrs.Set(lo, blob());
        }
      }
      break;
    }
  }
  return Status::Ok();
}

}  // namespace

Status ApplyOpInPlace(NodePtr* root, const Op& op) { return ApplyOneInPlace(root, op, nullptr); }

Result<NodePtr> ApplyOps(const NodePtr& root, const std::vector<Op>& ops) {
  NodePtr working = root;  // shared with the caller, so the first edit copies
  for (const Op& op : ops) CANOPY_RETURN_IF_ERROR(ApplyOneInPlace(&working, op, nullptr));
  return working;
}

Result<NodePtr> ApplyOps(const NodePtr& root, const std::vector<OpView>& ops, const NodeImage* owner) {
  NodePtr working = root;  // shared with the caller, so the first edit copies
  for (const OpView& op : ops) CANOPY_RETURN_IF_ERROR(ApplyOneInPlace(&working, op, owner));
  return working;
}

}  // namespace canopy::tree
