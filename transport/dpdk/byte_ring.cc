#include "transport/dpdk/byte_ring.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace canopy::transport::dpdk {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void RingMemoryFree::operator()(char* p) const { std::free(p); }

std::unique_ptr<char, RingMemoryFree> AllocateRingMemory(size_t capacity) {
  void* p = nullptr;
  if (capacity >= kHugePage) {
    if (::posix_memalign(&p, kHugePage, capacity) != 0) throw std::bad_alloc();
    (void)::madvise(p, capacity, MADV_HUGEPAGE);  // advice only: no THP, no harm
  } else {
    p = std::malloc(capacity == 0 ? 1 : capacity);
    if (p == nullptr) throw std::bad_alloc();
  }
  return std::unique_ptr<char, RingMemoryFree>(static_cast<char*>(p));
}

}  // namespace canopy::transport::dpdk
