// A context-free grammar over Unicode code points in llama.cpp's GBNF form,
// and its text parser.
//
// Representation (llama.cpp's llama_grammar_element, same encoding): a rule
// is a flat array of elements, its alternatives separated by kAlt and ended
// by kEnd. An alternative is a sequence of
//   kChar c [kCharRngUpper u | kCharAlt c']*   a character class (kCharNot:
//                                              negated; kCharAny: any)
//   kRuleRef r                                 rule r
//   kToken t                                   token literal t (below)
// A literal "abc" is three one-character classes. Repetitions and groups
// are rewritten at parse time into generated rules (llama.cpp's):
//   x*      -> R ::= x R |             (R a new rule)
//   x+      -> x x*
//   x?      -> R ::= x |
//   x{m,n}  -> m copies of x, then n - m nested options
//              O_k ::= x O_(k-1) |, O_1 ::= x |      (x{m,} : x*)
//   ( ... ) -> a new rule holding the alternatives
//   <tok>   -> T ::= kToken t | "tok"   (T a new rule, one per text)
//
// GBNF text (the `grammar` field of llama-server):
//   name ::= alt | alt ...      one rule; names are [A-Za-z0-9_-]+
//   "lit" with \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH escapes
//   [a-z0-9_] [^"\\] classes (negated with ^, ranges a-z), . any character
//   ( ), *, +, ?, {m}, {m,}, {m,n}; # comments to the end of the line.
//   <text> a token literal (llama.cpp's form: the text is everything from
//   the '<' to the first '>', both included: <think>, <|python_tag|>);
//   <"text"> the same for any text, written as a literal ("[TOOL_CALLS]",
//   escapes as in literals). A token literal matches, under a vocabulary
//   with a control token of exactly that text, that one token and nothing
//   else; under any other vocabulary (none with such a control token, or
//   no vocabulary: Matcher), its text as a literal. It is the only place
//   a control token is ever allowed: a class or a literal never matches
//   one, whatever its text. (llama.cpp's token ids <[N]> and negations
//   !<...> are refused: a grammar here is parsed without a vocabulary.)
// A rule ends at the end of its line unless inside parentheses (llama.cpp).
// Errors (InvalidArgument) name the line and column: a syntax error, an
// undefined rule, a missing root, left recursion (a rule that can reach
// itself without consuming a character: it would expand forever), a
// grammar beyond the size limits below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dpl::grammar {

enum class ElemType : uint8_t {
  kEnd,           // end of a rule
  kAlt,           // start of the next alternative
  kRuleRef,       // value: rule id
  kChar,          // value: code point (a class's first item)
  kCharNot,       // value: code point (a negated class's first item)
  kCharRngUpper,  // value: upper bound (inclusive) of the previous kChar/kCharAlt
  kCharAlt,       // value: another code point of the class
  kCharAny,       // any code point
  kToken,         // value: index into Grammar::token_texts(); the first
                  // element of its rule, whose second alternative is the
                  // text (the parser writes no other kToken)
};

struct Element {
  ElemType type;
  uint32_t value;
};

inline bool IsCharElement(ElemType t) {
  return t == ElemType::kChar || t == ElemType::kCharNot || t == ElemType::kCharAny;
}
inline bool IsEndOfSequence(ElemType t) { return t == ElemType::kEnd || t == ElemType::kAlt; }
// An element that consumes input: a character class or a token literal.
inline bool IsTerminal(ElemType t) { return IsCharElement(t) || t == ElemType::kToken; }

// Limits: any grammar beyond them is refused (InvalidArgument).
inline constexpr size_t kMaxRules = 1 << 16;
inline constexpr size_t kMaxElements = size_t{1} << 21;  // all rules together
inline constexpr uint32_t kMaxRepetition = 10000;        // m and n of x{m,n}
inline constexpr int kMaxNesting = 64;                   // parentheses

class Grammar {
 public:
  // Parses GBNF text; `root` names the start rule.
  static absl::StatusOr<Grammar> Parse(absl::string_view text, absl::string_view root = "root");

  const std::vector<std::vector<Element>>& rules() const { return rules_; }
  const std::string& rule_name(uint32_t id) const { return names_[id]; }
  uint32_t root() const { return root_; }
  // The texts of the grammar's token literals (kToken's value indexes it),
  // each once.
  const std::vector<std::string>& token_texts() const { return token_texts_; }
  size_t n_elements() const;
  // GBNF text of the (rewritten) rules, for messages and tests.
  std::string ToString() const;

 private:
  friend class GbnfParser;
  std::vector<std::vector<Element>> rules_;
  std::vector<std::string> names_;
  std::vector<std::string> token_texts_;
  uint32_t root_ = 0;
};

}  // namespace dpl::grammar
