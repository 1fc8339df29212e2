#include "tests/testing/json_schema.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace canopy::testing {
namespace {

using nlohmann::json;

bool HasType(const json& value, const std::string& type, bool* known) {
  *known = true;
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer()) return true;
    // 3.0 is an integer in JSON Schema.
    return value.is_number_float() && value.get<double>() == static_cast<double>(static_cast<long long>(value.get<double>()));
  }
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  *known = false;
  return false;
}

class Checker {
 public:
  explicit Checker(const json& root) : root_(root) {}

  void Check(const json& schema, const json& value, const std::string& where, std::vector<std::string>* out) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) out->push_back(where + ": not allowed here");
      return;
    }
    if (!schema.is_object()) {
      out->push_back(where + ": schema is not an object");
      return;
    }
    if (auto ref = schema.find("$ref"); ref != schema.end()) {
      const std::string prefix = "#/$defs/";
      std::string name = ref->is_string() ? ref->get<std::string>() : "";
      if (name.rfind(prefix, 0) != 0 || !root_.contains("$defs") || !root_["$defs"].contains(name.substr(prefix.size()))) {
        out->push_back(where + ": unresolvable $ref " + ref->dump());
        return;
      }
      if (++depth_ > 64) {
        out->push_back(where + ": $ref nesting too deep");
        return;
      }
      Check(root_["$defs"][name.substr(prefix.size())], value, where, out);
      --depth_;
    }
    if (auto type = schema.find("type"); type != schema.end()) {
      std::vector<std::string> names;
      if (type->is_string()) names.push_back(type->get<std::string>());
      if (type->is_array())
        for (const auto& t : *type) names.push_back(t.is_string() ? t.get<std::string>() : t.dump());
      bool matched = false;
      for (const auto& name : names) {
        bool known = false;
        matched = HasType(value, name, &known) || matched;
        if (!known) out->push_back(where + ": schema names unknown type \"" + name + "\"");
      }
      if (!matched) {
        out->push_back(where + ": expected type " + type->dump() + ", got " + std::string(value.type_name()) + " " +
                       value.dump().substr(0, 80));
        return;  // the rest would only repeat the mismatch
      }
    }
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
      bool found = false;
      for (const auto& option : *e) found = found || option == value;
      if (!found) out->push_back(where + ": " + value.dump().substr(0, 80) + " is not one of " + e->dump());
    }
    if (auto c = schema.find("const"); c != schema.end() && *c != value)
      out->push_back(where + ": expected " + c->dump() + ", got " + value.dump().substr(0, 80));
    if (value.is_number()) {
      double v = value.get<double>();
      if (auto m = schema.find("minimum"); m != schema.end() && m->is_number() && v < m->get<double>())
        out->push_back(where + ": " + value.dump() + " is below the minimum " + m->dump());
      if (auto m = schema.find("maximum"); m != schema.end() && m->is_number() && v > m->get<double>())
        out->push_back(where + ": " + value.dump() + " is above the maximum " + m->dump());
    }
    if (value.is_object()) CheckObject(schema, value, where, out);
    if (value.is_array()) {
      if (auto m = schema.find("minItems"); m != schema.end() && m->is_number_unsigned() && value.size() < m->get<size_t>())
        out->push_back(where + ": " + std::to_string(value.size()) + " items, fewer than " + m->dump());
      if (auto items = schema.find("items"); items != schema.end())
        for (size_t i = 0; i < value.size(); ++i) Check(*items, value[i], where + "/" + std::to_string(i), out);
    }
    if (auto one = schema.find("oneOf"); one != schema.end() && one->is_array()) {
      int passing = 0;
      std::vector<std::string> all;
      for (const auto& option : *one) {
        std::vector<std::string> v;
        Check(option, value, where, &v);
        if (v.empty()) ++passing;
        all.insert(all.end(), v.begin(), v.end());
      }
      if (passing != 1) {
        out->push_back(where + ": matches " + std::to_string(passing) + " of the oneOf schemas, not exactly one");
        if (passing == 0) out->insert(out->end(), all.begin(), all.end());
      }
    }
    if (auto any = schema.find("anyOf"); any != schema.end() && any->is_array()) {
      std::vector<std::string> all;
      bool passed = false;
      for (const auto& option : *any) {
        std::vector<std::string> v;
        Check(option, value, where, &v);
        if (v.empty()) passed = true;
        all.insert(all.end(), v.begin(), v.end());
      }
      if (!passed) {
        out->push_back(where + ": matches none of the anyOf schemas");
        out->insert(out->end(), all.begin(), all.end());
      }
    }
  }

 private:
  void CheckObject(const json& schema, const json& value, const std::string& where, std::vector<std::string>* out) {
    if (auto req = schema.find("required"); req != schema.end() && req->is_array())
      for (const auto& key : *req)
        if (key.is_string() && !value.contains(key.get<std::string>()))
          out->push_back(where + ": missing required member \"" + key.get<std::string>() + "\"");
    const json* properties = nullptr;
    if (auto p = schema.find("properties"); p != schema.end() && p->is_object()) properties = &*p;
    bool closed = false;
    if (auto ap = schema.find("additionalProperties"); ap != schema.end() && ap->is_boolean()) closed = !ap->get<bool>();
    for (const auto& [key, member] : value.items()) {
      if (properties != nullptr && properties->contains(key)) {
        Check((*properties)[key], member, where + "/" + key, out);
      } else if (closed) {
        out->push_back(where + ": unexpected member \"" + key + "\"");
      }
    }
  }

  const json& root_;
  int depth_ = 0;
};

}  // namespace

std::vector<std::string> JsonSchemaViolations(const nlohmann::json& schema, const nlohmann::json& value) {
  std::vector<std::string> out;
  Checker(schema).Check(schema, value, "", &out);
  return out;
}

nlohmann::json LoadJsonSchema(const std::string& relative_path) {
  std::string path = std::string(CANOPY_SOURCE_DIR) + "/" + relative_path;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read schema " + path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    throw std::runtime_error("schema " + path + " does not parse: " + e.what());
  }
}

std::string JsonConforms(const nlohmann::json& schema, const std::string& text) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return std::string("not one JSON document: ") + e.what() + "\n--- output was:\n" + text.substr(0, 2000);
  }
  std::string report;
  for (const auto& v : JsonSchemaViolations(schema, value)) report += v + "\n";
  if (!report.empty()) report += "--- output was:\n" + text.substr(0, 2000);
  return report;
}

}  // namespace canopy::testing
