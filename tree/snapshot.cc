#include "tree/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <semaphore>
#include <thread>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CANOPY_SNAPSHOT_AVX2 1
#endif

#include "base/buffer_pool.h"
#include "base/coding.h"
#include "base/crc32c.h"
#include "base/fd.h"
#include "tree/node_image.h"
#include "tree/xxh3.h"

namespace canopy::tree {

namespace {

constexpr uint8_t kBlockHead = 1;
constexpr uint8_t kBlockNodes = 2;
constexpr uint8_t kBlockTail = 3;

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

#ifdef CANOPY_SNAPSHOT_AVX2
// AVX2 forms of the checker's hot loops (StreamChecker::CheckRecords),
// used when the CPU has AVX2 (checked once at run time; the build targets
// baseline x86-64). Each checks exactly what the scalar loop after it
// checks, over a prefix of the work, and returns how far it got; the scalar
// loop goes on from there, so a mismatch is always reported by the scalar
// code, with the same message at the same record.
std::atomic<bool> vectors_allowed{true};  // AllowSnapshotCheckVectors
bool UseAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && vectors_allowed.load(std::memory_order_relaxed);
}

// 16 bytes at lo and 16 at hi, as one vector.
__attribute__((target("avx2"), always_inline)) inline __m256i Load2x16(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// The two-byte varints of at - s[0..3] (each in [2^7, 2^14)), one per 64-bit lane.
__attribute__((target("avx2"), always_inline)) inline __m256i TwoByteVarints(__m256i at, const uint64_t* s, __m256i low7,
                                                                              __m256i more) {
  const __m256i d = _mm256_sub_epi64(at, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  return _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(d, low7), more), _mm256_slli_epi64(_mm256_srli_epi64(d, 7), 8));
}

// Leaves of one shape, four per step: record k (at r + k * step, k < n,
// `span` readable bytes each; span is 16 or 32) matches when its first span
// bytes under `mask` equal `bits`. Writes the logical offset of each
// matching record (at + k * step) to top[k]. Returns the number of records
// matched, a multiple of 4 (the records of the first group with a mismatch
// are left to the caller).
__attribute__((target("avx2"))) size_t MatchShapeRunAvx2(const uint8_t* r, size_t step, size_t span, size_t n,
                                                         const uint8_t mask[32], const uint8_t bits[32], uint64_t at,
                                                         uint64_t* top) {
  // Span 16: two records per vector, against the 16-byte mask in both halves.
  const bool pairs = span == 16;
  const __m256i m = pairs ? _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mask)))
                          : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mask));
  const __m256i b = pairs ? _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)))
                          : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits));
  const auto s = static_cast<long long>(step);
  const __m256i advance = _mm256_set1_epi64x(4 * s);
  __m256i offsets =
      _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(at)), _mm256_setr_epi64x(0, s, 2 * s, 3 * s));
  size_t i = 0;
  for (; i + 4 <= n; i += 4, r += 4 * step) {
    __m256i eq = _mm256_set1_epi8(-1);
    if (pairs) {
      eq = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(Load2x16(r, r + step), m), b),
                            _mm256_cmpeq_epi8(_mm256_and_si256(Load2x16(r + 2 * step, r + 3 * step), m), b));
    } else {
      for (size_t k = 0; k < 4; ++k) {
        const __m256i rec = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + k * step));
        eq = _mm256_and_si256(eq, _mm256_cmpeq_epi8(_mm256_and_si256(rec, m), b));
      }
    }
    if (_mm256_movemask_epi8(eq) != -1) break;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(top + i), offsets);
    offsets = _mm256_add_epi64(offsets, advance);
  }
  return i;
}

// Child references, eight per step: the references at r name the subtrees
// stack[0], stack[1], ... of a parent at logical offset `at`, and each must be
// the two-byte minimal varint of at - stack[k]. Only used while every delta
// of the group is in [2^7, 2^14) (the caller's precondition for two-byte
// words; deltas decrease along the stack). n: references left; r has at
// least 16 readable bytes per full group taken. Returns the number of
// references matched, a multiple of 8.
__attribute__((target("avx2"))) size_t MatchTwoByteRefsAvx2(const uint8_t* r, const uint8_t* end,
                                                            const uint64_t* stack, size_t n, uint64_t at) {
  const __m256i vat = _mm256_set1_epi64x(static_cast<long long>(at));
  const __m256i low7 = _mm256_set1_epi64x(0x7f);
  const __m256i more = _mm256_set1_epi64x(0x80);
  size_t i = 0;
  for (; i + 8 <= n && end - r >= 16; i += 8, r += 16) {
    if (at - stack[i] >= 0x4000 || at - stack[i + 7] < 0x80) break;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r));
    const __m256i lo = _mm256_cvtepu16_epi64(raw);
    const __m256i hi = _mm256_cvtepu16_epi64(_mm_srli_si128(raw, 8));
    const __m256i eq = _mm256_and_si256(_mm256_cmpeq_epi64(lo, TwoByteVarints(vat, stack + i, low7, more)),
                                        _mm256_cmpeq_epi64(hi, TwoByteVarints(vat, stack + i + 4, low7, more)));
    if (_mm256_movemask_epi8(eq) != -1) break;
  }
  return i;
}
#endif  // CANOPY_SNAPSHOT_AVX2

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
  // Logical offsets of subtrees no parent has claimed yet: a stack of
  // open_depth entries in open (whose size is only its capacity).
  std::vector<uint64_t> open;
  size_t open_depth = 0;
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

  // The last childless record checked in full, if it is at most 32 bytes:
  // its length, and its bytes with every value byte masked out. A record
  // that equals it on every unmasked byte parses to the same counts,
  // lengths and keys (only value bytes differ), so it is exactly as valid;
  // such runs (leaves with the same keys and value lengths) are checked by
  // comparing words, not by parsing.
  size_t shape_len = 0;
  uint64_t shape_mask[4] = {0, 0, 0, 0};
  uint64_t shape_bits[4] = {0, 0, 0, 0};

  // Byte i of the eight is bits 8i..8i+7 (little-endian on every host).
  static inline uint64_t Load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
    return v;
  }
  // The two-byte varint of d (2^7 <= d < 2^14) as a little-endian word.
  static inline uint64_t TwoByteVarint(uint64_t d) { return (d & 0x7f) | 0x80 | ((d >> 7) << 8); }
  // The minimal varint encoding of v must be at *p (child deltas: a writer
  // always writes the minimal form, and the expected value is known, so
  // nothing read from the record decides where the next field starts).
  static inline bool ExpectVarint(const uint8_t** p, const uint8_t* end, uint64_t v) {
    const uint8_t* q = *p;
    if (v < 0x80) {
      if (q >= end || *q != v) return false;
      *p = q + 1;
      return true;
    }
    if (v < 0x4000) {
      if (end - q < 2 || q[0] != ((v & 0x7f) | 0x80) || q[1] != (v >> 7)) return false;
      *p = q + 2;
      return true;
    }
    if (v < 0x200000) {  // a child more than 16 KiB back: common, so no memcmp call
      if (end - q < 3 || q[0] != ((v & 0x7f) | 0x80) || q[1] != (((v >> 7) & 0x7f) | 0x80) || q[2] != (v >> 14)) {
        return false;
      }
      *p = q + 3;
      return true;
    }
    uint8_t want[10];
    size_t n = 0;
    while (v >= 0x80) {
      want[n++] = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    want[n++] = static_cast<uint8_t>(v);
    if (static_cast<size_t>(end - q) < n || std::memcmp(q, want, n) != 0) return false;
    *p = q + n;
    return true;
  }

  // Checks the records of one NODES payload [start, end) (at logical offset
  // `logical`) that begin in [from, limit): syntax, key order, and that each
  // child reference names exactly the subtree that precedes it (post-order),
  // as the minimal varint of its delta. A record may run past `limit` (not
  // past `end`). *resume: where the first record at or after `limit` begins.
  Status CheckRecords(const char* start_c, const char* from_c, const char* limit_c, const char* end_c,
                      const char** resume) {
    const auto* const start = reinterpret_cast<const uint8_t*>(start_c);
    const auto* const limit = reinterpret_cast<const uint8_t*>(limit_c);
    const auto* const end = reinterpret_cast<const uint8_t*>(end_c);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(from_c);
    const char* why = nullptr;
    const uint8_t* rec = p;
    // The stack of unclaimed subtrees, as a raw array.
    size_t depth = open_depth;
    if (open.size() < 1024) open.resize(1024);
    uint64_t* stack = open.data();
    size_t capacity = open.size();
    uint64_t count = 0;
    const uint64_t base_logical = logical;  // a local: the stack's stores cannot alias it
    auto push = [&](uint64_t at) {
      if (depth == capacity) [[unlikely]] {
        open.resize(capacity * 2);
        stack = open.data();
        capacity = open.size();
      }
      stack[depth++] = at;
      ++count;
    };
    while (p < limit) {
      if (shape_len != 0) {
        const uint64_t m0 = shape_mask[0], m1 = shape_mask[1], m2 = shape_mask[2], m3 = shape_mask[3];
        const uint64_t b0 = shape_bits[0], b1 = shape_bits[1], b2 = shape_bits[2], b3 = shape_bits[3];
        const size_t step = shape_len;
        const size_t span = step <= 16 ? 16 : 32;  // bytes compared per record
        // Batches of records that all start before `limit`, have `span`
        // bytes to read and fit on the stack: a counted loop with no other
        // test than the comparison.
        while (p < limit && static_cast<size_t>(end - p) >= span) {
          size_t n = std::min(static_cast<size_t>(limit - p + step - 1) / step,
                              (static_cast<size_t>(end - p) - span) / step + 1);
          if (depth == capacity) {
            open.resize(capacity * 2);
            stack = open.data();
            capacity = open.size();
          }
          n = std::min(n, capacity - depth);
          const uint64_t at = base_logical + static_cast<uint64_t>(p - start);
          uint64_t* const top = stack + depth;
          size_t i = 0;
#ifdef CANOPY_SNAPSHOT_AVX2
          if (n >= 8 && UseAvx2()) {
            i = MatchShapeRunAvx2(p, step, span, n, reinterpret_cast<const uint8_t*>(shape_mask),
                                  reinterpret_cast<const uint8_t*>(shape_bits), at, top);
          }
#endif
          if (span == 16) {
            for (const uint8_t* r = p + i * step; i < n; ++i, r += step) {
              if ((((Load64(r) & m0) ^ b0) | ((Load64(r + 8) & m1) ^ b1)) != 0) break;
              top[i] = at + i * step;
            }
          } else {
            for (const uint8_t* r = p + i * step; i < n; ++i, r += step) {
              if ((((Load64(r) & m0) ^ b0) | ((Load64(r + 8) & m1) ^ b1) | ((Load64(r + 16) & m2) ^ b2) |
                   ((Load64(r + 24) & m3) ^ b3)) != 0) {
                break;
              }
              top[i] = at + i * step;
            }
          }
          depth += i;
          count += i;
          p += i * step;
          if (i < n) break;  // a record of another shape
        }
        if (p >= limit) break;
      }
      // One record in full.
      rec = p;
      const char* q = reinterpret_cast<const char*>(p);
      const char* const cend = end_c;
      uint8_t keep[32];  // 0xff: a byte the record's validity depends on; 0: a value byte
      std::memset(keep, 0xff, sizeof keep);
      bool maskable = true;
      uint64_t attr_count, len, child_count;
      if (!Varint(&q, cend, &attr_count)) {
        why = "record cut short";
        break;
      }
      const char* prev_key = nullptr;
      uint64_t prev_len = 0;
      for (uint64_t i = 0; i < attr_count && why == nullptr; ++i) {
        if (!Varint(&q, cend, &len) || len > static_cast<uint64_t>(cend - q)) {
          why = "record cut short";
          break;
        }
        const char* key = q;
        q += len;
        if (prev_key != nullptr && !(std::string_view(prev_key, prev_len) < std::string_view(key, len))) {
          why = "attribute keys not strictly increasing";
          break;
        }
        prev_key = key;
        prev_len = len;
        if (!Varint(&q, cend, &len) || len > static_cast<uint64_t>(cend - q)) {
          why = "record cut short";
          break;
        }
        size_t value_at = static_cast<size_t>(reinterpret_cast<const uint8_t*>(q) - rec);
        if (value_at + len > sizeof keep) {
          maskable = false;
        } else if (len > 0) {
          std::memset(keep + value_at, 0, len);
        }
        q += len;
      }
      if (why != nullptr) break;
      if (!Varint(&q, cend, &child_count)) {
        why = "record cut short";
        break;
      }
      const uint64_t at = base_logical + static_cast<uint64_t>(rec - start);
      auto* r = reinterpret_cast<const uint8_t*>(q);
      if (child_count > 0) {
        if (child_count > depth) {
          why = "claims more children than precede it";
          break;
        }
        const size_t base = depth - static_cast<size_t>(child_count);
        size_t j = base;
#ifdef CANOPY_SNAPSHOT_AVX2
        if (depth - base >= 8 && UseAvx2()) {
          const size_t matched = MatchTwoByteRefsAvx2(r, end, stack + base, depth - base, at);
          j += matched;
          r += 2 * matched;
        }
#endif
        for (; j < depth;) {
          // The stack's offsets increase, so the expected deltas decrease:
          // four in a row are all two-byte varints when the first is below
          // 2^14 and the fourth at least 2^7; they are compared as one word.
          if (depth - j >= 4 && end - r >= 8 && at - stack[j] < 0x4000 && at - stack[j + 3] >= 0x80) {
            const uint64_t want = TwoByteVarint(at - stack[j]) | (TwoByteVarint(at - stack[j + 1]) << 16) |
                                  (TwoByteVarint(at - stack[j + 2]) << 32) |
                                  (TwoByteVarint(at - stack[j + 3]) << 48);
            if (Load64(r) != want) {
              why = "a child reference does not name the subtree before it";
              break;
            }
            r += 8;
            j += 4;
            continue;
          }
          if (!ExpectVarint(&r, end, at - stack[j])) {
            why = "a child reference does not name the subtree before it";
            break;
          }
          ++j;
        }
        if (why != nullptr) break;
        depth = base;
      }
      push(at);
      const size_t rec_len = static_cast<size_t>(r - rec);
      if (child_count == 0 && maskable && rec_len <= sizeof keep) {
        std::memset(keep + rec_len, 0, sizeof keep - rec_len);
        uint8_t bytes[32] = {};
        std::memcpy(bytes, rec, rec_len);
        for (int w = 0; w < 4; ++w) {
          shape_mask[w] = Load64(keep + 8 * w);
          shape_bits[w] = Load64(bytes + 8 * w) & shape_mask[w];
        }
        shape_len = rec_len;
      }
      p = r;
    }
    open_depth = depth;
    nodes += count;
    *resume = reinterpret_cast<const char*>(p);
    if (why != nullptr) return BadAt(reinterpret_cast<const char*>(rec), start_c, why);
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
    if (static_cast<uint8_t>(block[8]) == kBlockNodes) return AddNodesBlock(block);
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
      case kBlockTail: {
        if (!begun) return Bad("TAIL before HEAD");
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_nodes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_bytes, r.ReadFixed64());
        CANOPY_ASSIGN_OR_RETURN(uint64_t want_digest, r.ReadFixed64());
        if (!r.empty()) return Bad("trailing bytes in TAIL");
        if (open_depth != 1) {
          return Bad("TAIL before the tree is complete (" + std::to_string(open_depth) + " subtrees without a parent)");
        }
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

  // A NODES block of the right length. The CRC, the digest and the record
  // check go through the payload together, a piece at a time, so the bytes
  // come from memory once. The piece stays in L2 (128 KiB): the CRC, first,
  // streams it in with the hardware prefetcher running ahead, and the other
  // two read it from L2. 16 KiB pieces (L1-sized) made the CRC wait on memory
  // at each piece's start: with 8-byte values (1 M nodes, 16 MB) the whole
  // check ran at 10.4-10.7 GB/s against 12.0-13.0 with 128-256 KiB pieces.
  // The verdicts keep their order: a CRC mismatch is reported before
  // anything found in the records (which are parsed with bounds checks, so
  // unverified bytes are safe to read).
  Status AddNodesBlock(std::string_view block) {
    const char* const data = block.data();
    const char* const payload = data + kChunkHeaderBytes;
    const char* const payload_end = data + block.size() - 4;
    uint32_t crc = crc32c::Value(data, kChunkHeaderBytes);
    const bool check = begun && !complete && payload < payload_end;
    Status records;
    const char* next = payload;
    constexpr size_t kPiece = 128 << 10;
    for (const char* piece = payload; piece < payload_end;) {
      const char* piece_end = piece + std::min<size_t>(kPiece, static_cast<size_t>(payload_end - piece));
      crc = crc32c::Extend(crc, piece, static_cast<size_t>(piece_end - piece));
      if (check && records.ok()) {
        hash.Update(piece, static_cast<size_t>(piece_end - piece));
        records = CheckRecords(payload, next, piece_end, payload_end, &next);
      }
      piece = piece_end;
    }
    CANOPY_RETURN_IF_ERROR(NodesBlockFraming(block, crc));
    CANOPY_RETURN_IF_ERROR(records);
    AcceptNodesBlock(block.size());
    return Status::Ok();
  }

  // A NODES block's verdicts before its records', in AddNodesBlock's order:
  // `crc` is over all of `block` but its last 4 bytes.
  Status NodesBlockFraming(std::string_view block, uint32_t crc) const {
    if (DecodeFixed32(block.data() + block.size() - 4) != crc) {
      return Status::Corruption("snapshot block " + std::to_string(next_sequence) + ": CRC32C mismatch");
    }
    uint64_t seq = DecodeFixed64(block.data() + 9);
    if (seq != next_sequence) {
      return Status::Corruption("snapshot block: sequence " + std::to_string(seq) + ", expected " +
                                std::to_string(next_sequence));
    }
    if (complete) return Bad("block after TAIL");
    if (!begun) return Bad("NODES before HEAD");
    if (block.size() == kChunkOverheadBytes) return Bad("empty NODES block");
    return Status::Ok();
  }

  // Records a checked NODES block of `size` bytes.
  void AcceptNodesBlock(size_t size) {
    const uint64_t bytes = size - kChunkOverheadBytes;
    blocks.push_back({logical, physical + kChunkHeaderBytes, bytes});
    logical += bytes;
    ++next_sequence;
    physical += size;
  }

  // AddBlock for the `len` bytes at `offset` in file `fd` (a whole block,
  // its length taken from its header): see SnapshotReader::AddChunkFromFile.
  Status AddBlockFromFile(int fd, uint64_t offset, size_t len);

  NodeImage::Summary Summary() const {
    NodeImage::Summary s;
    s.tree = tree;
    s.version = version;
    s.nodes = nodes;
    s.body_bytes = logical;
    s.digest = digest;
    s.root = open_depth == 0 ? 0 : open[open_depth - 1];
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

// Reads exactly n bytes at `offset` of fd.
Status PreadExactly(int fd, char* dst, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoError(errno, "read snapshot block");
    if (got == 0) return Status::Corruption("snapshot: file ends inside a block");
    dst += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// Blocks in files are read to be checked (AddBlockFromFile) through a
// buffer of this size lent by the process-wide pool (base/buffer_pool.h):
// memory already mapped and touched. Reading the file's pages through a
// fresh mapping instead costs a fault per page on first touch; on a VM that
// shadows page tables that made a check 2-3x slower than pread.
constexpr size_t kCheckWindowBytes = 2u << 20;

// At most this many file blocks are checked at once in a process (one per
// hardware thread, at least 2): checks are CPU-bound, so more at once only
// take more buffers, and a buffer's first use touches fresh pages (a
// joiner's trees arrive on many streams, whose last blocks all complete
// within a few ms of each other). A check waits for its turn.
std::counting_semaphore<>& CheckTurns() {
  static auto* turns = new std::counting_semaphore<>(
      static_cast<std::ptrdiff_t>(std::clamp(std::thread::hardware_concurrency(), 2u, 64u)));
  return *turns;
}
class CheckTurn {
 public:
  CheckTurn() { CheckTurns().acquire(); }
  ~CheckTurn() { CheckTurns().release(); }
  CheckTurn(const CheckTurn&) = delete;
  CheckTurn& operator=(const CheckTurn&) = delete;
};

// A read-only mapping of the pages that hold [offset, offset + len) of fd,
// set up page by page as they are touched; unmapped when it goes.
class BlockMapping {
 public:
  static Result<BlockMapping> Map(int fd, uint64_t offset, size_t len) {
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t start = offset / page * page;
    BlockMapping m;
    m.size_ = static_cast<size_t>(offset + len - start);
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(start));
    if (p == MAP_FAILED) return ErrnoError(errno, "mmap snapshot block");
    m.base_ = static_cast<const char*>(p);
    m.block_ = std::string_view(m.base_ + (offset - start), len);
    return m;
  }
  BlockMapping(BlockMapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), size_(o.size_), block_(o.block_) {}
  BlockMapping& operator=(BlockMapping&&) = delete;
  ~BlockMapping() {
    if (base_ != nullptr) ::munmap(const_cast<char*>(base_), size_);
  }
  std::string_view block() const { return block_; }

 private:
  BlockMapping() = default;
  const char* base_ = nullptr;
  size_t size_ = 0;
  std::string_view block_;
};

Status StreamChecker::AddBlockFromFile(int fd, uint64_t offset, size_t len) {
  CheckTurn turn;
  PooledBuffer window = PooledBuffer::Take(std::min(len, kCheckWindowBytes));
  if (len <= kCheckWindowBytes) {  // every block a writer cuts at the default size
    CANOPY_RETURN_IF_ERROR(PreadExactly(fd, window.data(), len, offset));
    return AddBlock(std::string_view(window.data(), len));
  }
  // A block larger than a window holds one record bigger than the chunk
  // size (SnapshotWriter). Its CRC and digest go over its bytes read into
  // the window piece by piece; its records are then checked through a
  // mapping, which touches only the pages that hold record structure, not
  // those of a large value.
  CANOPY_ASSIGN_OR_RETURN(BlockMapping mapped, BlockMapping::Map(fd, offset, len));
  const std::string_view block = mapped.block();
  CANOPY_RETURN_IF_ERROR(PreadExactly(fd, window.data(), kChunkHeaderBytes, offset));
  CANOPY_ASSIGN_OR_RETURN(size_t header_len, SnapshotChunkLength(std::string_view(window.data(), 8)));
  if (header_len != len || static_cast<uint8_t>(window.data()[8]) != kBlockNodes) {
    return AddBlock(block);  // not what the caller read, or no NODES block: the general verdicts
  }
  const bool check = begun && !complete;
  uint32_t crc = 0;
  for (uint64_t at = 0; at < len - 4;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kCheckWindowBytes, len - 4 - at));
    CANOPY_RETURN_IF_ERROR(PreadExactly(fd, window.data(), n, offset + at));
    crc = crc32c::Extend(crc, window.data(), n);
    const size_t skip = at < kChunkHeaderBytes ? static_cast<size_t>(kChunkHeaderBytes - at) : 0;
    if (check && n > skip) hash.Update(window.data() + skip, n - skip);
    at += n;
  }
  CANOPY_RETURN_IF_ERROR(NodesBlockFraming(block, crc));
  const char* const payload = block.data() + kChunkHeaderBytes;
  const char* const payload_end = block.data() + len - 4;
  const char* next = payload;
  CANOPY_RETURN_IF_ERROR(CheckRecords(payload, payload, payload_end, payload_end, &next));
  AcceptNodesBlock(len);
  return Status::Ok();
}

// CheckWhole for the `size` bytes of file fd, block by block with
// AddBlockFromFile: nothing is mapped but the pages of blocks larger than a
// check window.
Status CheckFile(int fd, uint64_t size, StreamChecker* checker) {
  uint64_t off = 0;
  while (off < size && !checker->complete) {
    char head[8];
    const size_t have = static_cast<size_t>(std::min<uint64_t>(sizeof head, size - off));
    CANOPY_RETURN_IF_ERROR(PreadExactly(fd, head, have, off));
    CANOPY_ASSIGN_OR_RETURN(size_t len, SnapshotChunkLength(std::string_view(head, have)));
    if (len > size - off)
      return Status::Corruption("snapshot: truncated block at byte " + std::to_string(off));
    CANOPY_RETURN_IF_ERROR(checker->AddBlockFromFile(fd, off, len));
    off += len;
  }
  if (!checker->complete) return Status::Corruption("snapshot stream ended before its TAIL block");
  if (off != size) return Status::Corruption("snapshot: bytes after the TAIL block");
  return Status::Ok();
}

// How MapFile sets up the mapping's page tables.
enum class Populate {
  kNow,     // every page now, in one call: the caller reads them all at once
  kOnTouch  // page by page as they are first read: most may never be
};

// Opens `path` to be mapped: its descriptor and size (never 0).
Result<std::pair<UniqueFd, size_t>> OpenForMapping(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return ErrnoError(err, "open " + path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "fstat " + path);
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return Status::Corruption(path + ": empty snapshot file");
  return std::make_pair(std::move(fd), size);
}

// Maps the first `size` bytes of fd (`path`) read-only.
Result<const char*> MapFd(int fd, size_t size, Populate populate, const std::string& path) {
  const int flags = MAP_PRIVATE | (populate == Populate::kNow ? MAP_POPULATE : 0);
  void* p = ::mmap(nullptr, size, PROT_READ, flags, fd, 0);
  if (p == MAP_FAILED) return ErrnoError(errno, "mmap " + path);
  return static_cast<const char*>(p);
}

// Maps `path` read-only (whole file).
Result<std::pair<const char*, size_t>> MapFile(const std::string& path, Populate populate) {
  CANOPY_ASSIGN_OR_RETURN(auto opened, OpenForMapping(path));
  CANOPY_ASSIGN_OR_RETURN(const char* p, MapFd(opened.first.get(), opened.second, populate, path));
  return std::make_pair(p, opened.second);
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

Status SnapshotReader::AddChunkFromFile(int fd, uint64_t offset, size_t length) {
  Impl& m = *impl_;
  if (!m.error.ok()) return m.error;
  if (m.keep == Keep::kBytes)
    return Status::InvalidArgument("SnapshotReader::AddChunkFromFile keeps no bytes");
  Status s = m.checker.AddBlockFromFile(fd, offset, length);
  if (!s.ok()) return m.error = std::move(s);
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
  // The blocks were checked as they landed: nothing reads the file now, and
  // a lazily opened tree may never touch most of it, so its pages are not
  // all mapped up front (which set up a page-table entry per page again).
  CANOPY_ASSIGN_OR_RETURN(auto mapped, MapFile(path, Populate::kOnTouch));
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

void AllowSnapshotCheckVectors(bool allowed) {
#ifdef CANOPY_SNAPSHOT_AVX2
  vectors_allowed.store(allowed, std::memory_order_relaxed);
#else
  (void)allowed;
#endif
}

Result<Version> OpenSnapshotImage(std::string bytes) {
  StreamChecker checker;
  CANOPY_RETURN_IF_ERROR(CheckWhole(bytes.data(), bytes.size(), &checker));
  NodeImagePtr img = NodeImage::FromBuffer(std::move(bytes), std::move(checker.blocks), checker.Summary());
  return VersionOver(img);
}

Result<Version> OpenSnapshotFile(const std::string& path) {
  // Checked whole right away, read block by block (CheckFile); then mapped
  // for the lazy nodes, page by page as they are read.
  CANOPY_ASSIGN_OR_RETURN(auto opened, OpenForMapping(path));
  UniqueFd& fd = opened.first;
  StreamChecker checker;
  Status s = CheckFile(fd.get(), opened.second, &checker);
  if (!s.ok()) return s.WithContext(path);
  CANOPY_ASSIGN_OR_RETURN(const char* mapped, MapFd(fd.get(), opened.second, Populate::kOnTouch, path));
  NodeImagePtr img =
      NodeImage::FromMapping(mapped, opened.second, std::move(checker.blocks), checker.Summary());
  return VersionOver(img);
}

Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks) {
  SnapshotReader reader;
  for (const auto& c : chunks) CANOPY_RETURN_IF_ERROR(reader.AddChunk(c));
  return reader.Finish();
}

}  // namespace canopy::tree
