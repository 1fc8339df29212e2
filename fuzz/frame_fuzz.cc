// Fuzzes the transport frame decoder: header checks, then payload checks.
// Invariant: anything that decodes re-encodes to the same header bytes.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "transport/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::transport;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.size() < kFrameHeaderSize) return 0;
  // A receiver that accepts unchecked payloads too (rdma://); the default
  // refuses exactly the frames that carry the flag.
  auto header = DecodeFrameHeader(in.substr(0, kFrameHeaderSize), 1 << 20, PayloadCheck::kNone);
  if (!header.ok()) return 0;
  auto strict = DecodeFrameHeader(in.substr(0, kFrameHeaderSize), 1 << 20);
  if (strict.ok() != (header->payload_check == PayloadCheck::kCrc32c)) std::abort();
  std::string_view payload = in.substr(kFrameHeaderSize);
  if (payload.size() > header->payload_len) payload = payload.substr(0, header->payload_len);
  if (VerifyFramePayload(*header, payload).ok()) {
    char again[kFrameHeaderSize];
    EncodeFrameHeader(again, header->type, payload, header->bulk_len, header->payload_check);
    if (std::string_view(again, kFrameHeaderSize) != in.substr(0, kFrameHeaderSize)) std::abort();
  }
  return 0;
}
