// Private to canopy::tree: WAL segment files and buffered sequential reads.
//
// A tree's WAL is a sequence of segment files "wal-<first version, 20
// digits>.log" in the tree's directory. A record is exactly one EncodeDelta()
// encoding (which carries magic, total length and CRC32C). See README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/buffer_pool.h"
#include "base/fd.h"
#include "base/result.h"
#include "base/status.h"
#include "tree/delta.h"

namespace canopy::tree {

std::string WalSegmentName(uint64_t first_version);
std::string CheckpointName(uint64_t version);
// Parse "wal-<20 digits>.log" / "checkpoint-<20 digits>.snap"; false if not one.
bool ParseWalSegmentName(std::string_view name, uint64_t* first_version);
bool ParseCheckpointName(std::string_view name, uint64_t* version);

// Reads a file front to back through a buffer; views stay valid until the
// next call.
class BufferedFileReader {
 public:
  BufferedFileReader(UniqueFd fd, std::string path, uint64_t limit = UINT64_MAX);
  ~BufferedFileReader();
  BufferedFileReader(const BufferedFileReader&) = delete;
  BufferedFileReader& operator=(const BufferedFileReader&) = delete;
  // Up to n bytes from the current position (fewer only at end of file/limit).
  Result<std::string_view> Peek(size_t n);
  void Skip(size_t n);
  // Moves past the next n bytes, buffered or not: those not buffered are
  // never read (the next Peek reads from the file after them).
  Status Advance(uint64_t n);
  // Moves to file offset `offset`, dropping what is buffered.
  Status SeekTo(uint64_t offset);
  // A Peek that must read reads up to this many bytes ahead (default 1 MiB;
  // more when the Peek asks for more).
  void set_read_ahead(size_t bytes) { read_ahead_ = bytes; }
  uint64_t offset() const { return offset_; }
  // Bytes from the current position to the end of the file (or the limit),
  // as of when the reader was made: what a length field may claim at most.
  uint64_t remaining() const { return end_of_data_ > offset_ ? end_of_data_ - offset_ : 0; }

 private:
  UniqueFd fd_;
  std::string path_;
  uint64_t limit_;
  uint64_t end_of_data_ = 0;  // min(file size, limit)
  uint64_t offset_ = 0;       // file offset of buf_[pos_]
  uint64_t file_pos_ = 0;     // file offset of the next read
  size_t read_ahead_ = 1 << 20;
  // Lent by the process-wide pool (base/buffer_pool.h), so that scans on
  // many threads (every replica stream reading the records it sends) reuse
  // pages already faulted in.
  PooledBuffer buf_;
  size_t pos_ = 0, end_ = 0;  // valid bytes are buf_[pos_, end_)
};

// ScanSegment's read-ahead while it passes over records (skip_through_version).
inline constexpr size_t kSkipReadAheadBytes = 64 << 10;

struct WalSegment {
  uint64_t first_version = 0;  // new_version of its first record
  uint64_t last_version = 0;   // new_version of its last record
  uint64_t bytes = 0;          // valid bytes
  std::string path;
};

// Outcome of reading one segment.
struct SegmentScan {
  uint64_t valid_bytes = 0;  // bytes up to the end of the last good record
  bool torn = false;         // a bad or partial record follows valid_bytes
  std::string torn_reason;
};

// Calls `record(delta, encoded)` for each good record of the file, up to
// `limit` bytes (a file offset). Stops at the first record that is partial,
// fails its CRC or does not decode (torn = true). A non-ok Status from
// `record` stops the scan and is returned as is. IO errors are returned as
// errors. `start_offset` skips the bytes before it unread: it must be a record
// boundary (0, or the end of a record an earlier scan of this file passed to
// `record`, i.e. its start plus encoded.size()); anything else reads as torn.
// With `headers_only` each record is checked by DecodeDeltaHeader (magic,
// length, CRC) and `delta` carries only its tree and versions (no ops): for
// scans that hand records on whole, which then copy no values.
// With `skip_through_version` > 0, a record whose header (PeekDeltaHeader)
// says new_version <= skip_through_version is passed over unread: neither
// its body nor its CRC is read, and `record` is not called. Its length
// field alone finds the next record, which is checked as usual, so a
// damaged length still ends the scan as torn; valid_bytes counts passed-
// over records as good. For a read of the deltas after a version, which
// found it cost a read and a CRC of every byte before them.
// With `record_end` set, *record_end is the file offset just past each
// record when `record` is called for it (where a later scan may start: a
// caller cannot count it from the records it is handed once some are passed
// over).
Result<SegmentScan> ScanSegment(const std::string& path, uint64_t limit,
                                const std::function<Status(const Delta&, std::string_view)>& record,
                                uint64_t start_offset = 0, bool headers_only = false,
                                uint64_t skip_through_version = 0, uint64_t* record_end = nullptr);

// Appends records to the active segment of one tree. Not thread-safe: the
// owner serialises calls (the tree mutex).
class WalWriter {
 public:
  WalWriter(std::string dir, uint64_t segment_bytes, bool durable_creates);

  // Appends `record` (whose new_version is `version`). Starts a new segment
  // first if there is none or the current one is full (syncing the old one
  // when sync_old is set). On failure the active file is cut back to its
  // previous length, so no partial record remains; *broken is set if even
  // that failed, or if syncing the old segment failed (the WAL must not be
  // written again).
  Status Append(std::string_view record, uint64_t version, bool sync_old, bool* broken) {
    return AppendRecords(record, version, version, sync_old, broken);
  }
  // Same for consecutive records (new versions first_version..last_version)
  // concatenated in `records`: one write, all in the same segment.
  Status AppendRecords(std::string_view records, uint64_t first_version, uint64_t last_version, bool sync_old,
                       bool* broken);

  // Makes the file `staged` (on the WAL's file system) the next segment and
  // the active one: it holds `bytes` bytes of whole, checked records of new
  // versions first_version..last_version, written by the caller (a
  // replica's run of its leader's records, received straight into a file).
  // The old active segment is closed (synced first when sync_old); `staged`
  // is renamed into the WAL directory (which is synced when durable creates
  // are on); later appends go on after its records. On failure the WAL is as
  // it was and `staged` stays where it was, except that *broken is set if
  // syncing the old segment or the directory failed (the WAL must not be
  // written again).
  Status AdoptSegment(const std::string& staged, uint64_t first_version, uint64_t last_version,
                      uint64_t bytes, bool sync_old, bool* broken);

  // The active segment's file, shared so a syncer may use it unlocked.
  std::shared_ptr<UniqueFd> active_fd() const { return active_fd_; }
  // Closes the active segment; the next Append starts a new one.
  void CloseActive();

  std::vector<WalSegment>& segments() { return segments_; }
  const std::vector<WalSegment>& segments() const { return segments_; }

 private:
  std::string dir_;
  uint64_t segment_bytes_;
  bool durable_creates_;
  std::vector<WalSegment> segments_;  // in order; the last is active when active_fd_ is set
  std::shared_ptr<UniqueFd> active_fd_;
};

// fdatasync with EINTR retry.
Status SyncData(int fd, std::string_view what);

}  // namespace canopy::tree
