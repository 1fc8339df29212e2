#include "tree/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "base/coding.h"
#include "base/file.h"
#include "base/logging.h"
#include "tree/legacy_snapshot.h"
#include "tree/node_image.h"
#include "tree/wal_impl.h"

namespace canopy::tree {

const char* FsyncPolicyName(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kAlways:
      return "always";
    case FsyncPolicy::kBatch:
      return "batch";
    case FsyncPolicy::kNone:
      return "none";
  }
  return "unknown";
}

bool CheckpointIsStale(uint64_t checkpoint_bytes, uint64_t wal_bytes, uint64_t floor) {
  return wal_bytes > 0 && wal_bytes >= std::max(floor, checkpoint_bytes / 2);
}

Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name) {
  if (name == "always") return FsyncPolicy::kAlways;
  if (name == "batch") return FsyncPolicy::kBatch;
  if (name == "none") return FsyncPolicy::kNone;
  return Status::InvalidArgument("unknown fsync policy '" + std::string(name) +
                                 "' (want always, batch or none)");
}

Status Store::ValidateTreeName(std::string_view name) {
  if (name.empty() || name.size() > 200) {
    return Status::InvalidArgument("tree name must be 1..200 characters, got " + std::to_string(name.size()));
  }
  if (name[0] == '.') return Status::InvalidArgument("tree name '" + std::string(name) + "' starts with '.'");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("tree name '" + std::string(name) +
                                     "' has a character outside [A-Za-z0-9._-]");
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------ pins

struct VersionPin::Table {
  std::mutex mu;  // a leaf lock: taken with t.mu held or with nothing held
  std::multiset<uint64_t> pinned;

  void Add(uint64_t v) {
    std::lock_guard lk(mu);
    pinned.insert(v);
  }
  void Remove(uint64_t v) {
    std::lock_guard lk(mu);
    auto it = pinned.find(v);
    if (it != pinned.end()) pinned.erase(it);
  }
  // The oldest pinned version, or UINT64_MAX when nothing is pinned.
  uint64_t Oldest() {
    std::lock_guard lk(mu);
    return pinned.empty() ? std::numeric_limits<uint64_t>::max() : *pinned.begin();
  }
};

VersionPin::VersionPin(std::shared_ptr<Table> table, std::string tree, uint64_t version)
    : table_(std::move(table)), tree_(std::move(tree)), version_(version) {}

VersionPin::~VersionPin() { Release(); }

VersionPin::VersionPin(VersionPin&& other) noexcept
    : table_(std::move(other.table_)), tree_(std::move(other.tree_)), version_(other.version_) {
  other.table_.reset();
}

VersionPin& VersionPin::operator=(VersionPin&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::move(other.table_);
    other.table_.reset();
    tree_ = std::move(other.tree_);
    version_ = other.version_;
  }
  return *this;
}

void VersionPin::Release() {
  if (table_) table_->Remove(version_);
  table_.reset();
}

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// A past version in a tree's retained window, with the moment the next
// version replaced it as the newest.
struct RetainedVersion {
  Version version;
  SteadyTime superseded_at;
};

// Moves the oldest versions of `history` that no retention rule keeps into
// *dropped (for the caller to destroy with no lock held). `latest` is the
// newest version number; `pin_floor` the oldest pinned version (UINT64_MAX:
// none). history holds consecutive versions ending at latest - 1.
void PruneHistory(std::deque<RetainedVersion>& history, uint64_t latest, uint64_t pin_floor,
                  const RetentionPolicy& policy, SteadyTime now, std::vector<Version>* dropped) {
  const uint64_t keep = std::max<uint64_t>(policy.keep_versions, 1);
  const uint64_t count_floor = latest + 1 > keep ? latest + 1 - keep : 0;
  while (!history.empty()) {
    const RetainedVersion& front = history.front();
    const uint64_t n = front.version.number();
    if (n >= count_floor || n >= pin_floor) break;
    if (policy.keep_for.count() > 0 && now - front.superseded_at < policy.keep_for) break;
    if (dropped != nullptr) dropped->push_back(std::move(history.front().version));
    history.pop_front();
  }
}

// The request ids of one tree's recent commits (see store.h): client ->
// sequence -> version, bounded per client and in clients.
class RequestLog {
 public:
  // The version committed for `id`, or 0 when it is not remembered.
  uint64_t Find(const RequestId& id) const {
    auto it = clients_.find(id.client);
    if (it == clients_.end()) return 0;
    auto s = it->second.find(id.sequence);
    return s == it->second.end() ? 0 : s->second;
  }
  void Record(const RequestId& id, uint64_t version) {
    if (id.empty()) return;
    auto [it, fresh] = clients_.try_emplace(id.client);
    if (fresh) {
      order_.push_back(id.client);
      if (order_.size() > kRequestClients) {
        clients_.erase(order_.front());
        order_.pop_front();
      }
    }
    auto& seqs = it->second;
    seqs[id.sequence] = version;
    if (seqs.size() > kRequestsPerClient) seqs.erase(seqs.begin());  // the lowest sequence
  }
  void Clear() {
    clients_.clear();
    order_.clear();
  }

 private:
  std::unordered_map<std::string, std::map<uint64_t, uint64_t>> clients_;
  std::deque<std::string> order_;  // clients, oldest first
};

struct TreeState {
  TreeState(std::string n, std::string d) : name(std::move(n)), dir(std::move(d)) {}
  const std::string name;
  const std::string dir;  // <store>/trees/<name>; never changes

  // Serialises checkpoints, WAL truncation and snapshot installs; taken before mu.
  std::mutex maintenance_mu;

  std::mutex mu;  // guards everything below
  std::condition_variable sync_cv;
  Version latest;
  uint64_t synced = 0;  // newest version known synced
  uint64_t unsynced_bytes = 0;
  bool sync_running = false;
  uint64_t generation = 0;  // bumped when a snapshot install replaces the tree
  Status failed;            // non-ok: read-only until reopen
  uint64_t checkpoint_version = 0;
  // NewestCheckpoint's answer, opened in place; valid while its number is
  // checkpoint_version and generation is newest_checkpoint_generation.
  // Guarded by maintenance_mu.
  std::optional<Version> newest_checkpoint;
  uint64_t newest_checkpoint_generation = 0;
  uint64_t commits_since_checkpoint = 0;
  // WAL record bytes after checkpoint_version, and the size of that
  // checkpoint file (0: none); StoreOptions::checkpoint_wal_bytes.
  uint64_t wal_bytes_since_checkpoint = 0;
  uint64_t checkpoint_file_bytes = 0;
  bool checkpoint_queued = false;
  std::unique_ptr<WalWriter> wal;
  RequestLog requests;  // ids of recent commits (duplicate detection)
  // The retained past versions, oldest first, consecutive, ending at
  // latest.number() - 1 (empty: only the newest is held).
  std::deque<RetainedVersion> history;
  // Pins on this tree's versions; shared with the VersionPins handed out.
  const std::shared_ptr<VersionPin::Table> pins = std::make_shared<VersionPin::Table>();

  // REQUIRES: mu held. Whether a commit just made an automatic checkpoint
  // due (by commit count or by WAL bytes); marks it queued when so, and the
  // caller queues it.
  bool CheckpointDueLocked(const StoreOptions& options) {
    if (checkpoint_queued) return false;
    const bool by_commits = options.checkpoint_every_commits > 0 &&
                            commits_since_checkpoint >= options.checkpoint_every_commits;
    const bool by_bytes = options.checkpoint_wal_bytes > 0 &&
                          CheckpointIsStale(checkpoint_file_bytes, wal_bytes_since_checkpoint,
                                            options.checkpoint_wal_bytes);
    checkpoint_queued = by_commits || by_bytes;
    return checkpoint_queued;
  }

  // The newest deltas as written to the WAL (new version, record), oldest
  // first, consecutive and ending at latest, up to kRecentDeltaBytes: a
  // replica stream that keeps up reads what it sends next from here instead
  // of the WAL file. Emptied by a snapshot install; entries leave with the
  // WAL segments that hold them, so it never holds a delta the WAL no
  // longer does. Guarded by mu.
  std::deque<std::pair<uint64_t, std::string>> recent;
  size_t recent_bytes = 0;
  // REQUIRES: mu held; `version` is latest + 1's record just written.
  void RememberRecentLocked(uint64_t version, std::string_view record) {
    if (record.size() > kRecentDeltaBytes) {  // would leave at once: copy nothing
      ForgetRecentLocked(UINT64_MAX);
      return;
    }
    if (!recent.empty() && recent.back().first + 1 != version) ForgetRecentLocked(UINT64_MAX);
    recent.emplace_back(version, std::string(record));
    recent_bytes += record.size();
    while (recent_bytes > kRecentDeltaBytes || recent.size() > kRecentDeltas) {
      recent_bytes -= recent.front().second.size();
      recent.pop_front();
    }
  }
  // Forgets the recent deltas up to `version`. REQUIRES: mu held.
  void ForgetRecentLocked(uint64_t version) {
    while (!recent.empty() && recent.front().first <= version) {
      recent_bytes -= recent.front().second.size();
      recent.pop_front();
    }
  }
  static constexpr size_t kRecentDeltaBytes = 64u << 10;
  static constexpr size_t kRecentDeltas = 256;

  // REQUIRES: mu held.
  uint64_t OldestRetainedLocked() const {
    return history.empty() ? latest.number() : history.front().version.number();
  }

  // Where recent ReadDeltasSince calls stopped: the version reached, the WAL
  // segment and the offset of the record after it. A replica's stream asks
  // for the deltas after the version it was last sent, so its next read
  // starts there instead of decoding the segment from its beginning (which
  // made every streamed commit cost O(segment)). A stale entry (the segment
  // rewritten or gone) only costs one full scan. Guarded by cursor_mu, a leaf
  // lock taken with no other held.
  struct WalCursor {
    uint64_t version = 0;
    std::string path;
    uint64_t offset = 0;
  };
  std::mutex cursor_mu;
  std::array<WalCursor, 8> cursors;
  size_t next_cursor = 0;

  uint64_t FindCursor(uint64_t version, const std::string& path) {
    std::lock_guard lk(cursor_mu);
    for (const WalCursor& c : cursors) {
      if (c.offset > 0 && c.version == version && c.path == path) return c.offset;
    }
    return 0;
  }
  void RememberCursor(uint64_t version, const std::string& path, uint64_t offset) {
    std::lock_guard lk(cursor_mu);
    for (WalCursor& c : cursors) {
      if (c.version == version && c.path == path) {
        c.offset = offset;
        return;
      }
    }
    cursors[next_cursor] = WalCursor{version, path, offset};
    next_cursor = (next_cursor + 1) % cursors.size();
  }
};

std::string TreeLabel(const TreeState& t) { return "tree '" + t.name + "'"; }

Result<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return ErrnoStatus(errno, "opendir " + dir);
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Streams a snapshot of `v` into `path` via "<path>.tmp": fsync, rename, fsync dir.
Status WriteCheckpointFile(const std::string& path, const Version& v, size_t chunk_bytes) {
  std::string tmp = path + ".tmp";
  Status s;
  {
    auto fd = OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!fd.ok()) return fd.status();
    s = WriteSnapshot(v, chunk_bytes, [&](std::string_view chunk) {
      return WriteAll(fd->get(), chunk.data(), chunk.size(), tmp);
    });
    if (s.ok()) s = FsyncFd(fd->get(), tmp);
  }
  if (s.ok()) s = RenameFile(tmp, path);
  if (s.ok()) s = FsyncDir(DirName(path));
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

// Reads and fully verifies a format 1 (CSN1) checkpoint file.
Result<Version> LoadLegacyCheckpoint(const std::string& path) {
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  BufferedFileReader in(std::move(fd), path);
  csn1::SnapshotReader reader;
  while (!reader.complete()) {
    CANOPY_ASSIGN_OR_RETURN(std::string_view head, in.Peek(8));
    if (head.empty()) break;
    CANOPY_ASSIGN_OR_RETURN(size_t len, csn1::SnapshotChunkLength(head));
    if (len > in.remaining()) return Status::Corruption(path + ": truncated chunk");
    CANOPY_ASSIGN_OR_RETURN(std::string_view chunk, in.Peek(len));
    if (chunk.size() < len) return Status::Corruption(path + ": truncated chunk");
    CANOPY_RETURN_IF_ERROR(reader.AddChunk(chunk).WithContext(path));
    in.Skip(len);
  }
  CANOPY_ASSIGN_OR_RETURN(Version v, reader.Finish());
  CANOPY_ASSIGN_OR_RETURN(std::string_view rest, in.Peek(1));
  if (!rest.empty()) return Status::Corruption(path + ": bytes after the END chunk");
  return v;
}

// A read-only mapping of the first `size` (> 0) bytes of fd (`path`), a file
// of delta records: the owner that large values applied from those records
// in place point into (ApplyOps with an owner). Unmapped with its last
// reference.
Result<NodeImagePtr> MapDeltaRecords(int fd, size_t size, const std::string& path) {
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap " + path);
  return NodeImage::FromMapping(static_cast<const char*>(p), size, {}, {});
}

// A mapping of a WAL segment, for recovery to replay large values in place;
// null (values are then copied) if the file is empty or cannot be mapped. A
// segment is only ever appended to or cut after its last whole record, so
// the bytes of a replayed record never change under the mapping; an
// unlinked segment stays readable while a version refers into it (on a
// disk, its blocks stay allocated until then).
NodeImagePtr MapWalSegment(const std::string& path) {
  auto fd = OpenFile(path, O_RDONLY);
  if (!fd.ok()) return nullptr;
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0 || st.st_size <= 0) return nullptr;
  auto mapped = MapDeltaRecords(fd->get(), static_cast<size_t>(st.st_size), path);
  return mapped.ok() ? std::move(*mapped) : nullptr;
}

// Whether a replayed delta is applied from the mapping: it puts a value
// large enough to be kept in place (kReferencedValueBytes), and the record
// (the scan's copy of it, ending at file offset record_end) lies inside it.
bool ReplayInPlace(const Delta& d, std::string_view record, uint64_t record_end,
                   const NodeImagePtr& mapping) {
  if (!mapping || record_end < record.size() || record_end > mapping->size()) return false;
  for (const Op& op : d.ops) {
    if (op.type == OpType::kPutAttribute && op.value.size() >= kReferencedValueBytes) return true;
  }
  return false;
}

// ApplyOps over the mapped bytes of the record: its large values are not copied.
Result<NodePtr> ApplyMapped(const NodePtr& root, std::string_view record, uint64_t record_end,
                            const NodeImagePtr& mapping) {
  std::string_view mapped(mapping->data() + (record_end - record.size()), record.size());
  CANOPY_ASSIGN_OR_RETURN(DeltaView view, DecodeDeltaView(mapped));
  return ApplyOps(root, view.ops, mapping.get());
}

// Opens a checkpoint file in place (format 2), fully checked. A format 1
// file is decoded, rewritten in format 2 under the same name (atomically)
// and then opened in place; should the rewrite fail, the decoded tree is
// still returned (the file stays in format 1 and is migrated next time).
Result<Version> LoadCheckpoint(const std::string& path, const std::string& tree, uint64_t version) {
  uint32_t magic = 0;
  {
    CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
    char head[4];
    ssize_t n = ::pread(fd.get(), head, sizeof head, 0);
    if (n < 0) return ErrnoStatus(errno, "read " + path);
    if (n < 4) return Status::Corruption(path + ": truncated checkpoint (" + std::to_string(n) + " bytes)");
    magic = DecodeFixed32(head);
  }
  Result<Version> v = Status::Corruption("");
  if (magic == kSnapshotMagic) {
    v = OpenSnapshotFile(path);
  } else if (magic == kLegacySnapshotMagic) {
    v = LoadLegacyCheckpoint(path);
    if (v.ok() && v->tree() == tree && v->number() == version) {
      Status s = WriteCheckpointFile(path, *v, kDefaultSnapshotChunkBytes);
      if (s.ok()) {
        CANOPY_LOG(kInfo, "{}: migrated from checkpoint format {} (CSN1) to format {} (CBK1)", path,
                   kLegacySnapshotFormat, kSnapshotFormat);
        v = OpenSnapshotFile(path);
      } else {
        CANOPY_LOG(kWarn, "{}: format {} (CSN1) checkpoint read, but not migrated to format {}: {}", path,
                   kLegacySnapshotFormat, kSnapshotFormat, s.ToString());
      }
    }
  } else {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", magic);
    return Status::Corruption(path + ": not a checkpoint this canopy can read (magic 0x" + hex +
                              "); it reads format " + std::to_string(kSnapshotFormat) +
                              " (CBK1) and migrates format " + std::to_string(kLegacySnapshotFormat) + " (CSN1)");
  }
  if (!v.ok()) return v.status();
  if (v->tree() != tree || v->number() != version) {
    return Status::Corruption(path + ": holds tree '" + v->tree() + "' version " + std::to_string(v->number()));
  }
  return v;
}

class StoreImpl;

// An installer that writes a snapshot or checkpoint file as its bytes
// arrive starts the device writing every this many bytes (StartWriteback),
// so that the one fsync at the end waits for the last few MiB rather than
// the whole file: on a disk, joins of many trees at once otherwise all
// stalled in their final fsyncs together, with the CPUs idle for a quarter
// of the join (perf, joiner data dir on ext4). Large enough that each call
// hands the device a few MiB (a bulk piece is 2 MiB).
constexpr uint64_t kInstallWritebackBytes = 4 << 20;

// Starts write-back of [*written_back, landed) of fd once that range has
// reached kInstallWritebackBytes, and moves *written_back to landed.
Status WriteBackLanded(int fd, uint64_t landed, uint64_t* written_back, const std::string& path) {
  if (landed - *written_back < kInstallWritebackBytes) return Status::Ok();
  Status s = StartWriteback(fd, *written_back, landed - *written_back, path);
  *written_back = landed;
  return s;
}

class InstallerImpl final : public SnapshotInstaller {
 public:
  InstallerImpl(StoreImpl* store, std::string tree, std::string dir)
      : store_(store), tree_(std::move(tree)), dir_(std::move(dir)) {}
  ~InstallerImpl() override {
    file_.Reset();
    if (!finished_) (void)RemoveTree(dir_);
  }
  Status AddChunk(std::string_view chunk) override;
  Result<Version> Finish() override;

 private:
  StoreImpl* store_;
  std::string tree_;
  std::string dir_;  // private directory under <store>/tmp
  std::string path_;
  UniqueFd file_;
  uint64_t written_ = 0;       // bytes of file_
  uint64_t written_back_ = 0;  // write-back started for [0, written_back_)
  SnapshotReader reader_{SnapshotReader::Keep::kNothing};
  Status error_;
  bool finished_ = false;
};

// Node join on the bulk path (store.h, SnapshotFileInstaller).
class FileInstallerImpl final : public SnapshotFileInstaller {
 public:
  FileInstallerImpl(StoreImpl* store, std::string tree, CheckpointFileInfo info, std::string path)
      : store_(store), tree_(std::move(tree)), info_(info), path_(std::move(path)) {}
  ~FileInstallerImpl() override;
  // Opens the partial file (a resume: `offset` bytes held) and checks what it holds.
  Status Open(uint64_t offset);

  const CheckpointFileInfo& info() const override { return info_; }
  int fd() const override { return file_.get(); }
  uint64_t resume_offset() const override { return resume_offset_; }
  Status Landed(uint64_t bytes) override;
  Result<Version> Finish() override;

 private:
  // Feeds every whole block in [checked_, landed) to reader_. With
  // `stop_at_bad` (checking what a resume found) a bad or torn block ends
  // the check quietly there instead of failing.
  Status CheckBlocks(uint64_t landed, bool stop_at_bad);
  Status Fail(Status s);

  StoreImpl* store_;
  std::string tree_;
  CheckpointFileInfo info_;
  std::string path_;  // <store>/partial/<tree>/<identity>
  UniqueFd file_;
  std::unique_ptr<SnapshotReader> reader_ = std::make_unique<SnapshotReader>(SnapshotReader::Keep::kNothing);
  uint64_t checked_ = 0;  // the blocks in [0, checked_) passed reader_
  uint64_t landed_ = 0;
  uint64_t written_back_ = 0;  // write-back started for [0, written_back_) (StartWriteback)
  uint64_t resume_offset_ = 0;
  Status error_;
  bool finished_ = false;
};

// A replica's run of WAL records received into a staged file (store.h,
// WalRunWriter).
class WalRunWriterImpl final : public WalRunWriter {
 public:
  WalRunWriterImpl(StoreImpl* store, std::string tree, uint64_t bytes, std::string path, UniqueFd fd)
      : store_(store), tree_(std::move(tree)), bytes_(bytes), path_(std::move(path)), file_(std::move(fd)) {}
  ~WalRunWriterImpl() override {
    if (!adopted_) ::unlink(path_.c_str());
  }
  int fd() const override { return file_.get(); }
  Result<uint64_t> Commit(uint64_t count) override;

 private:
  StoreImpl* store_;
  std::string tree_;
  uint64_t bytes_;
  std::string path_;  // <store>/tmp/run-...: until Commit renames it into the WAL
  UniqueFd file_;
  bool used_ = false;     // Commit was called
  bool adopted_ = false;  // the file is a WAL segment now
};

class StoreImpl final : public Store {
 public:
  StoreImpl(std::string dir, StoreOptions options)
      : dir_(std::move(dir)),
        trees_dir_(JoinPath(dir_, "trees")),
        tmp_dir_(JoinPath(dir_, "tmp")),
        partial_dir_(JoinPath(dir_, "partial")),
        options_(options) {}

  ~StoreImpl() override {
    {
      std::lock_guard lk(bg_mu_);
      stop_ = true;
    }
    bg_cv_.notify_all();
    if (bg_thread_.joinable()) bg_thread_.join();
    if (options_.fsync == FsyncPolicy::kBatch) {
      Status s = SyncAll();
      if (!s.ok()) CANOPY_LOG(kWarn, "store {}: final sync failed: {}", dir_, s.ToString());
    }
  }

  Status Init() {
    CANOPY_RETURN_IF_ERROR(CreateDirs(trees_dir_));
    CANOPY_RETURN_IF_ERROR(CreateDirs(tmp_dir_));
    CANOPY_RETURN_IF_ERROR(CreateDirs(partial_dir_));
    std::string lock_path = JoinPath(dir_, "LOCK");
    CANOPY_ASSIGN_OR_RETURN(lock_fd_, OpenFile(lock_path, O_RDWR | O_CREAT, 0644));
    if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK)
        return Status::Unavailable("store " + dir_ + " is already open (LOCK is held)");
      return ErrnoStatus(errno, "flock " + lock_path);
    }
    CANOPY_ASSIGN_OR_RETURN(auto leftovers, ListDir(tmp_dir_));
    for (const auto& name : leftovers) CANOPY_RETURN_IF_ERROR(RemoveTree(JoinPath(tmp_dir_, name)));
    CANOPY_ASSIGN_OR_RETURN(auto names, ListDir(trees_dir_));
    for (const auto& name : names) {
      if (!ValidateTreeName(name).ok()) {
        CANOPY_LOG(kWarn, "store {}: ignoring {} (not a tree name)", dir_, JoinPath(trees_dir_, name));
        continue;
      }
      CANOPY_ASSIGN_OR_RETURN(auto t, RecoverTree(name));
      // Recovery started from an older checkpoint (the base of the retained
      // window) and never read the newest one: the background thread reads
      // and checks it now, so that the first joiner is not kept waiting
      // while its leader does (NewestCheckpoint).
      if (t->checkpoint_version > 0 && !t->newest_checkpoint) verify_queue_.push_back(t);
      trees_.emplace(name, std::move(t));
    }
    bg_thread_ = std::thread([this] { BackgroundLoop(); });
    return Status::Ok();
  }

  // ------------------------------------------------------------ trees

  Status CreateTree(std::string_view name) override {
    CANOPY_RETURN_IF_ERROR(ValidateTreeName(name));
    std::unique_lock lk(trees_mu_);
    if (trees_.count(name)) return Status::AlreadyExists("tree '" + std::string(name) + "' already exists");
    std::string dir = JoinPath(trees_dir_, name);
    if (::mkdir(dir.c_str(), 0755) != 0) return ErrnoStatus(errno, "mkdir " + dir);
    Status s = FsyncDir(trees_dir_);
    if (!s.ok()) {
      ::rmdir(dir.c_str());
      return s;
    }
    auto t = NewTreeState(std::string(name), Version(std::string(name), 0, Node::Empty()));
    trees_.emplace(std::string(name), std::move(t));
    return Status::Ok();
  }

  bool HasTree(std::string_view name) const override {
    std::shared_lock lk(trees_mu_);
    return trees_.count(name) > 0;
  }

  std::vector<std::string> ListTrees() const override {
    std::shared_lock lk(trees_mu_);
    std::vector<std::string> out;
    for (const auto& [name, t] : trees_) out.push_back(name);
    return out;
  }

  Result<Version> Latest(std::string_view tree) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    return t->latest;
  }

  Result<uint64_t> LatestVersion(std::string_view tree) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    return t->latest.number();
  }

  Result<uint64_t> DurableVersion(std::string_view tree) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    return t->synced;
  }

  Result<Version> At(std::string_view tree, uint64_t number) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    CANOPY_RETURN_IF_ERROR(CheckRetainedLocked(*t, number));
    if (number == t->latest.number()) return t->latest;
    return t->history[static_cast<size_t>(number - t->history.front().version.number())].version;
  }

  Result<RetainedVersions> Retained(std::string_view tree) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    return RetainedVersions{t->OldestRetainedLocked(), t->latest.number()};
  }

  Result<VersionPin> Pin(std::string_view tree, uint64_t number) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard lk(t->mu);
    CANOPY_RETURN_IF_ERROR(CheckRetainedLocked(*t, number));
    t->pins->Add(number);
    return VersionPin(t->pins, t->name, number);
  }

  Result<Transaction> Begin(std::string_view tree) const override {
    CANOPY_ASSIGN_OR_RETURN(Version v, Latest(tree));
    return Transaction(std::move(v));
  }

  // ------------------------------------------------------------ writes

  Result<CommitResult> Commit(Transaction txn, const RequestId& request) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(txn.base().tree()));
    Delta delta = txn.ToDelta();
    delta.request = request;
    return CommitDelta(*t, delta, txn.base().root(), txn.root(), "", CommitMode::kClient);
  }

  Result<CommitResult> CommitOps(std::string_view tree, std::vector<Op> ops, const RequestId& request,
                                 uint64_t base_version) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    Delta delta;
    delta.tree = t->name;
    delta.base_version = base_version;  // 0: any
    delta.ops = std::move(ops);
    delta.request = request;
    return CommitDelta(*t, delta, nullptr, nullptr, "", CommitMode::kClientOnLatest);
  }

  std::vector<Result<CommitResult>> CommitOpsBatch(std::string_view tree, std::vector<OpsCommit> commits) override {
    std::vector<Result<CommitResult>> results;
    results.reserve(commits.size());
    auto found = FindTree(tree);
    if (!found.ok()) {
      for (size_t i = 0; i < commits.size(); ++i) results.emplace_back(found.status());
      return results;
    }
    TreeState& t = **found;
    std::vector<Version> dropped;  // versions leaving the retained window; freed after t.mu is released
    std::unique_lock lk(t.mu);
    if (!t.failed.ok()) {
      for (size_t i = 0; i < commits.size(); ++i) results.emplace_back(t.failed);
      return results;
    }
    // First every commit is built on the one before it (nothing installed:
    // a failed WAL write must leave the tree as it was), then one write.
    struct Built {
      size_t index;
      NodePtr root;
      size_t record_end;  // offset in `records` after its WAL record
    };
    std::vector<Built> built;
    std::vector<std::pair<const RequestId*, uint64_t>> batch_ids;  // ids committed by this batch
    std::string records;
    uint64_t newest = t.latest.number();
    NodePtr root = t.latest.root();
    uint64_t wait_durable = 0;  // the newest earlier version a duplicate returns
    for (size_t i = 0; i < commits.size(); ++i) {
      OpsCommit& c = commits[i];
      if (!c.request.empty()) {
        uint64_t earlier = t.requests.Find(c.request);
        for (const auto& [id, v] : batch_ids) {
          if (*id == c.request) earlier = v;
        }
        if (earlier != 0) {
          wait_durable = std::max(wait_durable, earlier);
          results.emplace_back(CommitResult{earlier, "", true});
          continue;
        }
      }
      if (c.base_version != 0 && c.base_version != newest) {
        results.emplace_back(Status::Conflict(TreeLabel(t) + ": base version " + std::to_string(c.base_version) +
                                              " is stale: the newest version is " + std::to_string(newest)));
        continue;
      }
      Delta delta;
      delta.tree = t.name;
      delta.base_version = newest;
      delta.new_version = newest + 1;
      delta.ops = std::move(c.ops);
      delta.request = c.request;
      auto applied = ApplyOps(root, delta.ops);
      if (!applied.ok()) {
        results.emplace_back(applied.status().WithContext(TreeLabel(t) + ": delta to version " +
                                                          std::to_string(delta.new_version) + " does not apply"));
        continue;
      }
      std::string encoded = EncodeDelta(delta);
      records += encoded;
      root = std::move(*applied);
      newest = delta.new_version;
      if (!c.request.empty()) batch_ids.emplace_back(&c.request, newest);
      built.push_back(Built{i, root, records.size()});
      results.emplace_back(CommitResult{newest, std::move(encoded)});
    }
    if (!built.empty()) {
      const uint64_t first = t.latest.number() + 1;
      bool broken = false;
      Status s = t.wal->AppendRecords(records, first, newest, SyncsFiles(), &broken);
      if (!s.ok()) {
        if (broken) {
          t.failed = Status::IOError(TreeLabel(t) + ": WAL state in doubt after a failed write or sync (" +
                                     s.message() + "); the tree is read-only until the store is reopened");
        }
        Status failed = s.WithContext(TreeLabel(t) + ": commit of versions " + std::to_string(first) + ".." +
                                      std::to_string(newest) + " failed, the tree stays at version " +
                                      std::to_string(t.latest.number()));
        for (const Built& b : built) results[b.index] = failed;
        // Duplicates naming a version of this batch: it was never made.
        for (size_t i = 0; i < results.size(); ++i) {
          if (results[i].ok() && results[i]->duplicate && results[i]->version >= first) results[i] = failed;
        }
        return results;
      }
      const SteadyTime now = std::chrono::steady_clock::now();
      uint64_t v = t.latest.number();
      size_t record_begin = 0;
      for (const Built& b : built) {
        ++v;
        t.RememberRecentLocked(v, std::string_view(records).substr(record_begin, b.record_end - record_begin));
        record_begin = b.record_end;
        t.requests.Record(commits[b.index].request, v);
        t.history.push_back(RetainedVersion{std::move(t.latest), now});
        t.latest = Version(t.name, v, b.root);
      }
      PruneHistory(t.history, v, t.pins->Oldest(), options_.retention, now, &dropped);
      t.unsynced_bytes += records.size();
      if (options_.fsync == FsyncPolicy::kNone) t.synced = v;
      wait_durable = std::max(wait_durable, v);
    }
    bool queue_checkpoint = false;
    if (!built.empty()) {
      t.commits_since_checkpoint += built.size();
      t.wal_bytes_since_checkpoint += records.size();
      queue_checkpoint = t.CheckpointDueLocked(options_);
    }
    if (options_.fsync == FsyncPolicy::kAlways && wait_durable != 0) {
      Status ds = SyncLocked(lk, t, wait_durable, false);
      if (!ds.ok()) {
        for (auto& r : results) {
          if (r.ok()) r = ds;
        }
      }
    }
    bool kick = options_.fsync == FsyncPolicy::kBatch && t.unsynced_bytes >= options_.batch_bytes;
    lk.unlock();
    if (queue_checkpoint || kick) {
      {
        std::lock_guard bl(bg_mu_);
        if (queue_checkpoint) checkpoint_queue_.push_back(*found);
        if (kick) batch_kick_ = true;
      }
      bg_cv_.notify_one();
    }
    return results;
  }

  Result<CommitResult> ApplyDelta(const Delta& delta) override {
    if (delta.new_version != delta.base_version + 1) {
      return Status::InvalidArgument("delta for tree '" + delta.tree + "' goes from version " +
                                     std::to_string(delta.base_version) + " to " +
                                     std::to_string(delta.new_version) + ", not to the next version");
    }
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(delta.tree));
    Delta copy = delta;
    return CommitDelta(*t, copy, nullptr, nullptr, "", CommitMode::kReplicated);
  }

  Result<CommitResult> ApplyEncodedDelta(std::string_view encoded) override {
    CANOPY_ASSIGN_OR_RETURN(DeltaView view, DecodeDeltaView(encoded));
    std::shared_ptr<TreeState> t;
    return CommitEncoded(view, encoded, &t, /*sync=*/true);
  }

  // Commits a delta made elsewhere (kReplicated) from its encoding, decoded
  // in place: its ops are applied to the newest version before the tree
  // lock is taken, so a value goes from `encoded` into the tree in one copy
  // (DecodeDelta would first copy it into an Op). Should the newest version
  // not be the delta's base, or move meanwhile, or the ops not apply, it
  // goes the general way (decoded, applied under the lock), which gives the
  // same result or the same error as always. *t: the tree, looked up unless
  // set, and it must be the view's. `owner`: as ApplyOps's (the general way
  // copies every value).
  Result<CommitResult> CommitEncoded(const DeltaView& view, std::string_view encoded,
                                     std::shared_ptr<TreeState>* t, bool sync,
                                     const NodeImage* owner = nullptr) {
    auto general = [&]() -> Result<CommitResult> {
      CANOPY_ASSIGN_OR_RETURN(Delta delta, DecodeDelta(encoded));
      if (delta.new_version != delta.base_version + 1) return ApplyDelta(delta);  // the error
      if (!*t) {
        CANOPY_ASSIGN_OR_RETURN(*t, FindTree(delta.tree));
      }
      return CommitDelta(**t, delta, nullptr, nullptr, encoded, CommitMode::kReplicated, sync);
    };
    if (view.new_version != view.base_version + 1) return general();
    if (!*t) {
      CANOPY_ASSIGN_OR_RETURN(*t, FindTree(view.tree));
    }
    Version base;
    {
      std::lock_guard lk((*t)->mu);
      base = (*t)->latest;
    }
    if (base.number() != view.base_version) return general();
    auto applied = ApplyOps(base.root(), view.ops, owner);
    if (!applied.ok()) return general();
    Delta delta;  // what CommitDelta reads of a replicated delta: no ops (the new root is given)
    delta.tree = std::string(view.tree);
    delta.base_version = view.base_version;
    delta.new_version = view.new_version;
    if (!view.request_client.empty())
      delta.request = RequestId{std::string(view.request_client), view.request_sequence};
    auto committed =
        CommitDelta(**t, delta, base.root(), std::move(*applied), encoded, CommitMode::kReplicated, sync);
    if (!committed.ok() && committed.status().IsConflict()) return general();
    return committed;
  }

  Result<uint64_t> ApplyEncodedDeltas(std::span<const std::string_view> encoded) override {
    return ApplyRun(encoded, nullptr, 0);
  }

  Result<uint64_t> ApplyEncodedDeltasInPlace(std::span<const std::string_view> encoded,
                                             std::unique_ptr<char[]>* buffer, size_t buffer_bytes) override {
    return ApplyRun(encoded, buffer, buffer_bytes);
  }

  Result<std::unique_ptr<WalRunWriter>> BeginWalRun(std::string_view tree, uint64_t bytes) override {
    CANOPY_RETURN_IF_ERROR(FindTree(tree).status());
    if (bytes == 0 || bytes > kMaxWalRunBytes) {
      return Status::InvalidArgument("a WAL run of " + std::to_string(bytes) + " bytes (1.." +
                                     std::to_string(kMaxWalRunBytes) + ")");
    }
    std::string path = JoinPath(
        tmp_dir_, "run-" + std::to_string(::getpid()) + "-" + std::to_string(tmp_counter_.fetch_add(1)));
    CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDWR | O_CREAT | O_EXCL, 0644));
    return std::unique_ptr<WalRunWriter>(
        std::make_unique<WalRunWriterImpl>(this, std::string(tree), bytes, std::move(path), std::move(fd)));
  }

  // WalRunWriter::Commit. The run is mapped and checked whole, every delta
  // applied to the newest version under the tree lock, and only then is the
  // file made a WAL segment and are the versions published. *adopted: the
  // file was renamed into the WAL (the caller must not remove it).
  Result<uint64_t> CommitWalRun(std::string_view tree, const std::string& staged, int fd, uint64_t bytes,
                                uint64_t count, bool* adopted) {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat " + staged);
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      return Status::Corruption(
          fmt::format("{}: a run of {} bytes holds {}", TreeLabel(*t), bytes, st.st_size));
    }
    // Owns the mapping: the versions that keep a large value in place hold it.
    CANOPY_ASSIGN_OR_RETURN(const NodeImagePtr owner, MapDeltaRecords(fd, static_cast<size_t>(bytes), staged));
    CANOPY_ASSIGN_OR_RETURN(std::vector<std::string_view> records,
                            SplitDeltaRun(std::string_view(owner->data(), owner->size())));
    if (records.size() != count) {
      return Status::Corruption(
          fmt::format("{}: a run announced as {} records holds {}", TreeLabel(*t), count, records.size()));
    }
    std::vector<DeltaView> views;
    views.reserve(records.size());
    for (std::string_view record : records) {
      CANOPY_ASSIGN_OR_RETURN(DeltaView view, DecodeDeltaView(record));
      if (view.tree != t->name) {
        return Status::InvalidArgument("a run of deltas of tree '" + t->name + "' holds one of '" +
                                       std::string(view.tree) + "'");
      }
      const uint64_t want = views.empty() ? view.base_version : views.back().new_version;
      if (view.base_version != want || view.new_version != view.base_version + 1) {
        return Status::Corruption(fmt::format("{}: the run's records are not consecutive at version {}",
                                              TreeLabel(*t), view.new_version));
      }
      views.push_back(std::move(view));
    }
    std::vector<Version> dropped;  // versions leaving the retained window; freed after t.mu is released
    std::unique_lock lk(t->mu);
    if (!t->failed.ok()) return t->failed;
    if (views.front().base_version != t->latest.number()) {
      return Status::Conflict(fmt::format("{}: a run based on version {}, but the newest version is {}",
                                          TreeLabel(*t), views.front().base_version, t->latest.number()));
    }
    // Every delta applies before any is committed.
    std::vector<NodePtr> roots;
    roots.reserve(views.size());
    NodePtr root = t->latest.root();
    for (const DeltaView& view : views) {
      auto applied = ApplyOps(root, view.ops, owner.get());
      if (!applied.ok()) {
        return applied.status().WithContext(TreeLabel(*t) + ": delta to version " +
                                            std::to_string(view.new_version) + " does not apply");
      }
      root = *applied;
      roots.push_back(std::move(*applied));
    }
    bool broken = false;
    Status s = t->wal->AdoptSegment(staged, views.front().new_version, views.back().new_version, bytes,
                                    SyncsFiles(), &broken);
    if (broken) {
      *adopted = PathExists(JoinPath(t->dir, WalSegmentName(views.front().new_version)));
      t->failed = Status::IOError(TreeLabel(*t) + ": WAL state in doubt after a failed sync (" + s.message() +
                                  "); the tree is read-only until the store is reopened");
    }
    if (!s.ok()) return s;
    *adopted = true;
    for (size_t i = 0; i < views.size(); ++i) {
      const DeltaView& view = views[i];
      RequestId request;
      if (!view.request_client.empty())
        request = RequestId{std::string(view.request_client), view.request_sequence};
      PublishLocked(*t, view.new_version, records[i], request, std::move(roots[i]), &dropped);
    }
    const uint64_t reached = views.back().new_version;
    if (options_.fsync == FsyncPolicy::kAlways) CANOPY_RETURN_IF_ERROR(SyncLocked(lk, *t, reached, false));
    const bool queue_checkpoint = t->CheckpointDueLocked(options_);
    const bool kick = options_.fsync == FsyncPolicy::kBatch && t->unsynced_bytes >= options_.batch_bytes;
    lk.unlock();
    if (queue_checkpoint || kick) {
      {
        std::lock_guard bl(bg_mu_);
        if (queue_checkpoint) checkpoint_queue_.push_back(t);
        if (kick) batch_kick_ = true;
      }
      bg_cv_.notify_one();
    }
    return reached;
  }

  // ApplyEncodedDeltas(InPlace): every delta is decoded (in place) before
  // any is committed, to weigh its large values against the buffer's bytes.
  // A delta that does not decode ends the run there, as if it had been
  // reached: the ones before it are committed.
  Result<uint64_t> ApplyRun(std::span<const std::string_view> encoded, std::unique_ptr<char[]>* buffer,
                            size_t buffer_bytes) {
    if (encoded.empty()) return Status::InvalidArgument("no deltas to apply");
    std::vector<DeltaView> views;
    views.reserve(encoded.size());
    Status failed;
    uint64_t referable = 0;  // bytes of the values the tree could refer to in place
    for (std::string_view e : encoded) {
      auto view = DecodeDeltaView(e);
      if (!view.ok()) {
        failed = view.status();
        break;
      }
      for (const OpView& op : view->ops) {
        if (op.type == OpType::kPutAttribute && op.value.size() >= kReferencedValueBytes)
          referable += op.value.size();
      }
      views.push_back(std::move(*view));
    }
    NodeImagePtr owner;
    if (buffer != nullptr && *buffer && referable > 0 && referable * 2 >= buffer_bytes) {
      owner = NodeImage::OverBytes(std::move(*buffer), buffer_bytes);
    }
    std::shared_ptr<TreeState> t;
    uint64_t reached = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const DeltaView& view = views[i];
      if (!t || t->name != view.tree) {
        if (t) {
          failed = Status::InvalidArgument("a batch of deltas spans trees '" + t->name + "' and '" +
                                           std::string(view.tree) + "'");
          break;
        }
        auto found = FindTree(view.tree);
        if (!found.ok()) {
          failed = found.status();
          break;
        }
        t = *found;
      }
      auto applied = CommitEncoded(view, encoded[i], &t, /*sync=*/false, owner.get());
      if (!applied.ok()) {
        failed = applied.status();
        break;
      }
      reached = applied->version;
    }
    // Values no version kept (a failed run, or replaced within it): the
    // caller has its buffer back.
    if (owner) {
      if (auto back = NodeImage::TakeBackBytes(&owner)) *buffer = std::move(back);
    }
    if (t && reached != 0 && options_.fsync == FsyncPolicy::kAlways) {
      std::unique_lock lk(t->mu);
      CANOPY_RETURN_IF_ERROR(SyncLocked(lk, *t, reached, false));
    }
    if (!failed.ok()) return failed;
    return reached;
  }

  // ------------------------------------------------------------ WAL reads

  // Where a read of the deltas after a version starts, taken under t.mu:
  // the newest version and a copy of the WAL's segment list, or in_memory
  // when TreeState::recent holds the delta right after `version` (then
  // `read_recent`, if given, runs under the lock and the WAL is not read).
  struct WalView {
    uint64_t latest = 0;
    std::vector<WalSegment> segments;
    bool in_memory = false;
  };
  static WalView ViewWal(TreeState& t, uint64_t version, const std::function<void()>& read_recent) {
    std::lock_guard lk(t.mu);
    WalView view;
    view.latest = t.latest.number();
    if (version < view.latest && !t.recent.empty() && t.recent.front().first <= version + 1) {
      view.in_memory = true;
      if (read_recent) read_recent();
      return view;
    }
    view.segments = t.wal->segments();
    return view;
  }

  // Walks the WAL records of new versions version+1, version+2, ... in
  // order (`segments` and `latest` from ViewWal), handing each to take(its segment, the
  // record, the offset just past it in that file). Stops when take returns
  // false, at `latest`, where the records stop being consecutive, or, with
  // one_segment, at the end of the first segment. Each record is checked
  // (header, length, CRC) before it is handed on; the records before the
  // first one are passed over unread (ScanSegment's skip_through_version).
  // Ok with nothing taken when version == latest; NotFound when the WAL no
  // longer holds the delta right after `version`; InvalidArgument when
  // version > latest.
  Status WalkDeltasSince(TreeState& t, uint64_t version, uint64_t latest, const std::vector<WalSegment>& segments,
                         bool one_segment,
                         const std::function<bool(const WalSegment&, std::string_view, uint64_t)>& take) const {
    if (version > latest) {
      return Status::InvalidArgument(TreeLabel(t) + ": version " + std::to_string(version) +
                                     " is newer than the newest version " + std::to_string(latest));
    }
    if (version == latest) return Status::Ok();
    auto not_retained = [&] {
      return Status::NotFound(TreeLabel(t) + ": the WAL no longer holds the delta after version " +
                              std::to_string(version) + " (a snapshot is needed)");
    };
    size_t i = 0;
    while (i < segments.size() && segments[i].last_version <= version) ++i;
    if (i == segments.size() || segments[i].first_version > version + 1) return not_retained();
    uint64_t expected_base = version;
    bool taken_any = false;
    bool more = true;
    const Status stop = Status::Aborted("enough");
    std::string cursor_path;  // where the last record handed out ends
    uint64_t cursor_offset = 0;
    for (; i < segments.size(); ++i) {
      const WalSegment& seg = segments[i];
      if (seg.first_version > expected_base + 1) break;  // a gap: the rest is not contiguous
      // The first segment may be entered where an earlier read stopped.
      uint64_t start = taken_any ? 0 : t.FindCursor(expected_base, seg.path);
      Result<SegmentScan> scan = SegmentScan{};
      for (;;) {
        bool taken_here = false;
        uint64_t pos = 0;  // just past the record handed to the callback (ScanSegment sets it)
        scan = ScanSegment(
            seg.path, seg.bytes,
            [&](const Delta& d, std::string_view record) -> Status {
              if (d.new_version <= expected_base) return Status::Ok();
              if (d.base_version != expected_base) return stop;
              taken_here = taken_any = true;
              expected_base = d.new_version;
              cursor_path = seg.path;
              cursor_offset = pos;
              more = take(seg, record, pos);
              if (!more || expected_base >= latest) return stop;
              return Status::Ok();
            },
            start, /*headers_only=*/true, /*skip_through_version=*/expected_base, &pos);
        if (start == 0 || taken_here) break;
        start = 0;  // the cursor led nowhere (stale): read the segment whole
      }
      if (!scan.ok() && scan.status().code() != StatusCode::kAborted) {
        if (scan.status().IsNotFound()) return not_retained();  // segment deleted meanwhile
        return scan.status();
      }
      if (!scan.ok() || !more || expected_base >= latest || one_segment) break;
    }
    if (!taken_any) return not_retained();
    if (cursor_offset > 0) t.RememberCursor(expected_base, cursor_path, cursor_offset);
    return Status::Ok();
  }

  Result<std::vector<std::string>> ReadDeltasSince(std::string_view tree, uint64_t version,
                                                   size_t max_bytes) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::vector<std::string> out;
    size_t bytes = 0;
    const WalView view = ViewWal(*t, version, [&] {
      // Served from memory: the same records the WAL holds (TreeState::recent).
      for (auto it = t->recent.begin() + static_cast<std::ptrdiff_t>(version + 1 - t->recent.front().first);
           it != t->recent.end() && bytes < max_bytes; ++it) {
        out.push_back(it->second);
        bytes += it->second.size();
      }
    });
    if (view.in_memory) return out;
    CANOPY_RETURN_IF_ERROR(WalkDeltasSince(*t, version, view.latest, view.segments, /*one_segment=*/false,
                                           [&](const WalSegment&, std::string_view record, uint64_t) {
                                             out.emplace_back(record);
                                             bytes += record.size();
                                             return bytes < max_bytes;
                                           }));
    return out;
  }

  Result<std::optional<WalDeltaRange>> LocateDeltasSince(std::string_view tree, uint64_t version,
                                                         size_t max_bytes) const override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    const WalView view = ViewWal(*t, version, nullptr);
    if (view.in_memory) return std::optional<WalDeltaRange>();
    WalDeltaRange range;
    std::string path;
    CANOPY_RETURN_IF_ERROR(WalkDeltasSince(*t, version, view.latest, view.segments, /*one_segment=*/true,
                                           [&](const WalSegment& seg, std::string_view record, uint64_t end) {
                                             if (range.records == 0) {
                                               path = seg.path;
                                               range.offset = end - record.size();
                                               range.first_version = version + 1;
                                             }
                                             ++range.records;
                                             range.length = end - range.offset;
                                             return range.length < max_bytes;
                                           }));
    if (range.records == 0) return std::optional<WalDeltaRange>(std::move(range));  // version is the newest
    range.last_version = version + range.records;
    // The records were read by path; the descriptor must be that file. A
    // segment is only ever appended to, so its first record there still
    // names the first version unless the file was deleted (a truncation
    // after a checkpoint) or replaced since: then the caller reads the
    // deltas as copies, which sorts that case out as before.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return std::optional<WalDeltaRange>();
      return ErrnoStatus(errno, "open " + path);
    }
    char head[kDeltaPeekBytes];
    const ssize_t n = ::pread(fd.get(), head, sizeof head, static_cast<off_t>(range.offset));
    if (n < 0) return ErrnoStatus(errno, "read " + path);
    auto first = PeekDeltaHeader(std::string_view(head, static_cast<size_t>(n)));
    struct stat st {};
    if (!first.ok() || first->new_version != range.first_version || ::fstat(fd.get(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < range.offset + range.length) {
      return std::optional<WalDeltaRange>();
    }
    range.file = std::move(fd);
    return std::optional<WalDeltaRange>(std::move(range));
  }

  // ------------------------------------------------------------ maintenance

  Result<uint64_t> Checkpoint(std::string_view tree) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    return CheckpointTree(*t);
  }

  Result<Version> NewestCheckpoint(std::string_view tree) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard mlk(t->maintenance_mu);  // no checkpoint written, deleted or installed meanwhile
    uint64_t cv, generation;
    {
      std::lock_guard lk(t->mu);
      cv = t->checkpoint_version;
      generation = t->generation;
    }
    if (t->newest_checkpoint && t->newest_checkpoint->number() == cv &&
        t->newest_checkpoint_generation == generation) {
      return *t->newest_checkpoint;
    }
    t->newest_checkpoint.reset();
    std::string path = JoinPath(t->dir, CheckpointName(cv));
    if (::access(path.c_str(), F_OK) != 0) return Status::NotFound(TreeLabel(*t) + ": no checkpoint file");
    CANOPY_ASSIGN_OR_RETURN(Version v, LoadCheckpoint(path, t->name, cv));
    t->newest_checkpoint = v;
    t->newest_checkpoint_generation = generation;
    return v;
  }

  Status TruncateWalBefore(std::string_view tree, uint64_t version) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    std::lock_guard mlk(t->maintenance_mu);
    return TruncateLocked(*t, version);
  }

  Result<std::unique_ptr<SnapshotInstaller>> BeginSnapshotInstall(std::string_view tree) override {
    CANOPY_RETURN_IF_ERROR(ValidateTreeName(tree));
    std::string dir = JoinPath(
        tmp_dir_, "install-" + std::to_string(::getpid()) + "-" + std::to_string(tmp_counter_.fetch_add(1)));
    if (::mkdir(dir.c_str(), 0755) != 0) return ErrnoStatus(errno, "mkdir " + dir);
    return std::unique_ptr<SnapshotInstaller>(std::make_unique<InstallerImpl>(this, std::string(tree), dir));
  }

  Result<CheckpointFile> OpenNewestCheckpointFile(std::string_view tree) override {
    CANOPY_ASSIGN_OR_RETURN(auto t, FindTree(tree));
    // Opened under maintenance_mu (no checkpoint written, deleted or
    // installed meanwhile), so the descriptor is the file NewestCheckpoint
    // checked; it stays readable if the file is deleted later.
    CANOPY_ASSIGN_OR_RETURN(Version v, NewestCheckpoint(tree));
    std::lock_guard mlk(t->maintenance_mu);
    uint64_t cv = 0, wal_bytes_after = 0;
    {
      std::lock_guard lk(t->mu);
      cv = t->checkpoint_version;
      wal_bytes_after = t->wal_bytes_since_checkpoint;
    }
    if (cv != v.number()) return Status::Unavailable(TreeLabel(*t) + ": a newer checkpoint is being written");
    std::string path = JoinPath(t->dir, CheckpointName(cv));
    CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat " + path);
    CheckpointFile f;
    f.info = CheckpointFileInfo{cv, static_cast<uint64_t>(st.st_size), v.Digest()};
    f.wal_bytes_after = wal_bytes_after;
    f.fd = std::move(fd);
    return f;
  }

  Result<PartialFile> PartialCheckpointFile(std::string_view tree) const override {
    CANOPY_RETURN_IF_ERROR(ValidateTreeName(tree));
    std::string tree_partial = JoinPath(partial_dir_, tree);
    if (!PathExists(tree_partial)) return Status::NotFound("no partial checkpoint file of tree '" + std::string(tree) + "'");
    CANOPY_ASSIGN_OR_RETURN(auto names, ListDir(tree_partial));
    for (const auto& name : names) {
      PartialFile p;
      if (!ParsePartialName(name, &p.info)) continue;
      auto size = FileSize(JoinPath(tree_partial, name));
      if (!size.ok() || *size == 0 || *size > p.info.bytes) continue;
      p.held = *size;
      return p;
    }
    return Status::NotFound("no partial checkpoint file of tree '" + std::string(tree) + "'");
  }

  static std::string PartialName(const CheckpointFileInfo& f) {
    return fmt::format("{}-{}-{:016x}", f.version, f.bytes, f.digest);
  }
  static bool ParsePartialName(const std::string& name, CheckpointFileInfo* f) {
    unsigned long long v = 0, b = 0, d = 0;
    int end = 0;
    if (std::sscanf(name.c_str(), "%llu-%llu-%16llx%n", &v, &b, &d, &end) != 3) return false;
    if (static_cast<size_t>(end) != name.size()) return false;
    *f = CheckpointFileInfo{v, b, d};
    return PartialName(*f) == name;
  }

  Result<std::unique_ptr<SnapshotFileInstaller>> BeginSnapshotFileInstall(std::string_view tree,
                                                                          const CheckpointFileInfo& file,
                                                                          uint64_t offset) override {
    CANOPY_RETURN_IF_ERROR(ValidateTreeName(tree));
    const std::string label = "checkpoint file of tree '" + std::string(tree) + "' at version " +
                              std::to_string(file.version);
    // Everything announced is checked before anything is created.
    if (file.bytes > options_.max_install_file_bytes) {
      return Status::ResourceExhausted(fmt::format("{} announced as {} bytes: refused, over the limit of {} bytes "
                                                   "(--max-snapshot-bytes)",
                                                   label, file.bytes, options_.max_install_file_bytes));
    }
    if (file.bytes < 2 * kChunkOverheadBytes) {
      return Status::Corruption(fmt::format("{} announced as {} bytes: too short to be a checkpoint", label,
                                            file.bytes));
    }
    std::string tree_partial = JoinPath(partial_dir_, tree);
    std::string name = PartialName(file);
    std::string path = JoinPath(tree_partial, name);
    uint64_t held = 0;
    if (offset > 0) {
      if (auto size = FileSize(path); size.ok()) held = *size;
      if (held != offset) {
        (void)RemoveFile(path);
        return Status::InvalidArgument(fmt::format("{}: the sender resumes at byte {}, but {} bytes are held here",
                                                   label, offset, held));
      }
    }
    struct statvfs fs {};
    if (::statvfs(dir_.c_str(), &fs) == 0) {
      uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (file.bytes - held > free_bytes) {
        return Status::ResourceExhausted(fmt::format("{} announced as {} bytes: refused, only {} bytes free in {}",
                                                     label, file.bytes, free_bytes, dir_));
      }
    }
    // One partial file per tree: any other (an older checkpoint) goes.
    CANOPY_RETURN_IF_ERROR(CreateDirs(tree_partial));
    CANOPY_ASSIGN_OR_RETURN(auto others, ListDir(tree_partial));
    for (const auto& other : others) {
      if (other != name) CANOPY_RETURN_IF_ERROR(RemoveFile(JoinPath(tree_partial, other)));
    }
    if (offset == 0) CANOPY_RETURN_IF_ERROR(RemoveFile(path));
    auto installer = std::make_unique<FileInstallerImpl>(this, std::string(tree), file, path);
    CANOPY_RETURN_IF_ERROR(installer->Open(offset));
    return std::unique_ptr<SnapshotFileInstaller>(std::move(installer));
  }

  // A fresh private directory under <store>/tmp for an install.
  Result<std::string> NewInstallDir() {
    std::string dir = JoinPath(
        tmp_dir_, "install-" + std::to_string(::getpid()) + "-" + std::to_string(tmp_counter_.fetch_add(1)));
    if (::mkdir(dir.c_str(), 0755) != 0) return ErrnoStatus(errno, "mkdir " + dir);
    return dir;
  }

  // Moves the finished install directory into place as tree `name` at version `v`.
  Status PublishInstall(const std::string& name, const std::string& install_dir, const Version& v) {
    std::string tree_dir = JoinPath(trees_dir_, name);
    Version installed(name, v.number(), v.root());
    std::shared_ptr<TreeState> t;
    {
      std::unique_lock lk(trees_mu_);
      auto it = trees_.find(name);
      if (it == trees_.end()) {
        CANOPY_RETURN_IF_ERROR(RenameFile(install_dir, tree_dir));
        CANOPY_RETURN_IF_ERROR(FsyncDir(trees_dir_));
        auto state = NewTreeState(name, installed);
        state->checkpoint_version = v.number();
        state->checkpoint_file_bytes = FileSize(JoinPath(tree_dir, CheckpointName(v.number()))).value_or(0);
        trees_.emplace(name, std::move(state));
        return Status::Ok();
      }
      t = it->second;
    }
    std::deque<RetainedVersion> old_history;  // freed after t->mu is released
    std::lock_guard mlk(t->maintenance_mu);
    std::unique_lock lk(t->mu);
    t->wal->CloseActive();
    if (::renameat2(AT_FDCWD, install_dir.c_str(), AT_FDCWD, tree_dir.c_str(), RENAME_EXCHANGE) != 0) {
      return ErrnoStatus(errno, "exchange " + install_dir + " with " + tree_dir);
    }
    // From here on the tree directory holds the snapshot; the old one is in install_dir.
    ++t->generation;
    t->wal = std::make_unique<WalWriter>(t->dir, options_.wal_segment_bytes, SyncsFiles());
    // The history before the snapshot went with the old directory.
    old_history.swap(t->history);
    t->requests.Clear();
    t->ForgetRecentLocked(UINT64_MAX);
    t->latest = installed;
    t->synced = v.number();
    t->unsynced_bytes = 0;
    t->failed = Status::Ok();
    t->checkpoint_version = v.number();
    t->commits_since_checkpoint = 0;
    t->wal_bytes_since_checkpoint = 0;
    t->checkpoint_file_bytes = FileSize(JoinPath(tree_dir, CheckpointName(v.number()))).value_or(0);
    t->sync_cv.notify_all();
    lk.unlock();
    Status s = FsyncDir(trees_dir_);
    Status r = RemoveTree(install_dir);
    if (!r.ok())
      CANOPY_LOG(kWarn, "{}: could not remove the replaced state: {}", TreeLabel(*t), r.ToString());
    return s;
  }

  Status SyncAll() override {
    std::vector<std::shared_ptr<TreeState>> all;
    {
      std::shared_lock lk(trees_mu_);
      for (const auto& [n, t] : trees_) all.push_back(t);
    }
    Status first;
    for (const auto& t : all) {
      std::unique_lock lk(t->mu);
      Status s = SyncLocked(lk, *t, t->latest.number(), /*force=*/true);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  const std::string& dir() const override { return dir_; }
  const StoreOptions& options() const override { return options_; }

  const std::string& tmp_dir() const { return tmp_dir_; }
  const std::string& partial_dir() const { return partial_dir_; }

 private:
  bool SyncsFiles() const { return options_.fsync != FsyncPolicy::kNone; }

  // OK if version `number` of `t` is retained; else NotFound naming the window.
  // REQUIRES: t.mu held.
  static Status CheckRetainedLocked(const TreeState& t, uint64_t number) {
    const uint64_t oldest = t.OldestRetainedLocked(), newest = t.latest.number();
    if (number >= oldest && number <= newest) return Status::Ok();
    std::string held = oldest == newest ? "only version " + std::to_string(newest) + " is held"
                                        : "versions " + std::to_string(oldest) + ".." + std::to_string(newest) +
                                              " are held";
    if (number < oldest) {
      return Status::NotFound(TreeLabel(t) + ": version " + std::to_string(number) +
                              " is no longer held (past the retention; the oldest version held is " +
                              std::to_string(oldest) + ", " + held + ")");
    }
    return Status::NotFound(TreeLabel(t) + ": version " + std::to_string(number) +
                            " is not held yet (the newest version is " + std::to_string(newest) + ", " + held + ")");
  }

  // Drops the versions of `t` that no retention rule keeps any more.
  void PruneTree(TreeState& t) {
    std::vector<Version> dropped;
    std::lock_guard lk(t.mu);
    PruneHistory(t.history, t.latest.number(), t.pins->Oldest(), options_.retention,
                 std::chrono::steady_clock::now(), &dropped);
  }

  // The newest checkpoint file of `t` at or before the oldest retained
  // version: the base Open rebuilds the retained window from (0, the empty
  // tree, when there is none). REQUIRES: t.maintenance_mu held.
  uint64_t RetentionBaseCheckpoint(TreeState& t) {
    uint64_t floor;
    {
      std::lock_guard lk(t.mu);
      floor = t.OldestRetainedLocked();
    }
    uint64_t base = 0;
    auto names = ListDir(t.dir);
    if (!names.ok()) return 0;
    for (const auto& n : *names) {
      uint64_t cv;
      if (ParseCheckpointName(n, &cv) && cv <= floor) base = std::max(base, cv);
    }
    return base;
  }

  std::shared_ptr<TreeState> NewTreeState(const std::string& name, Version v) {
    auto t = std::make_shared<TreeState>(name, JoinPath(trees_dir_, name));
    t->synced = v.number();
    t->latest = std::move(v);
    t->wal = std::make_unique<WalWriter>(t->dir, options_.wal_segment_bytes, SyncsFiles());
    return t;
  }

  Result<std::shared_ptr<TreeState>> FindTree(std::string_view name) const {
    std::shared_lock lk(trees_mu_);
    auto it = trees_.find(name);
    if (it == trees_.end()) return Status::NotFound("no tree '" + std::string(name) + "' in store " + dir_);
    return it->second;
  }

  enum class CommitMode {
    kClient,          // a new commit on delta.base_version (Conflict if stale); duplicates detected
    kClientOnLatest,  // a new commit on the newest version, which must be delta.base_version unless that
                      // is 0 (the versions are set here); duplicates detected
    kReplicated,      // a delta made elsewhere (replica, recovery): applied as it is
  };

  // Under kAlways returns once the commit is synced, unless `sync` is false
  // (the caller syncs a batch once).
  Result<CommitResult> CommitDelta(TreeState& t, Delta& delta, const NodePtr& base_root, NodePtr new_root,
                                   std::string_view encoded, CommitMode mode, bool sync = true) {
    std::vector<Version> dropped;  // versions leaving the retained window; freed after t.mu is released
    std::unique_lock lk(t.mu);
    if (!t.failed.ok()) return t.failed;
    if (mode != CommitMode::kReplicated && !delta.request.empty()) {
      if (uint64_t earlier = t.requests.Find(delta.request); earlier != 0) {
        if (options_.fsync == FsyncPolicy::kAlways) CANOPY_RETURN_IF_ERROR(SyncLocked(lk, t, earlier, false));
        return CommitResult{earlier, "", true};
      }
    }
    if (mode == CommitMode::kClientOnLatest) {
      if (delta.base_version != 0 && delta.base_version != t.latest.number()) {
        return Status::Conflict(TreeLabel(t) + ": base version " + std::to_string(delta.base_version) +
                                " is stale: the newest version is " + std::to_string(t.latest.number()));
      }
      delta.base_version = t.latest.number();
      delta.new_version = delta.base_version + 1;
    }
    if (delta.base_version != t.latest.number() || (base_root && base_root != t.latest.root())) {
      return Status::Conflict(TreeLabel(t) + ": commit is based on version " +
                              std::to_string(delta.base_version) + " but the newest version is " +
                              std::to_string(t.latest.number()));
    }
    if (!new_root) {
      auto applied = ApplyOps(t.latest.root(), delta.ops);
      if (!applied.ok()) {
        return applied.status().WithContext(TreeLabel(t) + ": delta to version " +
                                            std::to_string(delta.new_version) + " does not apply");
      }
      new_root = std::move(*applied);
    }
    std::string owned;
    if (encoded.empty()) {
      owned = EncodeDelta(delta);
      encoded = owned;
    }
    bool broken = false;
    Status s = t.wal->Append(encoded, delta.new_version, SyncsFiles(), &broken);
    if (!s.ok()) {
      if (broken) {
        t.failed = Status::IOError(TreeLabel(t) + ": WAL state in doubt after a failed write or sync (" +
                                   s.message() + "); the tree is read-only until the store is reopened");
      }
      return s.WithContext(TreeLabel(t) + ": commit of version " + std::to_string(delta.new_version) +
                           " failed, the tree stays at version " + std::to_string(t.latest.number()));
    }
    uint64_t v = delta.new_version;
    PublishLocked(t, v, encoded, delta.request, std::move(new_root), &dropped);
    const bool queue_checkpoint = t.CheckpointDueLocked(options_);
    // A caller that passed the encoded bytes in has them (ApplyEncodedDelta):
    // copying a MiB-sized delta back out for nothing cost as much as logging it.
    CommitResult result{v, std::move(owned)};
    if (options_.fsync == FsyncPolicy::kAlways && sync) {
      Status ds = SyncLocked(lk, t, v, false);
      if (!ds.ok()) return ds;
    }
    bool kick = options_.fsync == FsyncPolicy::kBatch && t.unsynced_bytes >= options_.batch_bytes;
    lk.unlock();
    if (queue_checkpoint || kick) {
      std::shared_ptr<TreeState> self;
      if (queue_checkpoint) {
        auto found = FindTree(t.name);
        if (found.ok()) self = *found;
      }
      {
        std::lock_guard bl(bg_mu_);
        if (self) checkpoint_queue_.push_back(std::move(self));
        if (kick) batch_kick_ = true;
      }
      bg_cv_.notify_one();
    }
    return result;
  }

  // Makes `root` version v, the newest (its record `encoded` is in the WAL
  // now): the bookkeeping of every commit. Versions leaving the retained
  // window go to *dropped, to be freed once t.mu is released.
  // REQUIRES: t.mu held; v == latest + 1.
  void PublishLocked(TreeState& t, uint64_t v, std::string_view encoded, const RequestId& request,
                     NodePtr root, std::vector<Version>* dropped) {
    t.RememberRecentLocked(v, encoded);
    t.requests.Record(request, v);
    const SteadyTime now = std::chrono::steady_clock::now();
    t.history.push_back(RetainedVersion{std::move(t.latest), now});
    t.latest = Version(t.name, v, std::move(root));
    PruneHistory(t.history, v, t.pins->Oldest(), options_.retention, now, dropped);
    t.unsynced_bytes += encoded.size();
    if (options_.fsync == FsyncPolicy::kNone) t.synced = v;
    ++t.commits_since_checkpoint;
    t.wal_bytes_since_checkpoint += encoded.size();
  }

  // Waits until version `v` is synced, syncing itself if no one else is
  // (group commit: one fdatasync covers every record written before it).
  // REQUIRES: lk holds t.mu.
  Status SyncLocked(std::unique_lock<std::mutex>& lk, TreeState& t, uint64_t v, bool force) {
    const uint64_t gen = t.generation;
    if (!force && options_.fsync == FsyncPolicy::kNone) return Status::Ok();
    bool forced_done = false;
    while (t.synced < v || (force && !forced_done)) {
      if (!t.failed.ok()) return t.failed;
      if (t.generation != gen) {
        return Status::Aborted(TreeLabel(t) +
                               " was replaced by a snapshot install before the commit was synced");
      }
      if (t.sync_running) {
        t.sync_cv.wait(lk);
        continue;
      }
      t.sync_running = true;
      uint64_t target = t.latest.number();
      uint64_t bytes = t.unsynced_bytes;
      std::shared_ptr<UniqueFd> fd = t.wal->active_fd();
      lk.unlock();
      Status s = fd ? SyncData(fd->get(), t.dir + " WAL") : Status::Ok();
      lk.lock();
      t.sync_running = false;
      forced_done = true;
      if (t.generation == gen) {
        if (s.ok()) {
          t.synced = std::max(t.synced, target);
          t.unsynced_bytes -= std::min(t.unsynced_bytes, bytes);
        } else {
          t.failed = Status::IOError(TreeLabel(t) + ": WAL sync failed (" + s.ToString() +
                                     "); the tree is read-only until the store is reopened");
        }
      }
      t.sync_cv.notify_all();
    }
    return Status::Ok();
  }

  Result<uint64_t> CheckpointTree(TreeState& t) {
    std::lock_guard mlk(t.maintenance_mu);
    Version v;
    uint64_t wal_bytes_upto_v = 0;  // of the records up to v since the last checkpoint
    uint64_t generation = 0;
    {
      std::lock_guard lk(t.mu);
      t.checkpoint_queued = false;
      // After a failed sync the newest versions are in doubt; do not make them durable.
      if (!t.failed.ok()) return t.failed;
      v = t.latest;
      wal_bytes_upto_v = t.wal_bytes_since_checkpoint;
      generation = t.generation;
    }
    std::string path = JoinPath(t.dir, CheckpointName(v.number()));
    Status s = WriteCheckpointFile(path, v, options_.snapshot_chunk_bytes);
    if (!s.ok()) return s.WithContext(TreeLabel(t) + ": checkpoint at version " + std::to_string(v.number()));
    const uint64_t file_bytes = FileSize(path).value_or(0);
    uint64_t floor;
    {
      std::lock_guard lk(t.mu);
      if (v.number() >= t.checkpoint_version && t.generation == generation) {
        t.checkpoint_file_bytes = file_bytes;
        t.wal_bytes_since_checkpoint -= std::min(t.wal_bytes_since_checkpoint, wal_bytes_upto_v);
      }
      t.checkpoint_version = std::max(t.checkpoint_version, v.number());
      uint64_t since = t.latest.number() - v.number();
      t.commits_since_checkpoint = std::min(t.commits_since_checkpoint, since);
      floor = t.OldestRetainedLocked();
    }
    // Keep the newest two checkpoints (the older one is a fallback should the
    // newest be damaged), the newest one at or before the oldest retained
    // version (the base Open rebuilds the retained window from) and the
    // oldest one after it (the next base, once the window moves past it).
    // Everything else goes: at most four files.
    auto names = ListDir(t.dir);
    if (names.ok()) {
      std::vector<uint64_t> versions;
      for (const auto& n : *names) {
        uint64_t cv;
        if (ParseCheckpointName(n, &cv) && cv <= v.number()) versions.push_back(cv);
      }
      std::sort(versions.rbegin(), versions.rend());
      size_t base = versions.size(), next_base = versions.size();
      for (size_t i = 0; i < versions.size(); ++i) {
        if (versions[i] <= floor) {
          base = i;
          break;
        }
        next_base = i;
      }
      for (size_t i = 2; i < versions.size(); ++i) {
        if (i != base && i != next_base) (void)RemoveFile(JoinPath(t.dir, CheckpointName(versions[i])));
      }
    }
    return v.number();
  }

  // REQUIRES: t.maintenance_mu held.
  Status TruncateLocked(TreeState& t, uint64_t version) {
    // The deltas after the retention base checkpoint rebuild the retained window on restart.
    const uint64_t base = RetentionBaseCheckpoint(t);
    std::lock_guard lk(t.mu);
    uint64_t limit = std::min({version, t.checkpoint_version, base});
    auto& segs = t.wal->segments();
    size_t drop = 0;
    while (drop < segs.size() && segs[drop].last_version <= limit) ++drop;
    if (drop == 0) return Status::Ok();
    if (drop == segs.size() && t.wal->active_fd()) t.wal->CloseActive();
    Status first;
    size_t removed = 0;
    for (; removed < drop; ++removed) {
      Status s = RemoveFile(segs[removed].path);
      if (!s.ok()) {
        first = s;
        break;
      }
    }
    if (removed > 0) t.ForgetRecentLocked(segs[removed - 1].last_version);
    segs.erase(segs.begin(), segs.begin() + static_cast<std::ptrdiff_t>(removed));
    return first;
  }

  // Recovers tree `name`: its newest version and the retained window before
  // it, from a checkpoint at or before the window's oldest version plus a
  // replay of the WAL (tree/README.md, Recovery).
  Result<std::shared_ptr<TreeState>> RecoverTree(const std::string& name) {
    std::string dir = JoinPath(trees_dir_, name);
    CANOPY_ASSIGN_OR_RETURN(auto files, ListDir(dir));
    std::vector<uint64_t> checkpoints, segment_firsts;
    for (const auto& f : files) {
      uint64_t v;
      if (EndsWith(f, ".tmp")) {
        CANOPY_RETURN_IF_ERROR(RemoveFile(JoinPath(dir, f)));
      } else if (ParseCheckpointName(f, &v)) {
        checkpoints.push_back(v);
      } else if (ParseWalSegmentName(f, &v)) {
        segment_firsts.push_back(v);
      }
    }
    std::sort(checkpoints.begin(), checkpoints.end());
    std::sort(segment_firsts.begin(), segment_firsts.end());

    // When each segment was last written: no earlier than the versions its
    // records replaced stopped being the newest (the keep_for rule's clock).
    const SteadyTime steady_now = std::chrono::steady_clock::now();
    const auto system_now = std::chrono::system_clock::now();
    std::vector<SteadyTime> segment_written;
    std::vector<std::pair<RequestId, uint64_t>> replayed_requests;  // request ids in the WAL, in order
    std::vector<std::pair<uint64_t, uint64_t>> replayed_record_bytes;  // (new version, record bytes) applied
    for (uint64_t first : segment_firsts) {
      SteadyTime when = steady_now;
      struct stat st {};
      if (::stat(JoinPath(dir, WalSegmentName(first)).c_str(), &st) == 0) {
        auto mtime = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
        if (mtime < system_now) {
          when = steady_now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(system_now - mtime);
        }
      }
      segment_written.push_back(when);
    }

    // The oldest version the retention wants back, estimated from the file
    // names so that it is never newer than the real one.
    const RetentionPolicy& policy = options_.retention;
    const uint64_t keep = std::max<uint64_t>(policy.keep_versions, 1);
    uint64_t newest_named = checkpoints.empty() ? 0 : checkpoints.back();
    if (!segment_firsts.empty()) newest_named = std::max(newest_named, segment_firsts.back() - 1);
    uint64_t want_from = newest_named + 1 > keep ? newest_named + 1 - keep : 0;
    if (policy.keep_for.count() > 0) {
      for (size_t i = 0; i < segment_firsts.size(); ++i) {
        if (steady_now - segment_written[i] < policy.keep_for) {
          want_from = std::min(want_from, segment_firsts[i] - 1);
          break;
        }
      }
    }

    // Where to start: 0 (the empty tree) or a checkpoint the WAL continues
    // from; the newest such at or before want_from, else the oldest after it.
    // The newest checkpoint needs no WAL before it.
    const uint64_t newest_checkpoint = checkpoints.empty() ? 0 : checkpoints.back();
    auto wal_continues_from = [&](uint64_t c) {
      return c == newest_checkpoint || (!segment_firsts.empty() && segment_firsts.front() <= c + 1);
    };
    std::vector<uint64_t> bases;  // in the order to try them
    {
      std::vector<uint64_t> all = checkpoints;
      if (all.empty() || all.front() != 0) all.insert(all.begin(), 0);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        if (*it <= want_from && wal_continues_from(*it)) bases.push_back(*it);
      }
      for (uint64_t c : all) {
        if (c > want_from && wal_continues_from(c)) bases.push_back(c);
      }
    }
    std::set<uint64_t> unreadable;
    auto load = [&](uint64_t cv) -> Result<Version> {
      if (cv == 0 && !std::binary_search(checkpoints.begin(), checkpoints.end(), 0)) {
        return Version(name, 0, Node::Empty());
      }
      auto loaded = LoadCheckpoint(JoinPath(dir, CheckpointName(cv)), name, cv);
      if (!loaded.ok()) {
        unreadable.insert(cv);
        CANOPY_LOG(kWarn, "tree '{}': skipping unreadable checkpoint: {}", name, loaded.status().ToString());
      }
      return loaded;
    };

    uint64_t version = 0;
    uint64_t checkpoint_version = 0;  // newest checkpoint read and verified
    std::optional<Version> checkpoint_read;  // that checkpoint, as opened in place
    NodePtr root = Node::Empty();
    for (uint64_t cv : bases) {
      auto loaded = load(cv);
      if (loaded.ok()) {
        version = cv;
        root = loaded->root();
        checkpoint_version = cv;
        if (cv > 0) checkpoint_read = *loaded;
        break;
      }
    }
    std::deque<RetainedVersion> history;
    // Moves on to the newest readable checkpoint newer than `version` and at
    // least `at_least` (the WAL has a gap, or ends, before it); the history
    // replayed so far is dropped, as it would not be contiguous.
    auto jump_to_checkpoint = [&](uint64_t at_least) {
      for (auto it = checkpoints.rbegin(); it != checkpoints.rend() && *it > version && *it >= at_least; ++it) {
        if (unreadable.count(*it)) continue;
        auto loaded = load(*it);
        if (!loaded.ok()) continue;
        CANOPY_LOG(kInfo, "tree '{}': the WAL does not continue from version {}; going on from checkpoint {}", name,
                   version, *it);
        version = *it;
        root = loaded->root();
        checkpoint_version = *it;
        checkpoint_read = *loaded;
        history.clear();
        return true;
      }
      return false;
    };

    std::vector<WalSegment> segments;
    for (size_t i = 0; i < segment_firsts.size(); ++i) {
      WalSegment seg;
      seg.path = JoinPath(dir, WalSegmentName(segment_firsts[i]));
      bool any = false;
      // Large values replayed from this segment stay in the file: the
      // versions that hold them point into a read-only mapping of it, as a
      // received WAL run's do (CommitWalRun), instead of into fresh copies.
      const NodeImagePtr mapping = MapWalSegment(seg.path);
      uint64_t record_end = 0;  // file offset just past the record being replayed
      auto scan = ScanSegment(
          seg.path, UINT64_MAX,
          [&](const Delta& d, std::string_view record) -> Status {
            if (d.tree != name || d.new_version != d.base_version + 1 ||
                (any && d.base_version != seg.last_version)) {
              return Status::Corruption(seg.path + ": record for tree '" + d.tree + "' " +
                                        std::to_string(d.base_version) + " -> " +
                                        std::to_string(d.new_version) + " does not belong here");
            }
            if (!any) seg.first_version = d.new_version;
            any = true;
            seg.last_version = d.new_version;
            if (!d.request.empty()) replayed_requests.emplace_back(d.request, d.new_version);
            if (d.new_version <= version) return Status::Ok();  // already in the base
            if (d.base_version != version) {
              const uint64_t reached = version;
              if (!jump_to_checkpoint(d.base_version) ||
                  (d.new_version > version && d.base_version != version)) {
                return Status::Corruption("tree '" + name + "': WAL gap: recovered up to version " +
                                          std::to_string(reached) + ", but the next record in " + seg.path +
                                          " is based on version " + std::to_string(d.base_version));
              }
              if (d.new_version <= version) return Status::Ok();
            }
            auto applied = ReplayInPlace(d, record, record_end, mapping)
                               ? ApplyMapped(root, record, record_end, mapping)
                               : ApplyOps(root, d.ops);
            if (!applied.ok()) {
              return Status::Corruption(seg.path + ": delta to version " + std::to_string(d.new_version) +
                                        " does not apply: " + applied.status().message());
            }
            replayed_record_bytes.emplace_back(d.new_version, record.size());
            history.push_back(RetainedVersion{Version(name, version, std::move(root)), segment_written[i]});
            root = std::move(*applied);
            version = d.new_version;
            PruneHistory(history, version, std::numeric_limits<uint64_t>::max(), policy, steady_now, nullptr);
            return Status::Ok();
          },
          /*start_offset=*/0, /*headers_only=*/false, /*skip_through_version=*/0, &record_end);
      if (!scan.ok()) return scan.status();
      CANOPY_ASSIGN_OR_RETURN(uint64_t size, FileSize(seg.path));
      if (scan->torn) {
        CANOPY_LOG(kWarn, "tree '{}': cutting the WAL tail of {} at offset {} ({}; {} bytes dropped)", name,
                   seg.path, scan->valid_bytes, scan->torn_reason, size - scan->valid_bytes);
        if (::truncate(seg.path.c_str(), static_cast<off_t>(scan->valid_bytes)) != 0) {
          return ErrnoStatus(errno, "truncate " + seg.path);
        }
      }
      if (!any) {
        CANOPY_RETURN_IF_ERROR(RemoveFile(seg.path));
        continue;
      }
      seg.bytes = scan->valid_bytes;
      segments.push_back(std::move(seg));
    }
    // The WAL ended before the newest checkpoint (its tail was lost in a crash).
    if (newest_checkpoint > version) (void)jump_to_checkpoint(0);
    if (SyncsFiles()) CANOPY_RETURN_IF_ERROR(FsyncDir(dir));
    // The newest checkpoint of the recovered history: what NewestCheckpoint
    // answers (and a leader sends a joiner), though recovery may have started
    // from an older one (the base of the retained window). It is checked
    // when first opened.
    uint64_t newest_at_or_before = checkpoint_version;
    for (uint64_t cv : checkpoints) {
      if (cv <= version && !unreadable.count(cv)) newest_at_or_before = std::max(newest_at_or_before, cv);
    }
    auto t = NewTreeState(name, Version(name, version, root));
    for (const auto& [id, v] : replayed_requests) {
      if (v <= version) t->requests.Record(id, v);
    }
    t->checkpoint_version = newest_at_or_before;
    // Recovery read and checked that file already: NewestCheckpoint answers
    // from it, so the first joiner after a restart does not wait for the
    // file to be read and checked again.
    if (checkpoint_read && checkpoint_read->number() == newest_at_or_before) {
      t->newest_checkpoint = std::move(checkpoint_read);
      t->newest_checkpoint_generation = t->generation;
    }
    t->commits_since_checkpoint = version - newest_at_or_before;
    for (const auto& [v, bytes] : replayed_record_bytes) {
      if (v > newest_at_or_before && v <= version) t->wal_bytes_since_checkpoint += bytes;
    }
    if (newest_at_or_before > 0) {
      t->checkpoint_file_bytes = FileSize(JoinPath(dir, CheckpointName(newest_at_or_before))).value_or(0);
    }
    t->wal->segments() = std::move(segments);
    t->history = std::move(history);
    return t;
  }

  void BackgroundLoop() {
    SteadyTime last_prune{};
    const auto idle = options_.fsync == FsyncPolicy::kBatch
                          ? std::max(options_.batch_interval, std::chrono::milliseconds(1))
                          : std::chrono::milliseconds(1000);
    // First, the newest checkpoints recovery did not read (Init), one at a
    // time, stopping early when the store closes. NewestCheckpoint caches
    // what it checked; a caller that wants one meanwhile waits on the same
    // maintenance_mu and finds it cached, or checks it itself first.
    std::deque<std::shared_ptr<TreeState>> verify;
    {
      std::lock_guard lk(bg_mu_);
      verify.swap(verify_queue_);
    }
    for (const auto& t : verify) {
      {
        std::lock_guard lk(bg_mu_);
        if (stop_) return;
      }
      auto v = NewestCheckpoint(t->name);
      if (!v.ok() && !v.status().IsNotFound()) {  // NotFound: the tree, or its file, is gone since
        CANOPY_LOG(kWarn, "{}: newest checkpoint: {}", TreeLabel(*t), v.status().ToString());
      }
    }
    verify.clear();
    for (;;) {
      std::deque<std::shared_ptr<TreeState>> queue;
      {
        std::unique_lock lk(bg_mu_);
        bg_cv_.wait_for(lk, idle, [&] { return stop_ || !checkpoint_queue_.empty() || batch_kick_; });
        if (stop_) return;
        queue.swap(checkpoint_queue_);
        batch_kick_ = false;
      }
      std::vector<std::shared_ptr<TreeState>> all;
      {
        std::shared_lock lk(trees_mu_);
        for (const auto& [n, t] : trees_) all.push_back(t);
      }
      // Versions kept by time, or by a pin since released, leave the window
      // here too (at most once a second: commits prune as well).
      const auto now = std::chrono::steady_clock::now();
      if (now - last_prune >= std::chrono::seconds(1)) {
        last_prune = now;
        for (const auto& t : all) PruneTree(*t);
      }
      if (options_.fsync == FsyncPolicy::kBatch) {
        for (const auto& t : all) {
          std::unique_lock lk(t->mu);
          if (t->synced >= t->latest.number() || !t->failed.ok()) continue;
          Status s = SyncLocked(lk, *t, t->latest.number(), false);
          if (!s.ok()) CANOPY_LOG(kError, "{}", s.ToString());
        }
      }
      for (const auto& t : queue) {
        auto v = CheckpointTree(*t);
        if (!v.ok()) {
          CANOPY_LOG(kWarn, "{}", v.status().ToString());
          continue;
        }
        std::lock_guard mlk(t->maintenance_mu);
        uint64_t keep_from = *v > options_.wal_retain_versions ? *v - options_.wal_retain_versions : 0;
        Status s = TruncateLocked(*t, keep_from);
        if (!s.ok()) CANOPY_LOG(kWarn, "{}: WAL truncation: {}", TreeLabel(*t), s.ToString());
      }
    }
  }

  const std::string dir_;
  const std::string trees_dir_;
  const std::string tmp_dir_;
  const std::string partial_dir_;  // SnapshotFileInstaller's files, kept for a resume
  const StoreOptions options_;
  UniqueFd lock_fd_;
  std::atomic<uint64_t> tmp_counter_{0};

  mutable std::shared_mutex trees_mu_;
  std::map<std::string, std::shared_ptr<TreeState>, std::less<>> trees_;

  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  bool stop_ = false;
  bool batch_kick_ = false;
  std::deque<std::shared_ptr<TreeState>> checkpoint_queue_;
  std::deque<std::shared_ptr<TreeState>> verify_queue_;  // filled by Init, emptied by BackgroundLoop
  std::thread bg_thread_;
};

Status InstallerImpl::AddChunk(std::string_view chunk) {
  if (!error_.ok()) return error_;
  if (finished_) return error_ = Status::InvalidArgument("snapshot install already finished");
  bool had_begun = reader_.begun();
  Status s = reader_.AddChunk(chunk);
  if (s.ok() && !had_begun && reader_.begun()) {
    if (reader_.tree() != tree_) {
      s = Status::InvalidArgument("snapshot is of tree '" + reader_.tree() + "', not '" + tree_ + "'");
    } else {
      path_ = JoinPath(dir_, CheckpointName(reader_.version()));
      auto fd = OpenFile(path_, O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd.ok()) {
        file_ = std::move(*fd);
      } else {
        s = fd.status();
      }
    }
  }
  if (s.ok()) s = WriteAll(file_.get(), chunk.data(), chunk.size(), path_);
  if (s.ok()) written_ += chunk.size();
  if (s.ok() && store_->options().install_fsync_each_chunk) {
    s = FsyncFd(file_.get(), path_);
  } else if (s.ok()) {
    s = WriteBackLanded(file_.get(), written_, &written_back_, path_);
  }
  if (!s.ok()) error_ = s.WithContext("installing a snapshot of tree '" + tree_ + "'");
  return error_;
}

Result<Version> InstallerImpl::Finish() {
  if (!error_.ok()) return error_;
  if (finished_) return Status::InvalidArgument("snapshot install already finished");
  if (!reader_.complete()) {
    return error_ = Status::Corruption("snapshot stream ended before its TAIL block")
                        .WithContext("installing a snapshot of tree '" + tree_ + "'");
  }
  // The one sync of the whole install: the file, then its directory.
  Status s = FsyncFd(file_.get(), path_);
  file_.Reset();
  // Every block was checked as it arrived: the file is used in place.
  Result<Version> v = Status::Corruption("");
  if (s.ok()) {
    v = reader_.FinishFromFile(path_);
    if (!v.ok()) s = v.status();
  }
  if (s.ok()) s = FsyncDir(dir_);
  if (s.ok()) s = store_->PublishInstall(tree_, dir_, *v);
  if (!s.ok()) return error_ = s.WithContext("installing a snapshot of tree '" + tree_ + "'");
  finished_ = true;
  return Version(tree_, v->number(), v->root());
}

Result<uint64_t> WalRunWriterImpl::Commit(uint64_t count) {
  if (used_) return Status::InvalidArgument("WalRunWriter::Commit called twice");
  used_ = true;
  return store_->CommitWalRun(tree_, path_, file_.get(), bytes_, count, &adopted_);
}

FileInstallerImpl::~FileInstallerImpl() {
  if (finished_ || !file_) return;
  // Interrupted: keep the checked blocks for a resume, nothing after them.
  if (checked_ == 0 || ::ftruncate(file_.get(), static_cast<off_t>(checked_)) != 0) {
    file_.Reset();
    (void)RemoveFile(path_);
    return;
  }
  file_.Reset();
}

Status FileInstallerImpl::Fail(Status s) {
  error_ = s.WithContext("installing the checkpoint file of tree '" + tree_ + "' at version " +
                         std::to_string(info_.version));
  file_.Reset();
  (void)RemoveFile(path_);
  return error_;
}

Status FileInstallerImpl::Open(uint64_t offset) {
  CANOPY_ASSIGN_OR_RETURN(file_, OpenFile(path_, O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (offset > 0) {
    // The sender continues after these bytes: they must check out whole.
    Status s = CheckBlocks(offset, /*stop_at_bad=*/true);
    if (!s.ok()) return s;
    if (checked_ != offset) {
      // Keep the good blocks (the next offer names exactly those), not this installer.
      error_ = Status::InvalidArgument(
          fmt::format("{}: only {} of the {} bytes held check out; the sender resumes after them", path_,
                      checked_, offset));
      if (::ftruncate(file_.get(), static_cast<off_t>(checked_)) != 0 || checked_ == 0) {
        file_.Reset();
        (void)RemoveFile(path_);
      }
      file_.Reset();
      return error_;
    }
  }
  resume_offset_ = landed_ = written_back_ = checked_;
  if (resume_offset_ > 0) {
    CANOPY_LOG(kInfo, "{}: resuming at byte {} of {} (checked blocks kept from an interrupted transfer)", path_,
               resume_offset_, info_.bytes);
  }
  return Status::Ok();
}

Status FileInstallerImpl::CheckBlocks(uint64_t landed, bool stop_at_bad) {
  if (landed <= checked_) return Status::Ok();
  // The blocks complete in [checked_, landed), found from their 8-byte
  // headers alone (read from the page cache): a block still landing (one
  // node record fills a block of its own, up to 255 MiB) is neither mapped
  // nor scanned again for every piece that lands, which made a big block
  // cost the square of its size.
  uint64_t complete = checked_;
  std::vector<uint64_t> lengths;  // of the complete blocks, in order
  Status header_status;
  while (landed - complete >= 8) {
    char head[8];
    ssize_t n = ::pread(file_.get(), head, sizeof head, static_cast<off_t>(complete));
    if (n != static_cast<ssize_t>(sizeof head)) {
      header_status = n < 0 ? ErrnoStatus(errno, "read " + path_)
                            : Status::IOError(path_ + ": short read of a block header at byte " +
                                              std::to_string(complete));
      break;
    }
    auto len = SnapshotChunkLength(std::string_view(head, sizeof head));
    if (!len.ok()) {
      header_status = len.status();
      break;
    }
    if (*len > landed - complete) break;  // its end has not landed yet
    lengths.push_back(*len);
    complete += *len;
  }
  uint64_t pos = 0;  // bytes after checked_ the reader accepted
  Status s;
  for (uint64_t len : lengths) {
    // Read from the page cache the bytes just landed in, not mapped
    // (SnapshotReader::AddChunkFromFile).
    s = reader_->AddChunkFromFile(file_.get(), checked_ + pos, static_cast<size_t>(len));
    if (!s.ok()) break;
    pos += len;
  }
  if (s.ok()) s = header_status;  // a bad header after the good blocks
  if (s.ok()) {
    checked_ += pos;
    return s;
  }
  if (!stop_at_bad) return Fail(s.WithContext(path_ + " at byte " + std::to_string(checked_ + pos)));
  // A resume found a torn or bad block: keep what precedes it. The reader
  // refused that block and is dead, so check the good prefix again afresh.
  const uint64_t good = checked_ + pos;
  CANOPY_LOG(kInfo, "{}: kept bytes end in a bad block at byte {} ({}); resuming from there", path_, good,
             s.ToString());
  reader_ = std::make_unique<SnapshotReader>(SnapshotReader::Keep::kNothing);
  checked_ = 0;
  return CheckBlocks(good, /*stop_at_bad=*/false);
}

Status FileInstallerImpl::Landed(uint64_t bytes) {
  if (!error_.ok()) return error_;
  if (finished_) return Status::InvalidArgument("checkpoint file install already finished");
  if (bytes < landed_ || bytes > info_.bytes) {
    return Fail(Status::InvalidArgument("Landed(" + std::to_string(bytes) + ") after " + std::to_string(landed_) +
                                        " of " + std::to_string(info_.bytes) + " bytes"));
  }
  landed_ = bytes;
  CANOPY_RETURN_IF_ERROR(CheckBlocks(bytes, /*stop_at_bad=*/false));
  if (store_->options().install_fsync_each_chunk) {  // benchmark knob (StoreOptions)
    Status s = FsyncFd(file_.get(), path_);
    if (!s.ok()) return Fail(s);
  } else if (Status s = WriteBackLanded(file_.get(), landed_, &written_back_, path_); !s.ok()) {
    return Fail(s);
  }
  return Status::Ok();
}

Result<Version> FileInstallerImpl::Finish() {
  if (!error_.ok()) return error_;
  if (finished_) return Status::InvalidArgument("checkpoint file install already finished");
  if (checked_ != info_.bytes || !reader_->complete()) {
    return Fail(Status::Corruption(fmt::format("{}: {} of {} bytes checked{}", path_, checked_, info_.bytes,
                                               reader_->complete() ? "" : ", no TAIL block")));
  }
  if (reader_->tree() != tree_ || reader_->version() != info_.version) {
    return Fail(Status::Corruption(fmt::format("{}: holds tree '{}' version {}", path_, reader_->tree(),
                                               reader_->version())));
  }
  // The one sync of the file; then it moves into a private install
  // directory, is mapped in place and published like any snapshot install.
  Status s = FsyncFd(file_.get(), path_);
  if (!s.ok()) return Fail(s);
  file_.Reset();
  auto dir = store_->NewInstallDir();
  if (!dir.ok()) return Fail(dir.status());
  const std::string path = JoinPath(*dir, CheckpointName(info_.version));
  s = RenameFile(path_, path);
  Result<Version> v = Status::Corruption("");
  if (s.ok()) {
    v = reader_->FinishFromFile(path);
    if (!v.ok()) s = v.status();
  }
  if (s.ok() && v->Digest() != info_.digest) {
    s = Status::Corruption(fmt::format("{}: digest {:016x}, announced {:016x}", path, v->Digest(), info_.digest));
  }
  if (s.ok()) s = FsyncDir(*dir);
  if (s.ok()) s = store_->PublishInstall(tree_, *dir, *v);
  if (!s.ok()) {
    (void)RemoveTree(*dir);
    return Fail(s);
  }
  finished_ = true;
  return Version(tree_, v->number(), v->root());
}

}  // namespace

Result<std::unique_ptr<Store>> Store::Open(const std::string& dir, const StoreOptions& options) {
  if (options.fsync == FsyncPolicy::kBatch && options.batch_interval.count() <= 0) {
    return Status::InvalidArgument("batch_interval must be positive");
  }
  if (options.retention.keep_versions == 0) {
    return Status::InvalidArgument("retention.keep_versions must be at least 1 (the newest version)");
  }
  if (options.retention.keep_for.count() < 0) {
    return Status::InvalidArgument("retention.keep_for must not be negative");
  }
  auto store = std::make_unique<StoreImpl>(dir, options);
  CANOPY_RETURN_IF_ERROR(store->Init().WithContext("open store " + dir));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace canopy::tree
