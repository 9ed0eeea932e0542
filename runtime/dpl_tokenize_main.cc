// dpl-tokenize -m MODEL -p TEXT [--no-parse-special] [--no-bos]: prints the
// token ids as a JSON list, like `llama-tokenize --ids` (BOS added when the
// model's metadata says so, special-token text parsed by default).
#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "cli/cli.h"
#include "formats/model_file.h"
#include "runtime/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-tokenize", "Print the token ids of a text");
  cmd.options().add_options()
      ("m,model", "model or vocab file (GGUF or .dpl)", cxxopts::value<std::string>())
      ("p,prompt", "text to tokenize", cxxopts::value<std::string>())
      ("no-parse-special", "treat special-token text as plain text")
      ("no-bos", "never add BOS");
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  const cxxopts::ParseResult& args = cmd.args();
  if (!args.count("model") || !args.count("prompt")) return cmd.Fail("expected -m MODEL -p TEXT");
  auto model = dpl::formats::ModelFile::OpenIndex(args["model"].as<std::string>());
  if (!model.ok()) return cmd.Fail(model.status());
  auto tok = dpl::tokenizer::Tokenizer::FromMetadata((*model)->metadata());
  if (!tok.ok()) return cmd.Fail(tok.status());
  if (!tok->has_vocab()) {
    return cmd.Fail("this model has no vocabulary (tokenizer.ggml.model = \"none\")");
  }
  const bool add_bos = !args.count("no-bos") && tok->adds_bos_by_default();
  const std::vector<int32_t> ids =
      tok->Encode(args["prompt"].as<std::string>(), add_bos, !args.count("no-parse-special"));
  std::printf("[%s]\n", absl::StrJoin(ids, ", ").c_str());
  return 0;
}
