// PooledBuffer: an uninitialised heap buffer lent by a process-wide pool.
//
// For reads that come and go on many threads: a WAL scan on a replica
// stream's thread, a checkpoint block read to be checked, a run of records
// received from a leader. Each stream has a thread of its own, so a buffer
// kept per thread would be fresh memory for every stream. Fresh memory
// costs a page fault per page touched (zeroing included), far more than a
// copy into pages already in use, and more still on a VM that shadows page
// tables (measured on this project's build machine: ~3 ms per MiB first
// touched, against ~0.1 ms per MiB copied into warm memory). A buffer given
// back here is lent again to the next Take on any thread.
//
// Ownership: a PooledBuffer owns its bytes; destroying it gives them back
// to the pool, which keeps up to kKeptBuffers buffers of up to
// kMaxKeptBytes each (kKeptTotalBytes in all) and frees the rest. Release()
// takes the bytes out of the pool's reach for good; Adopt() hands such bytes
// back to a PooledBuffer.
//
// Thread safety: a PooledBuffer is not shared (move it between threads);
// Take and the return to the pool are safe from any thread (one mutex, held
// for a few comparisons).
#pragma once

#include <cstddef>
#include <memory>

namespace canopy {

class PooledBuffer {
 public:
  static constexpr size_t kKeptBuffers = 16;
  static constexpr size_t kMaxKeptBytes = size_t{16} << 20;
  static constexpr size_t kKeptTotalBytes = size_t{64} << 20;

  PooledBuffer() = default;  // empty: capacity() 0
  // At least `bytes`: the smallest kept buffer that large, else a new one
  // of exactly `bytes`. The contents are whatever the last user left.
  static PooledBuffer Take(size_t bytes);
  // Takes `bytes` (of `capacity` bytes, as Release() gave them out).
  static PooledBuffer Adopt(std::unique_ptr<char[]> bytes, size_t capacity);

  PooledBuffer(PooledBuffer&& other) noexcept;
  PooledBuffer& operator=(PooledBuffer&& other) noexcept;
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer();

  char* data() const { return bytes_.get(); }
  size_t capacity() const { return capacity_; }
  // Makes room for `bytes` (at least twice the capacity when it grows),
  // keeping the first `keep` bytes; the smaller buffer goes back to the pool.
  void Grow(size_t bytes, size_t keep);
  // The bytes, no longer the pool's (capacity() of them); empties this.
  std::unique_ptr<char[]> Release();

 private:
  PooledBuffer(std::unique_ptr<char[]> bytes, size_t capacity)
      : bytes_(std::move(bytes)), capacity_(capacity) {}
  void GiveBack();
  std::unique_ptr<char[]> bytes_;
  size_t capacity_ = 0;
};

}  // namespace canopy
