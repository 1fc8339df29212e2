// Which files one rcopy run copies, and where they go: the SRC arguments
// (several, and directory trees with recursive) mapped to destination paths
// relative to the server's root.
//
// Destinations:
//  - One SRC, not recursive (rcopy SRC HOST[:DST]): DST names the file; an
//    empty DST means the file name of SRC, and a DST ending in '/' gets that
//    name appended.
//  - Several SRCs, or recursive: DST is a directory ("" = the server's root);
//    a file SRC goes to DST/<its file name>, a directory SRC (recursive only)
//    to DST/<its name>/<path inside it>, or — when SRC ends in '/' or is
//    "." / ends in "/." (the contents, as rsync) — to DST/<path inside it>.
// Trees are walked in name order without following symlinks: symlinks,
// sockets, FIFOs and devices inside a tree are skipped (CopyPlan::skipped);
// empty directories are not recreated. A SRC named on the command line is
// taken as it is (a symlink to a file is followed when opened). The server
// still checks every destination (safe_path.h); nothing here is trusted.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace canopy::rcopy {

struct CopyItem {
  std::string source;       // local path to open
  std::string destination;  // relative to the server's root
  // Not OK: this item cannot be copied (a directory without recursive, a
  // directory that could not be read); the run reports it as failed.
  Status problem;
};

struct SkippedItem {
  std::string source;
  std::string reason;  // "symbolic link", "not a regular file"
};

struct CopyPlan {
  std::vector<CopyItem> items;  // in command-line order, trees in name order
  std::vector<SkippedItem> skipped;
  bool destination_is_directory = false;
};

// REQUIRES: !sources.empty(). `destination` is the DST part of HOST:DST
// (possibly empty).
CopyPlan PlanCopies(const std::vector<std::string>& sources, const std::string& destination, bool recursive);

}  // namespace canopy::rcopy
