#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/buffer_pool.h"
#include "base/clock.h"
#include "base/coding.h"
#include "base/crc32c.h"
#include "base/file.h"
#include "base/metrics.h"
#include "base/result.h"
#include "base/status.h"
#include "base/thread_set.h"
#include "base/units.h"
#include "tests/testing/test_util.h"

namespace canopy {
namespace {

TEST(StatusTest, OkAndErrors) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status bad = Status::Corruption("bad crc");
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(bad.IsCorruption());
  EXPECT_EQ(bad.ToString(), "Corruption: bad crc");
  EXPECT_EQ(bad.WithContext("wal-1").message(), "wal-1: bad crc");
  EXPECT_EQ(bad.WithContext("").message(), "bad crc");
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(ECONNREFUSED, "connect").code(), StatusCode::kUnavailable);
}

Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument("odd");
  return v / 2;
}

Result<int> Quarter(int v) {
  CANOPY_ASSIGN_OR_RETURN(int h, Half(v));
  return Half(h);
}

TEST(ResultTest, ValueAndPropagation) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_FALSE(Quarter(6).ok());
  EXPECT_EQ(Quarter(6).status().message(), "odd");
  Result<int> from_ok = Status::Ok();  // a bug in the caller, reported, not hidden
  EXPECT_EQ(from_ok.status().code(), StatusCode::kInternal);
}

TEST(Crc32cTest, StandardVectorsAndExtend) {
  EXPECT_EQ(crc32c::Value("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c::Value(""), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c::Value(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  std::string data = testing::RandomBytes(10000, 7);
  uint32_t whole = crc32c::Value(data);
  for (size_t split : {0, 1, 63, 4096, 9999, 10000}) {
    uint32_t c = crc32c::Extend(crc32c::Value(data.data(), split), data.data() + split, data.size() - split);
    EXPECT_EQ(c, whole) << split;
  }
}

TEST(CodingTest, FixedAndVarintRoundTrip) {
  std::string buf;
  PutFixed8(&buf, 0xab);
  PutFixed16(&buf, 0xbeef);
  PutFixed32(&buf, 0xdeadbeef);
  PutFixed64(&buf, 0x0123456789abcdefull);
  const uint64_t varints[] = {0, 1, 127, 128, 300, 1ull << 35, UINT64_MAX};
  for (uint64_t v : varints) PutVarint64(&buf, v);
  PutLengthPrefixed(&buf, "hello");
  EXPECT_EQ(static_cast<uint8_t>(buf[1]), 0xef);  // little-endian on the wire

  ByteReader r(buf);
  EXPECT_EQ(*r.ReadFixed8(), 0xab);
  EXPECT_EQ(*r.ReadFixed16(), 0xbeef);
  EXPECT_EQ(*r.ReadFixed32(), 0xdeadbeefu);
  EXPECT_EQ(*r.ReadFixed64(), 0x0123456789abcdefull);
  for (uint64_t v : varints) EXPECT_EQ(*r.ReadVarint64(), v);
  EXPECT_EQ(*r.ReadLengthPrefixed(), "hello");
  EXPECT_TRUE(r.empty());
  EXPECT_TRUE(r.ReadFixed8().status().IsCorruption());
}

TEST(CodingTest, TruncationAndOverflowAreCorruption) {
  std::string buf;
  PutLengthPrefixed(&buf, "payload");
  for (size_t cut = 0; cut < buf.size(); ++cut) {
    ByteReader r(std::string_view(buf).substr(0, cut));
    EXPECT_TRUE(r.ReadLengthPrefixed().status().IsCorruption()) << cut;
  }
  std::string overlong(11, '\xff');
  EXPECT_TRUE(ByteReader(overlong).ReadVarint64().status().IsCorruption());
  std::string huge_len;
  PutVarint64(&huge_len, 1ull << 40);
  EXPECT_TRUE(ByteReader(huge_len).ReadLengthPrefixed().status().IsCorruption());
  ByteReader bounded(huge_len);
  EXPECT_TRUE(bounded.ReadVarintBounded(1000, "count").status().IsCorruption());
}

TEST(FileTest, AtomicWriteReplacesWholeFile) {
  testing::TempDir dir;
  std::string path = dir.File("meta");
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "two two").ok());
  EXPECT_EQ(*ReadFileToString(path), "two two");
  EXPECT_TRUE(ReadFileToString(dir.File("missing")).status().IsNotFound());
  EXPECT_EQ(ReadFileToString(path, 3).status().code(), StatusCode::kResourceExhausted);
}

TEST(FileTest, FileSizeLimitIsResourceExhausted) {
  testing::TempDir dir;
  std::string path = dir.File("big");
  pid_t pid = testing::ForkChild([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &lim);
    Status s = WriteFileAtomic(path, std::string(8192, 'x'));
    if (s.code() != StatusCode::kResourceExhausted) return 1;
    return PathExists(path) ? 2 : 0;  // nothing published under the final name
  });
  EXPECT_EQ(testing::WaitChild(pid, std::chrono::seconds(10)), 0);
}

TEST(FileTest, StartWritebackLeavesTheBytesAndFailsOnlyOnARealError) {
  testing::TempDir dir;
  std::string path = dir.File("landing");
  auto fd = OpenFile(path, O_RDWR | O_CREAT | O_EXCL);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  const std::string bytes = testing::RandomBytes(3 << 20, 11);
  ASSERT_TRUE(WriteAll(fd->get(), bytes.data(), bytes.size(), path).ok());
  // Write-back of part of the file, of all of it, of nothing, and of a
  // range past its end: none changes what the file holds.
  EXPECT_TRUE(StartWriteback(fd->get(), 0, 1 << 20, path).ok());
  EXPECT_TRUE(StartWriteback(fd->get(), 0, bytes.size(), path).ok());
  EXPECT_TRUE(StartWriteback(fd->get(), 5, 0, path).ok());
  EXPECT_TRUE(StartWriteback(fd->get(), bytes.size(), 1 << 20, path).ok());
  ASSERT_TRUE(FsyncFd(fd->get(), path).ok());
  EXPECT_EQ(*ReadFileToString(path), bytes);
  // A pipe has nothing to write back: no error.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_TRUE(StartWriteback(w.get(), 0, 4096, "a pipe").ok());
  // A closed descriptor is an error that names the file.
  const int closed = fd->get();
  fd->Reset();
  Status s = StartWriteback(closed, 0, 4096, path);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(path), std::string::npos) << s.ToString();
}

TEST(UnitsTest, ParseAndFormatByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64K"), 65536u);
  EXPECT_EQ(*ParseByteSize("4MiB"), 4u << 20);
  EXPECT_EQ(*ParseByteSize("1g"), 1u << 30);
  EXPECT_EQ(*ParseByteSize("2MB"), 2'000'000u);
  EXPECT_EQ(*ParseByteSize("0", true), 0u);
  for (const char* bad : {"", "0", "M", "4X", "-1", "99999999999999999999", "20000000000000G"}) {
    EXPECT_EQ(ParseByteSize(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3u << 29), "1.50 GiB");
}

TEST(UnitsTest, ParseAndFormatBitRates) {
  EXPECT_EQ(*ParseBitRate("1000000"), 1'000'000u);
  EXPECT_EQ(*ParseBitRate("500M"), 500'000'000u);  // decimal, as iperf3 -b
  EXPECT_EQ(*ParseBitRate("80m"), 80'000'000u);
  EXPECT_EQ(*ParseBitRate("100k"), 100'000u);
  EXPECT_EQ(*ParseBitRate("1G"), 1'000'000'000u);
  EXPECT_EQ(*ParseBitRate("2.5G"), 2'500'000'000u);
  EXPECT_EQ(*ParseBitRate("0.5k"), 500u);
  EXPECT_EQ(*ParseBitRate("10Mbit/s"), 10'000'000u);
  EXPECT_EQ(*ParseBitRate("10mbps"), 10'000'000u);
  EXPECT_EQ(*ParseBitRate("3T"), 3'000'000'000'000u);
  EXPECT_EQ(*ParseBitRate("0", true), 0u);
  for (const char* bad : {"", "0", "0.0M", "M", ".", "1.", "5X", "5MB", "-1", "1.2.3", "0.1", "10000000000T",
                          "1234567890123456789012345678901"}) {
    EXPECT_EQ(ParseBitRate(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(FormatBitRate(950), "950 bit/s");
  EXPECT_EQ(FormatBitRate(80'000'000), "80.0 Mbit/s");
  EXPECT_EQ(FormatBitRate(2'500'000'000), "2.50 Gbit/s");
}

}  // namespace
}  // namespace canopy

namespace canopy {
namespace {

// ------------------------------------------------------------------ metrics

TEST(MetricsTest, ExpositionHasCountersGaugesHistogramsAndLabels) {
  auto& ok = metrics::GetCounter("canopy_test_ops_total", "Operations done.", {{"outcome", "ok"}});
  auto& bad = metrics::GetCounter("canopy_test_ops_total", "Operations done.", {{"outcome", "error"}});
  EXPECT_EQ(&ok, &metrics::GetCounter("canopy_test_ops_total", "Operations done.", {{"outcome", "ok"}}));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) ok.Increment();
    });
  }
  for (auto& t : threads) t.join();
  bad.Increment(2);
  auto& latency = metrics::GetHistogram("canopy_test_latency_seconds", "Latency.", metrics::LatencyBuckets());
  latency.Observe(0.0003);
  latency.Observe(3);
  double refreshed_value = 0;
  std::string text;
  {
    metrics::Refresher refresher([&] {
      metrics::GetGauge("canopy_test_level", "A level set when scraped.").Set(refreshed_value);
    });
    refreshed_value = 42;
    text = metrics::Exposition();
  }
  EXPECT_NE(text.find("# HELP canopy_test_ops_total Operations done."), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE canopy_test_ops_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_ops_total{outcome=\"ok\"} 4000"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_ops_total{outcome=\"error\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE canopy_test_latency_seconds histogram"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_latency_seconds_bucket{le=\"0.0005\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_latency_seconds_bucket{le=\"+Inf\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_latency_seconds_count 2"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_test_level 42"), std::string::npos) << text;
  // The refresher is gone: the gauge keeps its last value, nothing calls back.
  refreshed_value = 7;
  EXPECT_NE(metrics::Exposition().find("canopy_test_level 42"), std::string::npos);
  EXPECT_THROW(canopy::metrics::GetGauge("canopy_test_ops_total", "Not a gauge."), std::invalid_argument);
}

}  // namespace
}  // namespace canopy

namespace canopy {
namespace {
std::atomic<int> thread_local_teardowns{0};
struct CountsItsTeardown {
  ~CountsItsTeardown() { thread_local_teardowns.fetch_add(1); }
};
thread_local CountsItsTeardown per_thread_state;
}  // namespace

TEST(ThreadSetTest, JoinAllReturnsAfterEveryThreadFinishedItsThreadLocalTeardown) {
  thread_local_teardowns.store(0);
  constexpr int kThreads = 8;
  std::atomic<int> ran{0};
  {
    ThreadSet set;
    for (int i = 0; i < kThreads; ++i) {
      auto owned = std::make_unique<int>(i);  // a move-only capture
      set.Spawn([&ran, owned = std::move(owned)] {
        (void)&per_thread_state;  // naming it here constructs this thread's instance
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ran.fetch_add(1 + 0 * *owned);
      });
    }
    set.JoinAll();
    // Every task ran, and every thread has gone past its thread_local
    // destructors: a detached thread gives no such guarantee.
    EXPECT_EQ(ran.load(), kThreads);
    EXPECT_EQ(thread_local_teardowns.load(), kThreads);
    EXPECT_EQ(set.size(), 0u);
  }
}

TEST(ThreadSetTest, SpawnReapsThreadsThatFinished) {
  ThreadSet set;
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i) set.Spawn([&done] { done.fetch_add(1); });
  const Deadline deadline = Deadline::After(canopy::testing::ScaledBound(std::chrono::seconds(5)));
  while (done.load() < 4 && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(done.load(), 4);
  // The tasks have returned; their threads are joined by Reap (or by the next
  // Spawn), so a long-running server does not accumulate them.
  while (set.size() > 0 && !deadline.expired()) {
    set.Reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(set.size(), 0u);
  set.Spawn([] {});
  set.JoinAll();
  EXPECT_EQ(set.size(), 0u);
}

// Buffers given back are lent again, on any thread, with their bytes as
// left (never zero-filled); a take gets the smallest kept buffer that is
// large enough; oversized and released buffers are not kept.
TEST(PooledBufferTest, BuffersGoBackToThePoolAndServeTheNextTakeOnAnyThread) {
  const char* first = nullptr;
  {
    PooledBuffer a = PooledBuffer::Take(1 << 20);
    ASSERT_GE(a.capacity(), size_t{1} << 20);
    std::memcpy(a.data(), "marked", 6);
    first = a.data();
  }
  std::thread([&] {
    PooledBuffer b = PooledBuffer::Take(512 << 10);
    EXPECT_EQ(b.data(), first) << "the buffer given back serves the next take, from any thread";
    EXPECT_EQ(std::string(b.data(), 6), "marked");
  }).join();

  const char* small = nullptr;
  const char* large = nullptr;
  {
    PooledBuffer s = PooledBuffer::Take(1 << 20);
    PooledBuffer l = PooledBuffer::Take(4 << 20);
    small = s.data();
    large = l.data();
  }
  {
    PooledBuffer two = PooledBuffer::Take(2 << 20);
    EXPECT_EQ(two.data(), large);
    PooledBuffer half = PooledBuffer::Take(512 << 10);
    EXPECT_EQ(half.data(), small) << "the smallest buffer that is large enough";
    // Grow keeps what was written, and gives the smaller buffer back.
    std::memcpy(half.data(), "kept", 4);
    half.Grow(3 << 20, 4);
    EXPECT_GE(half.capacity(), size_t{3} << 20);
    EXPECT_EQ(std::string(half.data(), 4), "kept");
    PooledBuffer again = PooledBuffer::Take(1 << 20);
    EXPECT_EQ(again.data(), small);
  }
  {
    PooledBuffer huge = PooledBuffer::Take(PooledBuffer::kMaxKeptBytes + 1);
    std::unique_ptr<char[]> mine = PooledBuffer::Take(1 << 20).Release();
    ASSERT_NE(mine, nullptr);
    PooledBuffer adopted = PooledBuffer::Adopt(std::move(mine), 1 << 20);
    EXPECT_EQ(adopted.capacity(), size_t{1} << 20);
    EXPECT_EQ(PooledBuffer::Adopt(nullptr, 5).capacity(), 0u);
  }
  for (int i = 0; i < 3; ++i) {
    PooledBuffer b = PooledBuffer::Take(1);
    EXPECT_LE(b.capacity(), PooledBuffer::kMaxKeptBytes) << "a buffer over the limit is not kept";
  }
  PooledBuffer empty;
  EXPECT_EQ(empty.capacity(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
}

}  // namespace canopy
