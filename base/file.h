// Small, careful file helpers shared by the store and the tools.
//
// All functions report failures as Status values built with ErrnoStatus, so a
// full disk is ResourceExhausted and a permission problem PermissionDenied,
// with the path in the message. Nothing here throws.
//
// Thread safety: the functions are reentrant; concurrent calls on the same
// path race the way the underlying syscalls do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/fd.h"
#include "base/result.h"

namespace canopy {

// open(2) with O_CLOEXEC added.
Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode = 0644);

// Writes all n bytes (retrying short writes and EINTR).
Status WriteAll(int fd, const void* data, size_t n, std::string_view what);
// pwrite variant.
Status PwriteAll(int fd, const void* data, size_t n, uint64_t offset, std::string_view what);
// Reads exactly n bytes; Corruption ("unexpected end of file") if EOF comes first.
Status ReadExactly(int fd, void* data, size_t n, std::string_view what);
// Reads up to n bytes; returns how many (0 only at EOF).
Result<size_t> ReadSome(int fd, void* data, size_t n, std::string_view what);

// Whole-file read. Fails with ResourceExhausted past max_bytes.
Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes = SIZE_MAX);

// Crash-safe publish: writes `contents` to "<path>.tmp.<pid>", fsyncs it,
// renames it over `path` and fsyncs the directory. On failure the old file (if
// any) is untouched and the temporary is removed.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

Status FsyncFd(int fd, std::string_view what);
// Starts writing the dirty pages of [offset, offset + len) of fd to its
// device and returns without waiting for them (sync_file_range with
// SYNC_FILE_RANGE_WRITE; it may wait for room in the device's queue). It
// makes nothing durable: the file's metadata and the device's cache still
// need FsyncFd. What it buys is overlap: a writer that calls it as data lands
// keeps the device busy meanwhile, so its final FsyncFd waits for the last
// range only, not for every byte. Where the file system has no write-back
// (tmpfs) it does nothing; an fd it cannot apply to (a pipe) is no error.
Status StartWriteback(int fd, uint64_t offset, uint64_t len, std::string_view what);
// fsync of the directory itself, so that creates/renames inside it are durable.
Status FsyncDir(const std::string& dir);
// mkdir -p. OK if it exists already as a directory.
Status CreateDirs(const std::string& path);
Status RenameFile(const std::string& from, const std::string& to);
Status RemoveFile(const std::string& path);  // OK if it does not exist
Status RemoveTree(const std::string& path);  // rm -rf; OK if it does not exist
bool PathExists(const std::string& path);
Result<uint64_t> FileSize(const std::string& path);

// Directory part and file part of a path ("a/b/c" -> "a/b", "c").
std::string DirName(std::string_view path);
std::string BaseName(std::string_view path);
std::string JoinPath(std::string_view a, std::string_view b);

}  // namespace canopy
