// The one-sided stream (one_sided_stream.h): a Connection decorator over two
// log rings and the rdma:// connection they live on.
#include "transport/rdma/one_sided_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "transport/rdma/log_ring.h"
#include "transport/rdma/one_sided_record.h"
#include "transport/rdma/rdma_connection.h"

namespace canopy::transport::rdma {
namespace {

using namespace std::chrono_literals;

constexpr int kSpinPolls = 200;
constexpr std::chrono::microseconds kFirstSleep{20};

// Spins (yield) a while, then sleeps in steps that double up to a bound.
class Backoff {
 public:
  explicit Backoff(std::chrono::microseconds max_sleep) : max_sleep_(std::max(max_sleep, kFirstSleep)) {}
  void Pause() {
    if (++polls_ < kSpinPolls) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(2 * sleep_, max_sleep_);
  }

 private:
  std::chrono::microseconds max_sleep_;
  std::chrono::microseconds sleep_ = kFirstSleep;
  int polls_ = 0;
};

Result<Message> ExpectSetUp(Connection& stream, uint16_t type, Deadline deadline, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(Message m, stream.Receive(deadline));
  if (m.type != type || m.bulk_bytes != 0) {
    return Status::Corruption(fmt::format("rdma: one-sided set-up with {} expected {} (type {:#06x}), got type {:#06x}",
                                          stream.peer_uri(), what, type, m.type));
  }
  return m;
}

class OneSidedConnection final : public Connection {
 public:
  OneSidedConnection(Connection& stream, RdmaConnection& rdma, std::unique_ptr<LogRingReceiver> receiver,
                     std::unique_ptr<LogRingWriter> writer, uint64_t peer_ring_bytes,
                     std::chrono::microseconds max_poll_sleep)
      : stream_(stream),
        rdma_(rdma),
        receiver_(std::move(receiver)),
        writer_(std::move(writer)),
        max_inline_(OneSidedMaxInlinePayload(peer_ring_bytes)),
        max_poll_sleep_(max_poll_sleep) {}

  Status Send(uint16_t type, std::string_view payload) override {
    std::lock_guard<std::mutex> lock(send_mu_);
    CANOPY_RETURN_IF_ERROR(CheckSendable());
    if (payload.size() <= max_inline_) {
      EncodeOneSidedMessage(type, payload, &record_);
      CANOPY_RETURN_IF_ERROR(writer_->Append(record_, SendDeadline()));
      ++ring_sent_;
      ring_bytes_sent_ += payload.size();
      return Status::Ok();
    }
    CANOPY_RETURN_IF_ERROR(writer_->Append(EncodeOneSidedMarker(OneSidedRecordKind::kOnStream), SendDeadline()));
    return stream_.Send(type, payload);
  }

  Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) override {
    std::lock_guard<std::mutex> lock(send_mu_);
    CANOPY_RETURN_IF_ERROR(CheckSendable());
    CANOPY_RETURN_IF_ERROR(writer_->Append(EncodeOneSidedMarker(OneSidedRecordKind::kOnStream), SendDeadline()));
    return stream_.SendWithBulk(type, payload, bulk);
  }

  Result<Message> Receive(Deadline deadline) override {
    std::lock_guard<std::mutex> lock(receive_mu_);
    if (closed_) return Status::Aborted("rdma: one-sided connection closed");
    if (on_stream_pending_) return ReceiveFromStream(deadline);
    if (peer_ended_) return Status::Closed("rdma: the peer shut its one-sided stream down");
    Backoff backoff(max_poll_sleep_);
    for (;;) {
      if (closed_) return Status::Aborted("rdma: one-sided connection closed");
      CANOPY_ASSIGN_OR_RETURN(std::optional<std::string_view> polled, receiver_->Poll());
      if (polled) {
        CANOPY_ASSIGN_OR_RETURN(OneSidedRecord record, DecodeOneSidedRecord(*polled));
        Message m;
        m.type = record.type;
        m.payload.assign(record.payload);
        CANOPY_RETURN_IF_ERROR(receiver_->Release());
        switch (record.kind) {
          case OneSidedRecordKind::kMessage:
            ++ring_received_;
            ring_bytes_received_ += m.payload.size();
            return m;
          case OneSidedRecordKind::kOnStream:
            on_stream_pending_ = true;
            return ReceiveFromStream(deadline);
          case OneSidedRecordKind::kEnd:
            peer_ended_ = true;
            return Status::Closed("rdma: the peer shut its one-sided stream down");
        }
      }
      CANOPY_RETURN_IF_ERROR(rdma_.OneSidedHealth());
      if (deadline.expired()) return Status::Timeout("rdma: no message on the one-sided stream before the deadline");
      backoff.Pause();
    }
  }

  Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) override {
    return stream_.ReceiveBulk(sink, length, deadline);
  }

  Status Shutdown() override {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (shut_down_) return Status::Ok();
    CANOPY_RETURN_IF_ERROR(CheckSendable());
    shut_down_ = true;
    CANOPY_RETURN_IF_ERROR(writer_->Append(EncodeOneSidedMarker(OneSidedRecordKind::kEnd), SendDeadline()));
    // The marker must land before the writer's memory can go away.
    CANOPY_RETURN_IF_ERROR(writer_->Flush(SendDeadline()));
    return stream_.Shutdown();
  }

  void Close() override {
    closed_ = true;
    stream_.Close();
  }

  std::string peer_uri() const override { return stream_.peer_uri(); }

  ConnectionStats stats() const override {
    ConnectionStats s = stream_.stats();
    s.messages_sent += ring_sent_;
    s.messages_received += ring_received_;
    s.bytes_sent += ring_bytes_sent_;
    s.bytes_received += ring_bytes_received_;
    return s;
  }

 private:
  Status CheckSendable() const {
    if (closed_) return Status::Aborted("rdma: one-sided connection closed");
    if (shut_down_) return Status::InvalidArgument("rdma: Send after Shutdown on a one-sided connection");
    return Status::Ok();
  }
  Deadline SendDeadline() const { return Deadline::After(rdma_.io_timeout()); }

  Result<Message> ReceiveFromStream(Deadline deadline) {
    CANOPY_ASSIGN_OR_RETURN(Message m, stream_.Receive(deadline));
    on_stream_pending_ = false;
    return m;
  }

  Connection& stream_;
  RdmaConnection& rdma_;
  std::unique_ptr<LogRingReceiver> receiver_;  // guarded by receive_mu_
  std::unique_ptr<LogRingWriter> writer_;      // guarded by send_mu_
  const uint64_t max_inline_;
  const std::chrono::microseconds max_poll_sleep_;
  std::atomic<bool> closed_{false};
  std::mutex send_mu_;
  std::string record_;  // guarded by send_mu_
  bool shut_down_ = false;
  std::mutex receive_mu_;
  bool on_stream_pending_ = false;  // a kOnStream marker was read, its message not yet
  bool peer_ended_ = false;
  std::atomic<uint64_t> ring_sent_{0};
  std::atomic<uint64_t> ring_received_{0};
  std::atomic<uint64_t> ring_bytes_sent_{0};
  std::atomic<uint64_t> ring_bytes_received_{0};
};

}  // namespace

bool SupportsOneSided(const Connection& connection) {
  return dynamic_cast<const RdmaConnection*>(&connection) != nullptr;
}

Result<std::unique_ptr<Connection>> UpgradeToOneSided(Connection& stream, const OneSidedOptions& options,
                                                      Deadline deadline) {
  auto* rdma = dynamic_cast<RdmaConnection*>(&stream);
  if (rdma == nullptr) {
    return Status::NotSupported(
        fmt::format("rdma: a one-sided stream needs a plain rdma:// connection; {} is not one", stream.peer_uri()));
  }
  CANOPY_ASSIGN_OR_RETURN(auto receiver, LogRingReceiver::Create(stream, options.ring_bytes, options.epoch));
  CANOPY_RETURN_IF_ERROR(stream.Send(kOneSidedRingOfferType, EncodeRingOffer(receiver->offer())));
  CANOPY_ASSIGN_OR_RETURN(Message offer_message, ExpectSetUp(stream, kOneSidedRingOfferType, deadline, "a ring offer"));
  CANOPY_ASSIGN_OR_RETURN(RingOffer offer, DecodeRingOffer(offer_message.payload));
  if (OneSidedMaxInlinePayload(offer.ring_bytes) == 0) {
    return Status::InvalidArgument(
        fmt::format("rdma: the peer's one-sided ring of {} bytes is too small to carry a message", offer.ring_bytes));
  }
  CANOPY_ASSIGN_OR_RETURN(auto writer, LogRingWriter::Create(stream, offer));
  CANOPY_RETURN_IF_ERROR(stream.Send(kOneSidedFeedbackTargetType, EncodeFeedbackTarget(writer->feedback_target())));
  CANOPY_ASSIGN_OR_RETURN(Message target_message,
                          ExpectSetUp(stream, kOneSidedFeedbackTargetType, deadline, "a feedback target"));
  CANOPY_ASSIGN_OR_RETURN(FeedbackTarget target, DecodeFeedbackTarget(target_message.payload));
  CANOPY_RETURN_IF_ERROR(receiver->AttachWriter(target));
  return std::unique_ptr<Connection>(new OneSidedConnection(stream, *rdma, std::move(receiver), std::move(writer),
                                                            offer.ring_bytes, options.max_poll_sleep));
}

}  // namespace canopy::transport::rdma
