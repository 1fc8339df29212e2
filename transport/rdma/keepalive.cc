#include "transport/rdma/keepalive.h"

#include <algorithm>

namespace canopy::transport::rdma {

std::chrono::milliseconds ProbeIntervalFor(std::chrono::milliseconds io_timeout) {
  return std::clamp<std::chrono::milliseconds>(io_timeout / 4, std::chrono::milliseconds(100),
                                               std::chrono::milliseconds(10000));
}

std::chrono::microseconds AckTimeoutFor(uint8_t exponent) {
  return std::chrono::microseconds((4096ull << exponent) / 1000);
}

uint8_t AckTimeoutExponentFor(std::chrono::milliseconds io_timeout) {
  const auto budget = std::chrono::duration_cast<std::chrono::microseconds>(io_timeout) / 2 / (kRetryCount + 1);
  uint8_t exponent = 14;
  while (exponent < 20 && AckTimeoutFor(exponent + 1) <= budget) ++exponent;
  return exponent;
}

}  // namespace canopy::transport::rdma
