// json_schema_check SCHEMA.json DOCUMENT.json — checks one JSON document
// against a schema with the same checker the unit tests use (json_schema.h),
// for tests written in shell (tests/bench_run_test.sh).
// Exit status: 0 conforms; 1 violations (printed, one per line); 2 bad usage
// or a file that cannot be read or parsed.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/testing/json_schema.h"

namespace {

bool ReadJson(const char* path, nlohmann::json* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "json_schema_check: cannot read %s\n", path);
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  *out = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    std::fprintf(stderr, "json_schema_check: %s is not valid JSON\n", path);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: json_schema_check SCHEMA.json DOCUMENT.json\n");
    return 2;
  }
  nlohmann::json schema, doc;
  if (!ReadJson(argv[1], &schema) || !ReadJson(argv[2], &doc)) return 2;
  const auto violations = canopy::testing::JsonSchemaViolations(schema, doc);
  for (const auto& v : violations) std::printf("%s: %s\n", argv[2], v.c_str());
  return violations.empty() ? 0 : 1;
}
