// A small JSON Schema checker for the tools' --json output, so tests hold the
// tools to the schema files users read (tools/<tool>/<tool>.schema.json).
//
// Supported keywords (a subset of JSON Schema 2020-12, enough to pin down a
// report's shape): type (a name or a list of names: object, array, string,
// number, integer, boolean, null), required, properties,
// additionalProperties (boolean), items (one schema for every element),
// minItems, enum, const, minimum, maximum, oneOf, anyOf, and $ref to
// "#/$defs/<name>". Other keywords (title, description, $schema, $id, ...) are
// ignored. An unknown "type" name is an error of the schema, reported as a
// violation.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace canopy::testing {

// Returns every violation found, each as "<json pointer>: <what>"; empty
// means `value` conforms to `schema`.
std::vector<std::string> JsonSchemaViolations(const nlohmann::json& schema, const nlohmann::json& value);

// Reads and parses a schema file given relative to the source tree
// (CANOPY_SOURCE_DIR), e.g. "tools/rcopy/rcopy.schema.json". Throws
// std::runtime_error when it cannot be read or parsed (a broken test setup).
nlohmann::json LoadJsonSchema(const std::string& relative_path);

// For EXPECT_*: "" when `text` is exactly one JSON document (surrounding
// whitespace allowed) that conforms, else the parse error or the violations,
// one per line. Use as EXPECT_EQ(JsonConforms(schema, out), "").
std::string JsonConforms(const nlohmann::json& schema, const std::string& text);

}  // namespace canopy::testing
