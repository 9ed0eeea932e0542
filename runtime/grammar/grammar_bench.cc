// The grammar mask step by step through one answer, as a server slot makes
// it (one matcher for the whole answer, its caches warm from the steps
// before):
//   bazel run -c opt //runtime/grammar:grammar_bench -- [vocab.gguf] [seeds]
// (default ../shared/vocab/ggml-vocab-qwen2.gguf; run from the repository
// root, or pass the path). Schema: an array of integers. First the answer an
// H200 run of a random-weight Qwen2.5-7B gave (seed 1, long runs of
// whitespace: 16.9 ms a token through dpl-server), tokenized; then `seeds`
// (default 5) answers drawn uniformly from each step's allowed tokens, as
// random weights nearly do (at most 64 steps). Per step: us of FillMask,
// the stacks of the state it starts from, the tokens allowed, the token.
// First of all, what the vocabulary costs (the tokenizer read from the
// file's metadata, then VocabularyFromTokenizer): built at a server's first
// grammar, it was that request's ~290 ms on the H200 (SlotGrammars now builds
// it when the engine starts), and the per-request set-up (the schema
// converted and parsed, a fresh matcher).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/tokenizer_vocab.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using namespace dpl;

std::string Escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

struct Totals {
  double sum_us = 0, max_us = 0;
  int steps = 0;
  size_t max_stacks = 0;
  std::vector<double> us;
  void Add(double t, size_t stacks) {
    sum_us += t;
    max_us = std::max(max_us, t);
    max_stacks = std::max(max_stacks, stacks);
    us.push_back(t);
    ++steps;
  }
  double Median() {
    if (us.empty()) return 0;
    std::vector<double> s = us;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

// One step: the mask at the matcher's state, timed. Returns the allowed ids.
std::vector<int32_t> Step(grammar::Matcher& m, const grammar::Vocabulary& v, std::vector<uint32_t>& bits,
                          double* us) {
  const auto t0 = std::chrono::steady_clock::now();
  m.FillMask(v, absl::MakeSpan(bits));
  *us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < v.size(); ++id) {
    if ((bits[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) allowed.push_back(id);
  }
  return allowed;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "../shared/vocab/ggml-vocab-qwen2.gguf";
  const int seeds = argc > 2 ? std::atoi(argv[2]) : 5;
  auto gguf = formats::GgufFile::Open(path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  const auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  auto t0 = std::chrono::steady_clock::now();
  auto tok = tokenizer::Tokenizer::FromMetadata(gguf->metadata());
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  const double tokenizer_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  const grammar::Vocabulary v = grammar::VocabularyFromTokenizer(*tok);
  const double vocab_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto g = grammar::JsonSchemaToGrammar(nlohmann::ordered_json::parse(R"({"type":"array","items":{"type":"integer"}})"));
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
    return 1;
  }
  auto grammar = std::make_shared<const grammar::Grammar>(*std::move(g));
  { grammar::Matcher fresh(grammar); }
  const double request_ms = ms_since(t0);
  std::vector<uint32_t> bits(v.mask_words());
  std::printf("%s: %d tokens, trie of %zu nodes\n", path.c_str(), v.size(), v.n_nodes());
  std::printf("tokenizer from metadata %.1f ms, VocabularyFromTokenizer %.1f ms (once per engine); "
              "a request's schema -> grammar and matcher %.3f ms\n",
              tokenizer_ms, vocab_ms, request_ms);

  // The H200 answer's beginning (its text as the server returned it).
  const std::string text = "[0\n            \t\t\t   ,-1 ,\n  \t \t\t\t\t\t\t\t";
  {
    std::printf("\nthe H200 answer, tokenized: %s\n%5s %10s %7s %8s  %s\n", Escaped(text).c_str(), "step", "mask us",
                "stacks", "allowed", "token then taken");
    grammar::Matcher m(grammar);
    Totals t;
    int step = 0;
    for (int32_t id : tok->Encode(text, /*add_bos=*/false, /*parse_special=*/false)) {
      double us = 0;
      const size_t stacks = m.n_stacks();
      const std::vector<int32_t> allowed = Step(m, v, bits, &us);
      t.Add(us, stacks);
      std::printf("%5d %10.1f %7zu %8zu  '%s'\n", step++, us, stacks, allowed.size(), Escaped(v.piece(id)).c_str());
      if (!m.AcceptToken(v, id).ok()) {
        std::printf("rejected\n");
        break;
      }
    }
    std::printf("steps %d: mean %.1f us, median %.1f, max %.1f, most stacks %zu\n", t.steps, t.sum_us / t.steps,
                t.Median(), t.max_us, t.max_stacks);
  }

  // Random answers: each step's token uniform over the allowed ones.
  Totals all;
  for (int seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    grammar::Matcher m(grammar);
    Totals t;
    std::string answer;
    for (int step = 0; step < 64 && !m.ended(); ++step) {
      double us = 0;
      const size_t stacks = m.n_stacks();
      const std::vector<int32_t> allowed = Step(m, v, bits, &us);
      t.Add(us, stacks);
      all.Add(us, stacks);
      if (allowed.empty()) break;
      const int32_t id = allowed[rng() % allowed.size()];
      if (!m.AcceptToken(v, id).ok()) {
        std::printf("seed %d: token %d rejected\n", seed, id);
        return 1;
      }
      if (v.kind(id) == grammar::TokenKind::kText) answer += v.piece(id);
    }
    std::printf("\nseed %d: %d steps, mean %.1f us, median %.1f, max %.1f, most stacks %zu\n  %s\n", seed, t.steps,
                t.sum_us / t.steps, t.Median(), t.max_us, t.max_stacks, Escaped(answer.substr(0, 160)).c_str());
  }
  if (all.steps > 0) {
    std::printf("\nrandom answers, all steps %d: mean %.1f us, median %.1f, max %.1f, most stacks %zu\n", all.steps,
                all.sum_us / all.steps, all.Median(), all.max_us, all.max_stacks);
  }
  return 0;
}
