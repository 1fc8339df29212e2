// Fuzzes every replication message decoder (peer and client messages); the
// first byte picks the decoder, the rest is the payload.
#include <cstdint>
#include <string_view>

#include "replication/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::replication;
  if (size < 1) return 0;
  std::string_view p(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 24) {
    case 0: (void)DecodeHello(p); break;
    case 1: (void)DecodeChallenge(p); break;
    case 2: (void)DecodeAuth(p); break;
    case 3: (void)DecodeWelcome(p); break;
    case 4: (void)DecodeSubscribe(p); break;
    case 5: (void)DecodeSnapshotBegin(p); break;
    case 6: (void)DecodeSnapshotChunk(p); break;
    case 7: (void)DecodeSnapshotEnd(p); break;
    case 8: (void)DecodeDelta(p); break;
    case 9: (void)DecodeAck(p); break;
    case 10: (void)DecodeHeartbeat(p); break;
    case 11: (void)DecodeError(p); break;
    case 12: (void)DecodeCommitRequest(p); break;
    case 13: (void)DecodeCommitReply(p); break;
    case 14: (void)DecodeReadRequest(p); break;
    case 15: (void)DecodeReadReply(p); break;
    case 16: (void)DecodeStatusRequest(p); break;
    case 17: (void)DecodeStatusReply(p); break;
    case 18: (void)DecodeCreateTreeRequest(p); break;
    case 19: (void)DecodeCreateTreeReply(p); break;
    case 20: (void)DecodeDeltaBatchView(p); break;
    case 21: (void)DecodeDeltaRecords(p); break;
    case 22: (void)DecodeSnapshotFile(p); break;
    case 23: (void)DecodeCheckpointRequest(p); break;
  }
  return 0;
}
