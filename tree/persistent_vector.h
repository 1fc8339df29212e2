// PersistentVector<T>: an immutable-by-sharing sequence with O(log n) edits.
//
// A counted B+tree of 32-way chunks (leaves hold up to 32 elements, inner
// chunks up to 32 children with their subtree sizes). Copying a vector is
// O(1): the copy shares every chunk. An edit (Set, Insert, Erase) copies only
// the chunks on the path from the root to the element it touches, O(log32 n)
// chunks of at most 32 entries, and shares everything else with the vector it
// came from. A chunk referenced by this vector alone (reference count 1 along
// the whole path) is edited in place, so a batch of edits to a vector nobody
// else holds costs no copies at all. A copied inner chunk borrows the
// children it shares with its original instead of taking a reference on
// each (Borrow, below), so a copy touches the chunks on its path and not
// their 32 children's counts.
//
// Small vectors stay small: a vector of n <= 32 elements is a single leaf
// with room for the next power of two (or exactly n when built in bulk).
// Appending fills leaves completely (a full leaf split by an append leaves
// the old leaf full), so a vector built by PushBack uses ~8.5 bytes per
// 8-byte element.
//
// T must be nothrow default-constructible, copyable and movable (RefPtr<U>,
// pointers, integers). A T whose copy, destruction or key touches memory
// outside the element names it: `const void* prefetch_address() const`
// (nullptr: none), or `get()` for a pointer-like T; copies and releases of a
// chunk fetch those lines together rather than one miss at a time.
//
// Keyed vectors (sorted sequences searched by key): with a KeyOf functor,
// `KeyOf{}(const T&)` gives each element's search key, a small trivially
// copyable value that orders like the element's value. It may point at the
// element itself (its address in its leaf): every inner chunk holds, for
// each child, the key of that child's first element (its separator),
// refreshed on every edit path (Set, Insert, Erase: each edit re-reads the
// separators of the chunks it wrote from their children, which it has in
// cache), so no edit can leave a separator behind, and a chunk keeps alive
// each child whose elements its separators point into (by a reference of
// its own or through the chunk it was copied from). A separator is read
// only through the chunk that holds it. PartitionPoint then reads one separator
// per probe instead of descending to the first leaf of each probed child:
// at 10^6 elements a search takes about 20 dependent cache misses rather
// than ~50 (the leaf's 32 elements are prefetched together). A keyed vector
// offers no MutableAt (a write through a reference could change a key
// without refreshing its separators). Memory: one Key more per inner-chunk
// slot, about sizeof(Key) / 32 bytes per element.
//
// Thread safety: as a value type. Different vectors that share chunks may be
// read and edited from different threads at once (reference counts are
// atomic and a shared chunk is never written); one vector must not be edited
// while another thread reads it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace canopy::tree {

// No separators (the default): PersistentVector<T>.
struct NoKeys {};

namespace persistent_vector_detail {
template <typename T, typename KeyOf>
struct KeyType {
  using type = std::remove_cvref_t<decltype(std::declval<const KeyOf&>()(std::declval<const T&>()))>;
};
template <typename T>
struct KeyType<T, NoKeys> {
  using type = char;  // unused
};
}  // namespace persistent_vector_detail

template <typename T, typename KeyOf = NoKeys>
class PersistentVector {
  static constexpr bool kKeyed = !std::is_same_v<KeyOf, NoKeys>;

 public:
  static constexpr size_t kFanout = 32;
  // The separator type of a keyed vector (char, unused, otherwise).
  using Key = typename persistent_vector_detail::KeyType<T, KeyOf>::type;
  static_assert(std::is_trivially_copyable_v<Key> && alignof(Key) <= alignof(uint64_t));

  PersistentVector() noexcept = default;
  PersistentVector(const PersistentVector& o) noexcept : root_(o.root_) {
    if (root_) Ref(root_);
  }
  PersistentVector(PersistentVector&& o) noexcept : root_(std::exchange(o.root_, nullptr)) {}
  PersistentVector& operator=(const PersistentVector& o) noexcept {
    PersistentVector(o).swap(*this);
    return *this;
  }
  PersistentVector& operator=(PersistentVector&& o) noexcept {
    PersistentVector(std::move(o)).swap(*this);
    return *this;
  }
  ~PersistentVector() {
    if (root_) Unref(root_);
  }
  void swap(PersistentVector& o) noexcept { std::swap(root_, o.root_); }

  // Builds a vector from `items` in O(n), leaves packed full.
  static PersistentVector FromVector(std::vector<T>&& items) {
    PersistentVector v;
    if (items.empty()) return v;
    std::vector<Chunk*> level;
    for (size_t i = 0; i < items.size(); i += kFanout) {
      size_t n = std::min(kFanout, items.size() - i);
      Chunk* leaf = AllocLeaf(n);
      for (size_t k = 0; k < n; ++k) new (&Items(leaf)[k]) T(std::move(items[i + k]));
      leaf->count = static_cast<uint16_t>(n);
      leaf->total = n;
      level.push_back(leaf);
    }
    uint8_t height = 0;
    while (level.size() > 1) {
      ++height;
      std::vector<Chunk*> up;
      for (size_t i = 0; i < level.size(); i += kFanout) {
        size_t n = std::min(kFanout, level.size() - i);
        Chunk* inner = AllocInner(n, height);
        BorrowOf(inner).owned = AllOwned(n);
        for (size_t k = 0; k < n; ++k) {
          Kids(inner)[k] = level[i + k];
          Sizes(inner)[k] = level[i + k]->total;
          SetSeparator(inner, k);
          inner->total += level[i + k]->total;
        }
        inner->count = static_cast<uint16_t>(n);
        up.push_back(inner);
      }
      level = std::move(up);
    }
    v.root_ = level[0];
    return v;
  }

  size_t size() const noexcept { return root_ ? static_cast<size_t>(root_->total) : 0; }
  bool empty() const noexcept { return root_ == nullptr; }

  // REQUIRES: i < size(). O(log n).
  const T& operator[](size_t i) const noexcept {
    const Chunk* c = root_;
    while (c->height > 0) {
      const uint64_t* s = Sizes(c);
      size_t j = 0;
      while (i >= s[j]) i -= static_cast<size_t>(s[j++]);
      c = Kids(c)[j];
    }
    return Items(c)[i];
  }

  // The leaf that holds element i: `count` elements starting at `items`,
  // the first of which is element `first`. For sequential scans.
  struct Span {
    const T* items;
    size_t first;
    size_t count;
  };
  // REQUIRES: i < size().
  Span SpanAt(size_t i) const noexcept {
    const Chunk* c = root_;
    size_t first = 0;
    while (c->height > 0) {
      const uint64_t* s = Sizes(c);
      size_t j = 0;
      while (i >= s[j]) {
        i -= static_cast<size_t>(s[j]);
        first += static_cast<size_t>(s[j++]);
      }
      c = Kids(c)[j];
    }
    return Span{Items(c), first, c->count};
  }

  // For a predicate that holds for a prefix of the vector and for nothing
  // after it (e.g. "key < k" over elements sorted by key): the length of that
  // prefix. One descent, a binary search per chunk: O(log n) predicate calls.
  // `pred` takes a `const T&`, or for a keyed vector a `Key` (the element's
  // KeyOf), read from the separators without visiting the children.
  template <typename Pred>
  size_t PartitionPoint(Pred&& pred) const {
    if (!root_) return 0;
    const Chunk* c = root_;
    size_t base = 0;
    while (c->height > 0) {
      // The last child whose first element still satisfies pred (or child 0).
      size_t lo = 1, hi = c->count;
      if constexpr (kKeyed) {
        const Key* seps = Seps(c);
        // A binary search over a cold chunk would wait for one line at a
        // time; fetch the separators (and the sizes summed below) at once.
        PrefetchBytes(seps, c->count * sizeof(Key));
        PrefetchBytes(Sizes(c), c->count * sizeof(uint64_t));
        while (lo < hi) {
          size_t mid = lo + (hi - lo) / 2;
          if (pred(seps[mid])) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
      } else {
        while (lo < hi) {
          size_t mid = lo + (hi - lo) / 2;
          if (pred(FirstOf(Kids(c)[mid]))) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
      }
      size_t j = lo - 1;
      for (size_t k = 0; k < j; ++k) base += static_cast<size_t>(Sizes(c)[k]);
      c = Kids(c)[j];
    }
    size_t lo = 0, hi = c->count;
    const T* items = Items(c);
    if constexpr (kKeyed) {
      // Computing a leaf element's key may read what it points to: fetch
      // them all at once rather than one miss per probe.
      for (size_t k = 0; k < c->count; ++k) PrefetchOutside<0>(items[k]);
    }
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      bool below;
      if constexpr (kKeyed) {
        below = pred(KeyOf{}(items[mid]));
      } else {
        below = pred(items[mid]);
      }
      if (below) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return base + lo;
  }

  // Calls f(const T&) for every element in order.
  template <typename F>
  void ForEach(F&& f) const {
    if (root_) ForEachIn(root_, f);
  }

  // A writable reference to element i (copying shared chunks on its path).
  // REQUIRES: i < size(). Not for keyed vectors (use Set).
  T& MutableAt(size_t i)
    requires(!kKeyed)
  {
    Slot slot = RootSlot(&root_);
    for (;;) {
      Chunk* c = Writable(slot, (*slot.at)->count);
      if (c->height == 0) return Items(c)[i];
      uint64_t* s = Sizes(c);
      size_t j = 0;
      while (i >= s[j]) i -= static_cast<size_t>(s[j++]);
      slot = KidSlot(c, j);
    }
  }
  // Replaces element i (copying shared chunks on its path; a keyed vector
  // refreshes the separators on that path). REQUIRES: i < size().
  void Set(size_t i, T value) {
    if constexpr (!kKeyed) {
      MutableAt(i) = std::move(value);
    } else {
      SetIn(RootSlot(&root_), i, value);
    }
  }

  // Inserts `value` before element i. REQUIRES: i <= size().
  void Insert(size_t i, T value) {
    if (!root_) {
      root_ = AllocLeaf(1);
      new (&Items(root_)[0]) T(std::move(value));
      root_->count = 1;
      root_->total = 1;
      return;
    }
    Chunk* split = InsertIn(RootSlot(&root_), i, value);
    if (split) {
      Chunk* up = AllocInner(2, static_cast<uint8_t>(root_->height + 1));
      BorrowOf(up).owned = AllOwned(2);
      Kids(up)[0] = root_;
      Kids(up)[1] = split;
      Sizes(up)[0] = root_->total;
      Sizes(up)[1] = split->total;
      SetSeparator(up, 0);
      SetSeparator(up, 1);
      up->count = 2;
      up->total = root_->total + split->total;
      root_ = up;
    }
  }
  void PushBack(T value) { Insert(size(), std::move(value)); }

  // Removes element i. REQUIRES: i < size().
  void Erase(size_t i) {
    EraseIn(RootSlot(&root_), i);
    if (root_->count == 0) {
      Unref(root_);
      root_ = nullptr;
      return;
    }
    while (root_->height > 0 && root_->count == 1) {
      Chunk* only = Kids(root_)[0];
      if (!Owns(root_, 0)) Ref(only);  // root_'s base kept it alive; the vector takes a reference of its own
      root_->count = 0;  // root_ is ours alone after EraseIn: free it (and its base) without releasing `only`
      Unref(root_);
      root_ = only;
    }
  }

  // Bytes held by chunks reachable from this vector (shared ones included).
  size_t ChunkBytes() const {
    size_t bytes = 0;
    if (root_) CountBytes(root_, &bytes);
    return bytes;
  }

 private:
  struct Chunk {
    std::atomic<uint32_t> refs{1};
    uint16_t count = 0;    // elements (leaf) or children (inner) in use
    uint8_t height = 0;    // 0: leaf
    uint8_t capacity = 0;  // slots allocated
    uint64_t total = 0;    // elements in this subtree
  };
  static_assert(sizeof(Chunk) == 16);
  static_assert(alignof(T) <= alignof(Chunk), "entries follow the 16-byte header unpadded");

  // Copying an inner chunk without a reference per child. A copy (Clone)
  // of an inner chunk normally takes a reference on each of its up to 32
  // children, and freeing either copy later drops one again: in a large
  // vector those children's counts are cold cache lines, two misses per
  // child per commit that copies the chunk, though the copy and the
  // original share every child but the one the edit replaces. Instead the
  // copy holds one reference to the chunk it was copied from (its base),
  // which keeps every child they share alive, and counted references only
  // to the children it changes (bit k of `owned`: this chunk holds its own
  // reference to child k). A chunk that is some copy's base is never
  // edited again (its count stays above 1 while the copy lives, and it is
  // reachable from the copy only as a base). Chains are cut short: a copy
  // of a chunk that is kMaxBorrowDepth copies down a chain takes its own
  // reference on every child again, so a chain keeps at most that many
  // older chunks (not their children, which the newer copies share) alive
  // past their versions, and a copy costs ~32 / (kMaxBorrowDepth + 1)
  // child references on average instead of 32. Leaves always own their
  // elements (copying a leaf copies the elements).
  static constexpr uint8_t kMaxBorrowDepth = 4;
  struct Borrow {
    Chunk* base = nullptr;  // the chunk this one was copied from, held by one reference; or none
    uint32_t owned = 0;     // bit k: this chunk holds a counted reference to child k
    uint8_t depth = 0;      // chunks in the chain of bases below this one
  };
  static_assert(sizeof(Borrow) == 16);
  static_assert(kFanout <= 32, "one bit per child in Borrow::owned");

  // A leaf is followed by T[capacity]; an inner chunk by its Borrow, then
  // uint64_t sizes[capacity], then Chunk* kids[capacity].
  static T* Items(Chunk* c) noexcept { return reinterpret_cast<T*>(c + 1); }
  static const T* Items(const Chunk* c) noexcept { return reinterpret_cast<const T*>(c + 1); }
  static Borrow& BorrowOf(Chunk* c) noexcept { return *reinterpret_cast<Borrow*>(c + 1); }
  static const Borrow& BorrowOf(const Chunk* c) noexcept { return *reinterpret_cast<const Borrow*>(c + 1); }
  static uint64_t* Sizes(Chunk* c) noexcept { return reinterpret_cast<uint64_t*>(&BorrowOf(c) + 1); }
  static const uint64_t* Sizes(const Chunk* c) noexcept {
    return reinterpret_cast<const uint64_t*>(&BorrowOf(c) + 1);
  }
  static Chunk** Kids(Chunk* c) noexcept { return reinterpret_cast<Chunk**>(Sizes(c) + c->capacity); }
  static Chunk* const* Kids(const Chunk* c) noexcept {
    return reinterpret_cast<Chunk* const*>(Sizes(c) + c->capacity);
  }
  // Keyed vectors: Key seps[capacity] after the kids of an inner chunk.
  static Key* Seps(Chunk* c) noexcept { return static_cast<Key*>(static_cast<void*>(Kids(c) + c->capacity)); }
  static const Key* Seps(const Chunk* c) noexcept {
    return static_cast<const Key*>(static_cast<const void*>(Kids(c) + c->capacity));
  }
  static constexpr size_t kSepBytes = kKeyed ? sizeof(Key) : 0;

  // Ownership bits of inner chunks (Borrow::owned).
  static uint32_t AllOwned(size_t n) noexcept { return static_cast<uint32_t>((uint64_t{1} << n) - 1); }
  static bool Owns(const Chunk* c, size_t k) noexcept { return (BorrowOf(c).owned >> k) & 1u; }
  // The mask with a bit `v` inserted at k (bits from k move up one).
  static uint32_t MaskInsert(uint32_t m, size_t k, bool v) noexcept {
    const uint64_t low = m & ((uint64_t{1} << k) - 1);
    const uint64_t high = (uint64_t{m} >> k) << (k + 1);
    return static_cast<uint32_t>(low | high | (uint64_t{v} << k));
  }
  // The mask without bit k (bits above it move down one).
  static uint32_t MaskErase(uint32_t m, size_t k) noexcept {
    const uint64_t low = m & ((uint64_t{1} << k) - 1);
    const uint64_t high = (uint64_t{m} >> (k + 1)) << k;
    return static_cast<uint32_t>(low | high);
  }

  // Where a chunk is held: the vector's root (or a chunk a caller holds
  // alone), which is always a counted reference, or child `index` of the
  // inner chunk `parent`, which may be borrowed from parent's base.
  struct Slot {
    Chunk** at;
    Chunk* parent;  // nullptr: a counted reference
    size_t index;
    bool Owned() const noexcept { return parent == nullptr || Owns(parent, index); }
  };
  static Slot RootSlot(Chunk** at) noexcept { return Slot{at, nullptr, 0}; }
  static Slot KidSlot(Chunk* c, size_t j) noexcept { return Slot{&Kids(c)[j], c, j}; }

  // Fetches the memory outside element t that copying, releasing or keying
  // it touches (see the top of this file), for writing when kWrite is 1.
  template <int kWrite>
  static void PrefetchOutside(const T& t) noexcept {
    if constexpr (requires { t.prefetch_address(); }) {
      if (const void* p = t.prefetch_address()) __builtin_prefetch(p, kWrite);
    } else if constexpr (requires { t.get(); }) {
      __builtin_prefetch(t.get(), kWrite);
    }
  }
  // Fetches [p, p + bytes) for reading, one prefetch per cache line.
  static void PrefetchBytes(const void* p, size_t bytes) noexcept {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t at = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; at < end; at += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(at), 0);
  }
  // The key of the first element under c (REQUIRES: keyed, c not empty).
  static Key FirstKey(const Chunk* c) noexcept {
    return c->height == 0 ? KeyOf{}(Items(c)[0]) : Seps(c)[0];
  }
  // Re-reads the separator of child k of inner chunk c from the child.
  static void SetSeparator(Chunk* c, size_t k) noexcept {
    if constexpr (kKeyed) Seps(c)[k] = FirstKey(Kids(c)[k]);
  }
  // Copies inner entry `from` of chunk a to slot `to` of chunk b (sizes,
  // kids, separators; not the ownership bit).
  static void MoveEntry(const Chunk* a, size_t from, Chunk* b, size_t to) noexcept {
    Kids(b)[to] = Kids(a)[from];
    Sizes(b)[to] = Sizes(a)[from];
    if constexpr (kKeyed) Seps(b)[to] = Seps(a)[from];
  }

  static size_t CapacityFor(size_t n) noexcept {
    size_t cap = 1;
    while (cap < n) cap <<= 1;
    return std::min(cap, kFanout);
  }
  static size_t LeafBytes(size_t cap) { return sizeof(Chunk) + cap * sizeof(T); }
  static size_t InnerBytes(size_t cap) {
    return sizeof(Chunk) + sizeof(Borrow) + cap * (sizeof(uint64_t) + sizeof(Chunk*) + kSepBytes);
  }

  static Chunk* AllocLeaf(size_t cap) {
    Chunk* c = new (::operator new(LeafBytes(cap))) Chunk();
    c->capacity = static_cast<uint8_t>(cap);
    return c;
  }
  // An inner chunk with no children, no base and no ownership bits.
  static Chunk* AllocInner(size_t cap, uint8_t height) {
    Chunk* c = new (::operator new(InnerBytes(cap))) Chunk();
    c->capacity = static_cast<uint8_t>(cap);
    c->height = height;
    new (&BorrowOf(c)) Borrow();
    return c;
  }
  static void Free(Chunk* c) noexcept {
    c->~Chunk();
    ::operator delete(c);
  }

  static void Ref(Chunk* c) noexcept { c->refs.fetch_add(1, std::memory_order_relaxed); }
  static void Unref(Chunk* c) noexcept {
    if (c->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // As in Clone: fetch every entry's line first, so that the decrements
    // (each on a line no one has touched since, in a large tree) overlap
    // their misses instead of paying one memory latency each.
    if (c->height == 0) {
      for (size_t k = 0; k < c->count; ++k) PrefetchOutside<1>(Items(c)[k]);
      for (size_t k = 0; k < c->count; ++k) Items(c)[k].~T();
    } else {
      const Borrow& b = BorrowOf(c);
      for (size_t k = 0; k < c->count; ++k) {
        if (Owns(c, k)) __builtin_prefetch(Kids(c)[k], 1);
      }
      for (size_t k = 0; k < c->count; ++k) {
        if (Owns(c, k)) Unref(Kids(c)[k]);
      }
      if (b.base != nullptr) Unref(b.base);
    }
    Free(c);
  }

  // A copy of c (any reference count) with room for `cap` entries; its
  // entries are alive as long as it is.
  //
  // A leaf's copy copies the elements. An inner chunk's copy borrows its
  // children from c (see Borrow) unless c is kMaxBorrowDepth down a chain;
  // then it takes a reference on every child, and in a large tree those
  // children are spread over memory: one atomic increment per cold cache
  // line, each waiting for its miss. Fetching all the lines first lets the
  // misses overlap, so that copy costs about one memory latency, not 32.
  static Chunk* Clone(const Chunk* c, size_t cap) {
    Chunk* n;
    if (c->height == 0) {
      for (size_t k = 0; k < c->count; ++k) PrefetchOutside<1>(Items(c)[k]);
      n = AllocLeaf(cap);
      for (size_t k = 0; k < c->count; ++k) new (&Items(n)[k]) T(Items(c)[k]);
    } else {
      const Borrow& cb = BorrowOf(c);
      n = AllocInner(cap, c->height);
      Borrow& nb = BorrowOf(n);
      if (cb.depth < kMaxBorrowDepth) {
        for (size_t k = 0; k < c->count; ++k) MoveEntry(c, k, n, k);
        nb.base = const_cast<Chunk*>(c);
        nb.depth = static_cast<uint8_t>(cb.depth + 1);
        Ref(nb.base);
      } else {
        for (size_t k = 0; k < c->count; ++k) __builtin_prefetch(Kids(c)[k], 1);
        for (size_t k = 0; k < c->count; ++k) {
          MoveEntry(c, k, n, k);
          Ref(Kids(c)[k]);
        }
        nb.owned = AllOwned(c->count);
      }
    }
    n->count = c->count;
    n->total = c->total;
    return n;
  }
  // Moves the entries of a chunk we alone hold into a larger one and frees
  // it (an inner chunk's base and ownership bits move with them).
  static Chunk* Grow(Chunk* c, size_t cap) {
    Chunk* n;
    if (c->height == 0) {
      n = AllocLeaf(cap);
      for (size_t k = 0; k < c->count; ++k) {
        new (&Items(n)[k]) T(std::move(Items(c)[k]));
        Items(c)[k].~T();
      }
    } else {
      n = AllocInner(cap, c->height);
      for (size_t k = 0; k < c->count; ++k) MoveEntry(c, k, n, k);
      BorrowOf(n) = BorrowOf(c);
    }
    n->count = c->count;
    n->total = c->total;
    Free(c);
    return n;
  }
  // Makes the chunk at `slot` one that its holder alone holds by a counted
  // reference (copying it if it is shared, or borrowed from the holder's
  // base), with room for `need` entries.
  static Chunk* Writable(Slot slot, size_t need) {
    Chunk* c = *slot.at;
    const bool owned = slot.Owned();
    if (owned && c->refs.load(std::memory_order_acquire) == 1) {
      if (c->capacity < need) *slot.at = Grow(c, CapacityFor(need));
      return *slot.at;
    }
    Chunk* n = Clone(c, CapacityFor(std::max<size_t>(need, c->count)));
    if (owned) {
      Unref(c);
    } else {
      BorrowOf(slot.parent).owned |= uint32_t{1} << slot.index;
    }
    *slot.at = n;
    return n;
  }

  // Inserts into the subtree at `slot`; returns the new right sibling if the
  // chunk had to split (the caller links it in).
  static Chunk* InsertIn(Slot slot, size_t i, T& value) {
    if ((*slot.at)->height == 0) {
      Chunk* c = *slot.at;
      if (c->count < kFanout) {
        c = Writable(slot, c->count + 1u);
        T* it = Items(c);
        new (&it[c->count]) T();
        for (size_t k = c->count; k > i; --k) it[k] = std::move(it[k - 1]);
        it[i] = std::move(value);
        ++c->count;
        ++c->total;
        return nullptr;
      }
      c = Writable(slot, kFanout);
      // An append keeps this leaf full and starts a new one; otherwise split in half.
      size_t keep = (i == c->count) ? c->count : c->count / 2;
      Chunk* right = AllocLeaf(kFanout);
      for (size_t k = keep; k < c->count; ++k) {
        new (&Items(right)[k - keep]) T(std::move(Items(c)[k]));
        Items(c)[k].~T();
      }
      right->count = static_cast<uint16_t>(c->count - keep);
      right->total = right->count;
      c->count = static_cast<uint16_t>(keep);
      c->total = keep;
      if (i <= keep) {
        if (i == keep && keep == kFanout) {
          InsertIn(RootSlot(&right), 0, value);
        } else {
          InsertIn(slot, i, value);
        }
      } else {
        InsertIn(RootSlot(&right), i - keep, value);
      }
      return right;
    }

    Chunk* c = Writable(slot, (*slot.at)->count);
    size_t j = 0;
    while (j + 1 < c->count && i > Sizes(c)[j]) i -= static_cast<size_t>(Sizes(c)[j++]);
    Chunk* split = InsertIn(KidSlot(c, j), i, value);
    Sizes(c)[j] = Kids(c)[j]->total;
    SetSeparator(c, j);
    ++c->total;
    if (!split) return nullptr;
    return LinkChild(slot, j + 1, split);
  }

  // Inserts child `kid` (a chunk the caller hands over with its reference)
  // at position j of the inner chunk at `slot` (writable: ours alone);
  // returns a new right sibling if that chunk had to split.
  static Chunk* LinkChild(Slot slot, size_t j, Chunk* kid) {
    Chunk* c = *slot.at;
    if (c->count < kFanout) {
      c = Writable(slot, c->count + 1u);
      for (size_t k = c->count; k > j; --k) MoveEntry(c, k - 1, c, k);
      BorrowOf(c).owned = MaskInsert(BorrowOf(c).owned, j, true);
      Kids(c)[j] = kid;
      Sizes(c)[j] = kid->total;
      SetSeparator(c, j);
      ++c->count;
      // c->total already counts the element inserted into the split child.
      return nullptr;
    }
    size_t keep = (j == c->count) ? c->count : c->count / 2;
    Chunk* right = AllocInner(kFanout, c->height);
    for (size_t k = keep; k < c->count; ++k) {
      MoveEntry(c, k, right, k - keep);
      right->total += Sizes(c)[k];
      // right takes c's reference to a child c owns, and one of its own to
      // a child c borrows (c's base does not keep right's children alive).
      if (!Owns(c, k)) Ref(Kids(c)[k]);
    }
    BorrowOf(right).owned = AllOwned(c->count - keep);
    BorrowOf(c).owned &= AllOwned(keep);
    right->count = static_cast<uint16_t>(c->count - keep);
    c->count = static_cast<uint16_t>(keep);
    c->total -= right->total;
    // c->total still counts kid's elements (they were part of child j-1
    // before it split); they move with kid if kid goes to the right half.
    if (j > keep || (j == keep && keep == kFanout)) {
      c->total -= kid->total;
      right->total += kid->total;
      LinkChild(RootSlot(&right), j - keep, kid);
    } else {
      LinkChild(slot, j, kid);
    }
    return right;
  }

  // Keyed Set: replaces element i under `slot`, then refreshes the separator
  // of every inner chunk on the way back up.
  static void SetIn(Slot slot, size_t i, T& value) {
    Chunk* c = Writable(slot, (*slot.at)->count);
    if (c->height == 0) {
      Items(c)[i] = std::move(value);
      return;
    }
    size_t j = 0;
    while (i >= Sizes(c)[j]) i -= static_cast<size_t>(Sizes(c)[j++]);
    SetIn(KidSlot(c, j), i, value);
    SetSeparator(c, j);
  }

  static void EraseIn(Slot slot, size_t i) {
    Chunk* c = Writable(slot, (*slot.at)->count);
    if (c->height == 0) {
      T* it = Items(c);
      for (size_t k = i; k + 1 < c->count; ++k) it[k] = std::move(it[k + 1]);
      it[c->count - 1].~T();
      --c->count;
      --c->total;
      return;
    }
    size_t j = 0;
    while (i >= Sizes(c)[j]) i -= static_cast<size_t>(Sizes(c)[j++]);
    EraseIn(KidSlot(c, j), i);
    --Sizes(c)[j];
    --c->total;
    Chunk* kid = Kids(c)[j];
    if (kid->count == 0) {
      Unref(kid);  // owned: EraseIn made it writable
      RemoveChild(c, j);
      return;
    }
    SetSeparator(c, j);
    if (kid->count < kFanout / 4 && c->count > 1) {
      size_t left = j > 0 ? j - 1 : j;
      size_t right = left + 1;
      if (size_t(Kids(c)[left]->count) + Kids(c)[right]->count <= kFanout) MergeChildren(c, left);
    }
  }

  // Removes child j of inner chunk c (ours alone) without releasing it.
  static void RemoveChild(Chunk* c, size_t j) {
    for (size_t k = j; k + 1 < c->count; ++k) MoveEntry(c, k + 1, c, k);
    BorrowOf(c).owned = MaskErase(BorrowOf(c).owned, j);
    --c->count;
  }

  // Merges child left+1 into child left of inner chunk c (ours alone).
  static void MergeChildren(Chunk* c, size_t left) {
    Chunk* r = Kids(c)[left + 1];
    Chunk* l = Writable(KidSlot(c, left), size_t(Kids(c)[left]->count) + r->count);
    if (l->height == 0) {
      for (size_t k = 0; k < r->count; ++k) new (&Items(l)[l->count + k]) T(Items(r)[k]);
    } else {
      for (size_t k = 0; k < r->count; ++k) {
        MoveEntry(r, k, l, l->count + k);
        Ref(Kids(r)[k]);
      }
      BorrowOf(l).owned |= AllOwned(r->count) << l->count;
    }
    l->count = static_cast<uint16_t>(l->count + r->count);
    l->total += r->total;
    Sizes(c)[left] = l->total;
    SetSeparator(c, left);
    if (Owns(c, left + 1)) Unref(r);  // else c's base keeps r alive
    RemoveChild(c, left + 1);
  }

  static const T& FirstOf(const Chunk* c) noexcept {
    while (c->height > 0) c = Kids(c)[0];
    return Items(c)[0];
  }

  template <typename F>
  static void ForEachIn(const Chunk* c, F& f) {
    if (c->height == 0) {
      for (size_t k = 0; k < c->count; ++k) f(Items(c)[k]);
      return;
    }
    for (size_t k = 0; k < c->count; ++k) ForEachIn(Kids(c)[k], f);
  }

  static void CountBytes(const Chunk* c, size_t* bytes) {
    if (c->height == 0) {
      *bytes += LeafBytes(c->capacity);
      return;
    }
    *bytes += InnerBytes(c->capacity);
    // The older chunks c keeps alive as its chain of bases (see Borrow);
    // their children are c's or one of c's, counted below.
    for (const Chunk* b = BorrowOf(c).base; b != nullptr; b = BorrowOf(b).base)
      *bytes += InnerBytes(b->capacity);
    for (size_t k = 0; k < c->count; ++k) CountBytes(Kids(c)[k], bytes);
  }

  Chunk* root_ = nullptr;
};

}  // namespace canopy::tree
