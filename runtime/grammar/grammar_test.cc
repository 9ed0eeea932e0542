// GBNF parsing and its errors, JSON schema -> grammar keyword by keyword,
// the matcher byte by byte, and the mask against a brute-force simulation of
// every token on a small vocabulary.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"

namespace dpl::grammar {
namespace {

std::shared_ptr<const Grammar> G(const std::string& text) {
  absl::StatusOr<Grammar> g = Grammar::Parse(text);
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  return std::make_shared<const Grammar>(*std::move(g));
}

std::shared_ptr<const Grammar> Schema(const std::string& schema) {
  absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(schema));
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  return std::make_shared<const Grammar>(*std::move(g));
}

// Whether the grammar accepts the whole text (and may end there).
bool Full(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.Accept(text).ok() && m.IsComplete();
}
// Whether the text is a prefix of some sentence.
bool Prefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.Accept(text).ok();
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Grammar> g = Grammar::Parse(text);
  REQUIRE_FALSE(g.ok());
  return std::string(g.status().message());
}

TEST_CASE("GBNF: literals, classes, alternatives, groups, repetitions") {
  auto g = G(R"(root ::= "a" [b-d]+ ("x" | "yz")? tail # comment
tail ::= [^0-9]{2,3} .)");
  CHECK(Full(g, "abXY!"));
  CHECK(Full(g, "adcbxQRS?"));
  CHECK(Full(g, "abyz\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));  // é € 😀: code points, not bytes
  CHECK_FALSE(Full(g, "aXY!"));                                  // + needs one
  CHECK_FALSE(Full(g, "ab12!"));                                 // negated class
  CHECK_FALSE(Full(g, "abXYZW!"));                               // {2,3} then one more: 4 + 1 too many
  CHECK(Full(g, "abXYZ!"));
  CHECK_FALSE(Full(g, "abXY"));                                  // the "." missing
  CHECK(Prefix(g, "abXY"));

  auto rep = G("root ::= \"a\"{3} \"b\"{0,2} \"c\"{2,}");
  CHECK(Full(rep, "aaacc"));
  CHECK(Full(rep, "aaabbccccc"));
  CHECK_FALSE(Full(rep, "aacc"));
  CHECK_FALSE(Full(rep, "aaabbbcc"));
  CHECK_FALSE(Full(rep, "aaabc"));

  // Escapes and multi-line rules inside parentheses.
  auto esc = G("root ::= (\n  \"\\x41\\u00e9\\n\"\n  | [\\]\\\\]\n)");
  CHECK(Full(esc, "A\xC3\xA9\n"));
  CHECK(Full(esc, "]"));
  CHECK(Full(esc, "\\"));
  CHECK_FALSE(Full(esc, "A"));

  // An empty alternative, recursion (not left), a reference before its definition.
  auto rec = G("root ::= item\nitem ::= \"(\" item \")\" | \"\"");
  CHECK(Full(rec, ""));
  CHECK(Full(rec, "((()))"));
  CHECK_FALSE(Full(rec, "(()"));
  CHECK(Prefix(rec, "(()"));
  CHECK_FALSE(Prefix(rec, "())"));
}

TEST_CASE("GBNF errors name the line and column") {
  CHECK(ErrorOf("root ::= foo") == "grammar: line 1, column 10: undefined rule 'foo'");
  CHECK(ErrorOf("a ::= \"x\"") == "grammar: no 'root' rule");
  CHECK(ErrorOf("root ::= \"x\"\nroot ::= \"y\"") == "grammar: line 2, column 1: rule 'root' is defined twice");
  CHECK(ErrorOf("root ::= \"abc") == "grammar: line 1, column 10: unterminated literal");
  CHECK(ErrorOf("root ::= [abc") == "grammar: line 1, column 10: unterminated character class");
  CHECK(ErrorOf("root ::= (\"a\"") == "grammar: line 1, column 14: expected ')'");
  CHECK(ErrorOf("root := \"a\"") == "grammar: line 1, column 6: expected '::='");
  CHECK(ErrorOf("root ::= * \"a\"") == "grammar: line 1, column 10: '*' without a symbol before it");
  CHECK(ErrorOf("root ::= \"a\"{3,1}") == "grammar: line 1, column 13: a repetition {m,n} with n < m");
  CHECK(ErrorOf("root ::= \"a\"{99999}").find("a repetition count above 10000") != std::string::npos);
  CHECK(ErrorOf("root ::= [z-a]") == "grammar: line 1, column 10: a character range whose end is before its start");
  CHECK(ErrorOf("root ::= \"\\q\"") == "grammar: line 1, column 11: unknown escape '\\q'");
  CHECK(ErrorOf("root ::= \"a\" )") == "grammar: line 1, column 14: unexpected ')'");
  // Left recursion, direct, through another rule, and through a nullable rule.
  CHECK(ErrorOf("root ::= root \"a\" | \"b\"").find("rule 'root' is left-recursive") != std::string::npos);
  CHECK(ErrorOf("root ::= a\na ::= b \"x\"\nb ::= a | \"y\"").find("is left-recursive") != std::string::npos);
  CHECK(ErrorOf("root ::= e root \"x\" | \"y\"\ne ::= \"\" | \"z\"").find("is left-recursive") != std::string::npos);
  CHECK(ErrorOf("root ::= (root)* \"x\"").find("is left-recursive") != std::string::npos);
  // Size limits.
  std::string deep = "root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')');
  CHECK(ErrorOf(deep).find("parentheses nested deeper than 64") != std::string::npos);
  CHECK(ErrorOf("root ::= \"" + std::string(300, 'x') + "\"{10000}").find("exceed") != std::string::npos);
}

TEST_CASE("matcher: JSON byte by byte") {
  auto g = G(JsonObjectGbnf());
  for (const char* ok : {R"({})", R"({"a": 1})", R"({"a":-0.5e10,"b":[true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"]})",
                         "{\"n\":{\"m\":{\"k\":[[],[{}]]}}}", "{\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\": 0}",
                         "{\n  \"a\": 1,\n  \"b\": 2\n}", R"({"x": 12.25E-3, "y": 0, "z": -7})"}) {
    CHECK_MESSAGE(Full(g, ok), ok);
  }
  for (const char* bad : {R"([])", R"({"a" 1})", R"({"a": 01})", R"({"a": -})", R"({"a": 1.})", R"({"a": .5})",
                          R"({"a": 1e})", R"({"a": "\x"})", R"({"a": "\u12g4"})", R"({"a": tru})", R"({"a": 1,})",
                          "{\"a\": \"\x01\"}", "{\"a\": \"\xC0\xAF\"}", "{\"a\": \"\xED\xA0\x80\"}",
                          "{\"a\": \"\xE4\xB8\"}", "{\"a\": \"\x80\"}", R"({"a": 1} x)", "{\n\n\"a\": 1}"}) {
    CHECK_MESSAGE(!Full(g, bad), bad);
  }
  // Byte by byte: the first rejected byte is where the text stops being JSON.
  struct Case {
    std::string text;
    size_t bad_at;
  };
  for (const Case& c : std::vector<Case>{{R"({"a": 1.5e+3x)", 12}, {R"({"a": [1, 2}])", 11}, {"{\"\xE2\x82\x41", 4},
                                         {R"({"k": "v"]})", 9}, {"{ \"a\"  :1}", 6}, {R"({"a":-0.5e10})", 13}}) {
    Matcher m(g);
    size_t i = 0;
    for (; i < c.text.size(); ++i) {
      if (!m.Accept(c.text.substr(i, 1)).ok()) break;
    }
    CHECK_MESSAGE(i == c.bad_at, c.text);
  }
  // A multibyte character split across Accept calls, and the state kept on a rejection.
  Matcher m(g);
  REQUIRE(m.Accept("{\"\xE2").ok());
  CHECK_FALSE(m.IsComplete());
  REQUIRE(m.Accept("\x82").ok());
  CHECK_FALSE(m.Accept("}").ok());  // inside a character: rejected, state kept
  REQUIRE(m.Accept("\xAC\":\"").ok());
  CHECK(m.Accept("v\"}").ok());
  CHECK(m.IsComplete());
  CHECK(m.Accept(" ").ok());  // one space allowed after a value, not two
  CHECK_FALSE(m.Accept(" ").ok());
}

TEST_CASE("json schema: each keyword") {
  SUBCASE("types") {
    CHECK(Full(Schema(R"({"type": "string"})"), R"("hi")"));
    CHECK_FALSE(Full(Schema(R"({"type": "string"})"), "1"));
    CHECK(Full(Schema(R"({"type": "integer"})"), "-42"));
    CHECK_FALSE(Full(Schema(R"({"type": "integer"})"), "4.2"));
    CHECK(Full(Schema(R"({"type": "number"})"), "-0.5e10"));
    CHECK(Full(Schema(R"({"type": "boolean"})"), "false"));
    CHECK(Full(Schema(R"({"type": "null"})"), "null"));
    CHECK(Full(Schema(R"({"type": ["integer", "null"]})"), "null"));
    CHECK(Full(Schema(R"({"type": ["integer", "null"]})"), "3"));
    CHECK_FALSE(Full(Schema(R"({"type": ["integer", "null"]})"), "\"3\""));
    CHECK(Full(Schema(R"({})"), R"([{"any": "thing"}, 1])"));
    CHECK(Full(Schema(R"(true)"), "1"));
  }
  SUBCASE("properties, required, order, additionalProperties") {
    auto s = Schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]})");
    CHECK(Full(s, R"({"name": "x"})"));
    CHECK(Full(s, R"({"name": "x", "age": 3})"));
    CHECK(Full(s, R"({"name": "x", "tags": ["a", "b"]})"));
    CHECK(Full(s, R"({"name": "x", "age": 3, "tags": []})"));
    CHECK_FALSE(Full(s, R"({"age": 3})"));               // required missing
    CHECK_FALSE(Full(s, R"({"age": 3, "name": "x"})"));  // schema order
    CHECK_FALSE(Full(s, R"({"name": "x", "other": 1})"));  // no additional keys when properties are given
    CHECK_FALSE(Full(s, R"({"name": 1})"));
    CHECK_FALSE(Full(s, R"({"name": "x",})"));
    auto opt = Schema(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})");
    CHECK(Full(opt, "{}"));
    CHECK(Full(opt, R"({"b": 2})"));
    CHECK(Full(opt, R"({"a": 1, "b": 2})"));
    CHECK_FALSE(Full(opt, R"({, "b": 2})"));
    auto more = Schema(R"({"properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": {"type": "boolean"}})");
    CHECK(Full(more, R"({"a": 1, "x": true, "y": false})"));
    CHECK_FALSE(Full(more, R"({"a": 1, "x": 2})"));
    auto any = Schema(R"({"type": "object"})");
    CHECK(Full(any, R"({"x": [1, {"y": null}]})"));
    auto closed = Schema(R"({"type": "object", "additionalProperties": false})");
    CHECK(Full(closed, "{}"));
    CHECK_FALSE(Full(closed, R"({"x": 1})"));
    auto open = Schema(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": true})");
    CHECK(Full(open, R"({"a": 1, "b": "c"})"));
    CHECK(Full(open, R"({"b": "c"})"));
  }
  SUBCASE("items, minItems, maxItems") {
    auto s = Schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
    CHECK_FALSE(Full(s, "[]"));
    CHECK(Full(s, "[1]"));
    CHECK(Full(s, "[1, 2, 3]"));
    CHECK_FALSE(Full(s, "[1, 2, 3, 4]"));
    CHECK_FALSE(Full(s, "[\"a\"]"));
    CHECK(Full(Schema(R"({"type": "array", "maxItems": 0})"), "[]"));
    CHECK(Full(Schema(R"({"type": "array", "minItems": 2})"), "[1, \"x\", {}]"));
    CHECK_FALSE(Full(Schema(R"({"type": "array", "minItems": 2})"), "[1]"));
  }
  SUBCASE("minLength, maxLength") {
    auto s = Schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
    CHECK_FALSE(Full(s, R"("a")"));
    CHECK(Full(s, R"("ab")"));
    CHECK(Full(s, "\"a\xC3\xA9\\n\""));  // characters, not bytes: a é \n
    CHECK_FALSE(Full(s, R"("abcd")"));
  }
  SUBCASE("enum, const, anyOf, oneOf") {
    auto e = Schema(R"({"enum": ["red", 1, null, {"k": [true]}]})");
    CHECK(Full(e, R"("red")"));
    CHECK(Full(e, "1"));
    CHECK(Full(e, "null"));
    CHECK(Full(e, R"({"k":[true]})"));
    CHECK_FALSE(Full(e, R"("blue")"));
    CHECK(Full(Schema(R"({"const": "a\"b"})"), R"("a\"b")"));
    CHECK_FALSE(Full(Schema(R"({"const": "ab"})"), R"("ac")"));
    auto any = Schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
    CHECK(Full(any, "5"));
    CHECK(Full(any, R"("x")"));
    CHECK_FALSE(Full(any, R"("xy")"));
    CHECK(Full(Schema(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})"), "null"));
  }
  SUBCASE("$ref, recursive") {
    auto s = Schema(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
                      "$ref": "#/$defs/node"})");
    CHECK(Full(s, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
    CHECK_FALSE(Full(s, R"({"v": 1, "kids": [{"w": 2}]})"));
    auto d = Schema(R"({"definitions": {"c": {"enum": ["a", "b"]}}, "properties": {"x": {"$ref": "#/definitions/c"}}})");
    CHECK(Full(d, R"({"x": "b"})"));
  }
  SUBCASE("unknown keywords ignored, unsupported ones refused") {
    CHECK(Full(Schema(R"({"type": "string", "title": "t", "description": "d", "format": "date", "x-foo": 1})"), R"("z")"));
    auto err = [](const std::string& s) {
      absl::StatusOr<Grammar> g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(s));
      REQUIRE_FALSE(g.ok());
      return std::string(g.status().message());
    };
    CHECK(err(R"({"type": "string", "pattern": "^a"})") == "json schema at #: 'pattern' is not supported");
    CHECK(err(R"({"properties": {"a": {"allOf": []}}})") == "json schema at #/properties/a: 'allOf' is not supported");
    CHECK(err(R"({"$ref": "http://x/y"})").find("is not supported (only #/$defs/NAME") != std::string::npos);
    CHECK(err(R"({"$ref": "#/$defs/missing"})") == "json schema at #: '$ref' \"#/$defs/missing\" names no definition");
    CHECK(err(R"({"type": "strin"})") == "json schema at #: unknown type \"strin\"");
    CHECK(err(R"({"type": "string", "maxLength": 100000})").find("above the supported 10000") != std::string::npos);
    CHECK(err(R"({"type": "array", "minItems": 3, "maxItems": 2})") == "json schema at #: 'maxItems' is below 'minItems'");
    CHECK(err(R"({"properties": {"a": {}}, "required": ["b"]})").find("'required' names \"b\"") != std::string::npos);
    CHECK(err(R"(false)").find("a false schema") != std::string::npos);
    CHECK(err("3") == "json schema at #: a schema must be an object or a boolean");
    nlohmann::ordered_json deep = {{"type", "string"}};
    for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
    CHECK(err(deep.dump()).find("nested deeper than 64") != std::string::npos);
  }
}

// Several schemas in one grammar (tool_choice "required"): each keeps its
// own $defs, though both name theirs "v", and the rules of neither clash
// with "root" or with the other's.
TEST_CASE("json schema rules: several schemas in one grammar") {
  JsonSchemaRules rules;
  const auto a = nlohmann::ordered_json::parse(R"({"$defs": {"v": {"type": "integer"}}, "type": "object",
      "properties": {"root": {"$ref": "#/$defs/v"}}, "required": ["root"]})");
  const auto b = nlohmann::ordered_json::parse(R"({"$defs": {"v": {"type": "boolean"}}, "$ref": "#/$defs/v"})");
  absl::StatusOr<std::string> ea = rules.Add(a, "args");
  absl::StatusOr<std::string> eb = rules.Add(b, "args");
  REQUIRE((ea.ok() && eb.ok()));
  CHECK(*ea != *eb);
  const auto g = G(rules.Gbnf(absl::StrCat("\"a=\" ", *ea, " | \"b=\" ", *eb)));
  CHECK(Full(g, R"(a={"root": 3})"));
  CHECK(Full(g, "b=true"));
  CHECK(!Full(g, R"(a={"root": true})"));
  CHECK(!Full(g, "b=3"));
  const auto bad = nlohmann::ordered_json::parse(R"({"$ref": "#/$defs/v"})");  // b's $defs are not its
  CHECK(rules.Add(bad, "args").status().message() == "json schema at #: '$ref' \"#/$defs/v\" names no definition");
}

// Brute force: token t is allowed iff a fresh matcher (no cache shared)
// accepts the text so far and then t.
std::vector<uint32_t> BruteMask(const std::shared_ptr<const Grammar>& g, const std::string& history,
                                const Vocabulary& v) {
  std::vector<uint32_t> bits(v.mask_words(), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    Matcher fresh(g);
    REQUIRE(fresh.Accept(history).ok());
    if (fresh.AcceptToken(v, id).ok()) bits[id >> 5] |= 1u << (id & 31);
  }
  return bits;
}

TEST_CASE("json schema: whitespace between values is bounded and keeps the stacks few") {
  // The states a random-weight model visits most (runs of spaces and tabs,
  // grammar_bench): one state a whitespace character, a few stacks each.
  auto g = Schema(R"({"type": "array", "items": {"type": "integer"}})");
  Matcher m(g);
  REQUIRE(m.Accept("[0\n").ok());
  for (int i = 0; i < 20; ++i) {
    REQUIRE(m.Accept(i % 3 == 2 ? "\t" : " ").ok());
    CHECK(m.n_stacks() <= 4);
  }
  CHECK_FALSE(m.Accept(" ").ok());   // a 21st indent
  CHECK_FALSE(m.Accept("\n").ok());  // a second newline
  CHECK(m.Accept(",-1 ]").ok());
  CHECK(m.IsComplete());
  CHECK(Full(g, "[ 1]"));
  CHECK_FALSE(Full(g, "[  1]"));  // at most one space where no newline comes
}

TEST_CASE("vocabulary trie: long shared prefixes, NUL bytes, equal texts") {
  // The trie's sort compares 8-byte keys first: texts equal in their first 8
  // bytes, or differing only by trailing NULs, must still sort by bytes.
  std::vector<std::string> pieces = {"abcdefgh", "abcdefghi", std::string("abcdefgh\0", 9),
                                     std::string("abcdefgh\0x", 10), "a", std::string("a\0", 2), "", "ab", "ab",
                                     "abcdefghij", "abcdefgha", "b", std::string("\0", 1), "abcdefgh"};
  std::vector<TokenKind> kinds(pieces.size(), TokenKind::kText);
  Vocabulary v(pieces, kinds);
  std::set<std::string> prefixes;
  for (const std::string& p : pieces) {
    for (size_t n = 1; n <= p.size(); ++n) prefixes.insert(p.substr(0, n));
  }
  CHECK(v.n_nodes() == prefixes.size() + 1);  // one node a distinct prefix, and the root
  for (const char* text : {"root ::= [\\x00-\\x7F]*", "root ::= \"abcdefgh\" [i\\x00] .*", "root ::= \"a\" [^b]*"}) {
    auto g = G(text);
    for (const std::string history : {"", "a"}) {
      Matcher m(g);
      if (!m.Accept(history).ok()) continue;
      std::vector<uint32_t> bits(v.mask_words());
      m.FillMask(v, absl::MakeSpan(bits));
      CHECK_MESSAGE(bits == BruteMask(g, history, v), text, " after '", history, "'");
    }
  }
}

TEST_CASE("mask equals a brute-force simulation of every token (small vocabulary)") {
  std::vector<std::string> pieces = {"{", "}", "\"", "\":", ",", " ", "\n", "  ", "{\"", "\"}", "a", "name", "age",
                                     "1", "0", "-", ".", "5", "e", "10", "true", "tr", "ue", "null", "[", "]", "\\",
                                     "n", "u", "00", "e9", "\xC3", "\xA9", "\xC3\xA9", "\xE4\xB8\xAD", "\xE4", "\xB8\xAD",
                                     "\xF0\x9F", "\x98\x80", "", "<eos>", "<ctl>", "\": \"", "\", \"", "x\"", "\x01"};
  std::vector<TokenKind> kinds(pieces.size(), TokenKind::kText);
  kinds[40] = TokenKind::kEndOfGeneration;
  kinds[41] = TokenKind::kNever;
  Vocabulary v(pieces, kinds);
  auto g = Schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "number"},
                     "ok": {"type": "boolean"}}, "required": ["name"]})");
  std::mt19937 rng(7);
  int checked = 0, ended = 0;
  for (int run = 0; run < 60; ++run) {
    Matcher m(g);
    std::string history;
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> bits(v.mask_words());
      const int32_t n = m.FillMask(v, absl::MakeSpan(bits));
      const std::vector<uint32_t> brute = BruteMask(g, history, v);
      REQUIRE(bits == brute);
      ++checked;
      CHECK((bits[41 >> 5] >> (41 & 31) & 1) == 0);  // special: never
      CHECK((bits[39 >> 5] >> (39 & 31) & 1) == 0);  // empty text: never
      CHECK(((bits[40 >> 5] >> (40 & 31)) & 1) == (m.IsComplete() ? 1u : 0u));
      if (n == 0) break;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v.size(); ++id) {
        if (bits[id >> 5] >> (id & 31) & 1) allowed.push_back(id);
      }
      REQUIRE(static_cast<int32_t>(allowed.size()) == n);
      const int32_t pick = allowed[rng() % allowed.size()];
      REQUIRE(m.AcceptToken(v, pick).ok());
      if (v.kind(pick) == TokenKind::kText) history += v.piece(pick);
      if (m.ended()) {
        ++ended;
        break;
      }
    }
  }
  CHECK(checked > 200);
  CHECK(ended > 0);
}

}  // namespace
}  // namespace dpl::grammar

namespace dpl::grammar {
namespace {

TEST_CASE("GBNF token literals: <text> and <\"text\">, their errors, and text without a vocabulary") {
  // llama.cpp's form (the brackets are the text's), and any text quoted.
  auto g = G(R"(root ::= <think> [a-z]* </think> <"[TOOL_CALLS]"> ("x" <"[TOOL_CALLS]">)*)");
  CHECK(g->token_texts() == std::vector<std::string>{"<think>", "</think>", "[TOOL_CALLS]"});  // each once
  CHECK(g->ToString().find("<\"[TOOL_CALLS]\">") != std::string::npos);
  // Without a vocabulary a token literal is its text.
  CHECK(Full(g, "<think>ab</think>[TOOL_CALLS]"));
  CHECK(Full(g, "<think></think>[TOOL_CALLS]x[TOOL_CALLS]x[TOOL_CALLS]"));
  CHECK_FALSE(Full(g, "<think></think>"));
  auto esc = G("root ::= <\"\\x41\\u00e9\\\"\">");
  CHECK(esc->token_texts() == std::vector<std::string>{"A\xC3\xA9\""});
  CHECK(Full(esc, "A\xC3\xA9\""));
  // A literal reached first through nothing but token rules: not left recursion.
  CHECK(Full(G("root ::= <a> root | \"b\""), "<a><a>b"));

  CHECK(ErrorOf("root ::= <[12]>").find("token ids (<[N]>) are not supported") != std::string::npos);
  CHECK(ErrorOf("root ::= !<a>") == "grammar: line 1, column 10: negated tokens (!<...>) are not supported");
  CHECK(ErrorOf("root ::= <abc").find("unterminated token literal") != std::string::npos);
  CHECK(ErrorOf("root ::= <abc\n>").find("unterminated token literal") != std::string::npos);
  CHECK(ErrorOf("root ::= <\"\">") == "grammar: line 1, column 10: an empty token literal");
  CHECK(ErrorOf("root ::= <\"a\" >").find("expected '>'") != std::string::npos);
  CHECK(ErrorOf("root ::= <\"a") == "grammar: line 1, column 10: unterminated token literal");
}

// A small vocabulary with control tokens: [TOOL_CALLS], <|im_start|>, and
// pieces that spell both; <|im_end|> ends the generation.
struct ControlVocab {
  std::vector<std::string> pieces = {"[",  "TOOL", "_C", "ALLS", "]", "\"", "a",  "<|", "im", "_start", "|>", "x",
                                     "[TOOL_CALLS]", "<|im_start|>", "<|im_end|>", "[TOOL", "_CALLS]", ", ", "\"a", "a\""};
  static constexpr int32_t kCalls = 12, kImStart = 13, kEnd = 14, kTextCalls = 15;
  std::vector<TokenKind> kinds;
  ControlVocab() {
    kinds.assign(pieces.size(), TokenKind::kText);
    kinds[kCalls] = TokenKind::kControl;
    kinds[kImStart] = TokenKind::kControl;
    kinds[kEnd] = TokenKind::kEndOfGeneration;
  }
};

bool Has(const std::vector<uint32_t>& bits, int32_t id) { return (bits[id >> 5] >> (id & 31)) & 1; }

// Brute force by tokens: t is allowed iff a fresh matcher with the
// vocabulary accepts the tokens so far and then t.
std::vector<uint32_t> BruteTokenMask(const std::shared_ptr<const Grammar>& g, const std::vector<int32_t>& history,
                                     const Vocabulary& v) {
  std::vector<uint32_t> bits(v.mask_words(), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    Matcher fresh(g, &v);
    for (int32_t h : history) REQUIRE(fresh.AcceptToken(v, h).ok());
    if (fresh.AcceptToken(v, id).ok()) bits[id >> 5] |= 1u << (id & 31);
  }
  return bits;
}

TEST_CASE("a control token is allowed exactly where a token literal names it, never as text") {
  const ControlVocab cv;
  const Vocabulary v(cv.pieces, cv.kinds);
  CHECK(v.FindControl("[TOOL_CALLS]") == ControlVocab::kCalls);
  CHECK(v.FindControl("<|im_end|>") == -1);  // an end-of-generation token, not a control one
  CHECK(v.FindControl("[") == -1);
  // The marker as a token literal, then a JSON-like string whose class
  // takes any text (the markers' included), then the marker as plain text.
  auto g = G(R"(root ::= <"[TOOL_CALLS]"> "\"" [^"]* "\"" ("[TOOL_CALLS]" | ", " <"[TOOL_CALLS]">)?)");
  Matcher m(g, &v);
  std::vector<uint32_t> bits(v.mask_words());
  // At the literal: that control token alone (its text is not spelled out).
  CHECK(m.FillMask(v, absl::MakeSpan(bits)) == 1);
  CHECK(Has(bits, ControlVocab::kCalls));
  CHECK(m.Allows(v, ControlVocab::kCalls));
  CHECK_FALSE(m.Allows(v, 0));                      // "[": the text is no longer an alternative
  CHECK_FALSE(m.Allows(v, ControlVocab::kImStart));  // another control token
  CHECK_FALSE(Matcher(g, &v).Accept("[TOOL_CALLS]").ok());
  CHECK_FALSE(m.AcceptToken(v, ControlVocab::kImStart).ok());
  REQUIRE(m.AcceptToken(v, ControlVocab::kCalls).ok());
  REQUIRE(m.AcceptToken(v, 5).ok());  // "\""
  // Inside the string: every text piece, no control token, though [^"]
  // takes their texts.
  const int32_t n = m.FillMask(v, absl::MakeSpan(bits));
  CHECK_FALSE(Has(bits, ControlVocab::kCalls));
  CHECK_FALSE(Has(bits, ControlVocab::kImStart));
  CHECK(Has(bits, 15));  // "[TOOL": text
  CHECK(n == 16);        // all but the two control tokens, the end and "\"a"
  CHECK_FALSE(m.AcceptToken(v, ControlVocab::kCalls).ok());
  REQUIRE(m.Accept("[TOOL_CALLS]<|im_start|>\"").ok());  // the texts, as plain pieces
  // After the string: the plain literal "[TOOL_CALLS]" is text (its pieces),
  // the control token only after ", ".
  m.FillMask(v, absl::MakeSpan(bits));
  CHECK(Has(bits, 0));
  CHECK(Has(bits, ControlVocab::kTextCalls));
  CHECK(Has(bits, ControlVocab::kEnd));  // complete
  CHECK_FALSE(Has(bits, ControlVocab::kCalls));
  REQUIRE(m.AcceptToken(v, 17).ok());  // ", "
  CHECK(m.FillMask(v, absl::MakeSpan(bits)) == 1);
  CHECK(Has(bits, ControlVocab::kCalls));
  REQUIRE(m.AcceptToken(v, ControlVocab::kCalls).ok());
  CHECK(m.IsComplete());

  // The same grammar under a vocabulary whose [TOOL_CALLS] is text: the
  // literal is its text, spelled by any pieces.
  ControlVocab plain;
  plain.kinds[ControlVocab::kCalls] = TokenKind::kText;
  const Vocabulary pv(plain.pieces, plain.kinds);
  Matcher t(g, &pv);
  t.FillMask(pv, absl::MakeSpan(bits));
  CHECK(Has(bits, 0));
  CHECK(Has(bits, ControlVocab::kCalls));
  CHECK(Has(bits, ControlVocab::kTextCalls));
  CHECK_FALSE(Has(bits, ControlVocab::kImStart));
  CHECK(t.Accept("[TOOL_CALLS]\"a\"").ok());
  // A matcher made without the vocabulary, asked with it: text only.
  Matcher none(g);
  none.FillMask(v, absl::MakeSpan(bits));
  CHECK(Has(bits, 0));
  CHECK_FALSE(Has(bits, ControlVocab::kCalls));
}

TEST_CASE("mask with token literals equals a token-by-token brute force") {
  const ControlVocab cv;
  const Vocabulary v(cv.pieces, cv.kinds);
  auto g = G(R"(root ::= (<"[TOOL_CALLS]"> | <|im_start|> "x") "\"" [^"]{0,6} "\"" (", " <"[TOOL_CALLS]"> "a"*)*)");
  std::mt19937 rng(3);
  int checked = 0, controls = 0, ended = 0;
  for (int run = 0; run < 40; ++run) {
    Matcher m(g, &v);
    std::vector<int32_t> history;
    for (int step = 0; step < 16; ++step) {
      std::vector<uint32_t> bits(v.mask_words());
      const int32_t n = m.FillMask(v, absl::MakeSpan(bits));
      REQUIRE(bits == BruteTokenMask(g, history, v));
      ++checked;
      if (n == 0) break;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v.size(); ++id) {
        if (Has(bits, id)) allowed.push_back(id);
      }
      REQUIRE(static_cast<int32_t>(allowed.size()) == n);
      const int32_t pick = allowed[rng() % allowed.size()];
      REQUIRE(m.AcceptToken(v, pick).ok());
      history.push_back(pick);
      controls += v.kind(pick) == TokenKind::kControl;
      if (m.ended()) {
        ++ended;
        break;
      }
    }
  }
  CHECK(checked > 200);
  CHECK(controls > 40);
  CHECK(ended > 0);
}

}  // namespace
}  // namespace dpl::grammar
