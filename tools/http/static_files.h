// StaticFileHandler: answers GET and HEAD with files below a root directory
// (the thttpd model), for use with Server.
//
// Path safety: the request path is percent-decoded once; a NUL byte or a bad
// escape is 400; "." and ".." segments are resolved textually and a ".." that
// would climb above the root is 403. The rest is opened relative to a
// descriptor of the root with openat2(RESOLVE_BENEATH), so the kernel refuses
// (403) any symlink that leads outside the root - relative or absolute - at
// the moment of the open, with no check-then-use race. Where openat2 is
// missing, the path is resolved with realpath(3), must lie inside
// realpath(root), and is opened with O_NOFOLLOW. Only regular, world-readable files are served (so a
// server running as root still honours file permissions, like thttpd); other
// files are 403, missing ones 404. A directory path without a trailing '/'
// is redirected (301); with one, its index.html is served, else 403 (no
// listings).
//
// Responses carry Content-Type (by extension), Last-Modified, a strong ETag
// (size + mtime) and Accept-Ranges: bytes. If-None-Match / If-Modified-Since
// (exact match) give 304. A single Range gives 206 with Content-Range, an
// unsatisfiable one 416 with "Content-Range: bytes */size"; several ranges or
// a stale If-Range give the whole file (200). Other methods: 405 with
// "Allow: GET, HEAD".
//
// Thread safety: Handle() may run on several threads at once (it only reads
// immutable members and opens files).
#pragma once

#include <memory>
#include <string>

#include "base/fd.h"
#include "base/result.h"
#include "tools/http/server.h"

namespace canopy::http {

class StaticFileHandler : public Handler {
 public:
  // NotFound / InvalidArgument when `root` is missing or not a directory.
  static Result<std::unique_ptr<StaticFileHandler>> Create(const std::string& root);

  Response Handle(const Request& request) override;

  // The canonical (realpath) root.
  const std::string& root() const { return root_; }

 private:
  struct Opened;
  StaticFileHandler(std::string root, UniqueFd root_fd) : root_(std::move(root)), root_fd_(std::move(root_fd)) {}
  // Opens root/<relative> (already normalised, no ".." left) safely.
  // On failure returns the HTTP status to answer.
  int OpenBelowRoot(const std::string& relative, Opened* out) const;

  std::string root_;
  UniqueFd root_fd_;
};

}  // namespace canopy::http
