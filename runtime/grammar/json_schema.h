// JSON schema -> GBNF (llama.cpp's json-schema-to-grammar, the subset
// clients send), and the grammar of any JSON object (response_format
// json_object).
//
// Rules written (llama.cpp's primitives):
//   space    ::= | " " | "\n" [ \t]{0,20}     at most one newline and 20
//                                             indents between tokens: the
//                                             model cannot loop on spaces
//   string   ::= "\"" char* "\"" space
//   char     ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
//   number   ::= "-"? integral ("." [0-9]{1,16})? ([eE] [-+]? integral)? space
//   integral ::= [0] | [1-9] [0-9]{0,15}
//   integer  ::= "-"? integral space ; boolean, null; value: any JSON value
// Keywords: type (a name or a list of names), properties + required (keys
// in the schema's order, each optional one may be left out; the rest of
// the order is fixed), additionalProperties (false, true or a schema; not
// given: false when properties are, else any), items, minItems / maxItems,
// minLength / maxLength, enum, const, anyOf / oneOf, $ref to #/$defs/NAME or
// #/definitions/NAME (recursion allowed), an empty schema or true: any
// value. An object's keys with optional ones, p_1..p_n, are two chains of
// rules: head_i (nothing written yet) ::= kv_i tail_(i+1) [| head_(i+1) when
// p_i is optional], tail_i ::= "," space kv_i tail_(i+1) [or ("," space
// kv_i)? tail_(i+1) when optional], both ending in the additional keys.
// Unknown keywords (title, description, format, minimum, ...) are ignored,
// as llama.cpp ignores those it does not know; keywords whose meaning the
// grammar would silently break are refused (InvalidArgument naming the
// keyword and where it is): pattern, allOf, not, if/then/else,
// patternProperties, $ref elsewhere, a false schema.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/grammar/grammar.h"

namespace dpl::grammar {

// GBNF text whose rule "root" accepts exactly the JSON texts the schema
// describes (within the subset above).
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);
// Parsed.
absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema);

// Several schemas in one grammar, sharing the primitives above (the tools of
// tool_choice "required": each call's arguments follow its function's
// schema). Add gives the GBNF expression that accepts exactly that schema's
// JSON texts, its $refs resolved within it (errors as JsonSchemaToGbnf's);
// its rules are named after `hint` ("root" is taken), so no two schemas'
// rules clash, nor "root". Gbnf writes them all, with "root ::= " root_body
// (which uses the expressions).
class Converter;
class JsonSchemaRules {
 public:
  JsonSchemaRules();
  ~JsonSchemaRules();
  absl::StatusOr<std::string> Add(const nlohmann::ordered_json& schema, const std::string& hint);
  std::string Gbnf(absl::string_view root_body) const;

 private:
  std::unique_ptr<Converter> converter_;
};

// Any JSON object (response_format {"type": "json_object"}).
std::string JsonObjectGbnf();
// A string as a GBNF literal ("..." with escapes).
std::string GbnfLiteral(const std::string& bytes);
// A text as a GBNF token literal (<"..."> with escapes, grammar.h): the
// vocabulary's control token of that text where it has one, else the text.
std::string GbnfTokenLiteral(const std::string& text);

}  // namespace dpl::grammar
