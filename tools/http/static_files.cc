#include "tools/http/static_files.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "tools/http/http_date.h"
#include "tools/http/mime.h"
#include "tools/http/range.h"
#include "tools/http/url.h"

namespace canopy::http {

struct StaticFileHandler::Opened {
  UniqueFd fd;
  struct stat st {};
};

namespace {

int StatusForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
      return 404;
    case EACCES:
    case EPERM:
    case ELOOP:
    case EXDEV:
      return 403;
    default:
      return 500;
  }
}

// openat2(RESOLVE_BENEATH): the kernel refuses any resolution step that
// leaves dir_fd (a "..", or a symlink - absolute or relative - pointing
// outside) with EXDEV. Returns -1 with errno ENOSYS where openat2 is missing.
int OpenBeneath(int dir_fd, const std::string& relative) {
#ifdef SYS_openat2
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof how));
#else
  errno = ENOSYS;
  return -1;
#endif
}

bool EtagMatches(std::string_view if_none_match, std::string_view etag) {
  while (!if_none_match.empty()) {
    size_t comma = if_none_match.find(',');
    std::string_view item = if_none_match.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.size() > 2 && item.substr(0, 2) == "W/") item.remove_prefix(2);
    if (item == "*" || item == etag) return true;
    if (comma == std::string_view::npos) break;
    if_none_match.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<StaticFileHandler>> StaticFileHandler::Create(const std::string& root) {
  char resolved[PATH_MAX];
  if (::realpath(root.c_str(), resolved) == nullptr) return ErrnoStatus(errno, "root " + root);
  UniqueFd fd(::open(resolved, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("root {} (must be a directory)", resolved));
  return std::unique_ptr<StaticFileHandler>(new StaticFileHandler(resolved, std::move(fd)));
}

int StaticFileHandler::OpenBelowRoot(const std::string& relative, Opened* out) const {
  static std::atomic<bool> have_openat2{true};
  std::string rel = relative.empty() ? "." : relative;
  if (have_openat2.load(std::memory_order_relaxed)) {
    int fd = OpenBeneath(root_fd_.get(), rel);
    if (fd >= 0) {
      out->fd.Reset(fd);
      if (::fstat(fd, &out->st) != 0) return 500;
      return 0;
    }
    if (errno != ENOSYS) return StatusForErrno(errno);
    have_openat2.store(false);
  }
  // Without openat2: resolve every symlink first, check the result lies
  // inside the root, then open it without following a (swapped-in) final link.
  std::string full = root_ == "/" ? "/" + rel : root_ + "/" + rel;
  char resolved[PATH_MAX];
  if (::realpath(full.c_str(), resolved) == nullptr) return StatusForErrno(errno);
  std::string real = resolved;
  std::string inside;
  if (real == root_) {
    inside = ".";
  } else {
    std::string prefix = root_ == "/" ? "/" : root_ + "/";
    if (real.compare(0, prefix.size(), prefix) != 0) return 403;  // a symlink leads outside the root
    inside = real.substr(prefix.size());
  }
  int fd = ::openat(root_fd_.get(), inside.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return StatusForErrno(errno);
  out->fd.Reset(fd);
  if (::fstat(fd, &out->st) != 0) return 500;
  return 0;
}

Response StaticFileHandler::Handle(const Request& request) {
  if (request.method != "GET" && request.method != "HEAD") {
    Response r = Response::Error(405);
    r.headers.Add("Allow", "GET, HEAD");
    return r;
  }
  if (request.target == "*") return Response::Error(400, "'*' is only for OPTIONS");
  std::string_view raw_path = request.path();
  Result<std::string> decoded = PercentDecode(raw_path);
  if (!decoded.ok()) return Response::Error(400, decoded.status().message());
  if (decoded->find('\0') != std::string::npos) return Response::Error(400, "NUL byte in path");

  // Textual normalisation; ".." above the root is refused outright.
  std::vector<std::string_view> parts;
  std::string_view rest = *decoded;
  bool trailing_slash = !rest.empty() && rest.back() == '/';
  while (!rest.empty()) {
    size_t slash = rest.find('/');
    std::string_view seg = rest.substr(0, slash);
    if (seg == "..") {
      if (parts.empty()) return Response::Error(403, "path leaves the root");
      parts.pop_back();
    } else if (!seg.empty() && seg != ".") {
      parts.push_back(seg);
    }
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  std::string relative;
  for (auto seg : parts) {
    if (!relative.empty()) relative.push_back('/');
    relative.append(seg);
  }

  Opened file;
  std::string relative_served = relative;
  int error = OpenBelowRoot(relative, &file);
  if (error != 0) return Response::Error(error);
  if (S_ISDIR(file.st.st_mode)) {
    if (!trailing_slash) {
      Response r = Response::Error(301);
      std::string location = std::string(raw_path) + "/";
      if (!request.query().empty()) location += "?" + std::string(request.query());
      r.headers.Add("Location", location);
      return r;
    }
    std::string index = relative.empty() ? "index.html" : relative + "/index.html";
    Opened index_file;
    error = OpenBelowRoot(index, &index_file);
    if (error == 404) return Response::Error(403, "directory listing is not served");
    if (error != 0) return Response::Error(error);
    file = std::move(index_file);
    relative_served = index;
  }
  if (!S_ISREG(file.st.st_mode)) return Response::Error(403, "not a regular file");
  if ((file.st.st_mode & S_IROTH) == 0) return Response::Error(403, "file is not world-readable");

  uint64_t size = static_cast<uint64_t>(file.st.st_size);
  uint64_t mtime_ns = static_cast<uint64_t>(file.st.st_mtim.tv_sec) * 1000000000ull +
                      static_cast<uint64_t>(file.st.st_mtim.tv_nsec);
  std::string etag = fmt::format("\"{:x}-{:x}\"", size, mtime_ns);
  std::string last_modified = HttpDate(file.st.st_mtim.tv_sec);

  Response r;
  r.headers.Add("Content-Type", std::string(MimeTypeForPath(relative_served)));
  r.headers.Add("Last-Modified", last_modified);
  r.headers.Add("ETag", etag);
  r.headers.Add("Accept-Ranges", "bytes");

  const std::string* if_none_match = request.headers.Find("If-None-Match");
  const std::string* if_modified_since = request.headers.Find("If-Modified-Since");
  if ((if_none_match != nullptr && EtagMatches(*if_none_match, etag)) ||
      (if_none_match == nullptr && if_modified_since != nullptr && *if_modified_since == last_modified)) {
    r.status = 304;
    return r;
  }

  uint64_t first = 0;
  uint64_t length = size;
  if (const std::string* range_header = request.headers.Find("Range")) {
    const std::string* if_range = request.headers.Find("If-Range");
    bool range_applies = if_range == nullptr || *if_range == etag || *if_range == last_modified;
    ByteRange range;
    RangeResult rr = range_applies ? ParseRange(*range_header, size, &range) : RangeResult::kIgnore;
    if (rr == RangeResult::kUnsatisfiable) {
      Response bad = Response::Error(416, fmt::format("file has {} bytes", size));
      bad.headers.Add("Content-Range", fmt::format("bytes */{}", size));
      bad.headers.Add("Accept-Ranges", "bytes");
      return bad;
    }
    if (rr == RangeResult::kSatisfiable) {
      r.status = 206;
      first = range.first;
      length = range.length;
      r.headers.Add("Content-Range", fmt::format("bytes {}-{}/{}", first, first + length - 1, size));
    }
  }
  // For HEAD the server sends the head only; the body length still counts.
  r.file = FileBody{std::move(file.fd), first, length};
  return r;
}

}  // namespace canopy::http
