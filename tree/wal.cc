#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

#include "base/clock.h"
#include "base/coding.h"
#include "base/file.h"
#include "base/metrics.h"
#include "tree/wal_impl.h"

namespace canopy::tree {

namespace {

std::string NumberedName(const char* prefix, uint64_t v, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%020" PRIu64 "%s", prefix, v, suffix);
  return buf;
}

bool ParseNumbered(std::string_view name, std::string_view prefix, std::string_view suffix, uint64_t* v) {
  if (name.size() != prefix.size() + 20 + suffix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix || name.substr(prefix.size() + 20) != suffix) return false;
  uint64_t x = 0;
  for (char c : name.substr(prefix.size(), 20)) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  *v = x;
  return true;
}

}  // namespace

std::string WalSegmentName(uint64_t first_version) { return NumberedName("wal-", first_version, ".log"); }
std::string CheckpointName(uint64_t version) { return NumberedName("checkpoint-", version, ".snap"); }
bool ParseWalSegmentName(std::string_view name, uint64_t* v) {
  return ParseNumbered(name, "wal-", ".log", v);
}
bool ParseCheckpointName(std::string_view name, uint64_t* v) {
  return ParseNumbered(name, "checkpoint-", ".snap", v);
}

Status SyncData(int fd, std::string_view what) {
  // Every WAL sync of the process (its trees and stores together).
  static prometheus::Histogram& latency = metrics::GetHistogram(
      "canopy_wal_fsync_seconds", "Time of each WAL fdatasync (group commit, segment rotation).",
      metrics::LatencyBuckets());
  Clock::time_point start = Clock::now();
  while (::fdatasync(fd) != 0) {
    if (errno != EINTR) return ErrnoStatus(errno, std::string("fdatasync ") + std::string(what));
  }
  latency.Observe(std::chrono::duration<double>(Clock::now() - start).count());
  return Status::Ok();
}

// ---------------------------------------------------------------- reader

BufferedFileReader::BufferedFileReader(UniqueFd fd, std::string path, uint64_t limit)
    : fd_(std::move(fd)), path_(std::move(path)), limit_(limit) {
  struct stat st;
  uint64_t size = ::fstat(fd_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  end_of_data_ = std::min(size, limit_);
}

BufferedFileReader::~BufferedFileReader() = default;

Result<std::string_view> BufferedFileReader::Peek(size_t n) {
  if (end_ - pos_ < n) {
    // Move the unread bytes to the front and read more behind them.
    size_t have = end_ - pos_;
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, have);
      pos_ = 0;
      end_ = have;
    }
    // Read ahead up to read_ahead_ bytes, but not past the end of the data:
    // a scan that starts near the end (a replica stream's next delta) must
    // not allocate and zero a megabyte for a few hundred bytes.
    const uint64_t left = end_of_data_ > file_pos_ ? end_of_data_ - file_pos_ : 0;
    size_t want = std::max<size_t>(n, static_cast<size_t>(std::min<uint64_t>(have + left, read_ahead_)));
    if (buf_.capacity() < want) buf_.Grow(want, end_);
    while (end_ < n && file_pos_ < limit_) {
      size_t room = want - end_;
      if (limit_ - file_pos_ < room) room = static_cast<size_t>(limit_ - file_pos_);
      CANOPY_ASSIGN_OR_RETURN(size_t got, ReadSome(fd_.get(), buf_.data() + end_, room, path_));
      if (got == 0) break;
      end_ += got;
      file_pos_ += got;
    }
  }
  return std::string_view(buf_.data() + pos_, std::min(n, end_ - pos_));
}

void BufferedFileReader::Skip(size_t n) {
  pos_ += n;
  offset_ += n;
}

Status BufferedFileReader::Advance(uint64_t n) {
  if (n <= end_ - pos_) {
    Skip(static_cast<size_t>(n));
    return Status::Ok();
  }
  return SeekTo(offset_ + n);
}

Status BufferedFileReader::SeekTo(uint64_t offset) {
  if (::lseek(fd_.get(), static_cast<off_t>(offset), SEEK_SET) < 0) {
    return ErrnoStatus(errno, "lseek " + path_);
  }
  offset_ = file_pos_ = offset;
  pos_ = end_ = 0;
  return Status::Ok();
}

Result<SegmentScan> ScanSegment(const std::string& path, uint64_t limit,
                                const std::function<Status(const Delta&, std::string_view)>& record,
                                uint64_t start_offset, bool headers_only, uint64_t skip_through_version,
                                uint64_t* record_end) {
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  BufferedFileReader in(std::move(fd), path, limit);
  if (start_offset > 0) CANOPY_RETURN_IF_ERROR(in.SeekTo(start_offset));
  // Passing over records: read little ahead, so that a big record's body
  // is skipped by a seek rather than read into the buffer first.
  if (skip_through_version > 0) in.set_read_ahead(kSkipReadAheadBytes);
  SegmentScan scan;
  scan.valid_bytes = start_offset;
  for (;;) {
    CANOPY_ASSIGN_OR_RETURN(std::string_view head, in.Peek(8));
    if (head.empty()) break;  // clean end
    auto torn = [&](std::string why) {
      scan.torn = true;
      scan.torn_reason = std::move(why);
    };
    if (head.size() < 8) {
      torn("partial record header");
      break;
    }
    if (const uint32_t magic = DecodeFixed32(head.data()); magic != kDeltaMagic && magic != kDeltaWithRequestMagic) {
      torn("bad record magic");
      break;
    }
    uint32_t len = DecodeFixed32(head.data() + 4);
    if (len < kDeltaMinBytes || len > in.remaining()) {
      torn("record length " + std::to_string(len) + " does not fit the " + std::to_string(in.remaining()) +
           " bytes left");
      break;
    }
    if (skip_through_version > 0) {
      CANOPY_ASSIGN_OR_RETURN(std::string_view prefix, in.Peek(std::min<size_t>(len, kDeltaPeekBytes)));
      auto header = PeekDeltaHeader(prefix);
      if (header.ok() && header->new_version <= skip_through_version) {
        CANOPY_RETURN_IF_ERROR(in.Advance(len));
        scan.valid_bytes = in.offset();
        continue;
      }
    }
    CANOPY_ASSIGN_OR_RETURN(std::string_view rec, in.Peek(len));
    if (rec.size() < len) {
      torn("record of " + std::to_string(len) + " bytes cut short at " + std::to_string(rec.size()));
      break;
    }
    Result<Delta> delta = Delta{};
    if (headers_only) {
      auto header = DecodeDeltaHeader(rec);
      if (header.ok()) {
        delta->tree = std::string(header->tree);
        delta->base_version = header->base_version;
        delta->new_version = header->new_version;
      } else {
        delta = header.status();
      }
    } else {
      delta = DecodeDelta(rec);
    }
    if (!delta.ok()) {
      torn(delta.status().message());
      break;
    }
    if (record_end != nullptr) *record_end = in.offset() + len;
    CANOPY_RETURN_IF_ERROR(record(*delta, rec));
    in.Skip(len);
    scan.valid_bytes = in.offset();
  }
  return scan;
}

// ---------------------------------------------------------------- writer

WalWriter::WalWriter(std::string dir, uint64_t segment_bytes, bool durable_creates)
    : dir_(std::move(dir)), segment_bytes_(segment_bytes), durable_creates_(durable_creates) {}

void WalWriter::CloseActive() { active_fd_.reset(); }

Status WalWriter::AdoptSegment(const std::string& staged, uint64_t first_version, uint64_t last_version,
                               uint64_t bytes, bool sync_old, bool* broken) {
  *broken = false;
  if (active_fd_ && sync_old) {
    Status s = SyncData(active_fd_->get(), segments_.back().path);
    if (!s.ok()) {
      *broken = true;  // what the old segment holds is in doubt
      return s;
    }
  }
  std::string path = JoinPath(dir_, WalSegmentName(first_version));
  if (PathExists(path)) return Status::AlreadyExists(path + ": a WAL segment of that name exists");
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(staged, O_WRONLY));
  CANOPY_RETURN_IF_ERROR(RenameFile(staged, path));
  if (durable_creates_) {
    Status s = FsyncDir(dir_);
    if (!s.ok()) {
      // The rename may or may not survive a crash: keep the segment (its
      // records are checked) but write nothing more to this WAL.
      *broken = true;
      segments_.push_back(WalSegment{first_version, last_version, bytes, path});
      active_fd_.reset();
      return s;
    }
  }
  segments_.push_back(WalSegment{first_version, last_version, bytes, path});
  active_fd_ = std::make_shared<UniqueFd>(std::move(fd));
  return Status::Ok();
}

Status WalWriter::AppendRecords(std::string_view record, uint64_t first_version, uint64_t version, bool sync_old,
                                bool* broken) {
  *broken = false;
  bool fresh = false;
  if (!active_fd_ || segments_.back().bytes >= segment_bytes_) {
    if (active_fd_ && sync_old) {
      Status s = SyncData(active_fd_->get(), segments_.back().path);
      if (!s.ok()) {
        *broken = true;  // what the old segment holds is in doubt
        return s;
      }
    }
    std::string path = JoinPath(dir_, WalSegmentName(first_version));
    CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_EXCL, 0644));
    if (durable_creates_) {
      Status s = FsyncDir(dir_);
      if (!s.ok()) {
        ::unlink(path.c_str());
        return s;
      }
    }
    active_fd_ = std::make_shared<UniqueFd>(std::move(fd));
    segments_.push_back(WalSegment{first_version, first_version - 1, 0, path});
    fresh = true;
  }
  WalSegment& seg = segments_.back();
  Status s = PwriteAll(active_fd_->get(), record.data(), record.size(), seg.bytes, seg.path);
  if (!s.ok()) {
    // Cut any partial record so that the log ends on a record boundary.
    if (::ftruncate(active_fd_->get(), static_cast<off_t>(seg.bytes)) != 0) *broken = true;
    if (fresh) {
      ::unlink(seg.path.c_str());
      segments_.pop_back();
      active_fd_.reset();
    }
    return s;
  }
  seg.bytes += record.size();
  seg.last_version = version;
  return Status::Ok();
}

}  // namespace canopy::tree
