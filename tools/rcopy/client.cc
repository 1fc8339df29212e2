#include "tools/rcopy/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "base/clock.h"
#include "base/file.h"
#include "fmt/format.h"
#include "tools/rcopy/auth.h"
#include "tools/rcopy/checksum.h"
#include "transport/registry.h"

namespace canopy::rcopy {
namespace {

using transport::BulkSource;
using transport::Connection;

// How much an error explains: the server's own reason beats a local problem,
// which beats the transport error it caused, which beats "stopped because
// another stream failed".
enum class Rank { kAborted = 0, kTransport = 1, kLocal = 2, kServer = 3 };

// The rank of an error the server reported: its "stopped because another
// stream failed" (Aborted) explains nothing by itself.
Rank ServerRank(const Status& status) {
  return status.code() == StatusCode::kAborted ? Rank::kAborted : Rank::kServer;
}

uint64_t RandomTransferId() {
  std::random_device device;
  uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device();
  return id == 0 ? 1 : id;
}

// Deadline for the server to read `bytes` of a file (checksum, copy): the
// I/O timeout plus the time at a pessimistic 50 MB/s.
Deadline DiskDeadline(std::chrono::milliseconds io_timeout, uint64_t bytes) {
  return Deadline::After(io_timeout + std::chrono::milliseconds(bytes / 50'000));
}

// A token bucket shared by the streams of one copy: Acquire(n) returns when n
// more bytes fit in the rate. It starts empty and keeps at most kSlack of
// unused credit, so the achieved rate stays at the limit.
class Pacer {
 public:
  explicit Pacer(uint64_t bits_per_second)
      : bytes_per_second_(static_cast<double>(bits_per_second) / 8.0), next_(Clock::now()) {}

  // Returns false when `aborted` became true while waiting.
  template <typename Aborted>
  bool Acquire(uint64_t n, Aborted aborted) {
    Clock::time_point when;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Clock::time_point now = Clock::now();
      if (next_ < now - kSlack) next_ = now - kSlack;
      next_ += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(static_cast<double>(n) / bytes_per_second_));
      when = next_;
    }
    while (Clock::now() < when) {
      if (aborted()) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(when - Clock::now(), std::chrono::milliseconds(50)));
    }
    return true;
  }

  // DATA message size for this rate: about kSlack worth of bytes.
  static uint64_t PieceBytes(uint64_t bits_per_second, uint64_t chunk_bytes) {
    uint64_t piece = bits_per_second / 8 / 50;  // 20 ms
    return std::clamp<uint64_t>(piece, kMinChunkBytes, std::max(chunk_bytes, kMinChunkBytes));
  }

 private:
  static constexpr std::chrono::milliseconds kSlack{20};
  const double bytes_per_second_;
  std::mutex mu_;
  Clock::time_point next_;
};

// State shared by the stream workers of one copy.
class CopyState {
 public:
  explicit CopyState(uint16_t streams) : streams_(streams) {}

  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }

  // Records an error; the most explanatory one (then the first) wins. Every
  // other stream is told to stop.
  void Fail(Rank rank, const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!have_error_ || rank > error_rank_) {
      have_error_ = true;
      error_rank_ = rank;
      error_ = status;
    }
    aborted_.store(true);
    cv_.notify_all();
  }

  Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return have_error_ ? error_ : Status::Ok();
  }

  void AddSent(uint64_t n) { sent_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }

  // A stream finished sending (COMMIT sent, or gave up).
  void StreamDoneSending() {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_sending_;
    cv_.notify_all();
  }
  bool all_done_sending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_sending_ == streams_;
  }

  std::mutex& mu() { return mu_; }
  std::condition_variable& cv() { return cv_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const size_t streams_;
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> sent_{0};
  size_t done_sending_ = 0;
  bool have_error_ = false;
  Rank error_rank_ = Rank::kAborted;
  Status error_;
};

// Waits on the connection for the server's final RESULT (or an early error
// RESULT) while the stream's own thread sends.
class ResultReceiver {
 public:
  ResultReceiver(Connection& conn, CopyState& state) : conn_(conn), state_(state) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ResultReceiver() { Join(); }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  // Waits until a RESULT (or receive error) arrived or `until` says stop.
  // Returns true when it arrived.
  template <typename Pred>
  bool WaitFor(std::chrono::milliseconds step, Pred give_up) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!arrived_) {
      if (give_up()) return false;
      cv_.wait_for(lock, step);
    }
    return true;
  }

  // After Join().
  const std::optional<ResultMessage>& result() const { return result_; }
  const Status& receive_error() const { return receive_error_; }

 private:
  void Run() {
    auto m = conn_.Receive(Deadline::Infinite());
    std::lock_guard<std::mutex> lock(mu_);
    if (!m.ok()) {
      receive_error_ = m.status();
    } else if (m->type != kMsgResult || m->bulk_bytes != 0) {
      receive_error_ = Status::Corruption(fmt::format("server sent message type 0x{:04x}, expected RESULT", m->type));
    } else {
      auto decoded = DecodeResult(m->payload);
      if (decoded.ok()) {
        result_ = std::move(decoded).value();
      } else {
        receive_error_ = decoded.status().WithContext("bad RESULT from the server");
      }
    }
    if (!receive_error_.ok() || !result_->ok()) {
      // Stop this stream's sender right away (it may be blocked on a server
      // that no longer reads) and tell the other streams.
      if (result_.has_value()) state_.Fail(ServerRank(result_->ToStatus()), result_->ToStatus());
      conn_.Close();
    }
    arrived_ = true;
    cv_.notify_all();
  }

  Connection& conn_;
  CopyState& state_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool arrived_ = false;
  std::optional<ResultMessage> result_;
  Status receive_error_;
  std::thread thread_;
};

struct StreamContext {
  const ClientOptions& options;
  const std::string& uri;
  int fd;
  uint64_t file_size;
  uint32_t mode;
  uint64_t transfer_id;
  CopyState& state;
  uint64_t chunk_bytes;          // per DATA message
  Pacer* pacer;                  // null: unlimited
  uint64_t resume_offset = 0;    // bytes the server already has
  ResumeBase resume_base = ResumeBase::kNone;
  uint64_t base_id = 0;
  // Whole-file digest of the source (verified resumes), else null.
  std::shared_future<Result<uint64_t>>* file_digest = nullptr;
};

// Runs one stream; on success returns its verified digest (0 without verify).
std::optional<uint64_t> RunStream(const StreamContext& ctx, uint16_t index) {
  const ClientOptions& o = ctx.options;
  const ByteRange range = StreamRange(ctx.file_size, ctx.resume_offset, o.streams, index);
  const ChecksumAlgorithm algorithm = o.verify ? o.checksum : ChecksumAlgorithm::kNone;
  // Context for errors: which stream ("" with one). The transport's own
  // errors already name the server they were talking to.
  const std::string stream = o.streams > 1 ? fmt::format("stream {}/{}", index + 1, o.streams) : std::string();
  const std::string where = stream.empty() ? std::string() : stream + ": ";

  auto dialed = transport::Dial(ctx.uri, o.transport);
  if (!dialed.ok()) {
    ctx.state.Fail(Rank::kTransport, dialed.status().WithContext(stream));
    ctx.state.StreamDoneSending();
    return std::nullopt;
  }
  std::unique_ptr<Connection> conn = std::move(dialed).value();
  if (!o.secret.empty()) {
    Status authenticated = AuthenticateToServer(*conn, o.secret, Deadline::After(o.transport.io_timeout));
    if (!authenticated.ok()) {
      ctx.state.Fail(Rank::kServer, authenticated.WithContext(where + ctx.uri));
      ctx.state.StreamDoneSending();
      return std::nullopt;
    }
  }

  OpenRequest open;
  open.transfer_id = ctx.transfer_id;
  open.name = o.destination;
  open.file_size = ctx.file_size;
  open.mode = ctx.mode;
  open.streams = o.streams;
  open.stream_index = index;
  open.range_offset = range.offset;
  open.range_length = range.length;
  open.flags = (o.verify ? kOpenFlagVerify : 0) | (o.sink ? kOpenFlagSink : 0) |
               (o.keep_partial && !o.sink ? kOpenFlagKeepPartial : 0);
  open.checksum = algorithm;
  open.resume_offset = ctx.resume_offset;
  open.resume_base = ctx.resume_base;
  open.base_id = ctx.base_id;

  auto fail = [&](Rank rank, const Status& s) -> std::optional<uint64_t> {
    ctx.state.Fail(rank, s.WithContext(stream));
    ctx.state.StreamDoneSending();
    return std::nullopt;
  };

  Status sent = conn->Send(kMsgOpen, EncodeOpen(open));
  if (!sent.ok()) return fail(Rank::kTransport, sent.WithContext("send OPEN"));
  // Resuming from the target, the server first copies its prefix.
  auto reply = conn->Receive(ctx.resume_base == ResumeBase::kTarget
                                 ? DiskDeadline(o.transport.io_timeout, ctx.resume_offset)
                                 : Deadline::After(o.transport.io_timeout));
  if (!reply.ok()) return fail(Rank::kTransport, reply.status().WithContext("waiting for the server to accept"));
  if (reply->type != kMsgResult || reply->bulk_bytes != 0) {
    return fail(Rank::kTransport,
                Status::Corruption(fmt::format("server answered OPEN with message type 0x{:04x}", reply->type)));
  }
  auto accepted = DecodeResult(reply->payload);
  if (!accepted.ok()) return fail(Rank::kTransport, accepted.status().WithContext("bad reply to OPEN"));
  if (!accepted->ok()) return fail(ServerRank(accepted->ToStatus()), accepted->ToStatus());

  // Digest the source range on another thread while the data goes out.
  std::atomic<bool> cancel_digest{false};
  Result<uint64_t> digest = uint64_t{0};
  std::thread digester;
  if (o.verify) {
    digester = std::thread([&] {
      digest = DigestFileRange(ctx.fd, range.offset, range.length, algorithm, &cancel_digest);
    });
  }

  ResultReceiver receiver(*conn, ctx.state);
  Status send_status;
  const uint64_t end = range.offset + range.length;
  for (uint64_t offset = range.offset; offset < end && send_status.ok();) {
    if (ctx.state.aborted()) {
      send_status = Status::Aborted("stopped because the copy failed elsewhere");
      break;
    }
    uint64_t n = std::min<uint64_t>(ctx.chunk_bytes, end - offset);
    if (ctx.pacer != nullptr && !ctx.pacer->Acquire(n, [&] { return ctx.state.aborted(); })) continue;
    send_status = conn->SendWithBulk(kMsgData, EncodeData(DataHeader{offset}), BulkSource::FromFile(ctx.fd, offset, n));
    if (send_status.ok()) {
      ctx.state.AddSent(n);
      offset += n;
    }
  }
  if (digester.joinable()) {
    if (!send_status.ok()) cancel_digest.store(true);
    digester.join();
  }
  if (send_status.ok() && !digest.ok()) {
    send_status = digest.status().WithContext("checksum of " + o.source);
    ctx.state.Fail(Rank::kLocal, send_status.WithContext(stream));
  }
  uint64_t file_digest = 0;
  if (send_status.ok() && ctx.file_digest != nullptr) {
    const Result<uint64_t>& whole = ctx.file_digest->get();
    if (whole.ok()) {
      file_digest = *whole;
    } else {
      send_status = whole.status().WithContext("checksum of " + o.source);
      ctx.state.Fail(Rank::kLocal, send_status.WithContext(stream));
    }
  }
  if (send_status.ok()) {
    CommitRequest commit{range.length, algorithm, o.verify ? *digest : 0, file_digest};
    send_status = conn->Send(kMsgCommit, EncodeCommit(commit));
  }
  ctx.state.StreamDoneSending();

  // Wait for the server's verdict. After a send error the server has most
  // likely sent its reason already; give it a moment. After COMMIT the
  // verdict comes once every stream has committed and the file is published.
  Clock::time_point waiting_since = Clock::now();
  bool all_done_seen = false;
  bool arrived = receiver.WaitFor(std::chrono::milliseconds(50), [&] {
    if (!send_status.ok()) return Clock::now() - waiting_since > std::chrono::seconds(2);
    if (!all_done_seen && ctx.state.all_done_sending()) {
      all_done_seen = true;
      waiting_since = Clock::now();
    }
    // A verified resume: the server checksums the whole file before answering.
    auto limit = o.transport.io_timeout +
                 (ctx.file_digest != nullptr ? std::chrono::milliseconds(ctx.file_size / 50'000)
                                             : std::chrono::milliseconds(0));
    return all_done_seen && Clock::now() - waiting_since > limit;
  });
  if (!arrived) conn->Close();  // wakes the receiver
  receiver.Join();

  const std::optional<ResultMessage>& result = receiver.result();
  if (result.has_value() && !result->ok()) {
    ctx.state.Fail(ServerRank(result->ToStatus()), result->ToStatus());
    return std::nullopt;
  }
  if (!send_status.ok()) {
    // When the receive fails first (e.g. the peer vanished: Unavailable),
    // the receiver closes the connection to stop this sender, whose send then
    // fails with our own close (Aborted): the receive error is the cause.
    const Status& received = receiver.receive_error();
    if (send_status.code() == StatusCode::kAborted && !received.ok() && received.code() != StatusCode::kAborted) {
      ctx.state.Fail(Rank::kTransport, received.WithContext(where + "receive"));
      return std::nullopt;
    }
    ctx.state.Fail(send_status.code() == StatusCode::kAborted ? Rank::kAborted : Rank::kTransport,
                   send_status.WithContext(where + "send"));
    return std::nullopt;
  }
  if (!result.has_value()) {
    Status why = arrived ? receiver.receive_error()
                         : Status::Timeout(fmt::format("no answer from the server {} s after COMMIT",
                                                       o.transport.io_timeout.count() / 1000.0));
    if (why.IsClosed()) why = Status::Unavailable("the server closed the connection without a result");
    ctx.state.Fail(why.code() == StatusCode::kAborted ? Rank::kAborted : Rank::kTransport,
                   why.WithContext(where + "waiting for the server's result"));
    return std::nullopt;
  }
  if (result->bytes != range.length) {
    ctx.state.Fail(Rank::kServer, Status::Corruption(fmt::format("{}server received {} bytes, sent {}", where,
                                                                 result->bytes, range.length)));
    return std::nullopt;
  }
  if (o.verify && (result->checksum != algorithm || result->digest != *digest)) {
    ctx.state.Fail(Rank::kLocal, Status::Corruption(fmt::format(
                                     "{}{} mismatch on bytes [{}, {}): client {}, server {} ({})", where,
                                     ChecksumAlgorithmName(algorithm), range.offset, end, DigestHex(*digest),
                                     DigestHex(result->digest), ChecksumAlgorithmName(result->checksum))));
    return std::nullopt;
  }
  if (ctx.file_digest != nullptr && result->file_digest != file_digest) {
    ctx.state.Fail(Rank::kLocal, Status::Corruption(fmt::format(
                                     "{}{} mismatch on the whole resumed file: client {}, server {}", where,
                                     ChecksumAlgorithmName(algorithm), DigestHex(file_digest),
                                     DigestHex(result->file_digest))));
    return std::nullopt;
  }
  (void)conn->Shutdown();
  conn->Close();
  return o.verify ? *digest : 0;
}

// Asks the server what it holds to resume `o.destination` from.
Result<ResumeInfo> QueryResumeBase(const ClientOptions& o, const std::string& uri, uint64_t source_size) {
  auto dialed = transport::Dial(uri, o.transport);
  if (!dialed.ok()) return dialed.status();
  std::unique_ptr<Connection> conn = std::move(dialed).value();
  if (!o.secret.empty()) {
    CANOPY_RETURN_IF_ERROR(AuthenticateToServer(*conn, o.secret, Deadline::After(o.transport.io_timeout)));
  }
  QueryRequest query{o.destination, o.checksum, source_size};
  CANOPY_RETURN_IF_ERROR(conn->Send(kMsgQuery, EncodeQuery(query)).WithContext("send QUERY"));
  auto reply = conn->Receive(DiskDeadline(o.transport.io_timeout, source_size));
  if (!reply.ok()) {
    Status why = reply.status();
    if (why.IsClosed()) why = Status::Unavailable("the server closed the connection without an answer");
    return why.WithContext("waiting for the server's resume information");
  }
  conn->Close();
  if (reply->bulk_bytes == 0 && reply->type == kMsgResult) {
    auto result = DecodeResult(reply->payload);
    if (!result.ok()) return result.status().WithContext("bad RESULT from the server");
    if (!result->ok()) return result->ToStatus();
    return Status::Corruption("the server answered QUERY with an empty RESULT");
  }
  if (reply->bulk_bytes != 0 || reply->type != kMsgResumeInfo) {
    return Status::Corruption(fmt::format("server answered QUERY with message type 0x{:04x}", reply->type));
  }
  return DecodeResumeInfo(reply->payload);
}

}  // namespace

const char* ResumeOutcomeName(ResumeOutcome outcome) {
  switch (outcome) {
    case ResumeOutcome::kNotRequested: return "not requested";
    case ResumeOutcome::kNothing: return "nothing to resume";
    case ResumeOutcome::kResumed: return "resumed";
    case ResumeOutcome::kComplete: return "already complete";
    case ResumeOutcome::kPrefixMismatch: return "prefix mismatch";
    case ResumeOutcome::kLonger: return "longer than source";
  }
  return "unknown";
}

uint64_t EffectiveChunkBytes(const ClientOptions& o) {
  return o.rate_bits_per_second > 0 ? Pacer::PieceBytes(o.rate_bits_per_second, o.chunk_bytes) : o.chunk_bytes;
}

double CopyReport::gbit_per_second() const {
  if (seconds <= 0) return 0;
  return static_cast<double>(bytes_sent) * 8.0 / seconds / 1e9;
}

std::string MakeUri(const std::string& scheme, const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("{}://[{}]:{}", scheme, host, port);
  return fmt::format("{}://{}:{}", scheme, host, port);
}

CopyReport CopyFile(const ClientOptions& o) {
  CopyReport report;
  report.server_uri = MakeUri(o.scheme, o.host, o.port);
  report.destination = o.destination;
  report.streams = o.streams;
  report.chunk_bytes = o.chunk_bytes;
  report.sink = o.sink;

  if (o.streams < 1 || o.streams > kMaxStreams) {
    report.status = Status::InvalidArgument(fmt::format("streams must be 1..{}, not {}", kMaxStreams, o.streams));
    return report;
  }
  if (o.chunk_bytes < kMinChunkBytes || o.chunk_bytes > kMaxChunkBytes) {
    report.status = Status::InvalidArgument(
        fmt::format("chunk size must be {}..{} bytes, not {}", kMinChunkBytes, kMaxChunkBytes, o.chunk_bytes));
    return report;
  }
  if (o.verify && o.checksum == ChecksumAlgorithm::kNone) {
    report.status = Status::InvalidArgument("verify needs a checksum algorithm");
    return report;
  }
  auto file = OpenFile(o.source, O_RDONLY | O_NONBLOCK);  // never blocks on a FIFO
  if (!file.ok()) {
    report.status = file.status();
    return report;
  }
  struct stat st;
  if (::fstat(file->get(), &st) != 0) {
    report.status = ErrnoStatus(errno, "stat " + o.source);
    return report;
  }
  if (!S_ISREG(st.st_mode)) {
    report.status = Status::InvalidArgument(o.source + " is not a regular file");
    return report;
  }
  report.file_bytes = static_cast<uint64_t>(st.st_size);
  report.rate_bits_per_second = o.rate_bits_per_second;
  report.chunk_bytes = EffectiveChunkBytes(o);

  Clock::time_point start = Clock::now();
  auto finish = [&] {
    report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return report;
  };

  // Resume: what does the server have, and does it match our prefix?
  uint64_t resume_offset = 0;
  uint64_t base_id = 0;
  std::unique_ptr<Digest> prefix_digest;  // of our [0, resume_offset), for the whole-file digest
  if (o.resume) {
    if (o.sink) {
      report.status = Status::InvalidArgument("resume does not go with sink");
      return report;
    }
    auto info = QueryResumeBase(o, report.server_uri, report.file_bytes);
    if (!info.ok()) {
      report.status = info.status();
      return finish();
    }
    report.resume_base = info->base;
    report.existing_bytes = info->size;
    if (info->base == ResumeBase::kNone || info->size == 0) {
      report.resume = ResumeOutcome::kNothing;
      report.resume_base = ResumeBase::kNone;
    } else if (info->size > report.file_bytes) {
      report.resume = ResumeOutcome::kLonger;
    } else {
      prefix_digest = std::make_unique<Digest>(o.checksum);
      Status digested = UpdateDigestFromFile(*prefix_digest, file->get(), 0, info->size);
      if (!digested.ok()) {
        report.status = digested.WithContext("checksum of " + o.source);
        return finish();
      }
      if (info->checksum == o.checksum && info->digest == prefix_digest->Value()) {
        report.resume = ResumeOutcome::kResumed;
        resume_offset = info->size;
        base_id = info->base_id;
      } else {
        report.resume = ResumeOutcome::kPrefixMismatch;
      }
    }
    if (report.resume == ResumeOutcome::kResumed && info->base == ResumeBase::kTarget &&
        resume_offset == report.file_bytes) {
      // The destination already holds exactly our bytes.
      report.resume = ResumeOutcome::kComplete;
      report.resumed_from = report.bytes_skipped = resume_offset;
      if (o.verify) {
        report.checksum = o.checksum;
        report.file_digest = prefix_digest->Value();
      }
      return finish();
    }
    report.resumed_from = report.bytes_skipped = resume_offset;
  }

  CopyState state(o.streams);
  std::unique_ptr<Pacer> pacer;
  if (o.rate_bits_per_second > 0) pacer = std::make_unique<Pacer>(o.rate_bits_per_second);
  StreamContext ctx{o,
                    report.server_uri,
                    file->get(),
                    report.file_bytes,
                    static_cast<uint32_t>(st.st_mode & 0777),
                    RandomTransferId(),
                    state,
                    report.chunk_bytes,
                    pacer.get()};
  ctx.resume_offset = resume_offset;
  ctx.resume_base = resume_offset > 0 ? report.resume_base : ResumeBase::kNone;
  ctx.base_id = base_id;

  // A verified resume also compares the whole file: continue our prefix
  // digest over the rest of the source while the data goes out.
  std::atomic<bool> cancel_file_digest{false};
  std::shared_future<Result<uint64_t>> file_digest;
  if (o.verify && resume_offset > 0) {
    file_digest = std::async(std::launch::async, [&]() -> Result<uint64_t> {
                    CANOPY_RETURN_IF_ERROR(UpdateDigestFromFile(*prefix_digest, file->get(), resume_offset,
                                                                report.file_bytes - resume_offset,
                                                                &cancel_file_digest));
                    return prefix_digest->Value();
                  }).share();
    ctx.file_digest = &file_digest;
  }
  std::vector<std::optional<uint64_t>> digests(o.streams);

  std::vector<std::thread> workers;
  for (uint16_t i = 0; i < o.streams; ++i) {
    workers.emplace_back([&, i] { digests[i] = RunStream(ctx, i); });
  }
  std::mutex progress_mu;
  std::condition_variable progress_cv;
  bool finished = false;
  std::thread progress;
  if (o.progress) {
    progress = std::thread([&] {
      std::unique_lock<std::mutex> lock(progress_mu);
      while (!progress_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return finished; })) {
        o.progress(resume_offset + state.sent(), report.file_bytes);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  if (file_digest.valid()) {
    cancel_file_digest.store(true);
    file_digest.wait();
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (progress.joinable()) {
    {
      std::lock_guard<std::mutex> lock(progress_mu);
      finished = true;
    }
    progress_cv.notify_all();
    progress.join();
    o.progress(resume_offset + state.sent(), report.file_bytes);
  }
  report.bytes_sent = state.sent();
  report.status = state.error();
  if (report.status.ok()) {
    for (const auto& d : digests) {
      if (!d.has_value()) {
        report.status = Status::Internal("a stream ended without a result or an error");
        break;
      }
    }
  }
  if (report.status.ok() && o.verify) {
    report.checksum = o.checksum;
    for (const auto& d : digests) report.digests.push_back(*d);
    if (file_digest.valid() && file_digest.get().ok()) report.file_digest = *file_digest.get();
  }
  return report;
}

}  // namespace canopy::rcopy
