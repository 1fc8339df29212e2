// Edit operations and the Delta codec.
//
// A Delta is what one commit did to one tree: {tree, base version, new
// version (base + 1), ops}. Applied to the tree at `base_version` it yields
// `new_version`. It is the unit of the WAL and of replication.
//
// Encoding (all integers little-endian, see tree/README.md):
//   fixed32 magic "CDL1" | fixed32 total_length (whole encoding, CRC included)
//   | varint name_len, name | fixed64 base_version | fixed64 new_version
//   | varint op_count | ops... | fixed32 crc32c(every preceding byte)
// A delta that carries a request id (see RequestId) is encoded with magic
// "CDL2" and, right after new_version, varint client_len, client, varint
// sequence; one without is encoded as "CDL1" exactly as before, so older WAL
// files and peers still decode.
// An op is: u8 type | varint path_len, varint index * path_len | then
//   kInsertChild, kDeleteChild: varint index
//   kAppendChild: nothing
//   kPutAttribute: varint key_len, key, varint value_len, value
//   kDeleteAttribute: varint key_len, key
//
// DecodeDelta never trusts its input: the length and CRC are checked before
// anything is parsed, every count is bounded by the bytes that remain, and a
// bad byte anywhere, a truncation at any offset or trailing garbage yields
// Corruption (never a crash or a large allocation).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "tree/node.h"

namespace canopy::tree {

class NodeImage;

enum class OpType : uint8_t {
  kInsertChild = 1,      // insert an empty child of `path` at position `index` (0..child_count)
  kAppendChild = 2,      // append an empty child to `path`
  kDeleteChild = 3,      // delete child `index` of `path` (with its subtree)
  kPutAttribute = 4,     // set attribute `key` of the node at `path` to `value`
  kDeleteAttribute = 5,  // remove attribute `key` of the node at `path` (must exist)
};

const char* OpTypeName(OpType type);

struct Op {
  OpType type = OpType::kAppendChild;
  NodePath path;       // the node the op acts on (the parent for child ops)
  uint64_t index = 0;  // kInsertChild / kDeleteChild only
  std::string key;     // attribute ops only
  std::string value;   // kPutAttribute only

  static Op InsertChild(NodePath parent, uint64_t index);
  static Op AppendChild(NodePath parent);
  static Op DeleteChild(NodePath parent, uint64_t index);
  static Op PutAttribute(NodePath node, std::string key, std::string value);
  static Op DeleteAttribute(NodePath node, std::string key);

  bool operator==(const Op&) const = default;
};

// Who asked for a commit, so that a retried request is not applied twice:
// `client` names one client instance (unique across the cluster: the client
// picks a random part), `sequence` numbers its commits (any order, each used
// once). Empty (client empty) when the commit has no id.
struct RequestId {
  std::string client;
  uint64_t sequence = 0;

  bool empty() const { return client.empty(); }
  bool operator==(const RequestId&) const = default;
};

struct Delta {
  std::string tree;
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::vector<Op> ops;
  RequestId request;  // replicated with the delta and kept in the WAL

  bool operator==(const Delta&) const = default;
};

inline constexpr uint32_t kDeltaMagic = 0x314C4443;           // "CDL1" little-endian
inline constexpr uint32_t kDeltaWithRequestMagic = 0x324C4443;  // "CDL2": with a RequestId
// Longest RequestId::client a delta may carry.
inline constexpr size_t kMaxRequestClientBytes = 256;
// Smallest possible encoding (empty name, no ops): header, versions, count, crc.
inline constexpr size_t kDeltaMinBytes = 4 + 4 + 1 + 8 + 8 + 1 + 4;

std::string EncodeDelta(const Delta& delta);
// Corruption on any malformed, truncated or altered input.
Result<Delta> DecodeDelta(std::string_view encoded);

// What DecodeHeader reads: the delta's identity, without its ops.
struct DeltaHeader {
  std::string_view tree;  // points into the encoding
  uint64_t base_version = 0;
  uint64_t new_version = 0;
};
// Checks the magic, the length and the CRC exactly as DecodeDelta does and
// reads tree and versions; the ops are not parsed (or copied), so a record
// DecodeDelta would refuse for malformed ops behind a valid CRC passes here.
// For readers that only route or count whole records (a WAL scan for the
// deltas after a version); whoever applies a delta decodes it with
// DecodeDelta.
Result<DeltaHeader> DecodeDeltaHeader(std::string_view encoded);

// How many leading bytes of an encoding PeekDeltaHeader needs at most (a
// tree name is at most 200 bytes: Store::ValidateTreeName).
inline constexpr size_t kDeltaPeekBytes = 256;
// Reads tree and versions from the first bytes of an encoding (`prefix`:
// its first kDeltaPeekBytes bytes, or all of it if shorter), checking the
// magic and the bounds only: no length match, no CRC. For a scan that
// passes over the records it will not use unread (a WAL read for the
// deltas after a version skips those at or before it); any record that is
// used is checked whole with DecodeDeltaHeader or DecodeDelta. Corruption
// if the prefix does not hold a delta's header.
Result<DeltaHeader> PeekDeltaHeader(std::string_view prefix);

// Splits a run of whole encodings laid end to end (consecutive WAL records,
// as a replica receives them from its leader's WAL) into one view per
// delta, by each one's length field. Checks only what the split needs: the
// magic, and a length of at least kDeltaMinBytes that fits in what remains;
// each delta's CRC and fields are checked by whoever decodes it. Corruption
// otherwise, or when the run is empty.
Result<std::vector<std::string_view>> SplitDeltaRun(std::string_view run);

// Applies `ops` in order to `root` by path copying and returns the new root;
// `root` itself is never modified. InvalidArgument (naming the op and path) if
// an op addresses a node or child index that does not exist, or deletes a
// missing attribute; nothing is returned then.
Result<NodePtr> ApplyOps(const NodePtr& root, const std::vector<Op>& ops);

// A delta decoded in place: the tree name, the request's client, and every
// op's key and value are views into the encoding, which must outlive it.
// For whoever applies a received delta and keeps its encoding (a replica
// logs those bytes as they are): a MiB-sized value is then copied once,
// into the tree, instead of first into an Op and then into the tree.
struct OpView {
  OpType type = OpType::kAppendChild;
  NodePath path;
  uint64_t index = 0;
  std::string_view key;
  std::string_view value;
};
struct DeltaView {
  std::string_view tree;
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::string_view request_client;  // empty: no RequestId
  uint64_t request_sequence = 0;
  std::vector<OpView> ops;
};
// Checks and parses exactly as DecodeDelta does (DecodeDelta is this plus
// copies); Corruption on the same inputs.
Result<DeltaView> DecodeDeltaView(std::string_view encoded);
// Puts whose value is at least this long keep it in place when ApplyOps is
// given the owner of the bytes the views point into.
inline constexpr size_t kReferencedValueBytes = 64u << 10;
// ApplyOps over ops decoded in place. Without `owner`, every key and value
// is copied into the tree. With it (the image that holds the bytes the
// views point into: NodeImage::OverBytes), a put of a value of at least
// kReferencedValueBytes copies nothing: the new attribute points into
// owner's bytes and holds one reference to it, so owner lives as long as
// any version that holds such an attribute.
Result<NodePtr> ApplyOps(const NodePtr& root, const std::vector<OpView>& ops,
                         const NodeImage* owner = nullptr);

}  // namespace canopy::tree
