#include "transport/rdma/slot_pool.h"

#include <fmt/format.h>

namespace canopy::transport::rdma {

SlotPool::SlotPool(uint32_t count) : in_use_(count, false) {
  free_.reserve(count);
  for (uint32_t i = count; i > 0; --i) free_.push_back(i - 1);
}

std::optional<uint32_t> SlotPool::Acquire() {
  if (free_.empty()) return std::nullopt;
  const uint32_t index = free_.back();
  free_.pop_back();
  in_use_[index] = true;
  return index;
}

Status SlotPool::Release(uint32_t index) {
  if (index >= in_use_.size()) {
    return Status::Internal(fmt::format("rdma: slot {} out of range (pool of {})", index, in_use_.size()));
  }
  if (!in_use_[index]) return Status::Internal(fmt::format("rdma: slot {} released twice", index));
  in_use_[index] = false;
  free_.push_back(index);
  return Status::Ok();
}

}  // namespace canopy::transport::rdma
