// Fuzzes the tree delta codec and op application. Invariants: a delta that
// decodes re-encodes to a delta that decodes equal; applying its ops to an
// empty tree either works or fails cleanly.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tree/delta.h"
#include "tree/node.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::tree;
  auto delta = DecodeDelta(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!delta.ok()) return 0;
  auto again = DecodeDelta(EncodeDelta(*delta));
  if (!again.ok() || !(*again == *delta)) std::abort();
  (void)ApplyOps(Node::Empty(), delta->ops);
  return 0;
}
