#include "transport/rdma/bulk_policy.h"

namespace canopy::transport::rdma {

bool IsSoftwareRdmaVendor(uint32_t vendor_id) {
  constexpr uint32_t kRxeVendor = 0xFFFFFF;     // rdma_rxe since Linux 5.x
  constexpr uint32_t kOldRxeVendor = 0;         // rdma_rxe before that
  constexpr uint32_t kSiwVendor = 0x626d74;     // siw: "bmt"
  return vendor_id == kRxeVendor || vendor_id == kOldRxeVendor || vendor_id == kSiwVendor;
}

uint64_t EagerBulkFor(const std::optional<uint64_t>& configured, uint32_t vendor_id) {
  if (configured) return *configured;
  return IsSoftwareRdmaVendor(vendor_id) ? kSoftwareEagerBulk : kHardwareEagerBulk;
}

}  // namespace canopy::transport::rdma
