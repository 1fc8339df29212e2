// Fuzzes the tree delta codec and op application. Invariants: a delta that
// decodes re-encodes to a delta that decodes equal; applying its ops to an
// empty tree either works or fails cleanly; a split of the input as a run
// of deltas (SplitDeltaRun) covers it exactly, in order, with views into it.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tree/delta.h"
#include "tree/node.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::tree;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (auto run = SplitDeltaRun(input); run.ok()) {
    const char* at = input.data();
    for (std::string_view record : *run) {
      if (record.data() != at || record.size() < kDeltaMinBytes) std::abort();
      at += record.size();
    }
    if (at != input.data() + input.size()) std::abort();
  }
  auto delta = DecodeDelta(input);
  if (!delta.ok()) return 0;
  auto again = DecodeDelta(EncodeDelta(*delta));
  if (!again.ok() || !(*again == *delta)) std::abort();
  (void)ApplyOps(Node::Empty(), delta->ops);
  return 0;
}
