#include "tools/rcopy/server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/file.h"
#include "base/logging.h"
#include "fmt/format.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/protocol.h"
#include "tools/rcopy/safe_path.h"
#include "transport/registry.h"

namespace canopy::rcopy {
namespace {

using transport::BulkSink;
using transport::Connection;

constexpr size_t kVerifyPieceBytes = 1u << 20;
constexpr size_t kMaxTombstones = 4096;
constexpr std::chrono::seconds kDrainLimit{5};

// Seconds as text for messages ("60 s").
std::string SecondsText(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

// Deadline for receiving `bytes` bulk bytes: the idle timeout plus the time at
// a pessimistic 10 MB/s, so that big chunks on slow links do not time out.
Deadline BulkDeadline(std::chrono::milliseconds idle, uint64_t bytes) {
  return Deadline::After(idle + std::chrono::milliseconds(bytes / 10'000));
}

// One file being received, shared by the connections of its streams.
class Transfer {
 public:
  Transfer(const OpenRequest& params, SafeRelativePath path)
      : params_(params), path_(std::move(path)), seen_(params.streams, false) {}

  ~Transfer() {
    std::lock_guard<std::mutex> lock(mu_);
    RemoveTempLocked();
  }

  const OpenRequest& params() const { return params_; }
  const SafeRelativePath& path() const { return path_; }
  int fd() const { return file_fd_.get(); }

  // Creates the temporary file next to the final name, beneath root_fd.
  Status CreateTemp(int root_fd) {
    CANOPY_ASSIGN_OR_RETURN(dir_fd_, OpenParentBeneath(root_fd, path_, /*create_missing=*/true));
    struct stat st;
    if (::fstatat(dir_fd_.get(), path_.file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      return Status::AlreadyExists("destination '" + path_.ToString() + "' is a directory");
    }
    temp_name_ = fmt::format(".{}.rcopy-{:016x}.tmp", path_.file.substr(0, 200), params_.transfer_id);
    int fd = ::openat(dir_fd_.get(), temp_name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
    if (fd < 0) {
      int err = errno;
      temp_name_.clear();
      return ErrnoStatus(err, "create temporary file for '" + path_.ToString() + "'");
    }
    file_fd_.Reset(fd);
    return Status::Ok();
  }

  // Whether `other` describes the same transfer (every stream must agree).
  bool Matches(const OpenRequest& other) const {
    return other.name == params_.name && other.file_size == params_.file_size && other.mode == params_.mode &&
           other.streams == params_.streams && other.flags == params_.flags &&
           other.checksum == params_.checksum;
  }

  Status AddStream(uint16_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (seen_[index]) {
      return Status::AlreadyExists("stream " + std::to_string(index) + " of this transfer is already connected");
    }
    seen_[index] = true;
    ++attached_;
    return Status::Ok();
  }

  // Returns the number of streams still attached.
  int Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    return --attached_;
  }

  // OK while the transfer is alive or published; its failure otherwise.
  Status failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ && !outcome_.ok() ? outcome_ : Status::Ok();
  }

  bool finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

  // Marks the transfer failed (first reason wins), removes the temporary
  // file and wakes streams waiting in CommitStream.
  void Fail(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(why);
  }

  // Called by a stream whose range arrived completely. The last stream to
  // commit publishes the file; the others wait for that (up to `wait`).
  // Returns the outcome of the whole transfer.
  Status CommitStream(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return outcome_;
    ++committed_;
    if (committed_ == params_.streams) {
      Status published = PublishLocked();
      if (!published.ok()) {
        FailLocked(published);
      } else {
        finished_ = true;
        outcome_ = Status::Ok();
        cv_.notify_all();
      }
      return outcome_;
    }
    if (!cv_.wait_for(lock, wait, [&] { return finished_; })) {
      FailLocked(Status::Timeout(fmt::format("timed out after {} waiting for {} more of {} streams to commit",
                                             SecondsText(wait), params_.streams - committed_, params_.streams)));
    }
    return outcome_;
  }

 private:
  void FailLocked(const Status& why) {
    if (finished_) return;
    finished_ = true;
    outcome_ = why.ok() ? Status::Internal("transfer failed without a reason") : why;
    RemoveTempLocked();
    cv_.notify_all();
  }

  void RemoveTempLocked() {
    if (!temp_name_.empty() && dir_fd_.valid()) {
      ::unlinkat(dir_fd_.get(), temp_name_.c_str(), 0);
      temp_name_.clear();
    }
    file_fd_.Reset();
  }

  Status PublishLocked() {
    if (params_.sink()) return Status::Ok();
    std::string name = "'" + path_.ToString() + "'";
    if (::fchmod(file_fd_.get(), params_.mode & 0777) != 0) return ErrnoStatus(errno, "chmod " + name);
    CANOPY_RETURN_IF_ERROR(FsyncFd(file_fd_.get(), name));
    if (::renameat(dir_fd_.get(), temp_name_.c_str(), dir_fd_.get(), path_.file.c_str()) != 0) {
      return ErrnoStatus(errno, "rename temporary file to " + name);
    }
    temp_name_.clear();  // published: never remove it now
    file_fd_.Reset();
    if (::fsync(dir_fd_.get()) != 0) return ErrnoStatus(errno, "fsync directory of " + name);
    return Status::Ok();
  }

  const OpenRequest params_;
  const SafeRelativePath path_;
  UniqueFd dir_fd_;
  UniqueFd file_fd_;
  std::string temp_name_;  // empty when there is nothing to remove

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> seen_;
  int attached_ = 0;
  int committed_ = 0;
  bool finished_ = false;
  Status outcome_;
};

}  // namespace

class Server::Impl {
 public:
  explicit Impl(const ServerOptions& options) : options_(options) {}

  Status Init() {
    CANOPY_ASSIGN_OR_RETURN(root_fd_, OpenRootDirectory(options_.root));
    int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd < 0) return ErrnoStatus(errno, "open /dev/null");
    devnull_.Reset(null_fd);
    CANOPY_ASSIGN_OR_RETURN(listener_, transport::ListenOn(options_.listen_uri, options_.transport));
    endpoint_ = listener_->local_endpoint();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return Status::Ok();
  }

  transport::Endpoint endpoint() const { return endpoint_; }

  void Stop() {
    std::call_once(stop_once_, [&] {
      stopping_.store(true);
      if (listener_) listener_->Close();
      if (accept_thread_.joinable()) accept_thread_.join();
      std::unique_lock<std::mutex> lock(mu_);
      for (auto& [id, conn] : live_) conn->Close();
      cv_.wait(lock, [&] { return active_ == 0; });
    });
  }

  ServerStats stats() const {
    ServerStats s;
    s.connections = connections_.load();
    s.files_published = published_.load();
    s.transfers_failed = failed_.load();
    s.bytes_received = bytes_.load();
    return s;
  }

 private:
  void AcceptLoop() {
    while (!stopping_.load()) {
      auto accepted = listener_->Accept(Deadline::After(std::chrono::milliseconds(500)));
      if (!accepted.ok()) {
        if (accepted.status().IsTimeout()) continue;
        if (stopping_.load() || accepted.status().code() == StatusCode::kAborted) break;
        CANOPY_LOG(kWarn, "rcopy server: accept failed: {}", accepted.status().ToString());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      std::unique_ptr<Connection> conn = std::move(accepted).value();
      connections_.fetch_add(1);
      std::unique_lock<std::mutex> lock(mu_);
      if (active_ >= options_.max_connections) {
        lock.unlock();
        CANOPY_LOG(kWarn, "rcopy server: refusing {}: {} connections open", conn->peer_uri(), active_);
        (void)conn->Send(kMsgResult, EncodeResult(ResultMessage::FromStatus(Status::ResourceExhausted(
                                         fmt::format("server busy: {} connections open", options_.max_connections)))));
        (void)conn->Shutdown();
        continue;
      }
      uint64_t id = next_id_++;
      ++active_;
      live_[id] = conn.get();
      lock.unlock();
      std::thread([this, id, c = std::move(conn)]() mutable { RunConnection(id, std::move(c)); }).detach();
    }
  }

  void RunConnection(uint64_t id, std::unique_ptr<Connection> conn) {
    Serve(*conn);
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(id);
    }
    conn.reset();
    std::lock_guard<std::mutex> lock(mu_);
    --active_;
    cv_.notify_all();
  }

  Status SendResult(Connection& conn, const ResultMessage& result) {
    return conn.Send(kMsgResult, EncodeResult(result));
  }

  // Sends an error RESULT and ends the connection. With `clean` (the stream
  // is at a message boundary) the client's remaining messages are read and
  // discarded for a bounded time, so that it reads the RESULT rather than a
  // reset; the client closes as soon as it has seen the RESULT.
  void RefuseAndClose(Connection& conn, const Status& why, bool clean, uint64_t bytes = 0) {
    ResultMessage result = ResultMessage::FromStatus(why);
    result.bytes = bytes;
    (void)SendResult(conn, result);
    (void)conn.Shutdown();
    if (clean) Drain(conn);
    conn.Close();
  }

  void Drain(Connection& conn) {
    Deadline deadline = Deadline::After(kDrainLimit);
    while (!deadline.expired()) {
      auto m = conn.Receive(deadline);
      if (!m.ok()) return;
      if (m->bulk_bytes > 0 &&
          !conn.ReceiveBulk(BulkSink::ToFile(devnull_.get(), 0), m->bulk_bytes, deadline).ok()) {
        return;
      }
    }
  }

  Result<std::shared_ptr<Transfer>> Attach(const OpenRequest& open, SafeRelativePath path) {
    std::lock_guard<std::mutex> lock(transfers_mu_);
    if (tombstones_.count(open.transfer_id) != 0) {
      return Status::Aborted("this transfer already failed on another stream");
    }
    auto it = transfers_.find(open.transfer_id);
    if (it != transfers_.end()) {
      std::shared_ptr<Transfer> transfer = it->second;
      if (!transfer->Matches(open)) {
        return Status::InvalidArgument("transfer id reused with different file parameters");
      }
      CANOPY_RETURN_IF_ERROR(transfer->AddStream(open.stream_index));
      return transfer;
    }
    auto transfer = std::make_shared<Transfer>(open, std::move(path));
    if (!open.sink()) CANOPY_RETURN_IF_ERROR(transfer->CreateTemp(root_fd_.get()));
    CANOPY_RETURN_IF_ERROR(transfer->AddStream(open.stream_index));
    transfers_[open.transfer_id] = transfer;
    return transfer;
  }

  void Detach(const std::shared_ptr<Transfer>& transfer) {
    std::lock_guard<std::mutex> lock(transfers_mu_);
    if (transfer->Detach() > 0) return;
    if (!transfer->finished()) transfer->Fail(Status::Aborted("every stream left before the transfer finished"));
    uint64_t id = transfer->params().transfer_id;
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second == transfer) transfers_.erase(it);
    if (!transfer->failure().ok()) {
      failed_.fetch_add(1);
      if (tombstones_.insert(id).second) tombstone_order_.push_back(id);
      while (tombstone_order_.size() > kMaxTombstones) {
        tombstones_.erase(tombstone_order_.front());
        tombstone_order_.pop_front();
      }
    } else {
      published_.fetch_add(1);
    }
  }

  void Serve(Connection& conn) {
    const std::string peer = conn.peer_uri();
    auto first = conn.Receive(Deadline::After(options_.idle_timeout));
    if (!first.ok()) {
      CANOPY_LOG(kDebug, "rcopy server: {}: no OPEN: {}", peer, first.status().ToString());
      return;
    }
    if (first->type != kMsgOpen) {
      RefuseAndClose(conn, Status::Corruption(fmt::format("expected OPEN, got message type 0x{:04x}", first->type)),
                     first->bulk_bytes == 0);
      return;
    }
    bool clean = first->bulk_bytes == 0;
    auto open = DecodeOpen(first->payload);
    if (!open.ok()) return RefuseAndClose(conn, open.status(), clean);
    if (!clean) return RefuseAndClose(conn, Status::Corruption("OPEN must not carry bulk bytes"), false);
    auto path = SplitSafeRelativePath(open->name);
    if (!path.ok()) {
      CANOPY_LOG(kWarn, "rcopy server: {}: {}", peer, path.status().ToString());
      return RefuseAndClose(conn, path.status(), true);
    }
    auto attached = Attach(*open, std::move(path).value());
    if (!attached.ok()) {
      CANOPY_LOG(kWarn, "rcopy server: {}: {}", peer, attached.status().ToString());
      return RefuseAndClose(conn, attached.status(), true);
    }
    std::shared_ptr<Transfer> transfer = std::move(attached).value();
    ServeStream(conn, *open, *transfer);
    Detach(transfer);
  }

  void ServeStream(Connection& conn, const OpenRequest& open, Transfer& transfer) {
    const std::string peer = conn.peer_uri();
    Status sent = SendResult(conn, ResultMessage{});
    if (!sent.ok()) {
      transfer.Fail(sent.WithContext("send OPEN reply"));
      return;
    }
    Digest digest(open.verify() ? open.checksum : ChecksumAlgorithm::kNone);
    uint64_t received = 0;
    bool clean = true;
    Status status = ReceiveRange(conn, open, transfer, digest, &received, &clean);
    if (status.ok()) status = transfer.CommitStream(options_.idle_timeout);
    if (!status.ok()) {
      transfer.Fail(status);
      Status outcome = transfer.failure();  // the first reason, maybe another stream's
      if (outcome.ok()) outcome = status;
      CANOPY_LOG(kWarn, "rcopy server: {}: '{}' stream {}/{} failed: {}", peer, open.name, open.stream_index + 1,
                 open.streams, outcome.ToString());
      RefuseAndClose(conn, outcome, clean, received);
      return;
    }
    if (open.stream_index == 0) {
      CANOPY_LOG(kInfo, "rcopy server: {} '{}' ({} bytes, {} stream(s){}) from {}", open.sink() ? "sank" : "published",
                 open.name, open.file_size, open.streams, open.verify() ? ", verified" : "", peer);
    }
    ResultMessage result;
    result.bytes = received;
    result.checksum = digest.algorithm();
    result.digest = digest.Value();
    (void)SendResult(conn, result);
    (void)conn.Shutdown();
    // Wait (briefly) for the client's end of stream, so that closing here
    // cannot turn into a reset that overtakes the RESULT.
    auto tail = conn.Receive(Deadline::After(std::chrono::seconds(2)));
    (void)tail;
  }

  // Receives DATA messages until a valid COMMIT. *clean tells whether the
  // stream is still at a message boundary when an error is returned.
  Status ReceiveRange(Connection& conn, const OpenRequest& open, Transfer& transfer, Digest& digest,
                      uint64_t* received, bool* clean) {
    const uint64_t end = open.range_offset + open.range_length;
    uint64_t next = open.range_offset;
    std::string verify_buffer;
    for (;;) {
      Status failed = transfer.failure();
      if (!failed.ok()) return failed;
      auto m = conn.Receive(Deadline::After(options_.idle_timeout));
      if (!m.ok()) {
        *clean = false;
        if (m.status().IsTimeout()) {
          return Status::Timeout("no message from the client for " + SecondsText(options_.idle_timeout));
        }
        if (m.status().IsClosed()) return Status::Unavailable("the client closed the connection before COMMIT");
        return m.status().WithContext("receive");
      }
      const bool has_bulk = m->bulk_bytes > 0;
      if (m->type == kMsgCommit) {
        if (has_bulk) {
          *clean = false;
          return Status::Corruption("COMMIT must not carry bulk bytes");
        }
        CANOPY_ASSIGN_OR_RETURN(CommitRequest commit, DecodeCommit(m->payload));
        if (next != end || commit.bytes != open.range_length) {
          return Status::Corruption(fmt::format("COMMIT after {} of {} bytes of stream {} (client says it sent {})",
                                                next - open.range_offset, open.range_length, open.stream_index,
                                                commit.bytes));
        }
        *received = next - open.range_offset;
        if (open.verify()) {
          if (commit.checksum != open.checksum) {
            return Status::Corruption(fmt::format("COMMIT checksum is {}, OPEN said {}",
                                                  ChecksumAlgorithmName(commit.checksum),
                                                  ChecksumAlgorithmName(open.checksum)));
          }
          if (commit.digest != digest.Value()) {
            return Status::Corruption(fmt::format(
                "{} mismatch on bytes [{}, {}): client {}, server {}", ChecksumAlgorithmName(open.checksum),
                open.range_offset, end, DigestHex(commit.digest), DigestHex(digest.Value())));
          }
        }
        return Status::Ok();
      }
      if (m->type != kMsgData) {
        *clean = !has_bulk;
        return Status::Corruption(fmt::format("unexpected message type 0x{:04x} during data transfer", m->type));
      }
      auto data = DecodeData(m->payload);
      if (!data.ok() || !has_bulk || data->offset != next || m->bulk_bytes > end - next ||
          m->bulk_bytes > kMaxChunkBytes) {
        *clean = !has_bulk;
        if (!data.ok()) return data.status();
        return Status::Corruption(fmt::format("DATA of {} bytes at offset {} does not fit: expected offset {}, {} "
                                              "bytes left in the range (at most {} per message)",
                                              m->bulk_bytes, data->offset, next, end - next, kMaxChunkBytes));
      }
      Status chunk = ReceiveChunk(conn, open, transfer, next, m->bulk_bytes, digest, &verify_buffer);
      if (!chunk.ok()) {
        *clean = false;
        return chunk;
      }
      next += m->bulk_bytes;
      *received = next - open.range_offset;
      bytes_.fetch_add(m->bulk_bytes, std::memory_order_relaxed);
    }
  }

  Status ReceiveChunk(Connection& conn, const OpenRequest& open, Transfer& transfer, uint64_t offset,
                      uint64_t length, Digest& digest, std::string* buffer) {
    Deadline deadline = BulkDeadline(options_.idle_timeout, length);
    if (open.sink()) {
      if (!open.verify()) return conn.ReceiveBulk(BulkSink::ToFile(devnull_.get(), 0), length, deadline);
      buffer->resize(kVerifyPieceBytes);
      while (length > 0) {
        uint64_t piece = std::min<uint64_t>(length, buffer->size());
        CANOPY_RETURN_IF_ERROR(conn.ReceiveBulk(BulkSink::ToMemory(buffer->data()), piece, deadline));
        digest.Update(buffer->data(), static_cast<size_t>(piece));
        length -= piece;
      }
      return Status::Ok();
    }
    Status s = conn.ReceiveBulk(BulkSink::ToFile(transfer.fd(), offset), length, deadline);
    if (!s.ok()) return s.WithContext(fmt::format("write '{}' at offset {}", open.name, offset));
    if (open.verify()) {
      // Digest what actually landed in the file, not what passed the socket.
      buffer->resize(kVerifyPieceBytes);
      while (length > 0) {
        size_t want = static_cast<size_t>(std::min<uint64_t>(length, buffer->size()));
        ssize_t got = ::pread(transfer.fd(), buffer->data(), want, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return ErrnoStatus(errno, fmt::format("read back '{}' at offset {}", open.name, offset));
        if (got == 0) return Status::Corruption(fmt::format("'{}' is short at offset {} after writing", open.name, offset));
        digest.Update(buffer->data(), static_cast<size_t>(got));
        offset += static_cast<uint64_t>(got);
        length -= static_cast<uint64_t>(got);
      }
    }
    return Status::Ok();
  }

  const ServerOptions options_;
  UniqueFd root_fd_;
  UniqueFd devnull_;
  std::unique_ptr<transport::Listener> listener_;
  transport::Endpoint endpoint_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Connection*> live_;
  size_t active_ = 0;
  uint64_t next_id_ = 1;
  std::once_flag stop_once_;

  std::mutex transfers_mu_;
  std::map<uint64_t, std::shared_ptr<Transfer>> transfers_;
  std::set<uint64_t> tombstones_;
  std::deque<uint64_t> tombstone_order_;

  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> bytes_{0};
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CANOPY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

transport::Endpoint Server::local_endpoint() const { return impl_->endpoint(); }

void Server::Stop() {
  if (impl_) impl_->Stop();
}

ServerStats Server::stats() const { return impl_->stats(); }

}  // namespace canopy::rcopy
