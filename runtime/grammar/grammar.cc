#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dpl::grammar {

namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The UTF-8 character at s[*i] (advancing *i past it); false when the
// bytes there are not one.
bool DecodeUtf8At(absl::string_view s, size_t* i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || *i + n > s.size()) return false;
  uint32_t v = n == 1 ? c : c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char b = static_cast<unsigned char>(s[*i + k]);
    if ((b & 0xC0) != 0x80) return false;
    v = (v << 6) | (b & 0x3F);
  }
  *i += n;
  *cp = v;
  return true;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

class GbnfParser {
 public:
  explicit GbnfParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Run(absl::string_view root) {
    SkipSpace(true);
    while (pos_ < text_.size()) {
      if (absl::Status s = ParseRule(); !s.ok()) return s;
      SkipSpace(true);
    }
    // Every referenced rule defined.
    for (uint32_t id = 0; id < g_.rules_.size(); ++id) {
      if (!defined_[id]) {
        return Error(first_use_[id], absl::StrCat("undefined rule '", g_.names_[id], "'"));
      }
    }
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) return absl::InvalidArgumentError(absl::StrCat("grammar: no '", root, "' rule"));
    g_.root_ = it->second;
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    return std::move(g_);
  }

 private:
  absl::Status Error(size_t at, absl::string_view what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, ", column ", col, ": ", what));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t k = 0) const { return pos_ + k < text_.size() ? text_[pos_ + k] : '\0'; }

  // Skips spaces, tabs and comments; newlines too when `newline_ok`.
  void SkipSpace(bool newline_ok) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  absl::StatusOr<std::string> ParseName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsWordChar(text_[pos_])) ++pos_;
    if (pos_ == start) return Error(start, "expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t RuleId(const std::string& name, size_t at) {
    auto [it, inserted] = ids_.try_emplace(name, static_cast<uint32_t>(g_.rules_.size()));
    if (inserted) {
      g_.rules_.emplace_back();
      g_.names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(at);
    }
    return it->second;
  }

  absl::StatusOr<uint32_t> NewRule(const std::string& base, size_t at) {
    if (g_.rules_.size() >= kMaxRules) return Error(at, absl::StrCat("more than ", kMaxRules, " rules"));
    std::string name;
    do {
      name = absl::StrCat(base, "-", next_generated_++);
    } while (ids_.contains(name));
    const uint32_t id = RuleId(name, at);
    defined_[id] = true;
    return id;
  }

  absl::Status AddElements(size_t n, size_t at) {
    total_ += n;
    if (total_ > kMaxElements) return Error(at, absl::StrCat("the grammar exceeds ", kMaxElements, " elements"));
    return absl::OkStatus();
  }

  // One (maybe escaped) code point of a literal or a class.
  absl::StatusOr<uint32_t> ParseChar() {
    const size_t start = pos_;
    if (AtEnd()) return Error(start, "unexpected end of the grammar");
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error(start, "unexpected end after '\\'");
      const char e = text_[pos_++];
      int digits = 0;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return uint32_t(e);
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return Error(start, absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
      }
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        const int h = HexValue(Peek());
        if (h < 0) return Error(pos_, absl::StrCat("expected ", digits, " hex digits after '\\", std::string(1, e), "'"));
        v = v * 16 + static_cast<uint32_t>(h);
        ++pos_;
      }
      if (v > 0x10FFFF) return Error(start, "code point beyond U+10FFFF");
      return v;
    }
    uint32_t v = 0;
    if (!DecodeUtf8At(text_, &pos_, &v)) return Error(start, "invalid UTF-8 in the grammar");
    return v;
  }

  absl::Status ParseRule() {
    const size_t start = pos_;
    absl::StatusOr<std::string> name = ParseName();
    if (!name.ok()) return name.status();
    SkipSpace(false);
    if (text_.substr(pos_, 3) != "::=") return Error(pos_, "expected '::='");
    pos_ += 3;
    SkipSpace(true);
    const uint32_t id = RuleId(*name, start);
    if (defined_[id]) return Error(start, absl::StrCat("rule '", *name, "' is defined twice"));
    defined_[id] = true;
    std::vector<Element> body;
    if (absl::Status s = ParseAlternatives(*name, &body, 0); !s.ok()) return s;
    body.push_back({ElemType::kEnd, 0});
    if (absl::Status s = AddElements(body.size(), start); !s.ok()) return s;
    g_.rules_[id] = std::move(body);
    // The rule ends at a newline (or the end).
    SkipSpace(false);
    if (!AtEnd() && Peek() != '\n' && Peek() != '\r') {
      return Error(pos_, absl::StrCat("unexpected '", std::string(1, Peek()), "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseAlternatives(const std::string& name, std::vector<Element>* out, int depth) {
    if (absl::Status s = ParseSequence(name, out, depth); !s.ok()) return s;
    while (Peek() == '|') {
      out->push_back({ElemType::kAlt, 0});
      if (absl::Status s = AddElements(1, pos_); !s.ok()) return s;
      ++pos_;
      SkipSpace(true);
      if (absl::Status s = ParseSequence(name, out, depth); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status ParseSequence(const std::string& name, std::vector<Element>* out, int depth) {
    const bool nested = depth > 0;
    size_t last_start = out->size();  // the last symbol's first element
    bool have_last = false;
    while (!AtEnd()) {
      const size_t at = pos_;
      const char c = Peek();
      if (c == '"') {
        ++pos_;
        last_start = out->size();
        while (Peek() != '"') {
          if (AtEnd()) return Error(at, "unterminated literal");
          absl::StatusOr<uint32_t> ch = ParseChar();
          if (!ch.ok()) return ch.status();
          out->push_back({ElemType::kChar, *ch});
        }
        ++pos_;
        // An empty literal adds nothing: it cannot be repeated either.
        have_last = out->size() > last_start;
      } else if (c == '<' || c == '!') {
        absl::StatusOr<uint32_t> rule = ParseTokenLiteral(name);
        if (!rule.ok()) return rule.status();
        last_start = out->size();
        out->push_back({ElemType::kRuleRef, *rule});
        have_last = true;
        if (absl::Status s = AddElements(1, at); !s.ok()) return s;
      } else if (c == '[') {
        ++pos_;
        last_start = out->size();
        ElemType first = ElemType::kChar;
        if (Peek() == '^') {
          ++pos_;
          first = ElemType::kCharNot;
        }
        bool any = false;
        while (Peek() != ']') {
          if (AtEnd()) return Error(at, "unterminated character class");
          absl::StatusOr<uint32_t> lo = ParseChar();
          if (!lo.ok()) return lo.status();
          out->push_back({any ? ElemType::kCharAlt : first, *lo});
          any = true;
          if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
            ++pos_;
            absl::StatusOr<uint32_t> hi = ParseChar();
            if (!hi.ok()) return hi.status();
            if (*hi < *lo) return Error(at, "a character range whose end is before its start");
            out->push_back({ElemType::kCharRngUpper, *hi});
          }
        }
        ++pos_;
        if (!any) return Error(at, "an empty character class");
        have_last = true;
      } else if (c == '.') {
        ++pos_;
        last_start = out->size();
        out->push_back({ElemType::kCharAny, 0});
        have_last = true;
      } else if (IsWordChar(c)) {
        absl::StatusOr<std::string> ref = ParseName();
        if (!ref.ok()) return ref.status();
        SkipSpace(nested);
        if (text_.substr(pos_, 3) == "::=") {
          if (nested) return Error(at, "a rule definition inside parentheses");
          pos_ = at;  // the next rule starts here: this sequence ended
          return absl::OkStatus();
        }
        last_start = out->size();
        out->push_back({ElemType::kRuleRef, RuleId(*ref, at)});
        have_last = true;
        if (absl::Status s = AddElements(1, at); !s.ok()) return s;
        continue;  // spaces already skipped
      } else if (c == '(') {
        if (depth + 1 > kMaxNesting) return Error(at, absl::StrCat("parentheses nested deeper than ", kMaxNesting));
        ++pos_;
        SkipSpace(true);
        absl::StatusOr<uint32_t> sub = NewRule(name, at);
        if (!sub.ok()) return sub.status();
        std::vector<Element> body;
        if (absl::Status s = ParseAlternatives(name, &body, depth + 1); !s.ok()) return s;
        body.push_back({ElemType::kEnd, 0});
        if (Peek() != ')') return Error(pos_, "expected ')'");
        ++pos_;
        if (absl::Status s = AddElements(body.size(), at); !s.ok()) return s;
        g_.rules_[*sub] = std::move(body);
        last_start = out->size();
        out->push_back({ElemType::kRuleRef, *sub});
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) return Error(at, absl::StrCat("'", std::string(1, c), "' without a symbol before it"));
        uint32_t min = 0, max = UINT32_MAX;  // UINT32_MAX: unbounded
        ++pos_;
        if (c == '+') {
          min = 1;
        } else if (c == '?') {
          max = 1;
        } else if (c == '{') {
          SkipSpace(nested);
          absl::StatusOr<uint32_t> m = ParseInt();
          if (!m.ok()) return m.status();
          min = *m;
          SkipSpace(nested);
          if (Peek() == ',') {
            ++pos_;
            SkipSpace(nested);
            if (Peek() == '}') {
              max = UINT32_MAX;
            } else {
              absl::StatusOr<uint32_t> n = ParseInt();
              if (!n.ok()) return n.status();
              max = *n;
            }
          } else {
            max = min;
          }
          SkipSpace(nested);
          if (Peek() != '}') return Error(pos_, "expected '}'");
          ++pos_;
          if (max != UINT32_MAX && max < min) return Error(at, "a repetition {m,n} with n < m");
        }
        if (absl::Status s = Repeat(name, out, last_start, min, max, at); !s.ok()) return s;
        have_last = false;  // x** is an error, as in llama.cpp
      } else {
        break;
      }
      SkipSpace(nested);
    }
    if (total_ + out->size() > kMaxElements) {
      return Error(pos_, absl::StrCat("the grammar exceeds ", kMaxElements, " elements"));
    }
    return absl::OkStatus();
  }

  // A token literal at pos_ ('<'): <text> (the brackets part of the text)
  // or <"text">. Its rule, T ::= kToken t | "text", is made once per text.
  absl::StatusOr<uint32_t> ParseTokenLiteral(const std::string& name) {
    const size_t at = pos_;
    if (Peek() == '!') return Error(at, "negated tokens (!<...>) are not supported");
    std::string text;
    if (Peek(1) == '[' && Peek(2) >= '0' && Peek(2) <= '9') {
      return Error(at, "token ids (<[N]>) are not supported: name the token by its text, <text> or <\"text\">");
    }
    if (Peek(1) == '"') {
      pos_ += 2;
      while (Peek() != '"') {
        if (AtEnd()) return Error(at, "unterminated token literal");
        absl::StatusOr<uint32_t> ch = ParseChar();
        if (!ch.ok()) return ch.status();
        AppendUtf8(*ch, &text);
      }
      ++pos_;
      if (Peek() != '>') return Error(pos_, "expected '>' after a token literal's text");
      ++pos_;
    } else {
      // No escapes: the text is the bytes from '<' to the first '>'.
      const size_t end = text_.find('>', pos_ + 1);
      const size_t newline = text_.find_first_of("\r\n", pos_);
      if (end == absl::string_view::npos || (newline != absl::string_view::npos && newline < end)) {
        return Error(at, "unterminated token literal (<text> ends at the first '>' on its line)");
      }
      text = std::string(text_.substr(pos_, end + 1 - pos_));
      for (size_t i = 0; i < text.size();) {
        uint32_t c = 0;
        if (!DecodeUtf8At(text, &i, &c)) return Error(pos_ + i, "invalid UTF-8 in the grammar");
      }
      pos_ = end + 1;
    }
    if (text.empty()) return Error(at, "an empty token literal");
    if (auto it = token_rules_.find(text); it != token_rules_.end()) return it->second;
    absl::StatusOr<uint32_t> rule = NewRule(name, at);
    if (!rule.ok()) return rule.status();
    const uint32_t index = static_cast<uint32_t>(g_.token_texts_.size());
    g_.token_texts_.push_back(text);
    std::vector<Element> body = {{ElemType::kToken, index}, {ElemType::kAlt, 0}};
    for (size_t i = 0; i < text.size();) {
      uint32_t c = 0;
      DecodeUtf8At(text, &i, &c);  // valid: checked or encoded above
      body.push_back({ElemType::kChar, c});
    }
    body.push_back({ElemType::kEnd, 0});
    if (absl::Status s = AddElements(body.size(), at); !s.ok()) return s;
    g_.rules_[*rule] = std::move(body);
    token_rules_.emplace(text, *rule);
    return *rule;
  }

  absl::StatusOr<uint32_t> ParseInt() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(Peek() - '0');
      if (v > kMaxRepetition) return Error(start, absl::StrCat("a repetition count above ", kMaxRepetition));
      ++pos_;
    }
    if (pos_ == start) return Error(start, "expected a number");
    return static_cast<uint32_t>(v);
  }

  // Rewrites out[last_start..] (one symbol) as x{min,max}.
  absl::Status Repeat(const std::string& name, std::vector<Element>* out, size_t last_start, uint32_t min,
                      uint32_t max, size_t at) {
    const std::vector<Element> x(out->begin() + static_cast<std::ptrdiff_t>(last_start), out->end());
    out->resize(last_start);
    const uint64_t copies = min + (max == UINT32_MAX ? 1 : max - min);
    if (copies * (x.size() + 3) + total_ + out->size() > kMaxElements) {
      return Error(at, absl::StrCat("the repetition makes the grammar exceed ", kMaxElements, " elements"));
    }
    for (uint32_t i = 0; i < min; ++i) out->insert(out->end(), x.begin(), x.end());
    if (max == UINT32_MAX) {
      // R ::= x R |
      absl::StatusOr<uint32_t> r = NewRule(name, at);
      if (!r.ok()) return r.status();
      std::vector<Element> body = x;
      body.push_back({ElemType::kRuleRef, *r});
      body.push_back({ElemType::kAlt, 0});
      body.push_back({ElemType::kEnd, 0});
      total_ += body.size();
      g_.rules_[*r] = std::move(body);
      out->push_back({ElemType::kRuleRef, *r});
      return absl::OkStatus();
    }
    // O_1 ::= x | ; O_k ::= x O_(k-1) |
    uint32_t prev = 0;
    bool have_prev = false;
    for (uint32_t k = 0; k < max - min; ++k) {
      absl::StatusOr<uint32_t> r = NewRule(name, at);
      if (!r.ok()) return r.status();
      std::vector<Element> body = x;
      if (have_prev) body.push_back({ElemType::kRuleRef, prev});
      body.push_back({ElemType::kAlt, 0});
      body.push_back({ElemType::kEnd, 0});
      total_ += body.size();
      g_.rules_[*r] = std::move(body);
      prev = *r;
      have_prev = true;
    }
    if (have_prev) out->push_back({ElemType::kRuleRef, prev});
    return absl::OkStatus();
  }

  // A rule that reaches itself through first positions (after only
  // nullable rules) is left-recursive: its expansion would never end.
  absl::Status CheckLeftRecursion() {
    const size_t n = g_.rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        const std::vector<Element>& body = g_.rules_[r];
        bool alt_ok = true;  // the current alternative is all nullable so far
        for (const Element& e : body) {
          if (IsEndOfSequence(e.type)) {
            if (alt_ok) {
              nullable[r] = true;
              changed = true;
              break;
            }
            alt_ok = true;
          } else if (e.type == ElemType::kRuleRef) {
            alt_ok = alt_ok && nullable[e.value];
          } else if (IsTerminal(e.type)) {
            alt_ok = false;
          }
        }
      }
    }
    // Edges r -> s: s in a first position of r.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      bool reach = true;
      for (const Element& e : g_.rules_[r]) {
        if (IsEndOfSequence(e.type)) {
          reach = true;
        } else if (!reach) {
          continue;
        } else if (e.type == ElemType::kRuleRef) {
          first[r].push_back(e.value);
          reach = nullable[e.value];
        } else if (IsTerminal(e.type)) {
          reach = false;
        }
      }
    }
    // Iterative DFS for a cycle.
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (size_t s = 0; s < n; ++s) {
      if (color[s] != 0) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{static_cast<uint32_t>(s), 0}};
      color[s] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i < first[r].size()) {
          const uint32_t t = first[r][i++];
          if (color[t] == 1) {
            return Error(first_use_[t], absl::StrCat("rule '", g_.names_[t],
                                                     "' is left-recursive (it can reach itself without "
                                                     "consuming a character)"));
          }
          if (color[t] == 0) {
            color[t] = 1;
            path.push_back({t, 0});
          }
        } else {
          color[r] = 2;
          path.pop_back();
        }
      }
    }
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
  Grammar g_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;  // where each rule was first named
  absl::flat_hash_map<std::string, uint32_t> token_rules_;  // a token literal's text -> its rule
  size_t total_ = 0;               // elements so far
  int next_generated_ = 1;
};

absl::StatusOr<Grammar> Grammar::Parse(absl::string_view text, absl::string_view root) {
  return GbnfParser(text).Run(root);
}

size_t Grammar::n_elements() const {
  size_t n = 0;
  for (const auto& r : rules_) n += r.size();
  return n;
}

namespace {
std::string CharText(uint32_t c) {
  if (c == '"' || c == '\\' || c == ']' || c == '[' || c == '-' || c == '^') return absl::StrCat("\\", std::string(1, static_cast<char>(c)));
  if (c >= 0x20 && c < 0x7F) return std::string(1, static_cast<char>(c));
  return c <= 0xFF ? absl::StrFormat("\\x%02X", c) : c <= 0xFFFF ? absl::StrFormat("\\u%04X", c) : absl::StrFormat("\\U%08X", c);
}
// A text as a GBNF literal, quotes included.
std::string LiteralText(absl::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02X", c));
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}
}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rules_.size(); ++r) {
    absl::StrAppend(&out, names_[r], " ::=");
    const std::vector<Element>& body = rules_[r];
    for (size_t i = 0; i < body.size(); ++i) {
      const Element& e = body[i];
      switch (e.type) {
        case ElemType::kEnd: break;
        case ElemType::kAlt: absl::StrAppend(&out, " |"); break;
        case ElemType::kRuleRef: absl::StrAppend(&out, " ", names_[e.value]); break;
        case ElemType::kCharAny: absl::StrAppend(&out, " ."); break;
        case ElemType::kChar:
        case ElemType::kCharNot:
          absl::StrAppend(&out, " [", e.type == ElemType::kCharNot ? "^" : "", CharText(e.value));
          break;
        case ElemType::kCharAlt: absl::StrAppend(&out, CharText(e.value)); break;
        case ElemType::kCharRngUpper: absl::StrAppend(&out, "-", CharText(e.value)); break;
        case ElemType::kToken: absl::StrAppend(&out, " <", LiteralText(token_texts_[e.value]), ">"); break;
      }
      if ((e.type == ElemType::kChar || e.type == ElemType::kCharNot || e.type == ElemType::kCharAlt ||
           e.type == ElemType::kCharRngUpper) &&
          (i + 1 >= body.size() ||
           (body[i + 1].type != ElemType::kCharAlt && body[i + 1].type != ElemType::kCharRngUpper))) {
        absl::StrAppend(&out, "]");
      }
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace dpl::grammar
