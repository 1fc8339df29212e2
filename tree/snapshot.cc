#include "tree/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tree/node_image.h"

namespace canopy::tree {

namespace {

constexpr uint8_t kBlockHead = 1;
constexpr uint8_t kBlockNodes = 2;
constexpr uint8_t kBlockTail = 3;

struct Xxh3 {
  Xxh3() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~Xxh3() {
    if (state) XXH3_freeState(state);
  }
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void Update(const char* p, size_t n) { XXH3_64bits_update(state, p, n); }
  uint64_t Digest() const { return XXH3_64bits_digest(state); }
  XXH3_state_t* state;
};

inline char* PutVarintRaw(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}
inline size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------- body encoder

// Produces the body of a tree in post-order, whole records at a time. Lazy
// subtrees (still pointing into an image) are copied from the image's bytes:
// a subtree's records are contiguous and position-independent.
class BodyEncoder {
 public:
  explicit BodyEncoder(NodePtr root) : root_(std::move(root)) {}

  enum class Step { kFull, kDone };
  // Appends to *out while it stays at or under `limit` bytes; a record (or a
  // copied piece) that does not fit ends the call with kFull, unless *out
  // holds no body bytes yet (past `floor`), in which case it is appended
  // anyway (a block of its own). ResourceExhausted if that one item would
  // pass `hard_limit`.
  Result<Step> Fill(std::string* out, size_t floor, size_t limit, size_t hard_limit) {
    for (;;) {
      if (copy_.img) {
        size_t b = copy_.img->BlockOf(copy_.pos);
        const NodeImage::Block& blk = copy_.img->blocks()[b];
        uint64_t piece = std::min(blk.logical + blk.bytes, copy_.end) - copy_.pos;
        if (out->size() + piece > limit && out->size() > floor) return Step::kFull;
        if (out->size() + piece > hard_limit) return TooLarge(piece);
        ReserveWithTrailer(out, piece);
        out->append(copy_.img->data() + blk.physical + (copy_.pos - blk.logical), piece);
        copy_.pos += piece;
        logical_ += piece;
        if (copy_.pos == copy_.end) copy_ = Copy{};
        continue;
      }
      if (!started_) {
        started_ = true;
        Visit(root_.get());
        continue;
      }
      if (stack_.empty()) return Step::kDone;
      Frame& f = stack_.back();
      if (f.next < f.count) {
        if (f.next >= f.span.first + f.span.count) f.span = f.node->child_vector().SpanAt(f.next);
        const Node* child = f.span.items[f.next - f.span.first].get();
        ++f.next;
        Visit(child);
        continue;
      }
      // All children done: the record of f.node.
      const Node& n = *f.node;
      size_t attr_count = n.attribute_count();
      size_t size = VarintBytes(attr_count) + VarintBytes(f.count);
      n.ForEachAttribute([&](AttributeView a) {
        size += VarintBytes(a.key.size()) + a.key.size() + VarintBytes(a.value.size()) + a.value.size();
      });
      for (size_t j = f.base; j < offsets_.size(); ++j) size += VarintBytes(logical_ - offsets_[j]);
      if (out->size() + size > limit && out->size() > floor) return Step::kFull;
      if (out->size() + size > hard_limit) return TooLarge(size);
      size_t at = out->size();
      // Room for the block's CRC too: a record bigger than the block limit
      // (e.g. a node with MiB-sized attributes) would otherwise make the
      // 4-byte trailer reallocate and copy the whole block once more.
      ReserveWithTrailer(out, size);
      out->resize(at + size);
      char* p = out->data() + at;
      p = PutVarintRaw(p, attr_count);
      n.ForEachAttribute([&](AttributeView a) {
        p = PutVarintRaw(p, a.key.size());
        std::memcpy(p, a.key.data(), a.key.size());
        p += a.key.size();
        p = PutVarintRaw(p, a.value.size());
        std::memcpy(p, a.value.data(), a.value.size());
        p += a.value.size();
      });
      p = PutVarintRaw(p, f.count);
      for (size_t j = f.base; j < offsets_.size(); ++j) p = PutVarintRaw(p, logical_ - offsets_[j]);
      offsets_.resize(f.base);
      offsets_.push_back(logical_);
      logical_ += size;
      ++nodes_;
      stack_.pop_back();
    }
  }

  uint64_t nodes() const { return nodes_; }
  uint64_t body_bytes() const { return logical_; }

 private:
  struct Frame {
    const Node* node;
    size_t next;
    size_t count;
    size_t base;  // offsets_ index of this node's first child
    PersistentVector<NodePtr>::Span span;
  };
  struct Copy {
    NodeImagePtr img;
    uint64_t pos = 0, end = 0;
  };

  // Makes room for `bytes` more plus a block's CRC trailer (4 bytes), growing
  // geometrically. Without the trailer's room, a record bigger than the
  // block limit (a node with MiB-sized attributes) fills the string to its
  // capacity, and sealing the block reallocates and copies it all again.
  static void ReserveWithTrailer(std::string* out, uint64_t bytes) {
    const size_t need = out->size() + static_cast<size_t>(bytes) + 4;
    if (out->capacity() < need) out->reserve(std::max(need, 2 * out->capacity()));
  }

  Status TooLarge(uint64_t bytes) {
    return Status::ResourceExhausted("snapshot: a node record of " + std::to_string(bytes) +
                                     " bytes does not fit in a block (at most " +
                                     std::to_string(kMaxSnapshotChunkBytes) + ")");
  }

  void Visit(const Node* n) {
    NodeImagePtr img;
    uint64_t at;
    if (NodeImageAccess::Source(*n, &img, &at)) {
      // The subtree runs from its first leaf's record to the end of its own.
      size_t hint = 0;
      RecordParts root = ParseRecordParts(img->Record(at, &hint));
      uint64_t start = at;
      for (RecordParts r = root; r.child_count > 0;) {
        const char* d = r.deltas;
        start -= TakeVarint(&d);
        r = ParseRecordParts(img->Record(start, &hint));
      }
      uint64_t end = at + static_cast<uint64_t>(root.end - img->Record(at, &hint));
      offsets_.push_back(logical_ + (at - start));
      const NodeImage::Summary& whole = img->summary();
      nodes_ += (start == 0 && end == whole.body_bytes) ? whole.nodes : CountRecords(*img, start, end);
      copy_ = Copy{std::move(img), start, end};
      return;
    }
    stack_.push_back(Frame{n, 0, n->child_count(), offsets_.size(), {nullptr, 0, 0}});
  }

  static uint64_t CountRecords(const NodeImage& img, uint64_t start, uint64_t end) {
    uint64_t count = 0;
    size_t hint = 0;
    while (start < end) {
      const char* r = img.Record(start, &hint);
      start += static_cast<uint64_t>(ParseRecordParts(r).end - r);
      ++count;
    }
    return count;
  }

  NodePtr root_;
  std::vector<Frame> stack_;
  std::vector<uint64_t> offsets_;  // logical offsets of finished subtrees not yet claimed
  Copy copy_;
  uint64_t logical_ = 0;
  uint64_t nodes_ = 0;
  bool started_ = false;
};

// ---------------------------------------------------------------- checker

// Checks a stream block by block, and records where each NODES payload lies.
struct StreamChecker {
  std::string tree;
  uint64_t version = 0;
  uint64_t next_sequence = 0;
  uint64_t physical = 0;  // stream bytes accepted
  uint64_t logical = 0;   // body bytes accepted
  uint64_t nodes = 0;
  bool begun = false;
  bool complete = false;
  Xxh3 hash;
  std::vector<uint64_t> open;  // logical offsets of subtrees no parent has claimed yet
  std::vector<NodeImage::Block> blocks;
  uint64_t digest = 0;

  static Status Bad(const std::string& why) { return Status::Corruption("snapshot: " + why); }

  // A varint from [*p, end): false if cut short or longer than 64 bits.
  static inline bool Varint(const char** p, const char* end, uint64_t* v) {
    const char* q = *p;
    if (q < end && static_cast<uint8_t>(*q) < 0x80) [[likely]] {
      *v = static_cast<uint8_t>(*q);
      *p = q + 1;
      return true;
    }
    // Two bytes (child deltas of a wide node): no loop.
    if (end - q >= 2 && static_cast<uint8_t>(q[1]) < 0x80) {
      *v = (static_cast<uint64_t>(static_cast<uint8_t>(q[0]) & 0x7f)) |
           (static_cast<uint64_t>(static_cast<uint8_t>(q[1])) << 7);
      *p = q + 2;
      return true;
    }
    uint64_t result = 0;
    for (int shift = 0, i = 0; i < 10; ++i, shift += 7) {
      if (q == end) return false;
      uint8_t byte = static_cast<uint8_t>(*q++);
      if (i == 9 && byte > 1) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        *p = q;
        return true;
      }
    }
    return false;
  }

  // Checks the records of one NODES payload (at logical offset `logical`):
  // syntax, key order, and that each child reference names exactly the
  // subtree that precedes it (post-order).
  Status CheckRecords(const char* p, const char* end) {
    const char* const start = p;
    while (p < end) {
      const char* rec = p;
      uint64_t attr_count, len, child_count;
      if (!Varint(&p, end, &attr_count)) return BadAt(rec, start, "record cut short");
      const char* prev_key = nullptr;
      uint64_t prev_len = 0;
      for (uint64_t i = 0; i < attr_count; ++i) {
        if (!Varint(&p, end, &len) || len > static_cast<uint64_t>(end - p)) return BadAt(rec, start, "record cut short");
        const char* key = p;
        p += len;
        if (prev_key != nullptr &&
            !(std::string_view(prev_key, prev_len) < std::string_view(key, len))) {
          return BadAt(rec, start, "attribute keys not strictly increasing");
        }
        prev_key = key;
        prev_len = len;
        if (!Varint(&p, end, &len) || len > static_cast<uint64_t>(end - p)) return BadAt(rec, start, "record cut short");
        p += len;
      }
      if (!Varint(&p, end, &child_count)) return BadAt(rec, start, "record cut short");
      uint64_t at = logical + static_cast<uint64_t>(rec - start);
      if (child_count > 0) {
        if (child_count > open.size()) return BadAt(rec, start, "claims more children than precede it");
        size_t base = open.size() - static_cast<size_t>(child_count);
        for (size_t j = base; j < open.size(); ++j) {
          uint64_t delta;
          if (!Varint(&p, end, &delta)) return BadAt(rec, start, "record cut short");
          if (at - delta != open[j] || delta == 0 || delta > at) {
            return BadAt(rec, start, "a child reference does not name the subtree before it");
          }
        }
        open.resize(base);
      }
      open.push_back(at);
      ++nodes;
    }
    return Status::Ok();
  }
  Status BadAt(const char* rec, const char* start, const char* why) const {
    return Bad(std::string("record at body offset ") + std::to_string(logical + static_cast<uint64_t>(rec - start)) +
               ": " + why);
  }

  Status AddBlock(std::string_view block) {
    CANOPY_ASSIGN_OR_RETURN(size_t len, SnapshotChunkLength(block));
    if (len != block.size()) {
      return Status::Corruption("snapshot block: length field says " + std::to_string(len) + " bytes, have " +
                                std::to_string(block.size()));
    }
    if (DecodeFixed32(block.data() + len - 4) != crc32c::Value(block.data(), len - 4)) {
      return Status::Corruption("snapshot block " + std::to_string(next_sequence) + ": CRC32C mismatch");
    }
    uint8_t kind = static_cast<uint8_t>(block[8]);
    uint64_t seq = DecodeFixed64(block.data() + 9);
    if (seq != next_sequence) {
      return Status::Corruption("snapshot block: sequence " + std::to_string(seq) + ", expected " +
                                std::to_string(next_sequence));
    }
    if (complete) return Bad("block after TAIL");
    std::string_view payload = block.substr(kChunkHeaderBytes, len - kChunkOverheadBytes);
    ByteReader r(payload);
    switch (kind) {
      case kBlockHead: {
        if (begun) return Bad("second HEAD block");
        CANOPY_ASSIGN_OR_RETURN(std::string_view name, r.ReadLengthPrefixed(1024));
        CANOPY_ASSIGN_OR_RETURN(uint64_t v, r.ReadFixed64());
        if (!r.empty()) return Bad("trailing bytes in HEAD");
        tree = std::string(name);
        version = v;
        begun = true;
        break;
      }
      case kBlockNodes: {
        if (!begun) return Bad("NODES before HEAD");
        if (payload.empty()) return Bad("empty NODES block");
        CANOPY_RETURN_IF_ERROR(CheckRecords(payload.data(), payload.data() + payload.size()));
        hash.Update(payload.data(), payload.size());
        blocks.push_back({logical, physical + kChunkHeaderBytes, payload.size()});
        logical += payload.size();
        break;
      }
      case kBlockTail: {
        if (!begun) return Bad("TAIL before HEAD");
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_nodes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_bytes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_digest, r.ReadFixed64());
        if (!r.empty()) return Bad("trailing bytes in TAIL");
        if (open.size() != 1) return Bad("TAIL before the tree is complete (" + std::to_string(open.size()) + " subtrees without a parent)");
        if (want_nodes != nodes || want_bytes != logical) {
          return Bad("TAIL says " + std::to_string(want_nodes) + " nodes / " + std::to_string(want_bytes) +
                     " bytes, stream had " + std::to_string(nodes) + " / " + std::to_string(logical));
        }
        if (want_digest != hash.Digest()) return Bad("digest mismatch");
        digest = want_digest;
        complete = true;
        break;
      }
      default:
        return Status::Corruption("snapshot block: unknown kind " + std::to_string(kind));
    }
    ++next_sequence;
    physical += len;
    return Status::Ok();
  }

  NodeImage::Summary Summary() const {
    NodeImage::Summary s;
    s.tree = tree;
    s.version = version;
    s.nodes = nodes;
    s.body_bytes = logical;
    s.digest = digest;
    s.root = open.empty() ? 0 : open.back();
    return s;
  }
};

Version VersionOver(const NodeImagePtr& img) {
  return Version(img->summary().tree, img->summary().version, NodeImageAccess::Root(img));
}

// Checks a whole stream held at [data, data + size).
Status CheckWhole(const char* data, size_t size, StreamChecker* checker) {
  size_t off = 0;
  while (off < size && !checker->complete) {
    CANOPY_ASSIGN_OR_RETURN(size_t len, SnapshotChunkLength(std::string_view(data + off, size - off)));
    if (len > size - off) return Status::Corruption("snapshot: truncated block at byte " + std::to_string(off));
    CANOPY_RETURN_IF_ERROR(checker->AddBlock(std::string_view(data + off, len)));
    off += len;
  }
  if (!checker->complete) return Status::Corruption("snapshot stream ended before its TAIL block");
  if (off != size) return Status::Corruption("snapshot: bytes after the TAIL block");
  return Status::Ok();
}

Status ErrnoError(int err, const std::string& what) {
  return Status::IOError(what + ": " + std::strerror(err));
}

// Maps `path` read-only (whole file).
Result<std::pair<const char*, size_t>> MapFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return ErrnoError(err, "open " + path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError(err, "fstat " + path);
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Status::Corruption(path + ": empty snapshot file");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoError(err, "mmap " + path);
  return std::make_pair(static_cast<const char*>(p), size);
}

}  // namespace

// ---------------------------------------------------------------- digests, framing

uint64_t TreeDigest(const NodePtr& root) {
  NodeImagePtr img;
  uint64_t at;
  if (NodeImageAccess::Source(*root, &img, &at) && at == img->summary().root) return img->summary().digest;
  BodyEncoder enc(root);
  Xxh3 hash;
  std::string buf;
  constexpr size_t kPiece = 256 << 10;
  for (;;) {
    buf.clear();
    auto step = enc.Fill(&buf, 0, kPiece, SIZE_MAX);
    hash.Update(buf.data(), buf.size());
    if (!step.ok() || *step == BodyEncoder::Step::kDone) break;
  }
  return hash.Digest();
}

Result<size_t> SnapshotChunkLength(std::string_view prefix) {
  if (prefix.size() < 8) return Status::Corruption("snapshot block: truncated header");
  uint32_t magic = DecodeFixed32(prefix.data());
  if (magic != kSnapshotMagic) {
    if (magic == kLegacySnapshotMagic) {
      return Status::Corruption("snapshot is in format " + std::to_string(kLegacySnapshotFormat) +
                                " (CSN1 chunks); this canopy reads format " + std::to_string(kSnapshotFormat) +
                                " (CBK1 blocks)");
    }
    return Status::Corruption("snapshot block: bad magic (not format " + std::to_string(kSnapshotFormat) +
                              ", CBK1)");
  }
  uint32_t len = DecodeFixed32(prefix.data() + 4);
  if (len < kChunkOverheadBytes || len > kMaxSnapshotChunkBytes) {
    return Status::Corruption("snapshot block: implausible length " + std::to_string(len));
  }
  return static_cast<size_t>(len);
}

// ---------------------------------------------------------------- writer

struct SnapshotWriter::Impl {
  Impl(Version v, size_t max_chunk)
      : version(std::move(v)),
        limit(std::clamp(max_chunk, kMinSnapshotChunkBytes, kMaxSnapshotChunkBytes) - 4),
        encoder(version.root()) {
    // The untouched root of an image of this very tree and version: its
    // blocks are the stream, byte for byte (no encoding, no CRC to compute).
    uint64_t at;
    if (NodeImageAccess::Source(*version.root(), &verbatim, &at) &&
        (at != verbatim->summary().root || verbatim->summary().tree != version.tree() ||
         verbatim->summary().version != version.number())) {
      verbatim.reset();
    }
  }

  void Seal(std::string* c, uint8_t kind) {
    EncodeFixed32(c->data(), kSnapshotMagic);
    EncodeFixed32(c->data() + 4, static_cast<uint32_t>(c->size() + 4));
    (*c)[8] = static_cast<char>(kind);
    EncodeFixed64(c->data() + 9, next_sequence++);
    PutFixed32(c, crc32c::Value(c->data(), c->size()));
  }
  // Seals a NODES block: the body digest and the CRC in one pass over the
  // payload, a cache-sized piece at a time.
  void SealNodes(std::string* c) {
    EncodeFixed32(c->data(), kSnapshotMagic);
    EncodeFixed32(c->data() + 4, static_cast<uint32_t>(c->size() + 4));
    (*c)[8] = static_cast<char>(kBlockNodes);
    EncodeFixed64(c->data() + 9, next_sequence++);
    uint32_t crc = crc32c::Value(c->data(), kChunkHeaderBytes);
    constexpr size_t kPiece = 32 << 10;
    for (size_t off = kChunkHeaderBytes; off < c->size(); off += kPiece) {
      size_t n = std::min(kPiece, c->size() - off);
      hash.Update(c->data() + off, n);
      crc = crc32c::Extend(crc, c->data() + off, n);
    }
    PutFixed32(c, crc);
  }
  std::string Fresh() {
    std::string c = std::move(spare);
    spare = std::string();
    c.clear();
    c.reserve(limit + 4);
    c.assign(kChunkHeaderBytes, '\0');
    return c;
  }

  Version version;
  size_t limit;  // block bytes before the CRC
  BodyEncoder encoder;
  NodeImagePtr verbatim;  // set when the stream is this image's bytes
  size_t verbatim_at = 0;
  Xxh3 hash;
  std::string spare;
  Status status;
  uint64_t next_sequence = 0;
  bool began = false;
  bool body_done = false;
  bool done = false;
};

SnapshotWriter::SnapshotWriter(Version version, size_t max_chunk_bytes)
    : impl_(std::make_unique<Impl>(std::move(version), max_chunk_bytes)) {}
SnapshotWriter::~SnapshotWriter() = default;
bool SnapshotWriter::done() const { return impl_->done; }
const Status& SnapshotWriter::status() const { return impl_->status; }
uint64_t SnapshotWriter::chunks_emitted() const { return impl_->next_sequence; }

std::optional<std::string> SnapshotWriter::Next() {
  Impl& m = *impl_;
  if (m.done || !m.status.ok()) return std::nullopt;
  std::string c = m.Fresh();
  if (m.verbatim) {
    const char* at = m.verbatim->data() + m.verbatim_at;
    size_t len = DecodeFixed32(at + 4);  // checked when the image was opened
    c.assign(at, len);
    m.verbatim_at += len;
    ++m.next_sequence;
    if (m.verbatim_at == m.verbatim->size()) m.done = true;
    return c;
  }
  if (!m.began) {
    m.began = true;
    PutLengthPrefixed(&c, m.version.tree());
    PutFixed64(&c, m.version.number());
    m.Seal(&c, kBlockHead);
    return c;
  }
  if (!m.body_done) {
    auto step = m.encoder.Fill(&c, kChunkHeaderBytes, m.limit, kMaxSnapshotChunkBytes - 4);
    if (!step.ok()) {
      m.status = step.status();
      return std::nullopt;
    }
    if (*step == BodyEncoder::Step::kDone) m.body_done = true;
    if (c.size() > kChunkHeaderBytes) {
      m.SealNodes(&c);
      return c;
    }
  }
  PutFixed64(&c, m.encoder.nodes());
  PutFixed64(&c, m.encoder.body_bytes());
  PutFixed64(&c, m.hash.Digest());
  m.Seal(&c, kBlockTail);
  m.done = true;
  return c;
}

bool SnapshotWriter::NextInto(std::string* chunk) {
  if (impl_->done || !impl_->status.ok()) return false;
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
  return writer.status();
}

std::vector<std::string> EncodeSnapshotChunks(const Version& version, size_t max_chunk_bytes) {
  std::vector<std::string> out;
  SnapshotWriter writer(version, max_chunk_bytes);
  while (auto chunk = writer.Next()) out.push_back(std::move(*chunk));
  return out;
}

// ---------------------------------------------------------------- reader

struct SnapshotReader::Impl {
  explicit Impl(Keep k) : keep(k) {}
  Keep keep;
  StreamChecker checker;
  std::string bytes;
  Status error;
};

SnapshotReader::SnapshotReader(Keep keep) : impl_(std::make_unique<Impl>(keep)) {}
SnapshotReader::~SnapshotReader() = default;
bool SnapshotReader::begun() const { return impl_->checker.begun; }
const std::string& SnapshotReader::tree() const { return impl_->checker.tree; }
uint64_t SnapshotReader::version() const { return impl_->checker.version; }
bool SnapshotReader::complete() const { return impl_->checker.complete; }
uint64_t SnapshotReader::bytes() const { return impl_->checker.physical; }

Status SnapshotReader::AddChunk(std::string_view chunk) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  Status s = m.checker.AddBlock(chunk);
  if (!s.ok()) return m.error = std::move(s);
  if (m.keep == Keep::kBytes) m.bytes.append(chunk);
  return Status::Ok();
}

Result<Version> SnapshotReader::Finish() {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (m.keep != Keep::kBytes) return Status::InvalidArgument("SnapshotReader::Finish: the bytes were not kept");
  if (!m.checker.complete) return m.error = Status::Corruption("snapshot stream ended before its TAIL block");
  NodeImagePtr img =
      NodeImage::FromBuffer(std::move(m.bytes), std::move(m.checker.blocks), m.checker.Summary());
  m.error = Status::InvalidArgument("SnapshotReader already finished");
  return VersionOver(img);
}

Result<Version> SnapshotReader::FinishFromFile(const std::string& path) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (!m.checker.complete) return m.error = Status::Corruption("snapshot stream ended before its TAIL block");
  CANOPY_ASSIGN_OR_RETURN(auto mapped, MapFile(path));
  if (mapped.second != m.checker.physical) {
    ::munmap(const_cast<char*>(mapped.first), mapped.second);
    return Status::Corruption(path + ": holds " + std::to_string(mapped.second) + " bytes, the stream had " +
                              std::to_string(m.checker.physical));
  }
  NodeImagePtr img =
      NodeImage::FromMapping(mapped.first, mapped.second, std::move(m.checker.blocks), m.checker.Summary());
  m.error = Status::InvalidArgument("SnapshotReader already finished");
  return VersionOver(img);
}

Result<Version> OpenSnapshotImage(std::string bytes) {
  StreamChecker checker;
  CANOPY_RETURN_IF_ERROR(CheckWhole(bytes.data(), bytes.size(), &checker));
  NodeImagePtr img = NodeImage::FromBuffer(std::move(bytes), std::move(checker.blocks), checker.Summary());
  return VersionOver(img);
}

Result<Version> OpenSnapshotFile(const std::string& path) {
  CANOPY_ASSIGN_OR_RETURN(auto mapped, MapFile(path));
  StreamChecker checker;
  Status s = CheckWhole(mapped.first, mapped.second, &checker);
  if (!s.ok()) {
    ::munmap(const_cast<char*>(mapped.first), mapped.second);
    return s.WithContext(path);
  }
  NodeImagePtr img =
      NodeImage::FromMapping(mapped.first, mapped.second, std::move(checker.blocks), checker.Summary());
  return VersionOver(img);
}

Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks) {
  SnapshotReader reader;
  for (const auto& c : chunks) CANOPY_RETURN_IF_ERROR(reader.AddChunk(c));
  return reader.Finish();
}

}  // namespace canopy::tree
