// The one-sided log ring (log_ring.h) over an RdmaConnection's queue pair and
// protection domain.
#include "transport/rdma/log_ring.h"

#include <endian.h>
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "base/clock.h"
#include "transport/rdma/rdma_connection.h"

namespace canopy::transport::rdma {
namespace {

using namespace std::chrono_literals;

constexpr size_t kPage = 4096;
constexpr uint32_t kFeedbackSources = RdmaConnection::kOneSidedWrites;
// A record whose trailer is there but whose CRC does not match yet, or whose
// seq is there but whose length field does not fit the ring yet, may still be
// landing (a NIC need not place the bytes of one WRITE in order, and a reader
// may see its seq before its length: rxe copies a packet with memcpy while
// the reader polls); after this long it is corrupt.
constexpr auto kSettleBound = 1s;
constexpr int kSpinPolls = 200;

size_t RoundUpPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }

// Page-aligned zeroed memory, unmapped on destruction.
class Pages {
 public:
  static Result<Pages> Allocate(size_t bytes) {
    void* p = mmap(nullptr, RoundUpPage(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, fmt::format("rdma: allocate {} bytes for a log ring", bytes));
    return Pages(static_cast<char*>(p), bytes);
  }
  Pages() = default;
  Pages(Pages&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  Pages& operator=(Pages&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~Pages() {
    if (data_ != nullptr) munmap(data_, RoundUpPage(bytes_));
  }
  char* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  Pages(char* data, size_t bytes) : data_(data), bytes_(bytes) {}
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// Reads memory the peer's NIC writes into.
uint64_t LoadLe64(const char* p) { return le64toh(__atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE)); }
uint32_t LoadLe32(const char* p) { return le32toh(__atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_ACQUIRE)); }

Result<RdmaConnection*> AsRdma(Connection& connection) {
  auto* rdma = dynamic_cast<RdmaConnection*>(&connection);
  if (rdma == nullptr) {
    return Status::NotSupported(fmt::format(
        "rdma: a one-sided log ring needs a plain rdma:// connection; {} is not one", connection.peer_uri()));
  }
  return rdma;
}

void Deregister(ibv_mr*& mr) {
  if (mr != nullptr) ibv_dereg_mr(mr);
  mr = nullptr;
}

// Backs off from spinning to short sleeps while polling memory.
class PollBackoff {
 public:
  void Pause() {
    if (++polls_ < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(20us);
    }
  }

 private:
  int polls_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------
// Receiver

class LogRingReceiver::Impl {
 public:
  Impl(RdmaConnection& connection, Pages ring, Pages sources, uint64_t epoch)
      : connection_(connection), ring_(std::move(ring)), sources_(std::move(sources)), epoch_(epoch) {}
  ~Impl() {
    Deregister(ring_mr_);
    Deregister(sources_mr_);
  }

  Status Register() {
    CANOPY_ASSIGN_OR_RETURN(ring_mr_, connection_.RegisterOneSided(ring_.data(), ring_.size(), true));
    CANOPY_ASSIGN_OR_RETURN(sources_mr_, connection_.RegisterOneSided(sources_.data(), sources_.size(), false));
    return Status::Ok();
  }

  RingOffer offer() const {
    return RingOffer{reinterpret_cast<uintptr_t>(ring_.data()), ring_mr_->rkey, ring_.size(), epoch_};
  }
  uint64_t epoch() const { return epoch_; }
  uint64_t records() const { return records_; }

  Status AttachWriter(const FeedbackTarget& target) {
    if (target.epoch != epoch_) {
      return Status::InvalidArgument(fmt::format(
          "rdma: log ring writer accepted epoch {}, but the ring is at epoch {}", target.epoch, epoch_));
    }
    target_ = target;
    return Status::Ok();
  }

  Result<std::optional<std::string_view>> Poll() {
    if (current_bytes_ != 0) {
      return Status::InvalidArgument("rdma: log ring Poll before the previous record was released");
    }
    const uint64_t size = ring_.size();
    for (;;) {
      const uint64_t skip = RingImplicitSkip(consumed_, size);
      if (skip != 0) {
        consumed_ += skip;
        continue;
      }
      const uint64_t position = consumed_ % size;
      char* at = ring_.data() + position;
      if (LoadLe64(at) != next_seq_) return std::optional<std::string_view>();
      const uint32_t length = LoadLe32(at + 16);
      const uint64_t left = size - position;
      if (length == kRingPadLength) {
        const RingRecordHeader pad = DecodeRingRecordHeader(at);
        if (pad.crc != RingRecordCrc(pad, {})) {
          CANOPY_RETURN_IF_ERROR(CheckSettled(BadCrc()));
          return std::optional<std::string_view>();
        }
        CANOPY_RETURN_IF_ERROR(CheckEpoch(pad.epoch));
        settling_ = false;
        std::memset(at, 0, kRingRecordHeaderSize);
        consumed_ += left;
        ++next_seq_;
        continue;
      }
      const uint64_t bytes = RingRecordBytes(length);
      if (bytes > left) {
        CANOPY_RETURN_IF_ERROR(CheckSettled(
            fmt::format("record {} of {} bytes at offset {} overruns the ring", next_seq_, length, position)));
        return std::optional<std::string_view>();
      }
      if (LoadLe64(at + bytes - kRingRecordTrailerSize) != next_seq_) return std::optional<std::string_view>();
      const RingRecordHeader header = DecodeRingRecordHeader(at);
      const std::string_view payload(at + kRingRecordHeaderSize, length);
      if (header.crc != RingRecordCrc(header, payload)) {
        CANOPY_RETURN_IF_ERROR(CheckSettled(BadCrc()));
        return std::optional<std::string_view>();
      }
      CANOPY_RETURN_IF_ERROR(CheckEpoch(header.epoch));
      settling_ = false;
      current_bytes_ = bytes;
      ++records_;
      return std::optional<std::string_view>(payload);
    }
  }

  Status Release() {
    if (current_bytes_ == 0) return Status::InvalidArgument("rdma: log ring Release without a polled record");
    if (target_.rkey == 0 && target_.addr == 0) {
      return Status::InvalidArgument("rdma: log ring Release before AttachWriter");
    }
    std::memset(ring_.data() + consumed_ % ring_.size(), 0, current_bytes_);
    consumed_ += current_bytes_;
    current_bytes_ = 0;
    ++next_seq_;
    return Publish();
  }

  Status ReportDurable(uint64_t version) {
    if (target_.rkey == 0 && target_.addr == 0) {
      return Status::InvalidArgument("rdma: log ring ReportDurable before AttachWriter");
    }
    durable_ = std::max(durable_, version);
    return Publish();
  }

  Result<RingOffer> Revoke(uint64_t new_epoch) {
    if (new_epoch <= epoch_) {
      return Status::InvalidArgument(
          fmt::format("rdma: log ring revoke to epoch {}: not newer than the current {}", new_epoch, epoch_));
    }
    // The new registration exists before the old one goes, so its rkey differs.
    CANOPY_ASSIGN_OR_RETURN(ibv_mr * fresh, connection_.RegisterOneSided(ring_.data(), ring_.size(), true));
    Deregister(ring_mr_);  // from here on the NIC refuses the old rkey
    ring_mr_ = fresh;
    std::memset(ring_.data(), 0, ring_.size());
    epoch_ = new_epoch;
    consumed_ = 0;
    next_seq_ = 1;
    current_bytes_ = 0;
    durable_ = 0;
    settling_ = false;
    target_ = FeedbackTarget{};
    return offer();
  }

 private:
  Status CheckEpoch(uint64_t epoch) const {
    if (epoch == epoch_) return Status::Ok();
    return Status::PermissionDenied(fmt::format(
        "rdma: log ring record {} carries epoch {}, but the ring is at epoch {}", next_seq_, epoch, epoch_));
  }

  // Ok while the record at the read position may still be landing
  // (kSettleBound); then Corruption naming `what` is wrong with it.
  Status CheckSettled(const std::string& what) {
    const auto now = Clock::now();
    if (!settling_) {
      settling_ = true;
      settling_since_ = now;
      return Status::Ok();
    }
    if (now - settling_since_ < kSettleBound) return Status::Ok();
    return Status::Corruption("rdma: log ring " + what);
  }
  std::string BadCrc() const {
    return fmt::format("record {} at offset {} has a bad CRC", next_seq_, consumed_ % ring_.size());
  }

  // Writes {consumed, durable} into the writer's feedback block.
  Status Publish() {
    const uint32_t slot = next_source_++ % kFeedbackSources;
    const Deadline deadline = Deadline::After(connection_.io_timeout());
    if (source_seq_[slot] != 0) CANOPY_RETURN_IF_ERROR(connection_.WaitOneSidedWrite(source_seq_[slot], deadline));
    char* source = sources_.data() + static_cast<size_t>(slot) * 64;
    EncodeFeedback(source, RingFeedback{consumed_, durable_});
    CANOPY_ASSIGN_OR_RETURN(source_seq_[slot],
                            connection_.PostOneSidedWrite(source, sources_mr_->lkey, kFeedbackBlockSize,
                                                          target_.addr, target_.rkey, deadline));
    return Status::Ok();
  }

  RdmaConnection& connection_;
  Pages ring_;
  Pages sources_;
  ibv_mr* ring_mr_ = nullptr;
  ibv_mr* sources_mr_ = nullptr;
  uint64_t epoch_;
  FeedbackTarget target_;
  uint64_t consumed_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t current_bytes_ = 0;  // the polled, unreleased record
  uint64_t durable_ = 0;
  uint64_t records_ = 0;
  bool settling_ = false;
  Clock::time_point settling_since_{};
  uint32_t next_source_ = 0;
  std::array<uint64_t, kFeedbackSources> source_seq_{};
};

Result<std::unique_ptr<LogRingReceiver>> LogRingReceiver::Create(Connection& connection, uint64_t ring_bytes,
                                                                 uint64_t epoch) {
  CANOPY_RETURN_IF_ERROR(CheckRingBytes(ring_bytes));
  CANOPY_ASSIGN_OR_RETURN(RdmaConnection * rdma, AsRdma(connection));
  CANOPY_ASSIGN_OR_RETURN(Pages ring, Pages::Allocate(ring_bytes));
  CANOPY_ASSIGN_OR_RETURN(Pages sources, Pages::Allocate(kFeedbackSources * 64));
  auto impl = std::make_unique<Impl>(*rdma, std::move(ring), std::move(sources), epoch);
  CANOPY_RETURN_IF_ERROR(impl->Register());
  return std::unique_ptr<LogRingReceiver>(new LogRingReceiver(std::move(impl)));
}

LogRingReceiver::LogRingReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LogRingReceiver::~LogRingReceiver() = default;
RingOffer LogRingReceiver::offer() const { return impl_->offer(); }
uint64_t LogRingReceiver::epoch() const { return impl_->epoch(); }
Status LogRingReceiver::AttachWriter(const FeedbackTarget& target) { return impl_->AttachWriter(target); }
Result<std::optional<std::string_view>> LogRingReceiver::Poll() { return impl_->Poll(); }
Status LogRingReceiver::Release() { return impl_->Release(); }
Status LogRingReceiver::ReportDurable(uint64_t version) { return impl_->ReportDurable(version); }
Result<RingOffer> LogRingReceiver::Revoke(uint64_t new_epoch) { return impl_->Revoke(new_epoch); }
uint64_t LogRingReceiver::records_received() const { return impl_->records(); }

Result<std::string_view> LogRingReceiver::Wait(Deadline deadline) {
  PollBackoff backoff;
  for (;;) {
    CANOPY_ASSIGN_OR_RETURN(std::optional<std::string_view> record, impl_->Poll());
    if (record) return *record;
    if (deadline.expired()) return Status::Timeout("rdma: no log ring record arrived before the deadline");
    backoff.Pause();
  }
}

// ---------------------------------------------------------------------------
// Writer

class LogRingWriter::Impl {
 public:
  Impl(RdmaConnection& connection, const RingOffer& offer, Pages mirror, Pages feedback)
      : connection_(connection), offer_(offer), mirror_(std::move(mirror)), feedback_(std::move(feedback)) {}
  ~Impl() {
    Deregister(mirror_mr_);
    Deregister(feedback_mr_);
  }

  Status Register() {
    CANOPY_ASSIGN_OR_RETURN(mirror_mr_, connection_.RegisterOneSided(mirror_.data(), mirror_.size(), false));
    CANOPY_ASSIGN_OR_RETURN(feedback_mr_, connection_.RegisterOneSided(feedback_.data(), feedback_.size(), true));
    return Status::Ok();
  }

  FeedbackTarget target() const {
    return FeedbackTarget{reinterpret_cast<uintptr_t>(feedback_.data()), feedback_mr_->rkey, offer_.epoch};
  }
  uint64_t epoch() const { return offer_.epoch; }

  // The receiver's latest report; {} (nothing consumed, nothing durable: the
  // conservative answer) when the block stays torn.
  RingFeedback Feedback() const {
    for (int attempt = 0; attempt < 100000; ++attempt) {
      char copy[kFeedbackBlockSize];
      for (size_t i = 0; i < kFeedbackBlockSize; i += 8) EncodeFixedLe(copy + i, LoadLe64(feedback_.data() + i));
      if (std::optional<RingFeedback> feedback = DecodeFeedback(copy)) return *feedback;
      if (std::all_of(copy, copy + kFeedbackBlockSize, [](char c) { return c == 0; })) return RingFeedback{};
      std::this_thread::yield();  // torn: the receiver's write is landing
    }
    return RingFeedback{};
  }

  Status Append(std::string_view payload, Deadline deadline) {
    CANOPY_ASSIGN_OR_RETURN(RingPlacement placement, PlaceRecord(tail_, offer_.ring_bytes, payload.size()));
    CANOPY_RETURN_IF_ERROR(WaitForRoom(placement.advance(), deadline));
    if (placement.pad_record) {
      const uint64_t position = tail_ % offer_.ring_bytes;
      char* pad = mirror_.data() + position;
      EncodeRingPad(pad, next_seq_++, offer_.epoch);
      CANOPY_RETURN_IF_ERROR(Post(pad, kRingRecordHeaderSize, position, deadline));
    }
    char* record = mirror_.data() + placement.offset;
    EncodeRingRecord(record, next_seq_++, offer_.epoch, payload);
    CANOPY_RETURN_IF_ERROR(Post(record, placement.record_bytes, placement.offset, deadline));
    tail_ += placement.advance();
    return Status::Ok();
  }

  Status Flush(Deadline deadline) {
    if (last_seq_ == 0) return connection_.OneSidedHealth();
    return connection_.WaitOneSidedWrite(last_seq_, deadline);
  }

  Status WaitDurable(uint64_t version, Deadline deadline) {
    PollBackoff backoff;
    while (Feedback().durable < version) {
      CANOPY_RETURN_IF_ERROR(connection_.OneSidedHealth());
      if (deadline.expired()) {
        return Status::Timeout(fmt::format("rdma: the log ring receiver has not reported version {} durable "
                                           "(it reported {})",
                                           version, Feedback().durable));
      }
      backoff.Pause();
    }
    return Status::Ok();
  }

 private:
  static void EncodeFixedLe(char* out, uint64_t v) {
    const uint64_t le = htole64(v);
    std::memcpy(out, &le, 8);
  }

  Status WaitForRoom(uint64_t bytes, Deadline deadline) {
    PollBackoff backoff;
    for (;;) {
      CANOPY_ASSIGN_OR_RETURN(uint64_t free, RingFreeBytes(tail_, Feedback().consumed, offer_.ring_bytes));
      if (free >= bytes) return Status::Ok();
      CANOPY_RETURN_IF_ERROR(connection_.OneSidedHealth());
      if (deadline.expired()) {
        return Status::Timeout(fmt::format(
            "rdma: log ring full: {} of {} bytes await the receiver, and the next record needs {}",
            offer_.ring_bytes - free, offer_.ring_bytes, bytes));
      }
      backoff.Pause();
    }
  }

  Status Post(const char* local, uint64_t bytes, uint64_t offset, Deadline deadline) {
    CANOPY_ASSIGN_OR_RETURN(last_seq_, connection_.PostOneSidedWrite(local, mirror_mr_->lkey,
                                                                     static_cast<uint32_t>(bytes),
                                                                     offer_.addr + offset, offer_.rkey, deadline));
    return Status::Ok();
  }

  RdmaConnection& connection_;
  RingOffer offer_;
  Pages mirror_;    // records are built here, at their ring offset, and written from here
  Pages feedback_;  // the receiver's reports land here
  ibv_mr* mirror_mr_ = nullptr;
  ibv_mr* feedback_mr_ = nullptr;
  uint64_t tail_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t last_seq_ = 0;  // the connection's number of our latest write
};

Result<std::unique_ptr<LogRingWriter>> LogRingWriter::Create(Connection& connection, const RingOffer& offer) {
  CANOPY_RETURN_IF_ERROR(CheckRingBytes(offer.ring_bytes));
  CANOPY_ASSIGN_OR_RETURN(RdmaConnection * rdma, AsRdma(connection));
  CANOPY_ASSIGN_OR_RETURN(Pages mirror, Pages::Allocate(offer.ring_bytes));
  CANOPY_ASSIGN_OR_RETURN(Pages feedback, Pages::Allocate(kPage));
  auto impl = std::make_unique<Impl>(*rdma, offer, std::move(mirror), std::move(feedback));
  CANOPY_RETURN_IF_ERROR(impl->Register());
  return std::unique_ptr<LogRingWriter>(new LogRingWriter(std::move(impl)));
}

LogRingWriter::LogRingWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LogRingWriter::~LogRingWriter() = default;
FeedbackTarget LogRingWriter::feedback_target() const { return impl_->target(); }
uint64_t LogRingWriter::epoch() const { return impl_->epoch(); }
Status LogRingWriter::Append(std::string_view payload, Deadline deadline) { return impl_->Append(payload, deadline); }
Status LogRingWriter::Flush(Deadline deadline) { return impl_->Flush(deadline); }
Status LogRingWriter::WaitDurable(uint64_t version, Deadline deadline) {
  return impl_->WaitDurable(version, deadline);
}
uint64_t LogRingWriter::durable_version() const { return impl_->Feedback().durable; }
uint64_t LogRingWriter::consumed() const { return impl_->Feedback().consumed; }

}  // namespace canopy::transport::rdma
