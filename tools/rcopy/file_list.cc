#include "tools/rcopy/file_list.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "base/file.h"

namespace canopy::rcopy {
namespace {

namespace fs = std::filesystem;

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (name.empty()) return dir;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "dir/" "." "dir/.": copy what is inside, not the directory itself.
bool MeansContents(const std::string& source) {
  return source.back() == '/' || source == "." || EndsWith(source, "/.");
}

// The name a directory SRC gets on the server.
std::string DirectoryName(const std::string& source) {
  std::string trimmed = source;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::string name = BaseName(trimmed);
  if (name.empty() || name == "." || name == ".." || name == "/") {
    std::error_code ec;
    fs::path absolute = fs::absolute(trimmed, ec).lexically_normal();
    if (!ec) name = absolute.filename().string();
    if (name.empty() && !ec) name = absolute.parent_path().filename().string();
  }
  return name;
}

Status FsStatus(const std::error_code& ec, const std::string& what) { return ErrnoStatus(ec.value(), what); }

void Walk(const std::string& dir, const std::string& destination, CopyPlan* plan) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  std::vector<fs::directory_entry> entries;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) entries.push_back(*it);
  if (ec) {
    plan->items.push_back({dir, destination, FsStatus(ec, "read directory " + dir)});
    return;
  }
  std::sort(entries.begin(), entries.end(), [](const fs::directory_entry& a, const fs::directory_entry& b) {
    return a.path().filename().native() < b.path().filename().native();
  });
  for (const fs::directory_entry& entry : entries) {
    std::string name = entry.path().filename().string();
    std::string source = Join(dir, name);
    std::string target = Join(destination, name);
    fs::file_status st = entry.symlink_status(ec);
    if (ec) {
      plan->items.push_back({source, target, FsStatus(ec, "stat " + source)});
      ec.clear();
    } else if (fs::is_symlink(st)) {
      plan->skipped.push_back({source, "symbolic link"});
    } else if (fs::is_directory(st)) {
      Walk(source, target, plan);
    } else if (fs::is_regular_file(st)) {
      plan->items.push_back({source, target, Status::Ok()});
    } else {
      plan->skipped.push_back({source, "not a regular file"});
    }
  }
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(fs::status(path, ec));
}

Status DirectoryWithoutRecursive(const std::string& source) {
  return Status::InvalidArgument(source + " is a directory (use -r to copy a directory tree)");
}

}  // namespace

CopyPlan PlanCopies(const std::vector<std::string>& sources, const std::string& destination, bool recursive) {
  CopyPlan plan;
  if (sources.size() == 1 && !recursive) {
    const std::string& source = sources.front();
    std::string base = BaseName(source);
    CopyItem item{source, destination, Status::Ok()};
    if (destination.empty()) {
      item.destination = base;
    } else if (destination.back() == '/') {
      item.destination = destination + base;
    }
    if (IsDirectory(source)) item.problem = DirectoryWithoutRecursive(source);
    plan.items.push_back(std::move(item));
    return plan;
  }
  plan.destination_is_directory = true;
  std::string dir = destination;
  while (!dir.empty() && dir.back() == '/') dir.pop_back();
  for (const std::string& source : sources) {
    if (source.empty()) {
      plan.items.push_back({source, dir, Status::InvalidArgument("empty source name")});
      continue;
    }
    if (!IsDirectory(source)) {
      plan.items.push_back({source, Join(dir, BaseName(source)), Status::Ok()});
    } else if (!recursive) {
      plan.items.push_back({source, Join(dir, DirectoryName(source)), DirectoryWithoutRecursive(source)});
    } else {
      std::string walk_from = source;
      while (walk_from.size() > 1 && walk_from.back() == '/') walk_from.pop_back();
      Walk(walk_from, MeansContents(source) ? dir : Join(dir, DirectoryName(source)), &plan);
    }
  }
  return plan;
}

}  // namespace canopy::rcopy
