// Store: a directory of named, versioned, durable trees.
//
// Each tree has a linear history of versions 0, 1, 2, ... (version 0 is the
// empty root). A commit turns version v into v + 1 by applying a Delta with
// path copying; readers hold Version handles and are never blocked or
// affected by commits. Every commit is appended to the tree's write-ahead log
// (WAL) before it is acknowledged; periodic checkpoints (snapshot files) bound
// recovery time. Open() recovers each tree from its newest valid checkpoint
// plus a replay of the WAL, cutting a torn or corrupt tail (never applying
// it). The on-disk format is described in tree/README.md.
//
// Durability (StoreOptions::fsync):
//   kAlways: Commit/ApplyDelta return only after the record is fsynced;
//            concurrent committers on a tree share one fdatasync (group commit).
//   kBatch:  records are synced by a background thread every batch_interval,
//            or sooner once batch_bytes are unsynced; a crash may lose the
//            last unsynced commits (never a half-applied one).
//   kNone:   never synced (the OS decides); DurableVersion == LatestVersion.
// A new version becomes visible (Latest, a base for the next commit) as soon
// as its WAL record is written, before its fsync completes; DurableVersion
// says what is synced. With kAlways, Commit returning OK means durable.
//
// Errors: a stale base is Conflict; an unknown tree NotFound; a full disk or
// file size limit ResourceExhausted — the failed commit is not applied, its
// partial WAL record is cut, and the tree stays readable at its last good
// version. If an fsync itself fails, the data on disk is in doubt: the tree
// turns read-only and every later write on it returns IOError until the store
// is reopened (which recovers what did reach the disk).
//
// Request ids (RequestId, tree/delta.h): a commit may name the request it
// answers. Each tree remembers the ids of its recent commits — those
// committed here, applied from a replicated delta (the id travels in the
// delta) and replayed from the WAL by Open — up to kRequestsPerClient per
// client and kRequestClients clients (the oldest go first). A Commit or
// CommitOps whose id is remembered applies nothing: it returns the version
// the earlier commit made, with duplicate set, once that version is durable
// per the policy. So a client that retries a commit whose reply it lost, on
// this node or on a replica that took over, does not apply it twice. A
// snapshot install forgets the ids (the history they name is replaced); after
// a restart only the ids in the replayed WAL (since the checkpoint recovery
// starts from) are known.
//
// Thread safety: every Store method may be called from any number of threads
// concurrently. Writes to one tree are serialised by a per-tree mutex; reads
// (Latest, Version handles) never wait for fsyncs. The Store must outlive the
// SnapshotInstallers it hands out. Versions are immutable and outlive the Store.
//
// Past versions (StoreOptions::retention, At, Pin): besides the newest
// version, every tree retains a window of its recent versions, readable by
// number with At(). A version is retained while ANY of these keeps it:
//   - it is one of the newest retention.keep_versions versions (default 1000);
//   - it was the newest version at some moment within the last
//     retention.keep_for (it was superseded less than keep_for ago; off by
//     default);
//   - a VersionPin on it or on an older version of the tree is alive.
// The window is contiguous: oldest retained .. newest. Versions leave it from
// the old end when the next commit on the tree, or the background thread
// (about once a second), finds no rule keeping them; a read past it is
// NotFound naming the oldest and newest version held. Retained versions share every node they
// did not change with their neighbours (see tree/node.h), so each costs
// about what its commit changed. The same rules apply whether a version was
// committed here or applied from a replicated delta. A snapshot install
// (replica catch-up, node join) replaces the tree's whole history: only the
// installed version is held afterwards.
// Across a restart: Open() rebuilds the keep_versions and keep_for windows
// from a checkpoint at or before their oldest version plus a replay of the
// WAL, which checkpoint deletion and WAL truncation keep on disk for this
// purpose (tree/README.md states exactly what survives). Pins are not
// durable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "base/status.h"
#include "tree/delta.h"
#include "tree/node.h"
#include "tree/snapshot.h"
#include "tree/transaction.h"
#include "tree/version.h"

namespace canopy::tree {

// Which past versions of each tree stay readable (see the top of this file).
struct RetentionPolicy {
  // The newest this many versions, the newest included. Must be >= 1
  // (1: only the newest version; Open returns InvalidArgument for 0).
  uint64_t keep_versions = 1000;
  // Also every version superseded less than this long ago; 0 turns the rule
  // off. After a restart a replayed version counts as superseded when the
  // WAL segment holding its successor was last modified (never earlier than
  // it really was), so the rule keeps at least what it promised.
  std::chrono::milliseconds keep_for{0};
};

class VersionPin;

enum class FsyncPolicy : uint8_t { kAlways = 0, kBatch = 1, kNone = 2 };
const char* FsyncPolicyName(FsyncPolicy policy);
// "always" | "batch" | "none"; InvalidArgument otherwise.
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view name);

// Whether a checkpoint file of `checkpoint_bytes` (0: none) followed by
// `wal_bytes` of WAL records is worth replacing by a fresh checkpoint: the
// records reach half the file's size and at least `floor` bytes. Replaying
// them (decode, apply, log) would cost a recovering or joining node about
// what reading a fresh file costs. The store's own trigger
// (StoreOptions::checkpoint_wal_bytes as the floor) and a leader choosing
// the file to send a joiner use this one rule, so a leader does not rewrite
// a file its store considers fresh.
bool CheckpointIsStale(uint64_t checkpoint_bytes, uint64_t wal_bytes, uint64_t floor);

struct StoreOptions {
  FsyncPolicy fsync = FsyncPolicy::kAlways;
  // kBatch: sync at least this often...
  std::chrono::milliseconds batch_interval{10};
  // ...or as soon as this many bytes are unsynced.
  uint64_t batch_bytes = 1 << 20;
  // Write a checkpoint (in the background) after this many commits on a
  // tree since its last one; 0 disables automatic checkpoints.
  uint64_t checkpoint_every_commits = 10000;
  // Also write one (in the background) once the WAL records written on a
  // tree since its last checkpoint reach this many bytes, or half the size
  // of that checkpoint file if that is more; 0 disables this trigger. The
  // WAL replayed on recovery then stays smaller than the checkpoint it
  // follows, and the newest file is what a joining replica is sent (a
  // leader writes a fresh one first when the deltas after it reach half
  // its size: CheckpointIsStale).
  uint64_t checkpoint_wal_bytes = 4 << 20;
  // After an automatic checkpoint at version c, WAL segments holding only
  // deltas with new_version <= c - wal_retain_versions are deleted, so
  // replicas that lag by less than this can still catch up from the WAL
  // (and only those the retained window does not need to be rebuilt; see
  // TruncateWalBefore).
  uint64_t wal_retain_versions = 10000;
  // A new WAL segment is started once the current one reaches this size.
  uint64_t wal_segment_bytes = 64 << 20;
  // Chunk size of checkpoint files.
  size_t snapshot_chunk_bytes = kDefaultSnapshotChunkBytes;
  // Benchmark knob: a SnapshotInstaller fsyncs its file after every chunk
  // (as an installer that makes each received piece durable on arrival
  // would) instead of once in Finish(). Off by default; `canopy node
  // --install-fsync each-chunk` turns it on to measure what per-piece fsync
  // costs a node join.
  bool install_fsync_each_chunk = false;
  // Past versions kept readable (At, Pin).
  RetentionPolicy retention;
  // The largest checkpoint file a SnapshotFileInstaller accepts (node join
  // on the bulk path): a sender announcing more is refused before anything
  // is created or written. `canopy node --max-snapshot-bytes`.
  uint64_t max_install_file_bytes = uint64_t{1} << 40;
};

// The range of versions of one tree that At() can read now.
struct RetainedVersions {
  uint64_t oldest = 0;
  uint64_t newest = 0;
  bool operator==(const RetainedVersions&) const = default;
};

// Keeps one version of a tree, and every later one, retained (readable by
// Store::At) while it is alive, whatever the retention policy says. Obtained
// from Store::Pin; move-only; destroying it (or Release) lets the retention
// policy drop those versions again at its next pass. A pin only holds
// versions that are still retained when it is made, does not survive a
// restart, and holds nothing from before a snapshot install. Safe to destroy
// on any thread, before or after the Store. An empty (default-constructed or
// moved-from) pin holds nothing.
class VersionPin {
 public:
  struct Table;  // private to store.cc

  VersionPin() = default;
  VersionPin(std::shared_ptr<Table> table, std::string tree, uint64_t version);
  ~VersionPin();
  VersionPin(VersionPin&& other) noexcept;
  VersionPin& operator=(VersionPin&& other) noexcept;
  VersionPin(const VersionPin&) = delete;
  VersionPin& operator=(const VersionPin&) = delete;

  bool held() const { return table_ != nullptr; }
  const std::string& tree() const { return tree_; }
  uint64_t version() const { return version_; }
  // Gives the pin up now (as the destructor does); the pin is then empty.
  void Release();

 private:
  std::shared_ptr<Table> table_;
  std::string tree_;
  uint64_t version_ = 0;
};

struct CommitResult {
  uint64_t version = 0;       // the new version number
  std::string encoded_delta;  // EncodeDelta() of what was committed (also the WAL record); empty
                              // from ApplyEncodedDelta, whose caller holds those bytes
  // The commit's request id had been committed before, as `version`: nothing
  // was applied now and encoded_delta is empty.
  bool duplicate = false;
};

// How many request ids each tree remembers (see the top of this file).
inline constexpr size_t kRequestsPerClient = 4096;
inline constexpr size_t kRequestClients = 16384;

// Receives a snapshot stream for one tree (a replica catching up, a node
// joining). Chunks are checked and decoded as they arrive and written to a
// temporary checkpoint file without any fsync; Finish() syncs once, publishes
// the tree atomically (the old state of the tree, if any, is replaced
// whole — its WAL and checkpoints included) and the tree is then at the
// snapshot's version, ready for ApplyDelta of the following deltas.
// Destroying an unfinished installer discards everything it wrote; the tree
// is unchanged. Used by one thread at a time.
class SnapshotInstaller {
 public:
  virtual ~SnapshotInstaller() = default;
  // One whole chunk (as produced by SnapshotWriter). Corruption if the chunk
  // is bad or names another tree; the installer is then unusable.
  virtual Status AddChunk(std::string_view chunk) = 0;
  // Corruption if the stream is incomplete. On success returns the installed version.
  virtual Result<Version> Finish() = 0;
};

// One checkpoint file as a sender announces it (node join on the bulk path).
struct CheckpointFileInfo {
  uint64_t version = 0;  // the tree version the file holds
  uint64_t bytes = 0;    // its exact length
  uint64_t digest = 0;   // Version::Digest of that version (names the content)
  bool operator==(const CheckpointFileInfo&) const = default;
};

// An open checkpoint file to send whole (Store::OpenNewestCheckpointFile).
// The descriptor stays readable even if the store deletes the file (a newer
// checkpoint) while it is being sent. Move-only; closes on destruction.
// The WAL holds every delta after it (the store never truncates past its
// newest checkpoint), and wal_bytes_after says how many record bytes those
// deltas took when it was opened: what a sender weighs against the file's
// size (CheckpointIsStale) without reading the WAL.
struct CheckpointFile {
  CheckpointFileInfo info;
  uint64_t wal_bytes_after = 0;
  UniqueFd fd;
};

// Receives one whole checkpoint file (node join and catch-up on the bulk
// path: the sender's file bytes land in a file here, e.g. spliced from a
// socket, and are used in place). The file is written by the caller through
// fd() at offsets [resume_offset(), info.bytes), in order; after each piece
// the caller reports the length written so far with Landed(), which checks
// every block (CRC first, then structure) that is now complete. Finish()
// checks that the file is complete, fsyncs it once, renames it into place
// and publishes the tree in place (no decode pass), exactly as
// SnapshotInstaller::Finish does; the deltas after the checkpoint follow as
// usual.
//
// Resume: while the transfer is under way the file lives under
// <store>/partial/<tree>/, named by its CheckpointFileInfo. An installer
// destroyed unfinished (connection lost) leaves the blocks it has checked
// there (a killed process leaves what reached the file; the next Begin
// keeps its good whole blocks); Store::PartialCheckpointFile offers them to
// the sender, and a BeginSnapshotFileInstall of the same tree and file at
// that offset checks them again and continues after them, so they are not
// fetched again. Any other partial file of the tree is deleted then. A
// corrupt file (Landed or Finish returned Corruption) is deleted at once:
// no half file stays in place. Used by one thread at a time.
class SnapshotFileInstaller {
 public:
  virtual ~SnapshotFileInstaller() = default;
  virtual const CheckpointFileInfo& info() const = 0;
  // Where to write the file's bytes (pwrite, or transport::BulkSink::ToFile).
  virtual int fd() const = 0;
  // Bytes already held and checked from an interrupted transfer of this file.
  virtual uint64_t resume_offset() const = 0;
  // The first `bytes` bytes of the file are written. Corruption (and the
  // installer is dead, the file removed) if a block among them is bad;
  // InvalidArgument if `bytes` goes backwards or past info().bytes.
  virtual Status Landed(uint64_t bytes) = 0;
  // Corruption if the file is incomplete or is not of this tree at
  // info().version; on success the tree is installed at that version.
  virtual Result<Version> Finish() = 0;
};

// A replica's run of its leader's WAL records received straight into a
// file that becomes a segment of its own WAL (Store::BeginWalRun): the
// bytes land by the transport's bulk path (TCP: splice into the file), are
// checked (every record's length, CRC and fields) and applied, and only
// then is the file renamed into the tree's WAL. Attribute values of at
// least kReferencedValueBytes (delta.h) are not copied: the versions read
// them through a read-only mapping of that file, which stays mapped while
// any version refers to one (also after the segment is deleted). Until
// Commit succeeds the file lies in the store's tmp directory, which Open
// empties, so a crash never leaves unchecked records in a WAL. Destroyed
// uncommitted, the file is removed. Used by one thread at a time.
class WalRunWriter {
 public:
  virtual ~WalRunWriter() = default;
  // Where to write the run's bytes, from offset 0 (pwrite, or
  // transport::BulkSink::ToFile).
  virtual int fd() const = 0;
  // The run's `count` records are written: checks them and commits them as
  // ApplyEncodedDeltas does (Conflict if the first is not based on the
  // newest version; Corruption if the file does not hold exactly `count`
  // whole, valid records of the run's length; InvalidArgument if one does
  // not apply) and returns the version reached. All or nothing: on any
  // error no version is committed and the WAL is as it was.
  virtual Result<uint64_t> Commit(uint64_t count) = 0;
};

class Store {
 public:
  // Opens (creating if needed) the store in `dir` and recovers every tree.
  // Corruption if a tree cannot be recovered consistently (e.g. a WAL gap
  // after its checkpoint); PermissionDenied / IOError from the file system.
  static Result<std::unique_ptr<Store>> Open(const std::string& dir, const StoreOptions& options);

  // Stops background work and, for kBatch, syncs what is unsynced.
  virtual ~Store() = default;

  // Tree names: 1..200 characters from [A-Za-z0-9._-], not starting with '.'.
  static Status ValidateTreeName(std::string_view name);

  // Creates an empty tree at version 0, durably. AlreadyExists if present.
  virtual Status CreateTree(std::string_view name) = 0;
  virtual bool HasTree(std::string_view name) const = 0;
  // Sorted names.
  virtual std::vector<std::string> ListTrees() const = 0;

  // The newest version (committed; durable per policy only after Commit returned).
  virtual Result<Version> Latest(std::string_view tree) const = 0;
  virtual Result<uint64_t> LatestVersion(std::string_view tree) const = 0;
  // The tree at version `number`, if it is retained (see the top of this
  // file). NotFound for an unknown tree, or naming the oldest and newest
  // versions held when `number` is older than the oldest (no longer held)
  // or newer than the newest (not held yet: a replica may be behind).
  virtual Result<Version> At(std::string_view tree, uint64_t number) const = 0;
  // Which versions At() can read now.
  virtual Result<RetainedVersions> Retained(std::string_view tree) const = 0;
  // Keeps version `number` and every later one retained until the pin is
  // released. NotFound (as At) if `number` is not retained now.
  virtual Result<VersionPin> Pin(std::string_view tree, uint64_t number) = 0;
  // The newest version whose WAL record is known to be synced (see policies).
  virtual Result<uint64_t> DurableVersion(std::string_view tree) const = 0;

  // A transaction on the newest version of `tree`. Equivalent to
  // Transaction(*Latest(tree)).
  virtual Result<Transaction> Begin(std::string_view tree) const = 0;
  // Commits `txn` as version txn.base().number() + 1. Conflict if the tree's
  // newest version is no longer the base (by number and by root identity,
  // so a base from before a snapshot install conflicts too); nothing is
  // changed then. With a non-empty `request` that the tree already
  // remembers: no Conflict, nothing applied, the earlier version returned
  // with duplicate set.
  virtual Result<CommitResult> Commit(Transaction txn, const RequestId& request = {}) = 0;
  // Applies `ops` to whatever version is newest when the tree's write lock
  // is taken, as one commit (newest + 1): unlike Begin + Commit it never
  // conflicts with concurrent commits, so many committers on one tree do
  // not retry each other out. With base_version != 0 the newest version
  // must be that one (else Conflict). InvalidArgument (naming the op) if an
  // op does not apply to the newest version; nothing is changed then.
  // `request` as for Commit (checked first: a remembered id returns the
  // earlier version whatever the base). Durability as Commit.
  virtual Result<CommitResult> CommitOps(std::string_view tree, std::vector<Op> ops,
                                         const RequestId& request = {}, uint64_t base_version = 0) = 0;

  // One commit of a CommitOpsBatch: what CommitOps takes.
  struct OpsCommit {
    std::vector<Op> ops;
    RequestId request;
    uint64_t base_version = 0;  // 0: any
  };
  // Applies `commits` to `tree` in order, each exactly as CommitOps would
  // (its own request-id check, base check and ops; commit i + 1 sees what
  // commit i made, a duplicate within the batch included), under ONE hold
  // of the tree's write lock, with ONE WAL write for all of them and, under
  // kAlways, one sync after it. Returns one result per commit, in order;
  // each succeeds or fails on its own: a Conflict or InvalidArgument of one
  // changes nothing and does not affect the others. A failed WAL write (full
  // disk, ...) fails every commit that would have been written, and none of
  // them is applied (the log is cut back as for CommitOps); a failed sync
  // fails them all as CommitOps would. NotFound (for every commit) for an
  // unknown tree. Durability as Commit: with kAlways every OK result is
  // synced when this returns. encoded_delta is set as for CommitOps.
  // Thread safety: as every Store method; concurrent batches and single
  // commits on one tree are serialised by its write lock (and share syncs).
  virtual std::vector<Result<CommitResult>> CommitOpsBatch(std::string_view tree,
                                                           std::vector<OpsCommit> commits) = 0;

  // Applies an already built delta (replica side, or a leader committing a
  // delta it built itself). REQUIRES delta.base_version == the tree's newest
  // version (else Conflict) and new_version == base_version + 1 (else
  // InvalidArgument); logged per the fsync policy like Commit.
  virtual Result<CommitResult> ApplyDelta(const Delta& delta) = 0;
  // Same, from EncodeDelta() bytes (Corruption if they do not decode). The
  // result's encoded_delta is left empty: the caller holds those bytes.
  virtual Result<CommitResult> ApplyEncodedDelta(std::string_view encoded) = 0;
  // Applies consecutive encoded deltas in order, each as ApplyEncodedDelta,
  // but under kAlways syncs the WAL once, after the last (a replica applying
  // a batch from its leader pays one fdatasync). Returns the version reached.
  // On an error the deltas before the failing one stay applied (and synced
  // per the policy); the error names the failing delta's version.
  virtual Result<uint64_t> ApplyEncodedDeltas(std::span<const std::string_view> encoded) = 0;
  // ApplyEncodedDeltas for deltas that lie in a heap buffer the caller owns
  // (*buffer, of which the first `buffer_bytes` are in use), as a replica
  // receives a run of its leader's WAL records. When puts of values of at
  // least kReferencedValueBytes (delta.h) make up half or more of those
  // bytes, such values are not copied: the versions refer to them where
  // they lie, and the store takes the buffer (*buffer is then null) and
  // frees it once no version refers to any of them. Otherwise, or if no
  // version kept any of them, *buffer is the caller's again and every value
  // was copied, as by ApplyEncodedDeltas. A run of large values so costs
  // its memory once, in the buffer it landed in. (A buffer is taken only
  // while at least half of it is values in use; later commits that replace
  // them can leave it held by fewer.)
  // Begins a WalRunWriter for `bytes` bytes of the records of `tree`
  // (which must exist) that follow its newest version. NotFound for an
  // unknown tree; InvalidArgument if bytes is 0 or over kMaxWalRunBytes;
  // IOError from the file system.
  static constexpr uint64_t kMaxWalRunBytes = uint64_t{1} << 30;
  virtual Result<std::unique_ptr<WalRunWriter>> BeginWalRun(std::string_view tree, uint64_t bytes) = 0;
  virtual Result<uint64_t> ApplyEncodedDeltasInPlace(std::span<const std::string_view> encoded,
                                                     std::unique_ptr<char[]>* buffer,
                                                     size_t buffer_bytes) = 0;

  // Encoded deltas with new_version > `version`, in order, read from the WAL,
  // stopping once max_bytes have been collected (at least one delta is
  // returned when any is available). Empty when `version` is the newest.
  // NotFound if the WAL no longer holds the delta right after `version`
  // (truncated after a checkpoint, or a snapshot was installed since);
  // InvalidArgument if `version` is newer than the newest version.
  // Cost: the newest deltas (about the last 64 KiB of them) are kept in
  // memory as written, so a replica stream that keeps up reads no file; a
  // read that continues where an earlier one stopped (a replica stream
  // asking for what follows the version it was last sent) starts at that WAL
  // position, so it costs the deltas returned, not the segment; any other
  // start scans its segment from the beginning. The answer is the same
  // whichever way it was read.
  virtual Result<std::vector<std::string>> ReadDeltasSince(std::string_view tree, uint64_t version,
                                                           size_t max_bytes = 64 << 20) const = 0;

  // Where the deltas after `version` lie in the WAL, for a sender that hands
  // them on as the file's bytes (a replica stream: sendfile on TCP, an RDMA
  // READ of the mapping) instead of copies: the records of new versions
  // first_version..last_version, consecutive and whole, as bytes
  // [offset, offset + length) of one segment file, open in `file`. It ends
  // at that segment's end, or at the first record that reaches max_bytes
  // (one record at least). Every record is checked as ReadDeltasSince checks
  // it (header, length, CRC), with the same cost: the records before the
  // first are passed over unread.
  // nullopt when ReadDeltasSince is the better read: the deltas are held in
  // memory (a stream that keeps up), or the segment went away meanwhile (a
  // truncation after a checkpoint). A range of no records when `version` is
  // the newest; NotFound and InvalidArgument as ReadDeltasSince.
  struct WalDeltaRange {
    UniqueFd file;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t first_version = 0;
    uint64_t last_version = 0;
    uint64_t records = 0;
  };
  virtual Result<std::optional<WalDeltaRange>> LocateDeltasSince(std::string_view tree, uint64_t version,
                                                                 size_t max_bytes) const = 0;

  // Writes a checkpoint of the newest version now (synchronously) and
  // returns its version number. Does not truncate the WAL. Of the older
  // checkpoints it keeps the newest one, the newest one at or before the
  // oldest retained version (the base a restart rebuilds the retained
  // window from) and the oldest one after it (the next base), and deletes
  // the others.
  virtual Result<uint64_t> Checkpoint(std::string_view tree) = 0;

  // The tree's newest checkpoint, as a Version read in place from its file
  // (lazy nodes over the mapped, fully checked checkpoint; a SnapshotWriter
  // over it hands out the file's blocks as they are, encoding nothing).
  // This is what a snapshot sender streams, followed by the deltas after it:
  // the WAL after the newest checkpoint is never truncated. NotFound if the
  // tree has no checkpoint file. Kept open until a newer checkpoint or a
  // snapshot install replaces it; after a restart whose recovery started
  // from that file, it is the Version recovery opened (the file is not read
  // and checked again); after one that started from an older file, the
  // background thread reads and checks it right after Open (a caller that
  // comes first does so itself, and the thread then finds it kept).
  virtual Result<Version> NewestCheckpoint(std::string_view tree) = 0;
  // Deletes WAL segments that hold only deltas with new_version <= `version`.
  // Only deltas covered by a durable checkpoint are ever deleted: `version`
  // is clamped to the newest checkpoint's version, and to the version of the
  // checkpoint a restart would rebuild the retained window from (0, i.e.
  // nothing is deleted, while no checkpoint is at or before the oldest
  // retained version). Segments are whole files, so some older deltas may
  // remain.
  virtual Status TruncateWalBefore(std::string_view tree, uint64_t version) = 0;

  // Starts installing a snapshot of `tree` (which need not exist yet).
  virtual Result<std::unique_ptr<SnapshotInstaller>> BeginSnapshotInstall(std::string_view tree) = 0;

  // The newest checkpoint of `tree` opened for sending whole (its identity
  // and a descriptor); NotFound if the tree has none.
  virtual Result<CheckpointFile> OpenNewestCheckpointFile(std::string_view tree) = 0;
  // Starts receiving checkpoint file `file` of `tree` (which need not exist
  // yet). Checked before anything is created or written: ResourceExhausted
  // if file.bytes is over StoreOptions::max_install_file_bytes or over the
  // free space of the store's file system (what is already held for a
  // resume counts as held); Corruption if it is too short to be a
  // checkpoint; InvalidArgument for a bad tree name.
  // `offset` is where the sender starts: 0, or exactly the checked bytes
  // this store holds of the same file (what PartialCheckpointFile offered);
  // anything else is InvalidArgument and the partial file is deleted. The
  // installer's resume_offset() is `offset`.
  virtual Result<std::unique_ptr<SnapshotFileInstaller>> BeginSnapshotFileInstall(std::string_view tree,
                                                                                  const CheckpointFileInfo& file,
                                                                                  uint64_t offset = 0) = 0;
  // The partial checkpoint file an interrupted SnapshotFileInstaller of
  // `tree` left (its identity, and in `held` the bytes kept: whole checked
  // blocks, though a later Begin checks them again), to offer the sender
  // for a resume. NotFound if there is none.
  struct PartialFile {
    CheckpointFileInfo info;
    uint64_t held = 0;
  };
  virtual Result<PartialFile> PartialCheckpointFile(std::string_view tree) const = 0;

  // Syncs every tree's WAL now, whatever the policy.
  virtual Status SyncAll() = 0;

  virtual const std::string& dir() const = 0;
  virtual const StoreOptions& options() const = 0;
};

}  // namespace canopy::tree
