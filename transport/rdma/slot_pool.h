// SlotPool: a fixed set of equally sized buffer slots (indices 0..count-1)
// handed out and returned, used for the RDMA backend's registered send and
// staging rings. It only tracks indices; the memory lives in one registered
// region owned by the connection (slot i at base + i * slot_bytes).
//
// Thread safety: none; guarded by the owner's mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"

namespace canopy::transport::rdma {

class SlotPool {
 public:
  explicit SlotPool(uint32_t count = 0);

  uint32_t count() const { return static_cast<uint32_t>(in_use_.size()); }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }
  bool all_free() const { return free_.size() == in_use_.size(); }

  // A free slot, or nullopt when all are in use. Most recently released first
  // (its memory is likely still in cache).
  std::optional<uint32_t> Acquire();
  // Internal error for an index out of range or a slot that is not in use.
  Status Release(uint32_t index);

 private:
  std::vector<uint32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace canopy::transport::rdma
