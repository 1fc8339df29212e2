#include "tools/rcopy/safe_path.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace canopy::rcopy {
namespace {

constexpr size_t kMaxComponentBytes = 255;
constexpr size_t kMaxPathBytes = 4096;

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

}  // namespace

std::string SafeRelativePath::ToString() const {
  std::string out;
  for (const std::string& d : directories) {
    out += d;
    out += '/';
  }
  return out + file;
}

Result<SafeRelativePath> SplitSafeRelativePath(std::string_view name) {
  if (name.empty()) return Status::InvalidArgument("empty destination name");
  if (name.size() > kMaxPathBytes) {
    return Status::InvalidArgument("destination name of " + std::to_string(name.size()) +
                                   " bytes is longer than " + std::to_string(kMaxPathBytes));
  }
  if (name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("destination name contains a NUL byte");
  }
  if (name.front() == '/') {
    return Status::PermissionDenied("refusing absolute destination path " + Quoted(name) +
                                    ": names are relative to the server's root");
  }
  std::vector<std::string> components;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) slash = name.size();
    std::string_view component = name.substr(start, slash - start);
    start = slash + 1;
    if (component.empty() || component == ".") continue;
    if (component == "..") {
      return Status::PermissionDenied("refusing destination path " + Quoted(name) +
                                      ": '..' components would leave the server's root");
    }
    if (component.size() > kMaxComponentBytes) {
      return Status::InvalidArgument("destination path component of " + std::to_string(component.size()) +
                                     " bytes is longer than " + std::to_string(kMaxComponentBytes));
    }
    components.emplace_back(component);
  }
  std::string_view last = name.substr(name.rfind('/') + 1);  // npos + 1 == 0
  if (components.empty() || last.empty() || last == ".") {
    return Status::InvalidArgument("destination path " + Quoted(name) + " names no file");
  }
  SafeRelativePath path;
  path.file = std::move(components.back());
  components.pop_back();
  path.directories = std::move(components);
  return path;
}

Result<UniqueFd> OpenParentBeneath(int root_fd, const SafeRelativePath& path, bool create_missing) {
  int dup_fd = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoStatus(errno, "dup root directory");
  UniqueFd current(dup_fd);
  std::string walked;
  for (const std::string& component : path.directories) {
    walked += walked.empty() ? component : "/" + component;
    constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = ::openat(current.get(), component.c_str(), kFlags);
    if (fd < 0 && errno == ENOENT && create_missing) {
      if (::mkdirat(current.get(), component.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, "create directory " + Quoted(walked));
      }
      fd = ::openat(current.get(), component.c_str(), kFlags);
    }
    if (fd < 0) {
      int err = errno;
      if (err == ELOOP || err == ENOTDIR) {
        struct stat st;
        bool is_link = ::fstatat(current.get(), component.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                       S_ISLNK(st.st_mode);
        return Status::PermissionDenied("refusing destination path " + Quoted(path.ToString()) + ": " +
                                        Quoted(walked) +
                                        (is_link ? " is a symbolic link (not followed)" : " is not a directory"));
      }
      return ErrnoStatus(err, "open directory " + Quoted(walked));
    }
    current.Reset(fd);
  }
  return current;
}

Result<UniqueFd> OpenRootDirectory(const std::string& root) {
  char resolved[PATH_MAX];
  if (::realpath(root.c_str(), resolved) == nullptr) return ErrnoStatus(errno, "resolve root " + Quoted(root));
  int fd = ::open(resolved, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open root directory " + Quoted(resolved));
  return UniqueFd(fd);
}

}  // namespace canopy::rcopy
