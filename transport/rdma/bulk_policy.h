// Which bulk transfers the rdma backend copies through its slots ("eager")
// and which the receiver RDMA READs from the sender's registered memory
// (no verbs here).
//
// When no eager_bulk option is given (rdma_transport.h), the split depends on
// the device. A hardware HCA moves a READ's bytes by DMA with no CPU copy, so
// anything above 64 KiB goes as a READ. A software provider (Soft-RoCE's
// rdma_rxe, whose vendor id is 0xFFFFFF, or 0 in older kernels; soft-iWARP's
// siw, "bmt") copies every byte in the kernel either way, so a READ saves no
// copy, and a message of up to 1 MiB is one READ request (the receiver reads
// in 1 MiB requests, rdma_datapath.cc): a round trip with nothing in flight
// beside it. So up to 1 MiB goes eagerly
// there; larger transfers are READ as several requests in flight.
// Measured in two TCG guests on rxe, one bulk message at a time: 1 MiB moved
// 0.10 Gbit/s as a READ and 0.24-0.32 eagerly (ib_write_bw 0.28-0.36); a
// 128 MiB rcopy in 4 MiB messages 0.24-0.27 as READs, 0.20-0.26 eagerly.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

namespace canopy::transport::rdma {

inline constexpr uint64_t kHardwareEagerBulk = 64u << 10;
inline constexpr uint64_t kSoftwareEagerBulk = 1u << 20;
// True for the vendor ids of rdma_rxe and siw.
bool IsSoftwareRdmaVendor(uint32_t vendor_id);
// `configured` when set, else the default for a device of `vendor_id`
// (ibv_device_attr::vendor_id).
uint64_t EagerBulkFor(const std::optional<uint64_t>& configured, uint32_t vendor_id);

}  // namespace canopy::transport::rdma
