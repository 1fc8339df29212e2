// dpdk:// under injected faults: 5% of frames dropped, 5% reordered, 1%
// duplicated, in both directions (data and acks), between two net_memif
// ports in one process. 256 MiB must arrive byte-exact and in order.
// Label "slow" (tens of seconds on a loaded 2-core machine).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "base/crc32c.h"
#include "tests/dpdk_test_util.h"
#include "tests/testing/test_util.h"

namespace canopy::transport {
namespace {

using ::canopy::testing::RandomBytes;

TEST(DpdkLossyTransfer, TwoHundredFiftySixMiBSurviveDropReorderAndDuplication) {
  auto pair = ConnectMemifPair("fault_drop=0.05,fault_reorder=0.05,fault_dup=0.01,fault_seed=7");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const size_t total = size_t{256} << 20;
  const size_t piece = size_t{16} << 20;
  const std::string block = RandomBytes(piece, 42);
  auto start = std::chrono::steady_clock::now();
  Status send_status;
  std::thread sender([&] {
    for (size_t done = 0; done < total && send_status.ok(); done += piece) {
      // Each piece is a message whose bulk is the block rotated, so misordering shows.
      std::string rotated = block.substr(done / piece) + block.substr(0, done / piece);
      send_status = pair->client->SendWithBulk(7, std::to_string(done), BulkSource::FromMemory(rotated));
    }
    if (send_status.ok()) send_status = pair->client->Shutdown();
  });
  std::string got(piece, '\0');
  size_t received = 0;
  for (size_t done = 0; done < total; done += piece) {
    auto msg = pair->server->Receive(Deadline::After(60s));
    ASSERT_TRUE(msg.ok()) << msg.status().ToString() << " after " << received << " bytes";
    ASSERT_EQ(msg->type, 7);
    ASSERT_EQ(msg->payload, std::to_string(done));
    ASSERT_EQ(msg->bulk_bytes, piece);
    ASSERT_TRUE(pair->server->ReceiveBulk(BulkSink::ToMemory(got.data()), piece, Deadline::After(60s)).ok());
    std::string expected = block.substr(done / piece) + block.substr(0, done / piece);
    ASSERT_EQ(crc32c::Value(got), crc32c::Value(expected)) << "piece at " << done << " differs";
    ASSERT_TRUE(got == expected);
    received += piece;
  }
  auto end = pair->server->Receive(Deadline::After(20s));
  EXPECT_EQ(end.status().code(), StatusCode::kClosed) << end.status().ToString();
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status.ToString();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto stats = pair->client->stats();
  EXPECT_GT(stats.retransmits, 0u) << "with 5% loss the sender must have retransmitted";
  std::fprintf(stderr, "lossy 256 MiB: %.2f s (%.2f Gbit/s), %llu retransmits\n", secs,
               total * 8 / secs / 1e9, static_cast<unsigned long long>(stats.retransmits));
}

}  // namespace
}  // namespace canopy::transport
