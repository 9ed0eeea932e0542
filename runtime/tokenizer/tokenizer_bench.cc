// Tokenizer throughput: builds ~1 MB of mixed text (English prose, code,
// numbers, non-Latin scripts, emoji, whitespace runs) and times Encode.
//   bazel run //runtime/tokenizer:tokenizer_bench -- /work/shared/vocab/ggml-vocab-qwen2.gguf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "formats/gguf.h"
#include "runtime/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf [MB]\n", argv[0]);
    return 2;
  }
  const double mb = argc > 2 ? std::atof(argv[2]) : 1.0;
  auto t0 = std::chrono::steady_clock::now();
  auto gguf = dpl::formats::GgufFile::Open(argv[1]);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tok = dpl::tokenizer::Tokenizer::FromMetadata(gguf->metadata());
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  auto t1 = std::chrono::steady_clock::now();

  const char* kParts[] = {
      "The quick brown fox jumps over the lazy dog. It's been 3.14159 years since 1970! ",
      "    for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n\n",
      "Привет, как дела? Это тестовый текст на русском языке. ",
      "这是一个用于测试分词器速度的中文句子。", "🦙🚀 emoji 👍🏽 ",
      "   \t  indented\r\n", "Numbers: 1234567890 0x1F999 42,000,000.5 ",
      "<|im_start|>user\nhello<|im_end|>\n",
  };
  std::string text;
  const size_t target = static_cast<size_t>(mb * 1e6);
  for (size_t i = 0; text.size() < target; ++i) {
    text += kParts[(i * 7 + i / 3) % (sizeof(kParts) / sizeof(kParts[0]))];
  }

  size_t n_tokens = 0;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto a = std::chrono::steady_clock::now();
    n_tokens = tok->Encode(text, false, /*parse_special=*/true).size();
    auto b = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(b - a).count());
  }
  std::printf("load %.3f s; encode %.2f MB -> %zu tokens in %.3f s (%.2f MB/s, best of 3)\n",
              std::chrono::duration<double>(t1 - t0).count(), text.size() / 1e6, n_tokens, best,
              text.size() / 1e6 / best);
  return 0;
}
