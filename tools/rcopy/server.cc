#include "tools/rcopy/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/coding.h"
#include "base/file.h"
#include "base/logging.h"
#include "fmt/format.h"
#include "tools/rcopy/auth.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/protocol.h"
#include "tools/rcopy/safe_path.h"
#include "transport/connection_server.h"
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

// The identity of a resume base: it changes when the file is replaced,
// resized or written to (not when it is renamed).
uint64_t FileIdentity(const struct stat& st) {
  std::string key;
  PutFixed64(&key, static_cast<uint64_t>(st.st_dev));
  PutFixed64(&key, static_cast<uint64_t>(st.st_ino));
  PutFixed64(&key, static_cast<uint64_t>(st.st_size));
  PutFixed64(&key, static_cast<uint64_t>(st.st_mtim.tv_sec));
  PutFixed64(&key, static_cast<uint64_t>(st.st_mtim.tv_nsec));
  uint64_t id = DigestOf(ChecksumAlgorithm::kXxh3, key);
  return id == 0 ? 1 : id;
}

// Why a transfer ended decides what happens to the bytes it received. An
// interruption (the client went away or silent, the server is stopping) keeps
// them for --resume when the client asked for it; anything else (checksum
// mismatch, protocol violation, disk full, write errors, refused names)
// removes them: they are suspect or the reason would recur.
bool IsInterruption(const Status& why) {
  switch (why.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kClosed:
    case StatusCode::kTimeout:
    case StatusCode::kAborted: return true;
    default: return false;
  }
}

// Copies [0, length) of `from` to the same offsets of `to` (copy_file_range,
// else read + write), stopping when *cancel becomes true.
Status CopyPrefix(int from, int to, uint64_t length, const std::atomic<bool>& cancel) {
  uint64_t done = 0;
  bool use_copy_range = true;
  std::vector<char> buffer;
  while (done < length) {
    if (cancel.load(std::memory_order_relaxed)) return Status::Aborted("copy of the resume base cancelled");
    size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, 16u << 20));
    if (use_copy_range) {
      loff_t in = static_cast<loff_t>(done), out = static_cast<loff_t>(done);
      ssize_t n = ::copy_file_range(from, &in, to, &out, want, 0);
      if (n > 0) {
        done += static_cast<uint64_t>(n);
        continue;
      }
      if (n == 0) return Status::Corruption(fmt::format("resume base ended at {} of {} bytes", done, length));
      if (errno == EINTR) continue;
      if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP && errno != EPERM) {
        return ErrnoStatus(errno, "copy the resume base");
      }
      use_copy_range = false;
    }
    buffer.resize(1u << 20);
    want = std::min(want, buffer.size());
    ssize_t got = ::pread(from, buffer.data(), want, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus(errno, "read the resume base");
    if (got == 0) return Status::Corruption(fmt::format("resume base ended at {} of {} bytes", done, length));
    size_t written = 0;
    while (written < static_cast<size_t>(got)) {
      ssize_t w = ::pwrite(to, buffer.data() + written, static_cast<size_t>(got) - written,
                           static_cast<off_t>(done + written));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus(errno, "write the resume base");
      written += static_cast<size_t>(w);
    }
    done += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// Whether `name` is a temporary file of a transfer to `file`:
// ".<file>.rcopy-<16 hex digits>.tmp" (Transfer::CreateTemp). Names longer
// than the 200 bytes a temporary name keeps never match (two files could
// share the kept part).
bool IsTemporaryFileOf(std::string_view name, std::string_view file) {
  if (file.size() > 200) return false;
  const std::string head = "." + std::string(file) + ".rcopy-";
  constexpr std::string_view kTail = ".tmp";
  if (name.size() != head.size() + 16 + kTail.size() || name.substr(0, head.size()) != head ||
      name.substr(name.size() - kTail.size()) != kTail) {
    return false;
  }
  for (char c : name.substr(head.size(), 16)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The bytes at the start of an orphaned temporary file that a transfer wrote:
// up to its first hole (with -P, the ranges of later streams begin after a
// hole), without the zero bytes that pad the last block before that hole.
// Zero bytes the source really had may be cut too; the resume's checksum
// decides what is used, so a shorter prefix costs only a resend.
Result<uint64_t> WrittenPrefix(int fd, uint64_t size) {
  off_t hole = ::lseek(fd, 0, SEEK_HOLE);
  uint64_t end = hole < 0 ? size : std::min<uint64_t>(size, static_cast<uint64_t>(hole));
  constexpr uint64_t kMaxPaddingScan = 1u << 20;
  std::vector<char> buffer(64u << 10);
  const uint64_t floor = end > kMaxPaddingScan ? end - kMaxPaddingScan : 0;
  while (end > floor) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - floor));
    ssize_t got = ::pread(fd, buffer.data(), want, static_cast<off_t>(end - want));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus(errno, "read an orphaned temporary file");
    if (static_cast<size_t>(got) != want) return end;  // shorter than it said: keep what we know
    size_t i = want;
    while (i > 0 && buffer[i - 1] == 0) --i;
    end -= want - i;
    if (i > 0) break;
  }
  return end;
}

// One file being received, shared by the connections of its streams.
//
// Files in the destination directory: the temporary file
// ".<name>.rcopy-<transfer id>.tmp" receives the data; it is renamed to
// <name> when every stream committed, or — when the transfer was
// interrupted and the client set kOpenFlagKeepPartial — cut to the
// contiguous prefix that arrived and renamed to PartialFileName(<name>) once
// the last stream left; otherwise it is removed. A resumed transfer takes the
// partial file over by renaming it to its temporary name (or copies the
// prefix of the existing <name> into a new temporary file).
class Transfer {
 public:
  Transfer(const OpenRequest& params, SafeRelativePath path)
      : params_(params),
        path_(std::move(path)),
        seen_(params.streams, false),
        received_(params.streams, 0),
        base_ready_(params.resume_base != ResumeBase::kTarget) {}

  ~Transfer() {
    std::lock_guard<std::mutex> lock(mu_);
    if (keep_partial_) {
      KeepPartialLocked();
    } else {
      RemoveTempLocked();
    }
  }

  const OpenRequest& params() const { return params_; }
  const SafeRelativePath& path() const { return path_; }
  int fd() const { return file_fd_.get(); }
  // Held around each write into fd() by this transfer's streams (see
  // transport::BulkSink::file_write_lock).
  std::mutex* write_lock() { return &write_mu_; }

  // Creates the temporary file next to the final name, beneath root_fd: an
  // empty one, the partial file taken over, or (resume from the target) an
  // empty one to be filled by CopyBase. Conflict when the resume base is gone
  // or no longer the file RESUME_INFO described.
  Status CreateTemp(int root_fd) {
    CANOPY_ASSIGN_OR_RETURN(dir_fd_, OpenParentBeneath(root_fd, path_, /*create_missing=*/true));
    struct stat st;
    if (::fstatat(dir_fd_.get(), path_.file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      return Status::AlreadyExists("destination '" + path_.ToString() + "' is a directory");
    }
    temp_name_ = fmt::format(".{}.rcopy-{:016x}.tmp", path_.file.substr(0, 200), params_.transfer_id);
    if (params_.resume_base == ResumeBase::kPartial) return ClaimPartial();
    if (params_.resume_base == ResumeBase::kTarget) {
      CANOPY_ASSIGN_OR_RETURN(base_fd_, OpenBase(path_.file, "the existing '" + path_.ToString() + "'"));
    }
    int fd = ::openat(dir_fd_.get(), temp_name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
    if (fd < 0) {
      int err = errno;
      temp_name_.clear();
      return ErrnoStatus(err, "create temporary file for '" + path_.ToString() + "'");
    }
    file_fd_.Reset(fd);
    // Held while the transfer owns the file: tells AdoptOrphanedTemporaryFiles
    // (in this or another server process) that it is not an orphan. A QUERY
    // may hold it a moment on the empty file; nothing else blocks here.
    if (::flock(file_fd_.get(), LOCK_EX) != 0) return ErrnoStatus(errno, "lock the temporary file");
    return SizeTemp();
  }

  // Gives the temporary file its final size, as a hole beyond what it holds
  // (no blocks are allocated; ENOSPC still comes from the writes). Every
  // stream then writes inside the file, which lets a transport put bytes
  // straight into its pages (rdma:// READs into a tmpfs file's mapping)
  // rather than through write(). What arrived is still told by the streams'
  // counts (ContiguousPrefixLocked) or, for an orphan, by WrittenPrefix,
  // which stops at the first hole.
  Status SizeTemp() {
    struct stat st;
    if (::fstat(file_fd_.get(), &st) != 0) return ErrnoStatus(errno, "stat the temporary file");
    if (static_cast<uint64_t>(st.st_size) < params_.file_size &&
        ::ftruncate(file_fd_.get(), static_cast<off_t>(params_.file_size)) != 0) {
      return ErrnoStatus(errno, "size the temporary file for '" + path_.ToString() + "'");
    }
    return Status::Ok();
  }

  // Resume from the target: copies its first resume_offset bytes into the
  // temporary file. Called once, by the stream that created the transfer,
  // outside the server's locks (the other streams write only at or after
  // resume_offset meanwhile).
  Status CopyBase(const std::atomic<bool>& cancel) {
    if (params_.resume_base != ResumeBase::kTarget) return Status::Ok();
    Status s = CopyPrefix(base_fd_.get(), file_fd_.get(), params_.resume_offset, cancel);
    std::lock_guard<std::mutex> lock(mu_);
    base_fd_.Reset();
    if (s.ok()) base_ready_ = true;
    return s.WithContext("resume from the existing '" + path_.ToString() + "'");
  }

  // Whether `other` describes the same transfer (every stream must agree).
  bool Matches(const OpenRequest& other) const {
    return other.name == params_.name && other.file_size == params_.file_size && other.mode == params_.mode &&
           other.streams == params_.streams && other.flags == params_.flags &&
           other.checksum == params_.checksum && other.resume_offset == params_.resume_offset &&
           other.resume_base == params_.resume_base && other.base_id == params_.base_id;
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

  // Returns the number of streams still attached. When it is 0 an
  // interrupted transfer keeps its partial file now (no stream writes any
  // more).
  int Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--attached_ == 0 && keep_partial_) KeepPartialLocked();
    return attached_;
  }

  // Stream `index` has `bytes` of its range in the file (contiguous from the
  // start of its range).
  void RecordReceived(uint16_t index, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    received_[index] = bytes;
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

  // The server's digest of the whole published file (verified resumes).
  uint64_t file_digest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return file_digest_;
  }

  // Marks the transfer failed (first reason wins), removes the temporary
  // file (or marks it to be kept, see the class comment) and wakes streams
  // waiting in CommitStream.
  void Fail(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(why);
  }

  // Called by a stream whose range arrived completely, with the whole-file
  // digest its COMMIT carried. The last stream to commit publishes the file;
  // the others wait for that (up to `wait`). Returns the outcome of the whole
  // transfer.
  Status CommitStream(std::chrono::milliseconds wait, uint64_t client_file_digest) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return outcome_;
    if (committed_ > 0 && client_file_digest != client_file_digest_) {
      FailLocked(Status::Corruption("streams disagree about the whole-file checksum"));
      return outcome_;
    }
    client_file_digest_ = client_file_digest;
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
  // Opens `name` in the destination directory as a resume base: a regular
  // file (never through a symlink) with the identity the client was given.
  Result<UniqueFd> OpenBase(const std::string& name, const std::string& what, int flags = O_RDONLY) {
    int fd = ::openat(dir_fd_.get(), name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ELOOP) {
        return Status::Conflict(what + " to resume from is gone; run the copy again");
      }
      return ErrnoStatus(errno, "open " + what + " to resume from");
    }
    UniqueFd base(fd);
    struct stat st;
    if (::fstat(base.get(), &st) != 0) return ErrnoStatus(errno, "stat " + what);
    if (!S_ISREG(st.st_mode) || FileIdentity(st) != params_.base_id ||
        static_cast<uint64_t>(st.st_size) < params_.resume_offset) {
      return Status::Conflict(what + " changed since --resume checked it; run the copy again");
    }
    int fl = ::fcntl(base.get(), F_GETFL);
    if (fl >= 0) (void)::fcntl(base.get(), F_SETFL, fl & ~O_NONBLOCK);
    return base;
  }

  // Takes the partial file over: renames it to the temporary name.
  Status ClaimPartial() {
    const std::string partial = PartialFileName(path_.file);
    const std::string what = "the partial file of '" + path_.ToString() + "'";
    std::string temp = std::move(temp_name_);
    temp_name_.clear();
    CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenBase(partial, what, O_RDWR));
    // Locked before it gets its temporary name (see CreateTemp).
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      return Status::Conflict(what + " is being taken over by another copy; run the copy again");
    }
    if (::renameat(dir_fd_.get(), partial.c_str(), dir_fd_.get(), temp.c_str()) != 0) {
      if (errno == ENOENT) return Status::Conflict(what + " to resume from is gone; run the copy again");
      return ErrnoStatus(errno, "take over " + what);
    }
    temp_name_ = temp;  // ours now: removed or kept like any temporary file
    struct stat opened, renamed;
    if (::fstat(fd.get(), &opened) != 0 ||
        ::fstatat(dir_fd_.get(), temp_name_.c_str(), &renamed, AT_SYMLINK_NOFOLLOW) != 0 ||
        opened.st_ino != renamed.st_ino || opened.st_dev != renamed.st_dev) {
      // Not the file we checked: put it back and leave it alone.
      (void)::renameat(dir_fd_.get(), temp_name_.c_str(), dir_fd_.get(), partial.c_str());
      temp_name_.clear();
      return Status::Conflict(what + " was replaced while --resume took it over; run the copy again");
    }
    if (static_cast<uint64_t>(opened.st_size) != params_.resume_offset &&
        ::ftruncate(fd.get(), static_cast<off_t>(params_.resume_offset)) != 0) {
      return ErrnoStatus(errno, "truncate " + what);
    }
    file_fd_ = std::move(fd);
    return SizeTemp();
  }

  void FailLocked(const Status& why) {
    if (finished_) return;
    finished_ = true;
    outcome_ = why.ok() ? Status::Internal("transfer failed without a reason") : why;
    if (params_.keep_partial() && !params_.sink() && IsInterruption(outcome_) && !temp_name_.empty()) {
      keep_partial_ = true;  // done when the last stream detaches (no writer left)
    } else {
      RemoveTempLocked();
    }
    cv_.notify_all();
  }

  // Unlinks the temporary file. The descriptor stays open until the transfer
  // is destroyed: other streams may still be writing through it, and closing
  // it under them could let them write into whatever file reuses the number.
  void RemoveTempLocked() {
    if (!temp_name_.empty() && dir_fd_.valid()) {
      ::unlinkat(dir_fd_.get(), temp_name_.c_str(), 0);
      temp_name_.clear();
    }
  }

  // The bytes known to be in the file from offset 0 on: the resume base, then
  // each stream's range while the previous ranges arrived completely.
  uint64_t ContiguousPrefixLocked() const {
    if (!base_ready_) return 0;
    uint64_t prefix = params_.resume_offset;
    for (uint16_t i = 0; i < params_.streams; ++i) {
      ByteRange r = StreamRange(params_.file_size, params_.resume_offset, params_.streams, i);
      prefix += received_[i];
      if (received_[i] < r.length) break;
    }
    return prefix;
  }

  // Cuts the temporary file to its contiguous prefix and renames it to the
  // partial file name (replacing an older one); removes it when empty.
  void KeepPartialLocked() {
    keep_partial_ = false;
    if (temp_name_.empty()) return;
    uint64_t prefix = ContiguousPrefixLocked();
    const std::string partial = PartialFileName(path_.file);
    if (prefix > 0 && ::ftruncate(file_fd_.get(), static_cast<off_t>(prefix)) == 0 &&
        ::renameat(dir_fd_.get(), temp_name_.c_str(), dir_fd_.get(), partial.c_str()) == 0) {
      CANOPY_LOG(kInfo, "rcopy server: kept {} bytes of '{}' as '{}' for --resume", prefix, path_.ToString(),
                 partial);
      temp_name_.clear();
      file_fd_.Reset();
      return;
    }
    RemoveTempLocked();
  }

  Status PublishLocked() {
    if (params_.sink()) return Status::Ok();
    std::string name = "'" + path_.ToString() + "'";
    if (!base_ready_) return Status::Internal("publishing " + name + " before its resume base was copied");
    if (params_.verify() && params_.resume_offset > 0) {
      // The ranges' digests cover only what was sent; check the whole file.
      CANOPY_ASSIGN_OR_RETURN(file_digest_, DigestFileRange(file_fd_.get(), 0, params_.file_size, params_.checksum));
      if (file_digest_ != client_file_digest_) {
        return Status::Corruption(fmt::format("{} mismatch on the whole resumed file {}: client {}, server {}",
                                              ChecksumAlgorithmName(params_.checksum), name,
                                              DigestHex(client_file_digest_), DigestHex(file_digest_)));
      }
    }
    if (::fchmod(file_fd_.get(), params_.mode & 0777) != 0) return ErrnoStatus(errno, "chmod " + name);
    CANOPY_RETURN_IF_ERROR(FsyncFd(file_fd_.get(), name));
    if (::renameat(dir_fd_.get(), temp_name_.c_str(), dir_fd_.get(), path_.file.c_str()) != 0) {
      return ErrnoStatus(errno, "rename temporary file to " + name);
    }
    temp_name_.clear();  // published: never remove it now
    file_fd_.Reset();
    // A partial file of an earlier interrupted copy is obsolete now.
    ::unlinkat(dir_fd_.get(), PartialFileName(path_.file).c_str(), 0);
    if (::fsync(dir_fd_.get()) != 0) return ErrnoStatus(errno, "fsync directory of " + name);
    return Status::Ok();
  }

  const OpenRequest params_;
  const SafeRelativePath path_;
  UniqueFd dir_fd_;
  UniqueFd file_fd_;
  UniqueFd base_fd_;       // resume from the target: the target, until CopyBase
  std::string temp_name_;  // empty when there is nothing to remove

  mutable std::mutex mu_;
  std::mutex write_mu_;  // only around writes into file_fd_ (never with mu_)
  std::condition_variable cv_;
  std::vector<bool> seen_;
  std::vector<uint64_t> received_;  // per stream, contiguous from its range start
  bool base_ready_;
  int attached_ = 0;
  int committed_ = 0;
  bool finished_ = false;
  bool keep_partial_ = false;  // failed by an interruption: keep at the last Detach
  Status outcome_;
  uint64_t client_file_digest_ = 0;
  uint64_t file_digest_ = 0;
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
    CANOPY_ASSIGN_OR_RETURN(auto listener, transport::ListenOn(options_.listen_uri, options_.transport));
    transport::ConnectionServer::Options server_options;
    server_options.name = "rcopy server";
    server_options.max_serving = options_.max_connections;
    server_ = std::make_unique<transport::ConnectionServer>(
        std::move(listener), server_options, [this](Connection& conn, bool busy) {
          if (busy) {
            Refuse(conn);
          } else {
            Serve(conn);
          }
        });
    return Status::Ok();
  }

  transport::Endpoint endpoint() const { return server_->local_endpoint(); }

  void Stop() {
    stopping_.store(true);  // ends digests and base copies early
    if (server_) server_->Stop();
  }

  ServerStats stats() {
    ServerStats s;
    const transport::ConnectionServer::Counts counts = server_->counts();
    s.active_connections = counts.serving;
    s.peak_active_connections = counts.peak_serving;
    s.connections = counts.accepted;
    s.files_published = published_.load();
    s.transfers_failed = failed_.load();
    s.auth_failures = auth_failures_.load();
    s.bytes_received = bytes_.load();
    return s;
  }

 private:
  // A connection beyond --max-connections: told so, on its own thread.
  void Refuse(Connection& conn) {
    CANOPY_LOG(kWarn, "rcopy server: refusing {}: {} connections open", conn.peer_uri(), options_.max_connections);
    (void)conn.Send(kMsgResult,
                    EncodeResult(ResultMessage::FromStatus(Status::ResourceExhausted(fmt::format(
                        "server busy: it already serves its maximum of {} connections (--max-connections); "
                        "try again later",
                        options_.max_connections)))));
    (void)conn.Shutdown();
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

  struct Attached {
    std::shared_ptr<Transfer> transfer;
    bool created = false;  // this stream created the transfer (and copies its resume base)
  };

  Result<Attached> Attach(const OpenRequest& open, SafeRelativePath path) {
    std::lock_guard<std::mutex> lock(transfers_mu_);
    auto tomb = tombstones_.find(open.transfer_id);
    if (tomb != tombstones_.end()) {
      // Name the first failure (disk full, checksum, ...), not its echo: a
      // late stream's client reports whichever stream's answer it read.
      return tomb->second.WithContext("this transfer already failed on another stream");
    }
    auto it = transfers_.find(open.transfer_id);
    if (it != transfers_.end()) {
      std::shared_ptr<Transfer> transfer = it->second;
      if (!transfer->Matches(open)) {
        return Status::InvalidArgument("transfer id reused with different file parameters");
      }
      CANOPY_RETURN_IF_ERROR(transfer->AddStream(open.stream_index));
      return Attached{transfer, false};
    }
    auto transfer = std::make_shared<Transfer>(open, std::move(path));
    if (!open.sink()) CANOPY_RETURN_IF_ERROR(transfer->CreateTemp(root_fd_.get()));
    CANOPY_RETURN_IF_ERROR(transfer->AddStream(open.stream_index));
    transfers_[open.transfer_id] = transfer;
    return Attached{transfer, true};
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
      if (tombstones_.emplace(id, transfer->failure()).second) tombstone_order_.push_back(id);
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
    if (!options_.secret.empty()) {
      Status authenticated = AuthenticateClient(conn, options_.secret, Deadline::After(options_.idle_timeout));
      if (!authenticated.ok()) {
        auth_failures_.fetch_add(1);
        CANOPY_LOG(kWarn, "rcopy server: {}: refused: {}", peer, authenticated.ToString());
        (void)conn.Shutdown();
        conn.Close();
        return;
      }
    }
    auto first = conn.Receive(Deadline::After(options_.idle_timeout));
    if (!first.ok()) {
      CANOPY_LOG(kDebug, "rcopy server: {}: no OPEN: {}", peer, first.status().ToString());
      return;
    }
    if (first->type == kMsgQuery && first->bulk_bytes == 0) return AnswerQuery(conn, first->payload);
    if (IsAuthHello(first->type) && options_.secret.empty()) {
      return RefuseAndClose(conn, OpenServerRefusal(), first->bulk_bytes == 0);
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
    std::shared_ptr<Transfer> transfer = std::move(attached->transfer);
    ServeStream(conn, *open, *transfer, attached->created);
    Detach(transfer);
  }

  // QUERY: tells the client what it could resume from. It changes nothing
  // but orphaned temporary files (AdoptOrphanedTemporaryFiles): the partial
  // file is taken over only by the OPEN that follows.
  void AnswerQuery(Connection& conn, std::string_view payload) {
    const std::string peer = conn.peer_uri();
    auto query = DecodeQuery(payload);
    if (!query.ok()) return RefuseAndClose(conn, query.status(), true);
    auto info = FindResumeBase(*query);
    if (!info.ok()) {
      CANOPY_LOG(kWarn, "rcopy server: {}: resume query for '{}': {}", peer, query->name, info.status().ToString());
      return RefuseAndClose(conn, info.status(), true);
    }
    CANOPY_LOG(kDebug, "rcopy server: {}: resume query for '{}': {} of {} bytes", peer, query->name,
               ResumeBaseName(info->base), info->size);
    (void)conn.Send(kMsgResumeInfo, EncodeResumeInfo(*info));
    (void)conn.Shutdown();
    auto tail = conn.Receive(Deadline::After(std::chrono::seconds(2)));  // the client's end of stream
    (void)tail;
  }

  // The partial file of the name, else the name itself when it is a regular
  // file (symlinks are never followed), else nothing.
  Result<ResumeInfo> FindResumeBase(const QueryRequest& query) {
    CANOPY_ASSIGN_OR_RETURN(SafeRelativePath path, SplitSafeRelativePath(query.name));
    ResumeInfo info;
    auto dir = OpenParentBeneath(root_fd_.get(), path, /*create_missing=*/false);
    if (!dir.ok()) {
      if (dir.status().IsNotFound()) return info;
      return dir.status();
    }
    AdoptOrphanedTemporaryFiles(dir->get(), path);
    const std::pair<ResumeBase, std::string> candidates[] = {{ResumeBase::kPartial, PartialFileName(path.file)},
                                                             {ResumeBase::kTarget, path.file}};
    for (const auto& [base, name] : candidates) {
      int fd = ::openat(dir->get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) {
        if (errno == ENOENT || errno == ELOOP) continue;
        return ErrnoStatus(errno, "open '" + name + "' to resume from");
      }
      UniqueFd file(fd);
      struct stat st;
      if (::fstat(file.get(), &st) != 0) return ErrnoStatus(errno, "stat '" + name + "'");
      if (!S_ISREG(st.st_mode)) continue;
      info.base = base;
      info.size = static_cast<uint64_t>(st.st_size);
      info.base_id = FileIdentity(st);
      if (info.size <= query.source_size) {
        info.checksum = query.checksum;
        CANOPY_ASSIGN_OR_RETURN(info.digest, DigestFileRange(file.get(), 0, info.size, query.checksum, &stopping_));
      }
      return info;
    }
    return info;
  }

  // A server killed with SIGKILL (or a crash) leaves its transfers'
  // temporary files behind. Before a resume QUERY is answered, each such
  // orphan of the name — one no live transfer holds locked, in this or any
  // process (Transfer::CreateTemp) — becomes the name's partial file: cut to
  // the prefix it was written from the start (WrittenPrefix) and renamed to
  // PartialFileName, unless the partial file already there is at least as
  // long; an orphan not used that way is removed. The resume then checks the
  // partial file's checksum against the client's source as always, so a
  // prefix that is not the source's (a power loss, another copy) is never
  // used. Errors only leave the orphans as they are.
  void AdoptOrphanedTemporaryFiles(int dir_fd, const SafeRelativePath& path) {
    std::vector<std::string> orphans;
    {
      int scan_fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (scan_fd < 0) return;
      DIR* dir = ::fdopendir(scan_fd);
      if (dir == nullptr) {
        ::close(scan_fd);
        return;
      }
      while (struct dirent* entry = ::readdir(dir)) {
        if (IsTemporaryFileOf(entry->d_name, path.file)) orphans.emplace_back(entry->d_name);
      }
      ::closedir(dir);
    }
    const std::string partial = PartialFileName(path.file);
    for (const std::string& name : orphans) {
      int fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      UniqueFd file(fd);
      if (::flock(file.get(), LOCK_EX | LOCK_NB) != 0) continue;  // a live transfer's
      struct stat opened, named;
      if (::fstat(file.get(), &opened) != 0 || !S_ISREG(opened.st_mode) ||
          ::fstatat(dir_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 || opened.st_ino != named.st_ino ||
          opened.st_dev != named.st_dev) {
        continue;  // renamed or replaced since the scan: not an orphan any more
      }
      auto prefix = WrittenPrefix(file.get(), static_cast<uint64_t>(opened.st_size));
      if (!prefix.ok()) continue;
      struct stat existing;
      bool partial_is_longer = ::fstatat(dir_fd, partial.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
                               S_ISREG(existing.st_mode) && static_cast<uint64_t>(existing.st_size) >= *prefix;
      if (*prefix == 0 || partial_is_longer) {
        if (::unlinkat(dir_fd, name.c_str(), 0) == 0) {
          CANOPY_LOG(kInfo, "rcopy server: removed the orphaned temporary file '{}' ({} usable bytes)", name,
                     *prefix);
        }
        continue;
      }
      if (::ftruncate(file.get(), static_cast<off_t>(*prefix)) != 0) continue;
      if (::renameat(dir_fd, name.c_str(), dir_fd, partial.c_str()) != 0) continue;
      CANOPY_LOG(kInfo, "rcopy server: kept {} bytes of the orphaned '{}' as '{}' for --resume", *prefix, name,
                 partial);
    }
  }

  void ServeStream(Connection& conn, const OpenRequest& open, Transfer& transfer, bool created) {
    const std::string peer = conn.peer_uri();
    if (created) {
      Status based = transfer.CopyBase(stopping_);
      if (!based.ok()) {
        transfer.Fail(based);
        return RefuseAndClose(conn, based, true);
      }
    }
    Status sent = SendResult(conn, ResultMessage{});
    if (!sent.ok()) {
      transfer.Fail(sent.WithContext("send OPEN reply"));
      return;
    }
    Digest digest(open.verify() ? open.checksum : ChecksumAlgorithm::kNone);
    uint64_t received = 0;
    bool clean = true;
    uint64_t client_file_digest = 0;
    Status status = ReceiveRange(conn, open, transfer, digest, &received, &clean, &client_file_digest);
    if (status.ok()) status = transfer.CommitStream(options_.idle_timeout, client_file_digest);
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
    result.file_digest = transfer.file_digest();
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
                      uint64_t* received, bool* clean, uint64_t* client_file_digest) {
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
        *client_file_digest = commit.file_digest;
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
      transfer.RecordReceived(open.stream_index, *received);
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
    Status s =
        conn.ReceiveBulk(BulkSink::ToFile(transfer.fd(), offset, transfer.write_lock()), length, deadline);
    if (!s.ok()) return s.WithContext(fmt::format("write '{}' at offset {}", open.name, offset));
    // Start the device writing this chunk now, so that the one fsync when the
    // file is complete waits for the last chunks only (as a joining node's
    // install does: tree/store.cc, kInstallWritebackBytes).
    CANOPY_RETURN_IF_ERROR(StartWriteback(transfer.fd(), offset, length, open.name));
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
  std::atomic<bool> stopping_{false};

  std::mutex transfers_mu_;
  std::map<uint64_t, std::shared_ptr<Transfer>> transfers_;
  std::map<uint64_t, Status> tombstones_;  // failed transfers: their first failure
  std::deque<uint64_t> tombstone_order_;

  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> bytes_{0};
  // Last: its connection threads use everything above, and it joins them
  // before anything above is destroyed.
  std::unique_ptr<transport::ConnectionServer> server_;
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
