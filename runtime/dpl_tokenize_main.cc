// dpl-tokenize -m MODEL -p TEXT [--no-parse-special] [--no-bos]: prints the
// token ids as a JSON list, like `llama-tokenize --ids` (BOS added when the
// model's metadata says so, special-token text parsed by default).
#include <cstdio>
#include <iostream>

#include <cxxopts.hpp>

#include "absl/strings/str_join.h"
#include "formats/model_file.h"
#include "runtime/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-tokenize", "Print the token ids of a text");
  options.add_options()
      ("m,model", "model or vocab file (GGUF or .dpl)", cxxopts::value<std::string>())
      ("p,prompt", "text to tokenize", cxxopts::value<std::string>())
      ("no-parse-special", "treat special-token text as plain text")
      ("no-bos", "never add BOS")
      ("h,help", "show this help");
  auto fail = [](absl::string_view m) {
    std::fprintf(stderr, "dpl-tokenize: error: %.*s\n", static_cast<int>(m.size()), m.data());
    return 1;
  };
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  if (!args.count("model") || !args.count("prompt")) return fail("expected -m MODEL -p TEXT");
  auto model = dpl::formats::ModelFile::Open(args["model"].as<std::string>());
  if (!model.ok()) return fail(model.status().message());
  auto tok = dpl::tokenizer::Tokenizer::FromMetadata((*model)->metadata());
  if (!tok.ok()) return fail(tok.status().message());
  if (!tok->has_vocab()) return fail("this model has no vocabulary (tokenizer.ggml.model = \"none\")");
  const bool add_bos = !args.count("no-bos") && tok->adds_bos_by_default();
  const std::vector<int32_t> ids =
      tok->Encode(args["prompt"].as<std::string>(), add_bos, !args.count("no-parse-special"));
  std::printf("[%s]\n", absl::StrJoin(ids, ", ").c_str());
  return 0;
}
