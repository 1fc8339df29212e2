// Format 1 (CSN1) snapshot streams, kept to read (and migrate) data
// directories written before the block format; see legacy_snapshot.h.
#include "tree/legacy_snapshot.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "base/coding.h"
#include "base/crc32c.h"

namespace canopy::tree::csn1 {

namespace {

constexpr uint8_t kChunkBegin = 1;
constexpr uint8_t kChunkNodes = 2;
constexpr uint8_t kChunkEnd = 3;

void AppendRecord(std::string* out, const Node& n) {
  PutVarint64(out, n.attribute_count());
  n.ForEachAttribute([out](AttributeView a) {
    PutLengthPrefixed(out, a.key);
    PutLengthPrefixed(out, a.value);
  });
  PutVarint64(out, n.child_count());
}

// Pre-order walk producing body records, a few at a time.
class BodyWalker {
 public:
  explicit BodyWalker(const Node* root) : root_(root) {}

  // Appends records to *out until it holds at least `target` bytes or the
  // walk is over. Returns false once every record has been produced.
  bool Fill(std::string* out, size_t target) {
    while (out->size() < target) {
      if (!started_) {
        started_ = true;
        Emit(out, root_);
        continue;
      }
      if (stack_.empty()) return false;
      Frame& top = stack_.back();
      if (top.next < top.node->child_count()) {
        // Children come a leaf of the child sequence at a time.
        if (top.next >= top.span.first + top.span.count) top.span = top.node->child_vector().SpanAt(top.next);
        const Node* child = top.span.items[top.next - top.span.first].get();
        ++top.next;
        Emit(out, child);
      } else {
        stack_.pop_back();
      }
    }
    return !finished();
  }
  bool finished() const { return started_ && stack_.empty(); }
  uint64_t nodes() const { return nodes_; }

 private:
  struct Frame {
    const Node* node;
    size_t next;
    PersistentVector<NodePtr>::Span span;  // the leaf holding child `next`, once fetched
  };
  void Emit(std::string* out, const Node* n) {
    AppendRecord(out, *n);
    ++nodes_;
    if (n->child_count() > 0) stack_.push_back(Frame{n, 0, {nullptr, 0, 0}});
  }
  const Node* root_;
  std::vector<Frame> stack_;
  bool started_ = false;
  uint64_t nodes_ = 0;
};

struct Xxh3 {
  Xxh3() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~Xxh3() {
    if (state) XXH3_freeState(state);
  }
  Xxh3(const Xxh3& o) : state(XXH3_createState()) { XXH3_copyState(state, o.state); }
  Xxh3& operator=(Xxh3&& o) noexcept {
    std::swap(state, o.state);
    return *this;
  }
  Xxh3& operator=(const Xxh3&) = delete;
  void Update(std::string_view b) { XXH3_64bits_update(state, b.data(), b.size()); }
  uint64_t Digest() const { return XXH3_64bits_digest(state); }
  XXH3_state_t* state;
};

}  // namespace

uint64_t BodyDigest(const NodePtr& root) {
  BodyWalker walker(root.get());
  Xxh3 hash;
  std::string buf;
  while (!walker.finished()) {
    buf.clear();
    walker.Fill(&buf, 64 << 10);
    hash.Update(buf);
  }
  return hash.Digest();
}

Result<size_t> SnapshotChunkLength(std::string_view prefix) {
  if (prefix.size() < 8) return Status::Corruption("snapshot chunk: truncated header");
  if (DecodeFixed32(prefix.data()) != kMagic) return Status::Corruption("snapshot chunk: bad magic");
  uint32_t len = DecodeFixed32(prefix.data() + 4);
  if (len < kChunkOverheadBytes || len > kMaxSnapshotChunkBytes) {
    return Status::Corruption("snapshot chunk: implausible length " + std::to_string(len));
  }
  return static_cast<size_t>(len);
}

// ---------------------------------------------------------------- writer

struct SnapshotWriter::Impl {
  Impl(Version v, size_t max_chunk)
      : version(std::move(v)),
        max_payload(std::clamp(max_chunk, kMinSnapshotChunkBytes, kMaxSnapshotChunkBytes) -
                    kChunkOverheadBytes),
        walker(version.root().get()) {}

  // Fills in the header of a chunk whose payload already follows a
  // kChunkHeaderBytes placeholder in *c, and appends the CRC.
  void Seal(std::string* c, uint8_t kind) {
    WriteHeader(c, kind);
    PutFixed32(c, crc32c::Value(*c));
  }
  void WriteHeader(std::string* c, uint8_t kind) {
    EncodeFixed32(c->data(), kMagic);
    EncodeFixed32(c->data() + 4, static_cast<uint32_t>(c->size() + 4));
    (*c)[8] = static_cast<char>(kind);
    EncodeFixed64(c->data() + 9, next_sequence++);
  }
  // Seals a NODES chunk: the body digest and the chunk CRC in one pass over
  // the payload, a cache-sized piece at a time (two passes over a 1 MiB
  // chunk would each stream it from memory).
  void SealNodes(std::string* c) {
    WriteHeader(c, kChunkNodes);
    uint32_t crc = crc32c::Value(c->data(), kChunkHeaderBytes);
    std::string_view payload(c->data() + kChunkHeaderBytes, c->size() - kChunkHeaderBytes);
    constexpr size_t kPiece = 32 << 10;
    for (size_t off = 0; off < payload.size(); off += kPiece) {
      std::string_view piece = payload.substr(off, kPiece);
      hash.Update(piece);
      crc = crc32c::Extend(crc, piece.data(), piece.size());
    }
    body_bytes += payload.size();
    PutFixed32(c, crc);
  }

  // A new chunk buffer: header placeholder, then `carry` (body bytes left over).
  // Reuses the buffer a NextInto caller handed back, if any.
  std::string Fresh(std::string_view carry) {
    std::string c = std::move(spare);
    spare = std::string();
    c.clear();
    c.reserve(kChunkOverheadBytes + std::max(max_payload, carry.size()) + 256);
    c.assign(kChunkHeaderBytes, '\0');
    c.append(carry);
    return c;
  }

  Version version;
  size_t max_payload;
  BodyWalker walker;
  Xxh3 hash;
  std::string building;  // header placeholder + body bytes of the next NODES chunk
  std::string spare;     // a buffer to reuse (from NextInto)
  uint64_t body_bytes = 0;
  uint64_t next_sequence = 0;
  bool began = false;
  bool done = false;
};

SnapshotWriter::SnapshotWriter(Version version, size_t max_chunk_bytes)
    : impl_(std::make_unique<Impl>(std::move(version), max_chunk_bytes)) {}
SnapshotWriter::~SnapshotWriter() = default;
bool SnapshotWriter::done() const { return impl_->done; }
uint64_t SnapshotWriter::chunks_emitted() const { return impl_->next_sequence; }

std::optional<std::string> SnapshotWriter::Next() {
  Impl& m = *impl_;
  if (m.done) return std::nullopt;
  if (!m.began) {
    m.began = true;
    std::string c = m.Fresh({});
    PutLengthPrefixed(&c, m.version.tree());
    PutFixed64(&c, m.version.number());
    m.Seal(&c, kChunkBegin);
    m.building = m.Fresh({});
    return c;
  }
  const size_t limit = kChunkHeaderBytes + m.max_payload;
  // Records are encoded straight into the chunk buffer; whatever passes the
  // payload limit is carried into the next chunk.
  if (m.building.size() < limit && !m.walker.finished()) m.walker.Fill(&m.building, limit);
  if (m.building.size() > kChunkHeaderBytes) {
    std::string next;
    if (m.building.size() > limit) {
      next = m.Fresh(std::string_view(m.building).substr(limit));
      m.building.resize(limit);
    } else {
      next = m.Fresh({});
    }
    std::string chunk = std::move(m.building);
    m.building = std::move(next);
    m.SealNodes(&chunk);
    return chunk;
  }
  std::string c = m.Fresh({});
  PutFixed64(&c, m.walker.nodes());
  PutFixed64(&c, m.body_bytes);
  PutFixed64(&c, m.hash.Digest());
  m.Seal(&c, kChunkEnd);
  m.done = true;
  m.building.clear();
  m.building.shrink_to_fit();
  return c;
}

bool SnapshotWriter::NextInto(std::string* chunk) {
  if (impl_->done) return false;
  impl_->spare = std::move(*chunk);
  auto next = Next();
  if (!next) return false;
  *chunk = std::move(*next);
  return true;
}

Status WriteSnapshot(const Version& version, size_t max_chunk_bytes,
                     const std::function<Status(std::string_view chunk)>& sink) {
  SnapshotWriter writer(version, max_chunk_bytes);
  std::string chunk;
  while (writer.NextInto(&chunk)) CANOPY_RETURN_IF_ERROR(sink(chunk));
  return Status::Ok();
}

std::vector<std::string> EncodeSnapshotChunks(const Version& version, size_t max_chunk_bytes) {
  std::vector<std::string> out;
  SnapshotWriter writer(version, max_chunk_bytes);
  while (auto chunk = writer.Next()) out.push_back(std::move(*chunk));
  return out;
}

// ---------------------------------------------------------------- reader

namespace {

enum class Parse { kOk, kNeedMore, kBad };

struct Cursor {
  const char* p;
  const char* end;
};

Parse ParseVarint(Cursor* c, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0, i = 0; i < 10; ++i, shift += 7) {
    if (c->p == c->end) return Parse::kNeedMore;
    uint8_t byte = static_cast<uint8_t>(*c->p++);
    if (i == 9 && byte > 1) return Parse::kBad;  // would overflow 64 bits
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *v = result;
      return Parse::kOk;
    }
  }
  return Parse::kBad;
}

Parse ParseBytes(Cursor* c, std::string_view* out) {
  uint64_t len;
  Parse r = ParseVarint(c, &len);
  if (r != Parse::kOk) return r;
  if (len > static_cast<uint64_t>(c->end - c->p)) {
    // A length beyond any chunk we could ever accept is corruption, not "need more".
    return len > (uint64_t{1} << 40) ? Parse::kBad : Parse::kNeedMore;
  }
  *out = std::string_view(c->p, static_cast<size_t>(len));
  c->p += len;
  return Parse::kOk;
}

struct Record {
  std::vector<AttributeSlot> attributes;
  uint64_t child_count = 0;
};

// Parses one node record from the front of `in`. On kOk sets *consumed.
// kNeedMore when the record continues past the end of `in` (nothing is
// copied for a value that is not complete yet).
Parse ParseRecord(std::string_view in, Record* rec, size_t* consumed, std::string* why) {
  Cursor c{in.data(), in.data() + in.size()};
  uint64_t attr_count;
  Parse r = ParseVarint(&c, &attr_count);
  if (r != Parse::kOk) return r;
  std::string_view prev_key;
  for (uint64_t i = 0; i < attr_count; ++i) {
    std::string_view key, value;
    if ((r = ParseBytes(&c, &key)) != Parse::kOk) return r;
    if ((r = ParseBytes(&c, &value)) != Parse::kOk) return r;
    if (i > 0 && !(prev_key < key)) {
      *why = "attribute keys not strictly increasing";
      return Parse::kBad;
    }
    prev_key = key;
    rec->attributes.push_back(AttributeSlot::Make(key, value));
  }
  if ((r = ParseVarint(&c, &rec->child_count)) != Parse::kOk) return r;
  *consumed = static_cast<size_t>(c.p - in.data());
  return Parse::kOk;
}

}  // namespace

struct SnapshotReader::Impl {
  struct Frame {
    std::vector<AttributeSlot> attributes;
    std::vector<NodePtr> children;
    uint64_t expected = 0;
  };

  Status error;
  std::string tree;
  uint64_t version = 0;
  uint64_t next_sequence = 0;
  bool begun = false;
  bool complete = false;

  std::string pending;  // body bytes not yet parsed (an incomplete record)
  std::vector<Frame> stack;
  NodePtr root;
  uint64_t nodes = 0;
  uint64_t body_bytes = 0;
  Xxh3 hash;

  Status Fail(Status s) {
    error = std::move(s);
    return error;
  }

  // Attaches a finished node to its parent, finishing parents in turn.
  void Complete(NodePtr node) {
    for (;;) {
      if (stack.empty()) {
        root = std::move(node);
        return;
      }
      Frame& top = stack.back();
      top.children.push_back(std::move(node));
      if (top.children.size() < top.expected) return;
      node = Node::Make(std::move(top.attributes), std::move(top.children));
      stack.pop_back();
    }
  }

  // Parses whole records from the front of `in`; returns how many bytes they took.
  Result<size_t> ParseRecords(std::string_view in) {
    size_t off = 0;
    while (off < in.size()) {
      if (root) return Status::Corruption("snapshot: bytes after the last node");
      Record rec;
      size_t used = 0;
      std::string why;
      Parse r = ParseRecord(in.substr(off), &rec, &used, &why);
      if (r == Parse::kNeedMore) break;  // the rest of this record is in the next chunk
      if (r == Parse::kBad) {
        return Status::Corruption("snapshot: bad node record" + (why.empty() ? "" : ": " + why));
      }
      off += used;
      ++nodes;
      if (rec.child_count == 0) {
        Complete(Node::Make(std::move(rec.attributes), std::vector<NodePtr>{}));
      } else {
        stack.push_back(Frame{std::move(rec.attributes), {}, rec.child_count});
      }
    }
    return off;
  }

  Status AddBody(std::string_view payload) {
    if (pending.empty()) {
      // Common case: parse straight from the chunk, keep only an incomplete tail.
      CANOPY_ASSIGN_OR_RETURN(size_t used, ParseRecords(payload));
      pending.assign(payload.substr(used));
      return Status::Ok();
    }
    pending.append(payload);
    CANOPY_ASSIGN_OR_RETURN(size_t used, ParseRecords(pending));
    pending.erase(0, used);
    return Status::Ok();
  }

  Status AddChunk(std::string_view chunk) {
    CANOPY_ASSIGN_OR_RETURN(size_t len, SnapshotChunkLength(chunk));
    if (len != chunk.size()) {
      return Status::Corruption("snapshot chunk: length field says " + std::to_string(len) + " bytes, have " +
                                std::to_string(chunk.size()));
    }
    uint8_t kind = static_cast<uint8_t>(chunk[8]);
    // The CRC is checked before anything in the chunk is used. For NODES
    // chunks the body digest is computed in the same pass (into a copy of the
    // hash state, kept only if the CRC matches).
    std::string_view payload = chunk.substr(kChunkHeaderBytes, len - kChunkOverheadBytes);
    uint32_t crc = crc32c::Value(chunk.data(), kChunkHeaderBytes);
    std::optional<Xxh3> body_hash;
    if (kind == kChunkNodes && begun && !complete) {
      body_hash.emplace(hash);
      constexpr size_t kPiece = 32 << 10;
      for (size_t off = 0; off < payload.size(); off += kPiece) {
        std::string_view piece = payload.substr(off, kPiece);
        body_hash->Update(piece);
        crc = crc32c::Extend(crc, piece.data(), piece.size());
      }
    } else {
      crc = crc32c::Extend(crc, payload.data(), payload.size());
    }
    if (DecodeFixed32(chunk.data() + len - 4) != crc) {
      return Status::Corruption("snapshot chunk " + std::to_string(next_sequence) + ": CRC32C mismatch");
    }
    uint64_t seq = DecodeFixed64(chunk.data() + 9);
    if (seq != next_sequence) {
      return Status::Corruption("snapshot chunk: sequence " + std::to_string(seq) + ", expected " +
                                std::to_string(next_sequence));
    }
    if (complete) return Status::Corruption("snapshot chunk after END");
    ByteReader r(payload);
    switch (kind) {
      case kChunkBegin: {
        if (begun) return Status::Corruption("snapshot: second BEGIN chunk");
        CANOPY_ASSIGN_OR_RETURN(std::string_view name, r.ReadLengthPrefixed());
        CANOPY_ASSIGN_OR_RETURN(uint64_t v, r.ReadFixed64());
        if (!r.empty()) return Status::Corruption("snapshot: trailing bytes in BEGIN");
        tree = std::string(name);
        version = v;
        begun = true;
        break;
      }
      case kChunkNodes: {
        if (!begun) return Status::Corruption("snapshot: NODES before BEGIN");
        hash = std::move(*body_hash);
        body_bytes += payload.size();
        CANOPY_RETURN_IF_ERROR(AddBody(payload));
        break;
      }
      case kChunkEnd: {
        if (!begun) return Status::Corruption("snapshot: END before BEGIN");
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_nodes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_bytes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_digest, r.ReadFixed64());
        if (!r.empty()) return Status::Corruption("snapshot: trailing bytes in END");
        if (!root || !pending.empty() || !stack.empty()) {
          return Status::Corruption("snapshot: END before the tree is complete");
        }
        if (want_nodes != nodes || want_bytes != body_bytes) {
          return Status::Corruption("snapshot: END says " + std::to_string(want_nodes) + " nodes / " +
                                    std::to_string(want_bytes) + " bytes, stream had " +
                                    std::to_string(nodes) + " / " + std::to_string(body_bytes));
        }
        if (want_digest != hash.Digest()) return Status::Corruption("snapshot: digest mismatch");
        complete = true;
        break;
      }
      default:
        return Status::Corruption("snapshot chunk: unknown kind " + std::to_string(kind));
    }
    ++next_sequence;
    return Status::Ok();
  }
};

SnapshotReader::SnapshotReader() : impl_(std::make_unique<Impl>()) {}
SnapshotReader::~SnapshotReader() = default;
bool SnapshotReader::begun() const { return impl_->begun; }
const std::string& SnapshotReader::tree() const { return impl_->tree; }
uint64_t SnapshotReader::version() const { return impl_->version; }
bool SnapshotReader::complete() const { return impl_->complete; }

Status SnapshotReader::AddChunk(std::string_view chunk) {
  if (!impl_->error.ok()) return impl_->error;
  Status s = impl_->AddChunk(chunk);
  if (!s.ok()) return impl_->Fail(std::move(s));
  return s;
}

Result<Version> SnapshotReader::Finish() {
  if (!impl_->error.ok()) return impl_->error;
  if (!impl_->complete) return impl_->Fail(Status::Corruption("snapshot stream ended before its END chunk"));
  return Version(impl_->tree, impl_->version, impl_->root);
}

Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks) {
  SnapshotReader reader;
  for (const auto& c : chunks) CANOPY_RETURN_IF_ERROR(reader.AddChunk(c));
  return reader.Finish();
}

}  // namespace canopy::tree::csn1
