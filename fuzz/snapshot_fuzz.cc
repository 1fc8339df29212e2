// Fuzzes the streaming snapshot decoder: the input is cut into chunks the way
// a receiver would (by the length each chunk announces) and fed in order.
#include <cstdint>
#include <string_view>

#include "tree/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::tree;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  SnapshotReader reader;
  while (!in.empty()) {
    auto len = SnapshotChunkLength(in);
    if (!len.ok() || *len > in.size()) break;
    if (!reader.AddChunk(in.substr(0, *len)).ok()) return 0;
    in.remove_prefix(*len);
  }
  auto version = reader.Finish();
  if (version.ok()) (void)version->Digest();
  return 0;
}
