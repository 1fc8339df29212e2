#include "tests/transport_conformance.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/coding.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"
#include "transport/registry.h"
#include "transport/transport_metrics.h"

namespace canopy::transport::testing {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::TempDir;

// Every blocking call in the suite is bounded by this; a backend that hangs
// fails instead of stalling ctest (scaled under emulation: CANOPY_TEST_TIME_SCALE).
const std::chrono::milliseconds kIoLimit = ::canopy::testing::ScaledBound(20s);
Deadline IoDeadline() { return Deadline::After(kIoLimit); }

// Runs `body` on its own thread. Join() waits at most `limit`; past it,
// `unblock` (closing connections, so blocked calls return) is called and the
// thread is joined anyway, and the result says the body hung.
class Worker {
 public:
  explicit Worker(std::function<Status()> body) {
    std::packaged_task<Status()> task(std::move(body));
    result_ = task.get_future();
    thread_ = std::thread(std::move(task));
  }
  ~Worker() {
    if (thread_.joinable()) thread_.join();
  }
  Status Join(std::chrono::milliseconds limit = kIoLimit, const std::function<void()>& unblock = {}) {
    bool hung = result_.wait_for(limit) != std::future_status::ready;
    if (hung && unblock) unblock();
    thread_.join();
    Status s = result_.get();
    if (hung)
      return Status::Timeout("worker did not finish in time; after unblocking it returned " + s.ToString());
    return s;
  }

 private:
  std::future<Status> result_;
  std::thread thread_;
};

// Compares large byte strings without dumping them into the test log.
::testing::AssertionResult SameBytes(std::string_view actual, std::string_view expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << ", expected " << expected.size();
  }
  if (actual == expected) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) return ::testing::AssertionFailure() << "first difference at byte " << i;
  }
  return ::testing::AssertionSuccess();
}

// Deterministic pseudo-random bytes, 8 at a time (splitmix64): the suite
// moves hundreds of MiB, and a byte-wise generator dominates sanitizer runs.
std::string RandomBytes(size_t n, uint64_t seed) {
  std::string out(n, '\0');
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (size_t i = 0; i < n; i += 8) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return out;
}

// Payload of message `index` in sequence tests: its index, then seeded bytes.
std::string IndexedPayload(uint32_t index, size_t extra) {
  std::string payload(4, '\0');
  EncodeFixed32(payload.data(), index);
  payload += RandomBytes(extra, index + 1);
  return payload;
}

Status WriteFile(const std::string& path, std::string_view contents) {
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC));
  return WriteAll(fd.get(), contents.data(), contents.size(), path);
}

// Receives one message and checks type and payload.
::testing::AssertionResult ReceiveExpected(Connection& connection, uint16_t type, std::string_view payload,
                                           uint64_t bulk_bytes = 0) {
  auto message = connection.Receive(IoDeadline());
  if (!message.ok()) return ::testing::AssertionFailure() << "Receive: " << message.status().ToString();
  if (message->type != type)
    return ::testing::AssertionFailure() << "type " << message->type << ", expected " << type;
  if (message->bulk_bytes != bulk_bytes) {
    return ::testing::AssertionFailure()
           << "bulk_bytes " << message->bulk_bytes << ", expected " << bulk_bytes;
  }
  return SameBytes(message->payload, payload);
}

}  // namespace

void PrintTo(const ConformanceBackend& backend, std::ostream* os) { *os << backend.name; }

std::string ConformanceBackendName(const ::testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.name;
}

void TransportConformanceTest::SetUp() {
  const ConformanceBackend& backend = GetParam();
  if (backend.skip_reason) {
    std::string why = backend.skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  RegisterBuiltinTransports();
  auto endpoint = ParseEndpoint(backend.listen_uri);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  auto listener_transport = TransportRegistry::Global().Create(endpoint->scheme, backend.listener_options);
  ASSERT_TRUE(listener_transport.ok()) << listener_transport.status().ToString();
  listener_transport_ = *listener_transport;
  auto dialer_transport = TransportRegistry::Global().Create(endpoint->scheme, backend.dialer_options);
  ASSERT_TRUE(dialer_transport.ok()) << dialer_transport.status().ToString();
  dialer_transport_ = *dialer_transport;
  auto listener = listener_transport_->Listen(*endpoint);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  listener_ = std::move(*listener);
  listen_endpoint_ = listener_->local_endpoint();
  ASSERT_NE(listen_endpoint_.port, 0) << "local_endpoint() must report the port actually bound";
  ASSERT_EQ(listen_endpoint_.scheme, endpoint->scheme);
}

void TransportConformanceTest::TearDown() {
  if (listener_) listener_->Close();
  listener_.reset();
  dialer_transport_.reset();
  listener_transport_.reset();
}

Result<TransportConformanceTest::ConnectionPair> TransportConformanceTest::ConnectPair() {
  std::optional<Result<std::unique_ptr<Connection>>> accepted;
  std::thread acceptor([&] { accepted.emplace(listener_->Accept(IoDeadline())); });
  auto client = dialer_transport_->Connect(listen_endpoint_);
  if (!client.ok()) listener_->Close();  // unblocks Accept; the test fails anyway
  acceptor.join();
  if (!client.ok()) return client.status().WithContext("Connect");
  if (!accepted->ok()) return accepted->status().WithContext("Accept");
  ConnectionPair pair;
  pair.client = std::move(*client);
  pair.server = std::move(**accepted);
  return pair;
}

// ---------------------------------------------------------------------------

TEST_P(TransportConformanceTest, ExchangesMessagesBothWays) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(pair->client->peer_uri().rfind(listen_endpoint_.scheme + "://", 0), 0u)
      << pair->client->peer_uri();
  EXPECT_EQ(pair->server->peer_uri().rfind(listen_endpoint_.scheme + "://", 0), 0u)
      << pair->server->peer_uri();

  ASSERT_TRUE(pair->client->Send(7, "ping").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->server, 7, "ping"));
  ASSERT_TRUE(pair->server->Send(65535, "").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->client, 65535, ""));

  ConnectionStats client_stats = pair->client->stats();
  EXPECT_EQ(client_stats.messages_sent, 1u);
  EXPECT_EQ(client_stats.messages_received, 1u);
  EXPECT_EQ(client_stats.bytes_sent, 4u);
  ConnectionStats server_stats = pair->server->stats();
  EXPECT_EQ(server_stats.messages_received, 1u);
  EXPECT_EQ(server_stats.bytes_received, 4u);
}

TEST_P(TransportConformanceTest, KeepsManyMessagesInOrder) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  constexpr uint32_t kCount = 3000;
  Worker sender([&]() -> Status {
    for (uint32_t i = 0; i < kCount; ++i) {
      CANOPY_RETURN_IF_ERROR(
          pair->client->Send(static_cast<uint16_t>(i % 13), IndexedPayload(i, (i * 37) % 5000)));
    }
    return Status::Ok();
  });
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(
        ReceiveExpected(*pair->server, static_cast<uint16_t>(i % 13), IndexedPayload(i, (i * 37) % 5000)))
        << "message " << i;
  }
  ASSERT_TRUE(sender.Join().ok());
  EXPECT_EQ(pair->client->stats().messages_sent, kCount);
  EXPECT_EQ(pair->server->stats().messages_received, kCount);
}

TEST_P(TransportConformanceTest, SendBatchDeliversLikeConsecutiveSends) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  // More than one write's worth on TCP (64 frames), an empty payload among them.
  constexpr uint32_t kCount = 150;
  std::vector<std::string> payloads;
  for (uint32_t i = 0; i < kCount; ++i) payloads.push_back(i == 3 ? std::string() : IndexedPayload(i, (i * 53) % 3000));
  std::vector<std::string_view> views(payloads.begin(), payloads.end());
  Worker sender([&]() -> Status {
    CANOPY_RETURN_IF_ERROR(pair->client->SendBatch(9, views));
    CANOPY_RETURN_IF_ERROR(pair->client->SendBatch(9, {}));
    return pair->client->Send(10, "after");
  });
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_TRUE(ReceiveExpected(*pair->server, 9, payloads[i])) << "message " << i;
  ASSERT_TRUE(ReceiveExpected(*pair->server, 10, "after"));
  ASSERT_TRUE(sender.Join().ok());
  EXPECT_EQ(pair->client->stats().messages_sent, kCount + 1);
  EXPECT_EQ(pair->server->stats().messages_received, kCount + 1);
}

TEST_P(TransportConformanceTest, CarriesPayloadsFromOneByteTo64MiB) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  std::vector<size_t> sizes = {0};
  for (size_t size = 1; size <= (size_t{64} << 20); size *= 4) {
    sizes.push_back(size);
    if (size > 1 && size < (size_t{64} << 20)) sizes.push_back(size + 3);  // not a power of two
  }
  Worker sender([&]() -> Status {
    for (size_t i = 0; i < sizes.size(); ++i) {
      CANOPY_RETURN_IF_ERROR(pair->client->Send(static_cast<uint16_t>(i), RandomBytes(sizes[i], 1000 + i)));
    }
    return Status::Ok();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(ReceiveExpected(*pair->server, static_cast<uint16_t>(i), RandomBytes(sizes[i], 1000 + i)))
        << "payload of " << sizes[i] << " bytes";
  }
  ASSERT_TRUE(sender.Join().ok());
}

TEST_P(TransportConformanceTest, DeliversManySmallMessages) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  constexpr uint32_t kCount = 20000;
  Worker sender([&]() -> Status {
    for (uint32_t i = 0; i < kCount; ++i) {
      CANOPY_RETURN_IF_ERROR(pair->client->Send(1, IndexedPayload(i, i % 60)));
    }
    return Status::Ok();
  });
  for (uint32_t i = 0; i < kCount; ++i) {
    auto message = pair->server->Receive(IoDeadline());
    ASSERT_TRUE(message.ok()) << "message " << i << ": " << message.status().ToString();
    ASSERT_EQ(message->payload, IndexedPayload(i, i % 60)) << "message " << i;
  }
  ASSERT_TRUE(sender.Join().ok());
}

TEST_P(TransportConformanceTest, ServesSeveralConnectionsConcurrently) {
  constexpr int kClients = 4;
  constexpr uint32_t kMessages = 300;
  // Server: accept kClients connections and echo every message on its own thread.
  std::vector<std::unique_ptr<Connection>> server_side(kClients);
  std::vector<std::unique_ptr<Worker>> echoers;
  Worker acceptor([&]() -> Status {
    for (int i = 0; i < kClients; ++i) {
      CANOPY_ASSIGN_OR_RETURN(server_side[i], listener_->Accept(IoDeadline()));
      Connection* connection = server_side[i].get();
      echoers.push_back(std::make_unique<Worker>([connection]() -> Status {
        for (;;) {
          auto message = connection->Receive(IoDeadline());
          if (!message.ok()) return message.status().IsClosed() ? Status::Ok() : message.status();
          CANOPY_RETURN_IF_ERROR(connection->Send(message->type, message->payload));
        }
      }));
    }
    return Status::Ok();
  });
  std::vector<std::unique_ptr<Worker>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(std::make_unique<Worker>([&, c]() -> Status {
      CANOPY_ASSIGN_OR_RETURN(auto connection, dialer_transport_->Connect(listen_endpoint_));
      for (uint32_t i = 0; i < kMessages; ++i) {
        std::string payload = IndexedPayload(i, (i * 131 + c * 7) % 20000);
        CANOPY_RETURN_IF_ERROR(connection->Send(static_cast<uint16_t>(c), payload));
        CANOPY_ASSIGN_OR_RETURN(Message echo, connection->Receive(IoDeadline()));
        if (echo.type != c || echo.payload != payload) {
          return Status::Corruption("client " + std::to_string(c) + " got a wrong echo for message " +
                                    std::to_string(i));
        }
      }
      return connection->Shutdown();
    }));
  }
  auto close_all = [&] {
    listener_->Close();
    for (auto& connection : server_side) {
      if (connection) connection->Close();
    }
  };
  for (auto& client : clients) EXPECT_TRUE(client->Join(kIoLimit, close_all).ok());
  ASSERT_TRUE(acceptor.Join(kIoLimit, close_all).ok());
  for (auto& echoer : echoers) EXPECT_TRUE(echoer->Join(kIoLimit, close_all).ok());
}

TEST_P(TransportConformanceTest, ConcurrentSendersNeverInterleaveMessages) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  constexpr int kSenders = 4;
  constexpr uint32_t kPerSender = 300;
  // Sender 0's messages are larger than small socket buffers, so its writes
  // are partial and would interleave with the others' without the send lock.
  auto payload_of = [](int sender, uint32_t i) {
    return IndexedPayload(i, sender == 0 ? (96 << 10) + i * 7 : (i * 997 + sender) % 9000);
  };
  std::vector<std::unique_ptr<Worker>> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.push_back(std::make_unique<Worker>([&, s]() -> Status {
      for (uint32_t i = 0; i < kPerSender; ++i) {
        CANOPY_RETURN_IF_ERROR(pair->client->Send(static_cast<uint16_t>(s), payload_of(s, i)));
      }
      return Status::Ok();
    }));
  }
  std::vector<uint32_t> next(kSenders, 0);
  for (uint32_t n = 0; n < kSenders * kPerSender; ++n) {
    auto message = pair->server->Receive(IoDeadline());
    ASSERT_TRUE(message.ok()) << message.status().ToString();
    ASSERT_LT(message->type, kSenders);
    int s = message->type;
    ASSERT_TRUE(SameBytes(message->payload, payload_of(s, next[s])))
        << "sender " << s << " message " << next[s];
    ++next[s];
  }
  for (auto& sender : senders) EXPECT_TRUE(sender->Join().ok());
}

TEST_P(TransportConformanceTest, BulkFromMemoryIntoMemoryInPieces) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const std::string bulk = RandomBytes((size_t{8} << 20) + 13, 77);
  Worker sender([&]() -> Status {
    CANOPY_RETURN_IF_ERROR(pair->client->SendWithBulk(3, "header", BulkSource::FromMemory(bulk)));
    CANOPY_RETURN_IF_ERROR(pair->client->SendWithBulk(4, "empty bulk", BulkSource::FromMemory("")));
    return pair->client->Send(5, "after");
  });
  auto message = pair->server->Receive(IoDeadline());
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  EXPECT_EQ(message->type, 3);
  EXPECT_EQ(message->payload, "header");
  ASSERT_EQ(message->bulk_bytes, bulk.size());
  std::string received(bulk.size(), '\0');
  const size_t pieces[] = {1, 1000, 4096, size_t{1} << 20, 3, size_t{3} << 20};
  size_t done = 0;
  for (size_t piece : pieces) {
    ASSERT_TRUE(
        pair->server->ReceiveBulk(BulkSink::ToMemory(received.data() + done), piece, IoDeadline()).ok());
    done += piece;
  }
  ASSERT_TRUE(
      pair->server->ReceiveBulk(BulkSink::ToMemory(received.data() + done), bulk.size() - done, IoDeadline())
          .ok());
  EXPECT_TRUE(SameBytes(received, bulk));
  ASSERT_TRUE(ReceiveExpected(*pair->server, 4, "empty bulk", 0));
  ASSERT_TRUE(ReceiveExpected(*pair->server, 5, "after"));
  ASSERT_TRUE(sender.Join().ok());
  EXPECT_EQ(pair->client->stats().bytes_sent, 6 + bulk.size() + 10 + 5);
  EXPECT_EQ(pair->server->stats().bytes_received, 6 + bulk.size() + 10 + 5);
}

TEST_P(TransportConformanceTest, BulkBetweenFilesAndMemoryInAllCombinations) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  TempDir dir;
  const std::string contents = RandomBytes((size_t{12} << 20) + 4321, 99);
  const std::string source_path = dir.File("source");
  ASSERT_TRUE(WriteFile(source_path, contents).ok());
  auto source = OpenFile(source_path, O_RDONLY);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const uint64_t offset = 517;  // not page aligned
  const uint64_t length = contents.size() - offset - 1000;
  const std::string_view expected = std::string_view(contents).substr(offset, length);

  struct Case {
    bool from_file;
    bool to_file;
  };
  const Case cases[] = {{true, true}, {true, false}, {false, true}, {false, false}};
  Worker sender([&]() -> Status {
    for (const Case& c : cases) {
      BulkSource from = c.from_file ? BulkSource::FromFile(source->get(), offset, length)
                                    : BulkSource::FromMemory(expected);
      CANOPY_RETURN_IF_ERROR(pair->client->SendWithBulk(9, c.from_file ? "file" : "memory", from));
    }
    return pair->client->Send(10, "done");
  });
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.from_file ? "file" : "memory") + " -> " + (c.to_file ? "file" : "memory"));
    ASSERT_TRUE(ReceiveExpected(*pair->server, 9, c.from_file ? "file" : "memory", length));
    // Three pieces of uneven size.
    const uint64_t piece[3] = {length / 3 + 7, length / 3 - 11,
                               length - (length / 3 + 7) - (length / 3 - 11)};
    if (c.to_file) {
      const std::string sink_path = dir.File("sink" + std::to_string(index++));
      auto sink = OpenFile(sink_path, O_RDWR | O_CREAT | O_TRUNC);
      ASSERT_TRUE(sink.ok()) << sink.status().ToString();
      const uint64_t sink_offset = 100;
      uint64_t done = 0;
      for (uint64_t p : piece) {
        Status s =
            pair->server->ReceiveBulk(BulkSink::ToFile(sink->get(), sink_offset + done), p, IoDeadline());
        ASSERT_TRUE(s.ok()) << s.ToString();
        done += p;
      }
      EXPECT_EQ(::lseek(sink->get(), 0, SEEK_CUR), 0) << "the sink's file offset must stay untouched";
      auto written = ReadFileToString(sink_path);
      ASSERT_TRUE(written.ok()) << written.status().ToString();
      ASSERT_EQ(written->size(), sink_offset + length);
      EXPECT_EQ(written->substr(0, sink_offset), std::string(sink_offset, '\0'));
      EXPECT_TRUE(SameBytes(std::string_view(*written).substr(sink_offset), expected));
    } else {
      std::string received(length, '\0');
      uint64_t done = 0;
      for (uint64_t p : piece) {
        Status s = pair->server->ReceiveBulk(BulkSink::ToMemory(received.data() + done), p, IoDeadline());
        ASSERT_TRUE(s.ok()) << s.ToString();
        done += p;
      }
      EXPECT_TRUE(SameBytes(received, expected));
    }
  }
  ASSERT_TRUE(ReceiveExpected(*pair->server, 10, "done"));
  ASSERT_TRUE(sender.Join().ok());
  EXPECT_EQ(::lseek(source->get(), 0, SEEK_CUR), 0) << "the source's file offset must stay untouched";
}

// A bulk into a file that already covers the range (rcopy sizes its
// temporary file up front) writes the range only: the bytes around it and the
// file's size stay as they were. On rdma:// over tmpfs the bytes are READ
// straight into the file's mapped pages; elsewhere, and when the file is
// shorter, they are written.
TEST_P(TransportConformanceTest, BulkIntoAFileThatCoversTheRangeWritesOnlyTheRange) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  TempDir dir;
  const std::string contents = RandomBytes((size_t{6} << 20) + 777, 23);
  Worker sender([&]() -> Status {
    CANOPY_RETURN_IF_ERROR(pair->client->SendWithBulk(9, "covered", BulkSource::FromMemory(contents)));
    return pair->client->Send(10, "done");
  });
  ASSERT_TRUE(ReceiveExpected(*pair->server, 9, "covered", contents.size()));
  const std::string sink_path = dir.File("sink");
  const uint64_t sink_offset = 4096 + 100;
  const std::string before(sink_offset + contents.size() + 5000, 'z');
  ASSERT_TRUE(WriteFile(sink_path, before).ok());
  auto sink = OpenFile(sink_path, O_RDWR);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  struct statfs fs;
  ASSERT_EQ(::fstatfs(sink->get(), &fs), 0);
  const bool rdma_into_tmpfs =
      pair->server->peer_uri().find("rdma://") != std::string::npos && fs.f_type == TMPFS_MAGIC;
  prometheus::Counter* direct = CountersForScheme("rdma").bulk_direct_bytes;
  const double direct_before = direct->Value();
  const uint64_t piece[3] = {(size_t{1} << 20) + 5, (size_t{3} << 20) - 5,
                             contents.size() - (size_t{4} << 20)};
  uint64_t done = 0;
  for (uint64_t p : piece) {
    Status s = pair->server->ReceiveBulk(BulkSink::ToFile(sink->get(), sink_offset + done), p, IoDeadline());
    ASSERT_TRUE(s.ok()) << s.ToString();
    done += p;
  }
  ASSERT_TRUE(ReceiveExpected(*pair->server, 10, "done"));
  ASSERT_TRUE(sender.Join().ok());
  auto written = ReadFileToString(sink_path);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->size(), before.size()) << "the file's size changed";
  EXPECT_EQ(written->substr(0, sink_offset), before.substr(0, sink_offset));
  EXPECT_TRUE(SameBytes(std::string_view(*written).substr(sink_offset, contents.size()), contents));
  EXPECT_EQ(written->substr(sink_offset + contents.size()), before.substr(sink_offset + contents.size()));
  if (rdma_into_tmpfs) {
    EXPECT_EQ(direct->Value() - direct_before, static_cast<double>(contents.size()))
        << "rdma:// into a tmpfs file should READ every piece straight into its pages";
  }
}

// BulkSink::file_write_lock: while another holder keeps it, nothing is
// written into the file (the bytes wait in the transport, or the sender is
// held back); once released, the whole bulk lands byte-exact.
TEST_P(TransportConformanceTest, BulkIntoAFileWritesOnlyUnderItsWriteLock) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  TempDir dir;
  const std::string contents = RandomBytes((size_t{4} << 20) + 3, 41);
  Worker sender([&]() -> Status {
    return pair->client->SendWithBulk(9, "locked", BulkSource::FromMemory(contents));
  });
  ASSERT_TRUE(ReceiveExpected(*pair->server, 9, "locked", contents.size()));
  const std::string sink_path = dir.File("sink");
  auto sink = OpenFile(sink_path, O_RDWR | O_CREAT | O_TRUNC);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();

  std::mutex write_lock;
  std::unique_lock<std::mutex> held(write_lock);
  std::atomic<bool> finished{false};
  Worker receiver([&]() -> Status {
    Status s = pair->server->ReceiveBulk(BulkSink::ToFile(sink->get(), 0, &write_lock), contents.size(),
                                         IoDeadline());
    finished = true;
    return s;
  });
  // However long the lock is held, no byte may reach the file meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  struct stat st;
  ASSERT_EQ(::fstat(sink->get(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "bytes were written while another holder had the write lock";
  EXPECT_FALSE(finished.load());
  held.unlock();
  ASSERT_TRUE(receiver.Join().ok());
  ASSERT_TRUE(sender.Join().ok());
  auto written = ReadFileToString(sink_path);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_TRUE(SameBytes(*written, contents));
}

TEST_P(TransportConformanceTest, ShutdownDeliversEverythingThenClosed) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  constexpr uint32_t kCount = 500;
  const std::string bulk = RandomBytes(3 << 20, 5);
  Worker sender([&]() -> Status {
    for (uint32_t i = 0; i < kCount; ++i)
      CANOPY_RETURN_IF_ERROR(pair->client->Send(2, IndexedPayload(i, i % 3000)));
    CANOPY_RETURN_IF_ERROR(pair->client->SendWithBulk(3, "last", BulkSource::FromMemory(bulk)));
    return pair->client->Shutdown();
  });
  for (uint32_t i = 0; i < kCount; ++i)
    ASSERT_TRUE(ReceiveExpected(*pair->server, 2, IndexedPayload(i, i % 3000)));
  ASSERT_TRUE(ReceiveExpected(*pair->server, 3, "last", bulk.size()));
  std::string received(bulk.size(), '\0');
  ASSERT_TRUE(pair->server->ReceiveBulk(BulkSink::ToMemory(received.data()), bulk.size(), IoDeadline()).ok());
  EXPECT_TRUE(SameBytes(received, bulk));
  ASSERT_TRUE(sender.Join().ok());
  auto end = pair->server->Receive(IoDeadline());
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.status().code(), StatusCode::kClosed) << end.status().ToString();
  end = pair->server->Receive(IoDeadline());
  EXPECT_EQ(end.status().code(), StatusCode::kClosed) << "Closed must be sticky: " << end.status().ToString();

  // Half-close: the side that shut down still receives.
  EXPECT_FALSE(pair->client->Send(2, "after shutdown").ok());
  ASSERT_TRUE(pair->server->Send(4, "reply").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->client, 4, "reply"));
  ASSERT_TRUE(pair->server->Shutdown().ok());
  ASSERT_TRUE(pair->server->Shutdown().ok()) << "Shutdown is idempotent";
  auto client_end = pair->client->Receive(IoDeadline());
  EXPECT_EQ(client_end.status().code(), StatusCode::kClosed) << client_end.status().ToString();
}

TEST_P(TransportConformanceTest, PeerClosingMidBulkFailsTheReceiver) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const std::string bulk = RandomBytes(size_t{64} << 20, 8);
  Worker sender(
      [&]() -> Status { return pair->server->SendWithBulk(1, "big", BulkSource::FromMemory(bulk)); });
  ASSERT_TRUE(ReceiveExpected(*pair->client, 1, "big", bulk.size()));
  std::string received(bulk.size(), '\0');
  ASSERT_TRUE(pair->client->ReceiveBulk(BulkSink::ToMemory(received.data()), 1 << 20, IoDeadline()).ok());
  pair->server->Close();
  Status send_status = sender.Join(kIoLimit, [&] { pair->client->Close(); });
  EXPECT_EQ(send_status.code(), StatusCode::kAborted) << send_status.ToString();
  Status s = pair->client->ReceiveBulk(BulkSink::ToMemory(received.data() + (1 << 20)),
                                       bulk.size() - (1 << 20), IoDeadline());
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kClosed) << s.ToString();
  auto next = pair->client->Receive(IoDeadline());
  EXPECT_FALSE(next.ok());
  EXPECT_NE(next.status().code(), StatusCode::kTimeout) << next.status().ToString();
}

TEST_P(TransportConformanceTest, PeerClosingMidBulkFailsTheSender) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const std::string bulk = RandomBytes(size_t{64} << 20, 9);
  Worker sender(
      [&]() -> Status { return pair->client->SendWithBulk(1, "big", BulkSource::FromMemory(bulk)); });
  ASSERT_TRUE(ReceiveExpected(*pair->server, 1, "big", bulk.size()));
  std::string received(1 << 20, '\0');
  ASSERT_TRUE(
      pair->server->ReceiveBulk(BulkSink::ToMemory(received.data()), received.size(), IoDeadline()).ok());
  pair->server->Close();
  Status s = sender.Join(kIoLimit, [&] { pair->client->Close(); });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_FALSE(pair->client->Send(1, "more").ok());
}

TEST_P(TransportConformanceTest, ConnectToClosedPortIsUnavailable) {
  listener_->Close();
  auto connection = dialer_transport_->Connect(listen_endpoint_);
  ASSERT_FALSE(connection.ok());
  EXPECT_EQ(connection.status().code(), StatusCode::kUnavailable) << connection.status().ToString();
}

TEST_P(TransportConformanceTest, ReceiveAndAcceptHonourDeadlines) {
  auto accept = listener_->Accept(Deadline::After(50ms));
  EXPECT_EQ(accept.status().code(), StatusCode::kTimeout) << accept.status().ToString();

  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  auto start = Clock::now();
  auto message = pair->server->Receive(Deadline::After(150ms));
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), StatusCode::kTimeout) << message.status().ToString();
  EXPECT_GE(Clock::now() - start, 140ms) << "Receive returned Timeout before its deadline";
  // A timeout with nothing pending leaves the connection usable.
  ASSERT_TRUE(pair->client->Send(1, "late").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->server, 1, "late"));
}

TEST_P(TransportConformanceTest, SlowReceiverBlocksTheSender) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const std::string bulk = RandomBytes(size_t{64} << 20, 10);
  std::atomic<bool> sent{false};
  Worker sender([&]() -> Status {
    Status s = pair->client->SendWithBulk(1, "slow", BulkSource::FromMemory(bulk));
    sent = true;
    return s;
  });
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(sent.load())
      << "64 MiB went out while the receiver read nothing: in-flight bytes are unbounded";
  ASSERT_TRUE(ReceiveExpected(*pair->server, 1, "slow", bulk.size()));
  std::string received(bulk.size(), '\0');
  ASSERT_TRUE(pair->server->ReceiveBulk(BulkSink::ToMemory(received.data()), bulk.size(), IoDeadline()).ok());
  EXPECT_TRUE(SameBytes(received, bulk));
  ASSERT_TRUE(sender.Join(kIoLimit, [&] { pair->client->Close(); }).ok());
  EXPECT_TRUE(sent.load());
}

TEST_P(TransportConformanceTest, RefusesOversizedMessages) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  const size_t limit = GetParam().dialer_options.max_message_bytes;
  ASSERT_LE(limit, size_t{256} << 20) << "the suite allocates max_message_bytes + 1 bytes";
  std::string oversized(limit + 1, 'x');
  Status s = pair->client->Send(1, oversized);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = pair->client->SendWithBulk(1, oversized, BulkSource::FromMemory("bulk"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  oversized.clear();
  oversized.shrink_to_fit();
  // Nothing went on the wire: the connection still works.
  ASSERT_TRUE(pair->client->Send(2, "fine").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->server, 2, "fine"));
}

TEST_P(TransportConformanceTest, CloseFromAnotherThreadWakesBlockedCalls) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  // A blocked Receive.
  Worker receiver([&]() -> Status { return pair->server->Receive(Deadline::After(kIoLimit)).status(); });
  std::this_thread::sleep_for(100ms);
  pair->server->Close();
  Status s = receiver.Join();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_EQ(pair->server->Receive(Deadline::After(10ms)).status().code(), StatusCode::kAborted);
  EXPECT_EQ(pair->server->Send(1, "x").code(), StatusCode::kAborted);
  pair->server->Close();  // idempotent

  // A blocked Send (the peer reads nothing).
  auto second = ConnectPair();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const std::string bulk = RandomBytes(size_t{64} << 20, 11);
  Worker sender(
      [&]() -> Status { return second->client->SendWithBulk(1, "", BulkSource::FromMemory(bulk)); });
  std::this_thread::sleep_for(300ms);
  second->client->Close();
  s = sender.Join();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();

  // A blocked Accept.
  Worker acceptor([&]() -> Status { return listener_->Accept(Deadline::After(kIoLimit)).status(); });
  std::this_thread::sleep_for(100ms);
  listener_->Close();
  s = acceptor.Join();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
}

TEST_P(TransportConformanceTest, ConnectionsOutliveTheirTransportAndListener) {
  auto pair = ConnectPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  listener_->Close();
  listener_.reset();
  listener_transport_.reset();
  dialer_transport_.reset();
  ASSERT_TRUE(pair->client->Send(1, "still here").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->server, 1, "still here"));
  ASSERT_TRUE(pair->server->Send(2, "me too").ok());
  ASSERT_TRUE(ReceiveExpected(*pair->client, 2, "me too"));
}

}  // namespace canopy::transport::testing
