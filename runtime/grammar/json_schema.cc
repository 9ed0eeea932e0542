#include "runtime/grammar/json_schema.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dpl::grammar {

namespace {

constexpr int kMaxSchemaDepth = 64;

constexpr const char* kPrimitives =
    "space ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "string ::= \"\\\"\" char* \"\\\"\" space\n"
    "integral ::= [0] | [1-9] [0-9]{0,15}\n"
    "number ::= \"-\"? integral (\".\" [0-9]{1,16})? ([eE] [-+]? integral)? space\n"
    "integer ::= \"-\"? integral space\n"
    "boolean ::= (\"true\" | \"false\") space\n"
    "null ::= \"null\" space\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" space (string \":\" space value (\",\" space string \":\" space value)*)? \"}\" space\n"
    "array ::= \"[\" space (value (\",\" space value)*)? \"]\" space\n";

}  // namespace

// Outside the anonymous namespace: JsonSchemaRules holds one.
class Converter {
 public:
  Converter() {
    for (const char* n : {"space", "char", "string", "integral", "number", "integer", "boolean", "null", "value",
                          "object", "array", "root"}) {
      names_.insert(n);
    }
  }

  // The GBNF expression of one more schema (its $refs resolved within it).
  absl::StatusOr<std::string> Add(const nlohmann::ordered_json& schema, const std::string& hint) {
    root_ = &schema;
    refs_.clear();  // "#/$defs/x" of another schema is another rule
    absl::StatusOr<std::string> expr = Visit(schema, hint, "#", 0);
    root_ = nullptr;
    return expr;
  }

  // Every rule so far, with "root ::= " root_body.
  std::string Gbnf(absl::string_view root_body) const {
    std::string out = absl::StrCat("root ::= ", root_body, "\n", kPrimitives);
    for (const auto& [name, body] : rules_) absl::StrAppend(&out, name, " ::= ", body, "\n");
    return out;
  }

 private:
  static absl::Status Error(const std::string& where, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("json schema at ", where, ": ", what));
  }

  std::string NewName(absl::string_view hint) {
    std::string base;
    for (char c : hint) {
      const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      base.push_back(word ? c : '-');
    }
    if (base.empty() || base.size() > 40) base = base.empty() ? "r" : base.substr(0, 40);
    std::string name = base;
    for (int i = 1; names_.contains(name); ++i) name = absl::StrCat(base, "-", i);
    names_.insert(name);
    return name;
  }
  std::string Define(absl::string_view hint, std::string body) {
    std::string name = NewName(hint);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  static absl::StatusOr<uint32_t> Count(const nlohmann::ordered_json& s, const char* key, const std::string& where) {
    const nlohmann::ordered_json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return Error(where, absl::StrCat("'", key, "' must be a non-negative integer"));
    if (v.get<int64_t>() > kMaxRepetition) {
      return Error(where, absl::StrCat("'", key, "' ", v.get<int64_t>(), " is above the supported ", kMaxRepetition));
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  // The bounds a schema gives with keys lo and hi (minLength / maxLength,
  // minItems / maxItems): 0 and UINT32_MAX where absent.
  static absl::StatusOr<std::pair<uint32_t, uint32_t>> Bounds(const nlohmann::ordered_json& s, const char* lo,
                                                              const char* hi, const std::string& where) {
    std::pair<uint32_t, uint32_t> b(0, UINT32_MAX);
    if (s.contains(lo)) {
      absl::StatusOr<uint32_t> v = Count(s, lo, where);
      if (!v.ok()) return v.status();
      b.first = *v;
    }
    if (s.contains(hi)) {
      absl::StatusOr<uint32_t> v = Count(s, hi, where);
      if (!v.ok()) return v.status();
      b.second = *v;
    }
    if (b.second < b.first) return Error(where, absl::StrCat("'", hi, "' is below '", lo, "'"));
    return b;
  }

  // x{min,max} as GBNF (max UINT32_MAX: unbounded).
  static std::string Rep(const std::string& x, uint32_t min, uint32_t max) {
    if (max == UINT32_MAX) return min == 0 ? absl::StrCat(x, "*") : absl::StrCat(x, "{", min, ",}");
    if (min == max) return absl::StrCat(x, "{", min, "}");
    return absl::StrCat(x, "{", min, ",", max, "}");
  }

  absl::StatusOr<std::string> Visit(const nlohmann::ordered_json& s, const std::string& hint, const std::string& where,
                                    int depth) {
    if (depth > kMaxSchemaDepth) return Error(where, absl::StrCat("nested deeper than ", kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("value");
      return Error(where, "a false schema (nothing matches it)");
    }
    if (!s.is_object()) return Error(where, "a schema must be an object or a boolean");
    for (const char* k : {"pattern", "allOf", "not", "if", "then", "else", "patternProperties", "prefixItems",
                          "dependentRequired", "dependentSchemas", "propertyNames", "contains", "uniqueItems"}) {
      if (s.contains(k) && !(std::string(k) == "uniqueItems" && s[k] == false)) {
        return Error(where, absl::StrCat("'", k, "' is not supported"));
      }
    }
    if (s.contains("$ref")) return Ref(s["$ref"], where, depth);
    if (s.contains("const")) return absl::StrCat(GbnfLiteral(s["const"].dump()), " space");
    if (s.contains("enum")) {
      const nlohmann::ordered_json& e = s["enum"];
      if (!e.is_array() || e.empty()) return Error(where, "'enum' must be a non-empty array");
      std::vector<std::string> alts;
      for (const auto& v : e) alts.push_back(GbnfLiteral(v.dump()));
      return absl::StrCat("(", absl::StrJoin(alts, " | "), ") space");
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const nlohmann::ordered_json& list = s[k];
      if (!list.is_array() || list.empty()) return Error(where, absl::StrCat("'", k, "' must be a non-empty array"));
      std::vector<std::string> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<std::string> a = Visit(list[i], absl::StrCat(hint, "-", i), absl::StrCat(where, "/", k, "/", i), depth + 1);
        if (!a.ok()) return a.status();
        alts.push_back(*a);
      }
      return Define(hint, absl::StrJoin(alts, " | "));
    }
    if (s.contains("type")) {
      const nlohmann::ordered_json& t = s["type"];
      if (t.is_array()) {
        if (t.empty()) return Error(where, "'type' is an empty list");
        std::vector<std::string> alts;
        for (const auto& name : t) {
          if (!name.is_string()) return Error(where, "'type' must name types");
          absl::StatusOr<std::string> a = Typed(s, name.get<std::string>(), hint, where, depth);
          if (!a.ok()) return a.status();
          alts.push_back(*a);
        }
        return Define(hint, absl::StrJoin(alts, " | "));
      }
      if (!t.is_string()) return Error(where, "'type' must be a string or a list of strings");
      return Typed(s, t.get<std::string>(), hint, where, depth);
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      return Typed(s, "object", hint, where, depth);
    }
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      return Typed(s, "array", hint, where, depth);
    }
    if (s.contains("minLength") || s.contains("maxLength")) return Typed(s, "string", hint, where, depth);
    return std::string("value");
  }

  absl::StatusOr<std::string> Ref(const nlohmann::ordered_json& ref, const std::string& where, int depth) {
    if (!ref.is_string()) return Error(where, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    auto known = refs_.find(r);
    if (known != refs_.end()) return known->second;
    std::string key, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (r.rfind(prefix, 0) == 0) {
        key = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = r.substr(std::string(prefix).size());
      }
    }
    if (key.empty() || name.empty() || name.find('/') != std::string::npos) {
      return Error(where, absl::StrCat("'$ref' \"", r, "\" is not supported (only #/$defs/NAME and #/definitions/NAME)"));
    }
    const nlohmann::ordered_json& root = *root_;
    if (!root.is_object() || !root.contains(key) || !root[key].is_object() || !root[key].contains(name)) {
      return Error(where, absl::StrCat("'$ref' \"", r, "\" names no definition"));
    }
    // Named before its body is visited: a recursive reference finds it.
    const std::string rule = NewName(absl::StrCat("def-", name));
    refs_[r] = rule;
    const size_t slot = rules_.size();
    rules_.emplace_back(rule, "");
    absl::StatusOr<std::string> body = Visit(root[key][name], rule, r, depth + 1);
    if (!body.ok()) return body.status();
    rules_[slot].second = *body;
    return rule;
  }

  absl::StatusOr<std::string> Typed(const nlohmann::ordered_json& s, const std::string& type, const std::string& hint,
                                    const std::string& where, int depth) {
    if (type == "null" || type == "boolean" || type == "number" || type == "integer") return type;
    if (type == "string") {
      if (!s.contains("minLength") && !s.contains("maxLength")) return std::string("string");
      absl::StatusOr<std::pair<uint32_t, uint32_t>> b = Bounds(s, "minLength", "maxLength", where);
      if (!b.ok()) return b.status();
      return Define(hint, absl::StrCat("\"\\\"\" ", Rep("char", b->first, b->second), " \"\\\"\" space"));
    }
    if (type == "array") {
      std::string item = "value";
      if (s.contains("items")) {
        if (s["items"].is_array()) return Error(where, "'items' as a list (a tuple) is not supported");
        absl::StatusOr<std::string> it = Visit(s["items"], absl::StrCat(hint, "-item"), absl::StrCat(where, "/items"), depth + 1);
        if (!it.ok()) return it.status();
        item = *it;
      }
      absl::StatusOr<std::pair<uint32_t, uint32_t>> b = Bounds(s, "minItems", "maxItems", where);
      if (!b.ok()) return b.status();
      const uint32_t min = b->first, max = b->second;
      const std::string more = absl::StrCat("(\",\" space ", item, ")");
      std::string body;
      if (max == 0) {
        body = "\"[\" space \"]\" space";
      } else if (min == 0) {
        body = absl::StrCat("\"[\" space (", item, " ", Rep(more, 0, max == UINT32_MAX ? max : max - 1),
                            ")? \"]\" space");
      } else {
        body = absl::StrCat("\"[\" space ", item, " ", Rep(more, min - 1, max == UINT32_MAX ? max : max - 1),
                            " \"]\" space");
      }
      return Define(hint, body);
    }
    if (type == "object") return Object(s, hint, where, depth);
    return Error(where, absl::StrCat("unknown type \"", type, "\""));
  }

  absl::StatusOr<std::string> Object(const nlohmann::ordered_json& s, const std::string& hint, const std::string& where,
                                     int depth) {
    const bool has_props = s.contains("properties");
    if (has_props && !s["properties"].is_object()) return Error(where, "'properties' must be an object");
    absl::flat_hash_set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(where, "'required' must be an array of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return Error(where, "'required' must be an array of names");
        if (!has_props || !s["properties"].contains(r.get<std::string>())) {
          return Error(where, absl::StrCat("'required' names \"", r.get<std::string>(), "\", which is not in 'properties'"));
        }
        required.insert(r.get<std::string>());
      }
    }
    // Additional keys: their value rule, or none.
    std::string additional;
    if (s.contains("additionalProperties")) {
      const nlohmann::ordered_json& a = s["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) additional = "value";
      } else {
        absl::StatusOr<std::string> v = Visit(a, absl::StrCat(hint, "-additional"), absl::StrCat(where, "/additionalProperties"), depth + 1);
        if (!v.ok()) return v.status();
        additional = *v;
      }
    } else if (!has_props) {
      additional = "value";
    }
    struct Prop {
      std::string kv;
      bool required;
    };
    std::vector<Prop> props;
    if (has_props) {
      for (const auto& [name, sub] : s["properties"].items()) {
        absl::StatusOr<std::string> v =
            Visit(sub, absl::StrCat(hint, "-", name), absl::StrCat(where, "/properties/", name), depth + 1);
        if (!v.ok()) return v.status();
        props.push_back({absl::StrCat(GbnfLiteral(nlohmann::ordered_json(name).dump()), " space \":\" space ", *v),
                         required.contains(name)});
      }
    }
    const std::string akv = additional.empty() ? "" : absl::StrCat("string \":\" space ", additional);
    // tail_i / head_i, from the end.
    std::string tail = akv.empty() ? "\"\"" : Define(absl::StrCat(hint, "-more"), absl::StrCat("(\",\" space ", akv, ")*"));
    std::string head =
        akv.empty() ? "\"\"" : Define(absl::StrCat(hint, "-rest"), absl::StrCat("(", akv, " (\",\" space ", akv, ")*)?"));
    for (size_t i = props.size(); i-- > 0;) {
      const Prop& p = props[i];
      const std::string kv = Define(absl::StrCat(hint, "-kv"), p.kv);
      const std::string new_head = p.required ? absl::StrCat(kv, " ", tail)
                                              : absl::StrCat(kv, " ", tail, " | ", head);
      const std::string new_tail = p.required ? absl::StrCat("\",\" space ", kv, " ", tail)
                                              : absl::StrCat("(\",\" space ", kv, ")? ", tail);
      head = Define(absl::StrCat(hint, "-h"), new_head);
      tail = Define(absl::StrCat(hint, "-t"), new_tail);
    }
    return Define(hint, absl::StrCat("\"{\" space ", head, " \"}\" space"));
  }

  const nlohmann::ordered_json* root_ = nullptr;  // the schema Add is converting
  absl::flat_hash_set<std::string> names_;
  std::vector<std::pair<std::string, std::string>> rules_;
  absl::flat_hash_map<std::string, std::string> refs_;
};

std::string GbnfLiteral(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02X", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

std::string GbnfTokenLiteral(const std::string& text) { return absl::StrCat("<", GbnfLiteral(text), ">"); }

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) {
  Converter c;
  absl::StatusOr<std::string> expr = c.Add(schema, "root");
  if (!expr.ok()) return expr.status();
  return c.Gbnf(*expr);
}

JsonSchemaRules::JsonSchemaRules() : converter_(std::make_unique<Converter>()) {}
JsonSchemaRules::~JsonSchemaRules() = default;

absl::StatusOr<std::string> JsonSchemaRules::Add(const nlohmann::ordered_json& schema, const std::string& hint) {
  return converter_->Add(schema, hint);
}

std::string JsonSchemaRules::Gbnf(absl::string_view root_body) const { return converter_->Gbnf(root_body); }

absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema) {
  absl::StatusOr<std::string> text = JsonSchemaToGbnf(schema);
  if (!text.ok()) return text.status();
  absl::StatusOr<Grammar> g = Grammar::Parse(*text);
  if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("json schema: ", g.status().message()));
  return g;
}

std::string JsonObjectGbnf() { return absl::StrCat("root ::= object\n", kPrimitives); }

}  // namespace dpl::grammar
