// Keeping the rcopy server inside its root directory.
//
// A client names its destination with a relative path. SplitSafeRelativePath
// rejects anything that could leave the root by name (absolute paths, ".."
// components, NUL bytes, overlong names); OpenParentBeneath then walks the
// directory components from an open root descriptor with openat(O_NOFOLLOW)
// one component at a time, so a symlink anywhere on the way (for example a
// link in the root pointing outside) is refused rather than followed. The
// final component is never opened by name for writing: the server creates a
// temporary file next to it (O_CREAT|O_EXCL|O_NOFOLLOW) and renames it over
// the final name, which replaces a symlink there instead of writing through it.
//
// Thread safety: reentrant (no shared state; the root descriptor is only read).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/fd.h"
#include "base/result.h"

namespace canopy::rcopy {

struct SafeRelativePath {
  std::vector<std::string> directories;  // components leading to the file, may be empty
  std::string file;                      // the final component, never empty
  // "a/b/c" form without "." or empty components.
  std::string ToString() const;
};

// PermissionDenied for absolute paths and ".." components; InvalidArgument for
// empty names, names without a file component ("", ".", "a/"), NUL bytes,
// components over 255 bytes or paths over 4096 bytes. "." and empty components
// (a//b, ./a) are dropped.
Result<SafeRelativePath> SplitSafeRelativePath(std::string_view name);

// Opens the directory that will hold path.file, beneath root_fd, refusing to
// follow symlinks in any component (PermissionDenied naming the component).
// With create_missing, absent directories are created with mode 0755.
// NotFound when a directory is missing and create_missing is false.
Result<UniqueFd> OpenParentBeneath(int root_fd, const SafeRelativePath& path, bool create_missing);

// Opens `root` (resolved with realpath) as a directory descriptor.
Result<UniqueFd> OpenRootDirectory(const std::string& root);

}  // namespace canopy::rcopy
