#include "base/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace canopy {

Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);
  return UniqueFd(fd);
}

Status WriteAll(int fd, const void* data, size_t n, std::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, std::string("write ") + std::string(what));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const void* data, size_t n, uint64_t offset, std::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, std::string("write ") + std::string(what));
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status ReadExactly(int fd, void* data, size_t n, std::string_view what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, std::string("read ") + std::string(what));
    }
    if (r == 0) return Status::Corruption(std::string("unexpected end of file: ") + std::string(what));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

Result<size_t> ReadSome(int fd, void* data, size_t n, std::string_view what) {
  for (;;) {
    ssize_t r = ::read(fd, data, n);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR) return ErrnoStatus(errno, std::string("read ") + std::string(what));
  }
}

Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::string out;
  char buf[65536];
  for (;;) {
    CANOPY_ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf, sizeof buf, path));
    if (n == 0) break;
    if (out.size() + n > max_bytes) {
      return Status::ResourceExhausted(path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, n);
  }
  return out;
}

Status FsyncFd(int fd, std::string_view what) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return ErrnoStatus(errno, std::string("fsync ") + std::string(what));
  }
  return Status::Ok();
}

Status StartWriteback(int fd, uint64_t offset, uint64_t len, std::string_view what) {
  if (len == 0) return Status::Ok();
  while (::sync_file_range(fd, static_cast<off64_t>(offset), static_cast<off64_t>(len),
                           SYNC_FILE_RANGE_WRITE) != 0) {
    if (errno == EINTR) continue;
    if (errno == ESPIPE || errno == EINVAL || errno == ENOSYS) return Status::Ok();  // nothing to write back
    return ErrnoStatus(errno, std::string("write-back of ") + std::string(what));
  }
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY));
  return FsyncFd(fd.get(), dir);
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Status s;
  {
    auto fd = OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!fd.ok()) return fd.status();
    s = WriteAll(fd->get(), contents.data(), contents.size(), tmp);
    if (s.ok()) s = FsyncFd(fd->get(), tmp);
  }
  if (s.ok()) s = RenameFile(tmp, path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(DirName(path));
}

Status CreateDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "mkdir " + path);
  return Status::Ok();
}

Status RenameFile(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "rename " + from + " -> " + to);
  return Status::Ok();
}

Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink " + path);
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "remove " + path);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Result<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  return static_cast<uint64_t>(st.st_size);
}

std::string DirName(std::string_view path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

std::string BaseName(std::string_view path) {
  auto pos = path.find_last_of('/');
  return std::string(pos == std::string_view::npos ? path : path.substr(pos + 1));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  std::string out(a);
  if (out.back() != '/') out.push_back('/');
  out.append(b);
  return out;
}

}  // namespace canopy
