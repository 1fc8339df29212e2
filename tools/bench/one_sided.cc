#include "tools/bench/one_sided.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "base/clock.h"
#include "base/coding.h"
#include "tools/bench/perftest.h"
#if CANOPY_HAVE_RDMA
#include "transport/rdma/log_ring.h"
#endif

namespace canopy::bench {
namespace {

constexpr uint8_t kOneSidedVersion = 1;
constexpr size_t kOpenSize = 9;

// Room for 8 records of the test's size (at least 4 KiB).
uint64_t RingBytesFor(uint64_t size) {
#if CANOPY_HAVE_RDMA
  return std::max<uint64_t>(4096, 8 * transport::rdma::RingRecordBytes(size + 1));
#else
  (void)size;
  return 4096;
#endif
}

}  // namespace

#if CANOPY_HAVE_RDMA

namespace {

Result<transport::Message> ExpectType(transport::Connection& conn, uint16_t type, Deadline deadline,
                                      std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(transport::Message m, conn.Receive(deadline));
  if (m.type == kMsgError) return Status::Unavailable(fmt::format("bench server: {}", m.payload));
  if (m.type != type || m.bulk_bytes != 0) {
    return Status::Corruption(fmt::format("expected {}, got message type 0x{:04x}", what, m.type));
  }
  return m;
}

}  // namespace

Result<std::vector<double>> RunOneSidedLatency(transport::Connection& conn, const OneSidedLatencyOptions& options) {
  using transport::rdma::LogRingWriter;
  if (options.size == 0 || options.size > kMaxMessageSize) {
    return Status::InvalidArgument(fmt::format("one-sided latency: size {} outside 1..{}", options.size,
                                               kMaxMessageSize));
  }
  auto io = [&] { return Deadline::After(options.io_timeout); };
  std::string open(kOpenSize, '\0');
  open[0] = static_cast<char>(kOneSidedVersion);
  EncodeFixed64(open.data() + 1, options.size);
  CANOPY_RETURN_IF_ERROR(conn.Send(kMsgRingOpen, open));
  CANOPY_ASSIGN_OR_RETURN(transport::Message offer_message, ExpectType(conn, kMsgRingOffer, io(), "RING_OFFER"));
  CANOPY_ASSIGN_OR_RETURN(transport::rdma::RingOffer offer, transport::rdma::DecodeRingOffer(offer_message.payload));
  CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<LogRingWriter> writer, LogRingWriter::Create(conn, offer));
  CANOPY_RETURN_IF_ERROR(
      conn.Send(kMsgRingTarget, transport::rdma::EncodeFeedbackTarget(writer->feedback_target())));

  const std::string ping = "p" + std::string(options.size, 'x');
  uint64_t sent = 0;
  auto round_trip = [&]() -> Result<double> {
    const Clock::time_point start = Clock::now();
    CANOPY_RETURN_IF_ERROR(writer->Append(ping, io()));
    CANOPY_RETURN_IF_ERROR(writer->WaitDurable(++sent, io()));
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  for (uint64_t i = 0; i < options.warmup; ++i) CANOPY_RETURN_IF_ERROR(round_trip().status());
  std::vector<double> samples;
  const Clock::time_point start = Clock::now();
  while (samples.size() < std::max<uint64_t>(options.iterations, 1)) {
    CANOPY_ASSIGN_OR_RETURN(double us, round_trip());
    samples.push_back(us);
    if (Clock::now() - start >= options.time_limit) break;
  }
  CANOPY_RETURN_IF_ERROR(writer->Append("e", io()));
  CANOPY_ASSIGN_OR_RETURN(transport::Message done_message, ExpectType(conn, kMsgDone, io(), "DONE"));
  CANOPY_ASSIGN_OR_RETURN(DoneCounts done, DecodeDone(done_message.payload));
  if (done.messages != sent || done.bytes != sent * options.size) {
    return Status::Corruption(fmt::format("bench server received {} ring records ({} bytes), the client wrote {}",
                                          done.messages, done.bytes, sent));
  }
  return samples;
}

Status ServeOneSidedLatency(transport::Connection& conn, std::string_view open_payload,
                            std::chrono::milliseconds idle_timeout) {
  using transport::rdma::LogRingReceiver;
  if (open_payload.size() != kOpenSize || static_cast<uint8_t>(open_payload[0]) != kOneSidedVersion) {
    return Status::Corruption(fmt::format("RING_OPEN of {} bytes or of another bench build", open_payload.size()));
  }
  const uint64_t size = DecodeFixed64(open_payload.data() + 1);
  if (size == 0 || size > kMaxMessageSize) return Status::Corruption(fmt::format("RING_OPEN size {}", size));
  CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<LogRingReceiver> ring,
                          LogRingReceiver::Create(conn, RingBytesFor(size), /*epoch=*/1));
  CANOPY_RETURN_IF_ERROR(conn.Send(kMsgRingOffer, transport::rdma::EncodeRingOffer(ring->offer())));
  CANOPY_ASSIGN_OR_RETURN(transport::Message target_message,
                          ExpectType(conn, kMsgRingTarget, Deadline::After(idle_timeout), "RING_TARGET"));
  CANOPY_ASSIGN_OR_RETURN(transport::rdma::FeedbackTarget target,
                          transport::rdma::DecodeFeedbackTarget(target_message.payload));
  CANOPY_RETURN_IF_ERROR(ring->AttachWriter(target));
  DoneCounts counts;
  for (;;) {
    CANOPY_ASSIGN_OR_RETURN(std::string_view record, ring->Wait(Deadline::After(idle_timeout)));
    const bool end = record == "e";
    if (!end && (record.size() != size + 1 || record[0] != 'p')) {
      return Status::Corruption(fmt::format("ring record of {} bytes in a test of {} byte pings", record.size(), size));
    }
    CANOPY_RETURN_IF_ERROR(ring->Release());
    if (end) break;
    ++counts.messages;
    counts.bytes += size;
    CANOPY_RETURN_IF_ERROR(ring->ReportDurable(counts.messages));
  }
  return conn.Send(kMsgDone, EncodeDone(counts));
}

#else

Result<std::vector<double>> RunOneSidedLatency(transport::Connection&, const OneSidedLatencyOptions& options) {
  (void)RingBytesFor(options.size);
  return Status::NotSupported("bench --one-sided needs the rdma backend (build with CANOPY_WITH_RDMA)");
}

Status ServeOneSidedLatency(transport::Connection&, std::string_view, std::chrono::milliseconds) {
  return Status::NotSupported("this bench server was built without the rdma backend: no --one-sided");
}

#endif

}  // namespace canopy::bench
