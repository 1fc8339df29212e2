// ByteRing: a fixed-capacity FIFO of bytes addressed by absolute stream
// offsets, used for the DPDK backend's send and receive buffers.
// Bytes [begin(), end()) are held; Append adds at end(), Consume drops from
// begin().
//
// The storage is shared (RingStorage, reference counted) so that transmit
// mbufs can point straight into the send ring (zero-copy transmit): each such
// mbuf keeps the storage alive and *pins* the bytes it covers; the owner must
// not consume pinned bytes (PinFloor) so that Append never overwrites bytes
// a queued frame still points at.
//
// Thread safety: none. The ring itself is guarded by the owning ConnState's
// mutex; the pin and frame counters are touched only by whoever holds the
// port's poll lock (frames are built, transmitted and freed there, and acks consume the
// send ring there).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace canopy::transport::dpdk {

// The ring's memory: rings of 2 MiB and more are 2 MiB aligned and asked
// to be backed by transparent huge pages (madvise MADV_HUGEPAGE), as DPDK
// keeps its own buffers in huge pages. The first pass through a ring
// otherwise takes one page fault per 4 KiB (4096 for the default 16 MiB send
// ring), and in a VM whose page tables the hypervisor shadows each costs
// tens of microseconds: measured, the first 16 MiB an rcopy sent over
// af_packet took 150-230 ms, and 90-150 ms with huge pages. Where THP is
// off ("never") the advice does nothing. Memory: a ring once touched is
// resident 2 MiB at a time rather than 4 KiB at a time; a busy ring is
// wholly resident either way. Throws std::bad_alloc as new[] does.
struct RingMemoryFree {
  void operator()(char* p) const;
};
std::unique_ptr<char, RingMemoryFree> AllocateRingMemory(size_t capacity);

struct RingStorage {
  static constexpr int kPinSlotShift = 16;  // pins are counted per 64 KiB of stream

  explicit RingStorage(size_t capacity)
      : bytes(AllocateRingMemory(capacity)), capacity(capacity), pins((capacity >> kPinSlotShift) + 2, 0) {}

  // [from, to): absolute stream offsets, to - from <= capacity.
  void Pin(uint64_t from, uint64_t to) {
    for (uint64_t s = from >> kPinSlotShift; s <= (to - 1) >> kPinSlotShift; ++s) ++pins[s % pins.size()];
  }
  void Unpin(uint64_t from, uint64_t to) {
    for (uint64_t s = from >> kPinSlotShift; s <= (to - 1) >> kPinSlotShift; ++s) --pins[s % pins.size()];
  }

  // A frame now points into this storage (`self` is a reference to it, such
  // as its ring's storage()). The frames together hold one reference, taken
  // by the first and dropped by the last: a reference per frame (an atomic
  // add and subtract on one shared count) took 13% of a sender's CPU over
  // memif, whose transmit frees every frame within its burst.
  void AddFrame(const std::shared_ptr<RingStorage>& self) {
    if (frames++ == 0) held_by_frames = self;
  }
  // A frame let go of `storage`, which is destroyed here if it was the last
  // reference (its ring gone, no other frame left).
  static void ReleaseFrame(RingStorage* storage) {
    if (--storage->frames == 0) std::shared_ptr<RingStorage> last = std::move(storage->held_by_frames);
  }

  std::unique_ptr<char, RingMemoryFree> bytes;
  const size_t capacity;
  std::vector<uint32_t> pins;  // per slot (offset >> kPinSlotShift) modulo pins.size()
  uint64_t frames = 0;         // frames pointing into the storage
  std::shared_ptr<RingStorage> held_by_frames;  // set while frames > 0
};

class ByteRing {
 public:
  explicit ByteRing(size_t capacity) : storage_(std::make_shared<RingStorage>(capacity)) {}

  size_t capacity() const { return storage_->capacity; }
  size_t size() const { return static_cast<size_t>(end_ - begin_); }
  size_t space() const { return capacity() - size(); }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  const std::shared_ptr<RingStorage>& storage() const { return storage_; }
  // Where absolute offset `at` lives, and how many bytes follow it contiguously.
  char* At(uint64_t at) const { return storage_->bytes.get() + at % capacity(); }
  size_t ContiguousFrom(uint64_t at) const { return capacity() - static_cast<size_t>(at % capacity()); }

  // Appends min(n, space()) bytes; returns how many.
  size_t Append(const char* src, size_t n) {
    n = std::min(n, space());
    AppendWith(n, [&](char* dst, size_t len, size_t done) { std::memcpy(dst, src + done, len); });
    return n;
  }

  // Calls fill(dst, len, src_offset) for pieces covering the next n bytes
  // (REQUIRES: n <= space()), then appends them.
  template <typename Fill>
  void AppendWith(size_t n, Fill fill) {
    size_t done = 0;
    while (done < n) {
      size_t chunk = std::min(n - done, ContiguousFrom(end_ + done));
      fill(At(end_ + done), chunk, done);
      done += chunk;
    }
    end_ += n;
  }

  // Writes n bytes at absolute offsets [at, at + n) past end() (out-of-order
  // data, REQUIRES: at >= end(), at + n <= begin() + capacity()); they become
  // part of the ring when ExtendTo reaches them.
  template <typename Fill>
  void WriteAt(uint64_t at, size_t n, Fill fill) {
    size_t done = 0;
    while (done < n) {
      size_t chunk = std::min(n - done, ContiguousFrom(at + done));
      fill(At(at + done), chunk, done);
      done += chunk;
    }
  }
  // Takes bytes written by WriteAt up to `upto` into the ring.
  // REQUIRES: upto <= begin() + capacity(), every byte in [end(), upto) written.
  void ExtendTo(uint64_t upto) { end_ = std::max(end_, upto); }

  // Moves an empty ring forward by n offsets (bytes delivered elsewhere).
  // REQUIRES: size() == 0.
  void Skip(uint64_t n) {
    begin_ += n;
    end_ += n;
  }

  // Copies n bytes starting at absolute offset `from` (REQUIRES: inside
  // [begin(), end())) to dst, without consuming them.
  void CopyOut(uint64_t from, size_t n, char* dst) const {
    size_t done = 0;
    while (done < n) {
      size_t chunk = std::min(n - done, ContiguousFrom(from + done));
      std::memcpy(dst + done, At(from + done), chunk);
      done += chunk;
    }
  }

  // Drops bytes up to absolute offset `upto` (clamped to end()).
  void ConsumeTo(uint64_t upto) { begin_ = std::max(begin_, std::min(upto, end_)); }

  // The first offset in [begin(), limit) still pinned by a queued frame
  // (rounded down to its pin slot, never below begin()), else limit.
  uint64_t PinFloor(uint64_t limit) const {
    if (limit <= begin_) return limit;
    const auto& pins = storage_->pins;
    for (uint64_t s = begin_ >> RingStorage::kPinSlotShift; s <= (limit - 1) >> RingStorage::kPinSlotShift; ++s) {
      if (pins[s % pins.size()] != 0) return std::max(begin_, s << RingStorage::kPinSlotShift);
    }
    return limit;
  }

  // Copies out and consumes min(n, size()) bytes; returns how many.
  size_t Read(char* dst, size_t n) {
    n = std::min(n, size());
    CopyOut(begin_, n, dst);
    begin_ += n;
    return n;
  }

 private:
  std::shared_ptr<RingStorage> storage_;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
};

}  // namespace canopy::transport::dpdk
