// Command-line edge helpers shared by the tools (get, load, rcopy, bench):
// what a tool does before, or instead of, a successful parse.
//
// Thread safety: pure functions, or writes to stdout/stderr only.
#pragma once

#include <string>
#include <string_view>

namespace canopy::cli {

// Exit status of a command line that cannot be used (every tool's convention:
// 0 success, 1 the operation failed, 2 bad usage).
inline constexpr int kExitUsage = 2;

// True when `flag` (e.g. "--json") is one of argv[1..] before a "--": known
// even when the rest of the command line does not parse, so that a tool asked
// for JSON can answer a usage error in JSON too.
bool CommandLineHas(int argc, char** argv, std::string_view flag);

// Reports a usage error of tool `tool` and returns kExitUsage. With `json`,
// one JSON object on stdout: {"ok": false, "tool": TOOL, "error": MESSAGE,
// "error_code": "usage", "usage": true}. Always "TOOL: MESSAGE (try --help)"
// on stderr.
int UsageError(std::string_view tool, const std::string& message, bool json);

}  // namespace canopy::cli
