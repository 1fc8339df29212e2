// The schema checker the tool tests rely on: it must accept what conforms and
// name what does not.
#include "tests/testing/json_schema.h"

#include <gtest/gtest.h>

namespace canopy::testing {
namespace {

using nlohmann::json;

const json kReport = json::parse(R"({
  "$defs": {"rate": {"type": "number", "minimum": 0}},
  "type": "object",
  "required": ["ok", "gbit_per_s"],
  "additionalProperties": false,
  "properties": {
    "ok": {"type": "boolean"},
    "gbit_per_s": {"$ref": "#/$defs/rate"},
    "mode": {"enum": ["send", "recv"]},
    "version": {"const": 1},
    "count": {"type": "integer", "maximum": 10},
    "samples": {"type": "array", "minItems": 1, "items": {"type": "number"}},
    "error": {"type": ["string", "null"]}
  }
})");

TEST(JsonSchemaTest, AcceptsConformingDocument) {
  json doc = {{"ok", true}, {"gbit_per_s", 9.5}, {"mode", "send"}, {"version", 1},
              {"count", 3.0}, {"samples", {1, 2.5}}, {"error", nullptr}};
  EXPECT_TRUE(JsonSchemaViolations(kReport, doc).empty());
}

TEST(JsonSchemaTest, NamesEachViolation) {
  json doc = {{"ok", "yes"}, {"mode", "both"}, {"version", 2}, {"count", 11},
              {"samples", json::array()}, {"extra", 1}};
  auto v = JsonSchemaViolations(kReport, doc);
  auto has = [&](const std::string& needle) {
    for (const auto& s : v)
      if (s.find(needle) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("missing required member \"gbit_per_s\"")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("/ok: expected type")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("/mode: \"both\" is not one of")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("/version: expected 1")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("/count: 11 is above the maximum")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("/samples: 0 items")) << ::testing::PrintToString(v);
  EXPECT_TRUE(has("unexpected member \"extra\"")) << ::testing::PrintToString(v);
}

TEST(JsonSchemaTest, RefAndIntegerAndOneOf) {
  EXPECT_FALSE(JsonSchemaViolations(kReport, json{{"ok", true}, {"gbit_per_s", -1}}).empty());
  EXPECT_FALSE(JsonSchemaViolations(kReport, json{{"ok", true}, {"gbit_per_s", 1}, {"count", 2.5}}).empty());
  json one_of = json::parse(R"({"oneOf": [
      {"type": "object", "required": ["ok"], "properties": {"ok": {"const": true}}},
      {"type": "object", "required": ["ok", "error"], "properties": {"ok": {"const": false}}}]})");
  EXPECT_TRUE(JsonSchemaViolations(one_of, json{{"ok", true}}).empty());
  EXPECT_TRUE(JsonSchemaViolations(one_of, json{{"ok", false}, {"error", "x"}}).empty());
  EXPECT_FALSE(JsonSchemaViolations(one_of, json{{"ok", false}}).empty());
  EXPECT_FALSE(JsonSchemaViolations(json{{"type", "float"}}, json(1.0)).empty());
}

TEST(JsonSchemaTest, ConformsRejectsTextThatIsNotOneDocument) {
  EXPECT_EQ(JsonConforms(kReport, " {\"ok\": true, \"gbit_per_s\": 1}\n"), "");
  EXPECT_NE(JsonConforms(kReport, "{\"ok\": true, \"gbit_per_s\": 1}\n{}"), "");
  EXPECT_NE(JsonConforms(kReport, "error: connection refused\n"), "");
  EXPECT_NE(JsonConforms(kReport, ""), "");
}

}  // namespace
}  // namespace canopy::testing
