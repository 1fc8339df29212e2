// Fuzzes the block-format snapshot reader (tree/snapshot.h, format 2).
//
// Two modes, chosen by the first byte:
// - even: the rest is a byte stream, cut into blocks the way a receiver does
//   (by the length each block announces) and fed to SnapshotReader in order;
//   the same bytes are also opened whole with OpenSnapshotImage.
// - odd: the rest is a NODES payload. The harness frames it with a valid
//   HEAD, a valid CRC and a TAIL whose byte count and digest match (node
//   count from the second byte), so the fuzzer reaches the record and
//   child-reference checks that a CRC would otherwise hide. With bit 1 of
//   the mode byte also set, a third byte cuts the payload into two NODES
//   blocks (at that byte's share of 256 of its length): the checker's state
//   carried from block to block (the stack of subtrees, the last leaf shape
//   it compares runs of leaves against) is fuzzed across the cut.
// In the odd mode every stream is opened twice, with and without the
// record check's vector form (AllowSnapshotCheckVectors), which must agree.
// Whatever opens is then read everywhere: every lazy node decoded (counted,
// compared with itself re-encoded), its digest taken and re-encoded.
#include <xxhash.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tree/snapshot.h"

namespace {
using namespace canopy;
using namespace canopy::tree;

std::string Block(uint8_t kind, uint64_t seq, std::string_view payload) {
  std::string b(kChunkHeaderBytes, '\0');
  b.append(payload);
  EncodeFixed32(b.data(), kSnapshotMagic);
  EncodeFixed32(b.data() + 4, static_cast<uint32_t>(b.size() + 4));
  b[8] = static_cast<char>(kind);
  EncodeFixed64(b.data() + 9, seq);
  PutFixed32(&b, crc32c::Value(b));
  return b;
}

void Exercise(const Version& v) {
  // Re-encoding copies untouched subtrees; decoding that must give the same tree.
  auto again = DecodeSnapshotChunks(EncodeSnapshotChunks(v, kMinSnapshotChunkBytes));
  if (!again.ok()) __builtin_trap();
  if (again->Digest() != v.Digest()) __builtin_trap();
  (void)CountNodes(v.root());  // decodes every lazy node
  if (!TreesEqual(v.root(), again->root())) __builtin_trap();
  if (TreeDigest(v.root()) != v.Digest()) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    SnapshotReader reader;
    std::string_view rest = in;
    while (!rest.empty()) {
      auto len = SnapshotChunkLength(rest);
      if (!len.ok() || *len > rest.size()) break;
      if (!reader.AddChunk(rest.substr(0, *len)).ok()) break;
      rest.remove_prefix(*len);
    }
    auto version = reader.Finish();
    auto whole = OpenSnapshotImage(std::string(in));
    if (version.ok() != whole.ok() && rest.empty()) __builtin_trap();
    if (version.ok()) Exercise(*version);
    if (whole.ok()) Exercise(*whole);
    return 0;
  }
  if (in.empty()) return 0;
  uint64_t nodes = static_cast<uint8_t>(in[0]);
  std::string_view payload = in.substr(1);
  size_t cut = payload.size();
  if ((data[0] & 2) != 0) {
    if (payload.empty()) return 0;
    cut = static_cast<uint8_t>(payload[0]) * (payload.size() - 1) / 256;
    payload.remove_prefix(1);
  }
  std::string head;
  PutLengthPrefixed(&head, "fuzz");
  PutFixed64(&head, 1);
  std::string tail;
  PutFixed64(&tail, nodes);
  PutFixed64(&tail, payload.size());
  PutFixed64(&tail, XXH3_64bits(payload.data(), payload.size()));
  std::string stream = Block(1, 0, head);
  if (cut == 0 || cut >= payload.size()) {
    stream += Block(2, 1, payload) + Block(3, 2, tail);
  } else {
    stream += Block(2, 1, payload.substr(0, cut)) + Block(2, 2, payload.substr(cut)) + Block(3, 3, tail);
  }
  // The record check with and without the CPU's vector unit: the same
  // verdict and the same message.
  AllowSnapshotCheckVectors(false);
  auto scalar = OpenSnapshotImage(stream);
  AllowSnapshotCheckVectors(true);
  auto v = OpenSnapshotImage(std::move(stream));
  if (v.ok() != scalar.ok() || v.status().ToString() != scalar.status().ToString()) __builtin_trap();
  if (v.ok()) Exercise(*v);
  return 0;
}
