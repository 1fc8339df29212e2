#include "tools/cli/cli.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace canopy::cli {

bool CommandLineHas(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == flag) return true;
  }
  return false;
}

int UsageError(std::string_view tool, const std::string& message, bool json) {
  if (json) {
    nlohmann::json j = {{"ok", false}, {"tool", tool}, {"error", message}, {"error_code", "usage"}, {"usage", true}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  std::fprintf(stderr, "%.*s: %s (try --help)\n", static_cast<int>(tool.size()), tool.data(), message.c_str());
  return kExitUsage;
}

}  // namespace canopy::cli
