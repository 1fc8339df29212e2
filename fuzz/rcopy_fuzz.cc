// Fuzzes rcopy's protocol decoders; the first byte picks the decoder.
#include <cstdint>
#include <string_view>

#include "tools/rcopy/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::rcopy;
  if (size < 1) return 0;
  std::string_view p(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 6) {
    case 0: (void)DecodeOpen(p); break;
    case 1: (void)DecodeData(p); break;
    case 2: (void)DecodeCommit(p); break;
    case 3: (void)DecodeResult(p); break;
    case 4: (void)DecodeQuery(p); break;
    case 5: (void)DecodeResumeInfo(p); break;
  }
  return 0;
}
