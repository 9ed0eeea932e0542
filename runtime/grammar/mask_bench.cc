// Times the grammar mask per step on a real vocabulary:
//   bazel run -c opt //runtime/grammar:mask_bench -- [vocab.gguf]
// (default ../shared/vocab/ggml-vocab-qwen2.gguf; run from the repository
// root, or pass the path). A JSON-schema grammar at a few states (after each
// prefix below); for each, the mean of 5. Then a grammar with a token
// literal that names a control token (<|im_start|>): at it, and in a string
// after it.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/tokenizer_vocab.h"
#include "runtime/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  using namespace dpl;
  const std::string path = argc > 1 ? argv[1] : "../shared/vocab/ggml-vocab-qwen2.gguf";
  auto gguf = formats::GgufFile::Open(path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tok = tokenizer::Tokenizer::FromMetadata(gguf->metadata());
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  const grammar::Vocabulary v = grammar::VocabularyFromTokenizer(*tok);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %d tokens, trie of %zu nodes, built in %.1f ms\n", path.c_str(), v.size(), v.n_nodes(), build_ms);

  auto g = grammar::JsonSchemaToGrammar(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string", "maxLength": 64},
      "tags": {"type": "array", "items": {"type": "string"}}, "score": {"type": "number"},
      "kind": {"enum": ["person", "company"]}}, "required": ["name", "age", "kind"]})"));
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
    return 1;
  }
  auto grammar = std::make_shared<const grammar::Grammar>(*std::move(g));
  const char* prefixes[] = {
      "",                                                         // the object's start
      "{",                                                        // a key
      "{\"name\": \"Jo",                                          // inside a string: nearly every token
      "{\"name\": \"Jo\", \"age\": 4",                            // inside an integer
      "{\"name\": \"Jo\", \"age\": 42, \"email\": \"a@b.c",       // a string of at most 64 characters
      "{\"name\": \"Jo\", \"age\": 42, \"tags\": [\"x\", ",      // the next array item
      "{\"name\": \"Jo\", \"age\": 42, \"kind\": \"person\"}",   // complete: end of generation
  };
  std::vector<uint32_t> bits(v.mask_words());
  std::printf("%-50s %8s %14s %14s %14s\n", "state (text so far)", "allowed", "cold us/mask", "warm-DFA us", "same-state us");
  for (const char* p : prefixes) {
    // cold: a fresh matcher (no transition cached); warm-DFA: a copy of it
    // after that walk, its kept masks dropped: the same walk with every
    // transition cached; same-state: the mask asked again at the same state
    // (kept by state: a copy).
    const int reps = 5;
    double cold = 0, warm = 0, same = 0;
    int32_t n = 0;
    for (int i = 0; i < reps; ++i) {
      grammar::Matcher m(grammar);
      if (!m.Accept(p).ok()) {
        std::fprintf(stderr, "prefix rejected: %s\n", p);
        return 1;
      }
      auto a = std::chrono::steady_clock::now();
      n = m.FillMask(v, absl::MakeSpan(bits));
      auto b = std::chrono::steady_clock::now();
      m.FillMask(v, absl::MakeSpan(bits));
      auto c = std::chrono::steady_clock::now();
      cold += std::chrono::duration<double, std::micro>(b - a).count();
      same += std::chrono::duration<double, std::micro>(c - b).count();
      grammar::Matcher w = m;  // every transition of the walk cached, no mask kept for a new state
      w.ForgetMasks();
      a = std::chrono::steady_clock::now();
      w.FillMask(v, absl::MakeSpan(bits));
      warm += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    std::printf("%-50s %8d %14.1f %14.1f %14.1f\n", (std::string("'") + p + "'").c_str(), n, cold / reps,
                warm / reps, same / reps);
  }
  // A grammar with a token literal resolved to a control token (qwen2's
  // <|im_start|>, as Mistral's [TOOL_CALLS] in a forced call): the mask at
  // the literal (the token alone) and inside the string after it (the
  // state's tops looked at once more).
  auto lit = grammar::Grammar::Parse(R"(root ::= <|im_start|> "\"" [^"\\]* "\"")");
  const int32_t im_start = v.FindControl("<|im_start|>");
  if (!lit.ok() || im_start < 0) return 0;
  auto literal = std::make_shared<const grammar::Grammar>(*std::move(lit));
  for (const bool after : {false, true}) {
    const int reps = 5;
    double cold = 0, warm = 0;
    int32_t n = 0;
    for (int i = 0; i < reps; ++i) {
      grammar::Matcher m(literal, &v);
      if (after && (!m.AcceptToken(v, im_start).ok() || !m.Accept("\"Jo").ok())) return 1;
      auto a = std::chrono::steady_clock::now();
      n = m.FillMask(v, absl::MakeSpan(bits));
      cold += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
      grammar::Matcher w = m;
      w.ForgetMasks();
      a = std::chrono::steady_clock::now();
      w.FillMask(v, absl::MakeSpan(bits));
      warm += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    std::printf("%-50s %8d %14.1f %14.1f\n", after ? "token literal <|im_start|>, then '\"Jo'" : "at a token literal <|im_start|>",
                n, cold / reps, warm / reps);
  }
  return 0;
}
