#include "base/buffer_pool.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace canopy {
namespace {

struct Kept {
  std::unique_ptr<char[]> bytes;
  size_t capacity = 0;
};

struct Pool {
  std::mutex mu;
  std::vector<Kept> kept;  // at most kKeptBuffers
  size_t total = 0;        // bytes in kept
};

Pool& ThePool() {
  static auto* pool = new Pool();  // never destroyed: buffers may come back until exit
  return *pool;
}

}  // namespace

PooledBuffer PooledBuffer::Take(size_t bytes) {
  {
    Pool& pool = ThePool();
    std::lock_guard lock(pool.mu);
    auto best = pool.kept.end();
    for (auto it = pool.kept.begin(); it != pool.kept.end(); ++it) {
      if (it->capacity >= bytes && (best == pool.kept.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != pool.kept.end()) {
      PooledBuffer out(std::move(best->bytes), best->capacity);
      pool.total -= best->capacity;
      pool.kept.erase(best);
      return out;
    }
  }
  return PooledBuffer(std::make_unique_for_overwrite<char[]>(bytes), bytes);
}

PooledBuffer PooledBuffer::Adopt(std::unique_ptr<char[]> bytes, size_t capacity) {
  return bytes ? PooledBuffer(std::move(bytes), capacity) : PooledBuffer();
}

PooledBuffer::PooledBuffer(PooledBuffer&& other) noexcept
    : bytes_(std::move(other.bytes_)), capacity_(std::exchange(other.capacity_, 0)) {}

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) noexcept {
  if (this != &other) {
    GiveBack();
    bytes_ = std::move(other.bytes_);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

PooledBuffer::~PooledBuffer() { GiveBack(); }

void PooledBuffer::Grow(size_t bytes, size_t keep) {
  if (bytes <= capacity_) return;
  PooledBuffer bigger = Take(std::max(bytes, capacity_ * 2));
  if (keep > 0) std::memcpy(bigger.data(), data(), std::min(keep, capacity_));
  *this = std::move(bigger);  // the old one goes back
}

std::unique_ptr<char[]> PooledBuffer::Release() {
  capacity_ = 0;
  return std::move(bytes_);
}

void PooledBuffer::GiveBack() {
  if (!bytes_) return;
  const size_t capacity = std::exchange(capacity_, 0);
  std::unique_ptr<char[]> bytes = std::move(bytes_);
  if (capacity > kMaxKeptBytes) return;
  Pool& pool = ThePool();
  std::lock_guard lock(pool.mu);
  if (pool.kept.size() < kKeptBuffers && pool.total + capacity <= kKeptTotalBytes) {
    pool.kept.push_back(Kept{std::move(bytes), capacity});
    pool.total += capacity;
    return;
  }
  // Full: keep the larger of this and the smallest kept, which serves more takes.
  auto smallest = std::min_element(pool.kept.begin(), pool.kept.end(),
                                   [](const Kept& a, const Kept& b) { return a.capacity < b.capacity; });
  if (smallest != pool.kept.end() && smallest->capacity < capacity &&
      pool.total - smallest->capacity + capacity <= kKeptTotalBytes) {
    pool.total += capacity - smallest->capacity;
    std::swap(smallest->bytes, bytes);  // the smaller one is freed once the lock is released
    smallest->capacity = capacity;
  }
}

}  // namespace canopy
