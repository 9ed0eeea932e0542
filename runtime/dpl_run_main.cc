// dpl-run: generate text with a GGUF or .dpl model. Flag names and defaults
// follow llama.cpp's llama-cli where they apply.
//
//   dpl-run -m MODEL -p "text" [-n N] [--temp T] [--top-k K] ...
//   dpl-run -m MODEL --tokens 1,2,3 --all-logits --dump-logits OUT.f32
//   dpl-run -m MODEL -cnv [-sys "..."] [--single-turn -p "..."] [--reasoning-budget 0]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <future>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cli/cli.h"
#include "formats/model_file.h"
#include "formats/output_file.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/device.h"
#include "runtime/generate/generate.h"
#include "runtime/generate/sampler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using dpl::generate::Timings;

void PrintText(absl::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

// The logits file, written whole or not at all (never over the model).
absl::Status WriteLogits(const std::string& path, const std::string& model,
                         const std::vector<float>& rows) {
  dpl::formats::OutputOptions o;
  o.inputs = {model};
  return dpl::formats::WriteFileAtomically(
      path, {reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float)}, o);
}

// A loaded model: its tokenizer and its decoder on the chosen device.
struct Loaded {
  std::shared_ptr<dpl::formats::ModelFile> index;  // metadata only
  std::optional<dpl::tokenizer::Tokenizer> tok;
  std::unique_ptr<dpl::generate::Decoder> decoder;
  double load_seconds = 0;       // start to loaded, all of it
  double index_seconds = 0;        // the file's metadata and tensor table
  double tokenizer_seconds = 0;    // built alongside the device's load
  double device_init_seconds = 0;  // the CUDA context, alongside the index (StartDeviceInit)
  double prefault_seconds = 0;     // the file's pages mapped, alongside the context (StartWeightPrefault)
  double host_copy_gb_per_s = 0;   // and the host's copy speed measured first
};

void PrintTimings(const Loaded& l, const Timings& t) {
  std::fprintf(stderr, "\n\ntimings:\n");
  std::fprintf(stderr, "  load:      %10.2f ms (index %.0f ms; alongside: device context %.0f ms, "
               "file pages %.0f ms (host copies %.1f GB/s), tokenizer %.0f ms", l.load_seconds * 1e3,
               l.index_seconds * 1e3, l.device_init_seconds * 1e3, l.prefault_seconds * 1e3,
               l.host_copy_gb_per_s, l.tokenizer_seconds * 1e3);
  for (const auto& [stage, sec] : l.decoder->LoadStages()) {
    std::fprintf(stderr, "; %s %.0f ms", stage.c_str(), sec * 1e3);
  }
  std::fprintf(stderr, ")\n");
  std::fprintf(stderr, "  prompt:    %10.2f ms / %5lld tokens (%8.2f tokens/s)\n",
               t.prompt_seconds * 1e3, static_cast<long long>(t.n_prompt),
               t.prompt_seconds > 0 ? t.n_prompt / t.prompt_seconds : 0.0);
  std::fprintf(stderr, "  generated: %10.2f ms / %5lld tokens (%8.2f tokens/s)\n",
               t.generate_seconds * 1e3, static_cast<long long>(t.n_generated),
               t.generate_seconds > 0 ? t.n_generated / t.generate_seconds : 0.0);
}

// dpl-run's flags (llama-cli's names and defaults where they apply).
void AddFlags(cxxopts::Options& options) {
  options.add_options()
      ("m,model", "model file (GGUF or .dpl)", cxxopts::value<std::string>())
      ("p,prompt", "prompt text", cxxopts::value<std::string>())
      ("f,file", "read the prompt from a file", cxxopts::value<std::string>())
      ("n,n-predict", "tokens to generate (-1: until end of generation)",
       cxxopts::value<int32_t>()->default_value("-1"))
      ("c,ctx-size", "context size (0: the model's training context; the cpu device caps it at 4096)",
       cxxopts::value<int64_t>()->default_value("4096"))
      ("s,seed", "sampling seed (-1: random)", cxxopts::value<int64_t>()->default_value("-1"))
      ("temp", "temperature (0: greedy)", cxxopts::value<float>()->default_value("0.8"))
      ("top-k", "top-k (0: off)", cxxopts::value<int32_t>()->default_value("40"))
      ("top-p", "top-p (1: off)", cxxopts::value<float>()->default_value("0.95"))
      ("min-p", "min-p (0: off)", cxxopts::value<float>()->default_value("0.05"))
      ("repeat-penalty", "repetition penalty (1: off)", cxxopts::value<float>()->default_value("1.0"))
      ("repeat-last-n", "tokens the penalty looks back over", cxxopts::value<int32_t>()->default_value("64"))
      ("cnv,conversation", "chat: read user turns from standard input")
      ("single-turn", "chat: answer the -p prompt once and exit")
      ("sys,system-prompt", "chat: system message", cxxopts::value<std::string>())
      ("chat-template",
       absl::StrCat("chat: a built-in family renderer, one of ", dpl::tokenizer::ChatTemplateNames(),
                    " (default: the model's own Jinja template)"),
       cxxopts::value<std::string>()->default_value(""))
      ("chat-template-file", "chat: a Jinja chat template file, rendered in place of the model's",
       cxxopts::value<std::string>()->default_value(""))
      ("reasoning-budget",
       "chat: thinking allowed, -1 unrestricted or 0 off (qwen3; other templates ignore it)",
       cxxopts::value<int32_t>()->default_value("-1"))
      ("tokens", "evaluate these token ids (comma-separated) instead of a prompt",
       cxxopts::value<std::string>())
      ("all-logits", "with --tokens: keep the logits of every position")
      ("dump-logits", "write float32 logits [positions][n_vocab] to this file",
       cxxopts::value<std::string>())
      ("device", "cuda (the GPU runtime) or cpu (the float64 reference)",
       cxxopts::value<std::string>()->default_value("cuda"))
      ("t,threads", "CPU threads (0: all)", cxxopts::value<int>()->default_value("0"))
      ("weights-upload",
       "cuda: how the weights reach the GPU: pin (the file's pages pinned, copied by the copy "
       "engine), staged (host threads copy through pinned buffers) or auto (staged where the "
       "host copies at 30 GB/s or more, measured at start-up, else pinned; staged where "
       "pinning fails)",
       cxxopts::value<std::string>()->default_value("auto"))
      ("ubatch-size", "cuda: prompt tokens per forward pass (a longer prompt runs in chunks)",
       cxxopts::value<int>()->default_value("2048"));
}

absl::StatusOr<Loaded> Load(const cxxopts::ParseResult& args) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = args["model"].as<std::string>();
  Loaded l;
  dpl::runtime::DeviceOptions dopt;
  dopt.device = args["device"].as<std::string>();
  std::future<double> device_init = dpl::runtime::StartDeviceInit(dopt.device);
  DPL_ASSIGN_OR_RETURN(l.index, dpl::formats::ModelFile::OpenIndex(path));
  l.index_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The weights' pages are mapped while the context is created.
  dpl::runtime::WeightPrefault prefault = dpl::runtime::StartWeightPrefault(
      dopt.device == "cuda" ? l.index : nullptr);
  // The tokenizer is built while the weights load.
  std::future<absl::StatusOr<dpl::tokenizer::Tokenizer>> tok =
      std::async(std::launch::async, [&l] {
        const auto start = std::chrono::steady_clock::now();
        auto t = dpl::tokenizer::Tokenizer::FromMetadata(l.index->metadata());
        l.tokenizer_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return t;
      });
  dopt.threads = args["threads"].as<int>();
  dopt.n_ctx = args["ctx-size"].as<int64_t>();
  dopt.max_batch = args["ubatch-size"].as<int>();
  dopt.weights_upload = args["weights-upload"].as<std::string>();
  const char* eager = std::getenv("DPL_EAGER");  // debugging: no graph (docs in README)
  dopt.eager = eager != nullptr && *eager != '\0' && std::strcmp(eager, "0") != 0;
  dopt.index = l.index;
  l.device_init_seconds = device_init.get();
  l.host_copy_gb_per_s = dopt.host_copy_gb_per_s = prefault.host_copy_gb_per_s.get();
  DPL_ASSIGN_OR_RETURN(l.decoder, dpl::runtime::CreateDecoder(path, dopt));
  l.prefault_seconds = prefault.seconds.get();
  DPL_ASSIGN_OR_RETURN(l.tok, tok.get());
  l.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l;
}

// --tokens: evaluate ids, optionally dump logits, print the last argmax.
absl::Status RunTokens(const cxxopts::ParseResult& args, Loaded& l) {
  dpl::generate::Decoder& dec = *l.decoder;
  DPL_ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                       dpl::tokenizer::Tokenizer::ParseIdList(args["tokens"].as<std::string>(),
                                                              dec.n_vocab()));
  if (ids.empty()) return absl::InvalidArgumentError("--tokens: no ids");
  std::vector<float> last, all;
  const bool want_all = args.count("all-logits") > 0;
  const auto t0 = std::chrono::steady_clock::now();
  DPL_RETURN_IF_ERROR(dec.Eval(ids, &last, want_all ? &all : nullptr));
  const std::vector<float>& rows = want_all ? all : last;
  const size_t V = static_cast<size_t>(dec.n_vocab());
  for (size_t r = 0; r * V < rows.size(); ++r) {
    const int64_t pos = static_cast<int64_t>(want_all ? r : ids.size() - 1);
    DPL_RETURN_IF_ERROR(dpl::generate::CheckFinite(absl::MakeConstSpan(rows).subspan(r * V, V), pos));
  }
  Timings t;
  t.n_prompt = ids.size();
  t.prompt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.count("dump-logits")) {
    DPL_RETURN_IF_ERROR(WriteLogits(args["dump-logits"].as<std::string>(),
                                    args["model"].as<std::string>(), want_all ? all : last));
  }
  int32_t best = 0;
  for (int32_t i = 1; i < dec.n_vocab(); ++i) best = last[i] > last[best] ? i : best;
  std::printf("evaluated %zu tokens; argmax of the last logits: %d %s\n", ids.size(), best,
              l.tok->TokenToPiece(best).c_str());
  PrintTimings(l, t);
  return absl::OkStatus();
}

dpl::generate::SamplerParams SamplerFlags(const cxxopts::ParseResult& args) {
  dpl::generate::SamplerParams sp;
  sp.temperature = args["temp"].as<float>();
  sp.top_k = args["top-k"].as<int32_t>();
  sp.top_p = args["top-p"].as<float>();
  sp.min_p = args["min-p"].as<float>();
  sp.repeat_penalty = args["repeat-penalty"].as<float>();
  sp.repeat_last_n = args["repeat-last-n"].as<int32_t>();
  const int64_t seed = args["seed"].as<int64_t>();
  sp.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  return sp;
}

// A prompt file: a regular file (or a pipe) of at most kMaxPromptBytes.
// Why the cap: the prompt must fit the context (at most 2^24 tokens, each at
// least one byte), and /dev/zero must not be read forever.
constexpr uint64_t kMaxPromptBytes = 64ull << 20;

absl::StatusOr<std::string> ReadPromptFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open prompt file ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("prompt file ", path, " is a directory"));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("reading prompt file ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    if (text.size() + n > kMaxPromptBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("prompt file ", path, " is larger than ",
                                                     kMaxPromptBytes >> 20, " MiB"));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

absl::StatusOr<std::string> PromptText(const cxxopts::ParseResult& args) {
  if (args.count("file")) return ReadPromptFile(args["file"].as<std::string>());
  return args.count("prompt") ? args["prompt"].as<std::string>() : std::string();
}

// Ranges as llama.cpp states them; each error names the flag and its range.
absl::Status CheckFlags(const cxxopts::ParseResult& args) {
  auto range = [](absl::string_view flag, double v, double lo, double hi) -> absl::Status {
    if (v >= lo && v <= hi) return absl::OkStatus();  // false for NaN too
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", v, " is out of range [", lo, ", ", hi, "]"));
  };
  DPL_RETURN_IF_ERROR(range("-c", args["ctx-size"].as<int64_t>(), 0, dpl::runtime::kMaxContext));
  DPL_RETURN_IF_ERROR(range("-t", args["threads"].as<int>(), 0, 1024));
  DPL_RETURN_IF_ERROR(range("-ub", args["ubatch-size"].as<int>(), 1, 8192));
  DPL_RETURN_IF_ERROR(
      dpl::runtime::ParseUploadMethod(args["weights-upload"].as<std::string>()).status());
  DPL_RETURN_IF_ERROR(range("-n", args["n-predict"].as<int32_t>(), -1, 1 << 30));
  DPL_RETURN_IF_ERROR(range("--temp", args["temp"].as<float>(), 0, 1e6));
  DPL_RETURN_IF_ERROR(range("--top-k", args["top-k"].as<int32_t>(), 0, 1 << 30));
  DPL_RETURN_IF_ERROR(range("--top-p", args["top-p"].as<float>(), 0, 1));
  DPL_RETURN_IF_ERROR(range("--min-p", args["min-p"].as<float>(), 0, 1));
  DPL_RETURN_IF_ERROR(range("--repeat-penalty", args["repeat-penalty"].as<float>(), 1e-6, 1e6));
  DPL_RETURN_IF_ERROR(range("--repeat-last-n", args["repeat-last-n"].as<int32_t>(), 0, 1 << 20));
  if (args.count("prompt") && args.count("file")) {
    return absl::InvalidArgumentError("-p and -f both give the prompt: use one");
  }
  if (args.count("single-turn") && !args.count("prompt") && !args.count("file")) {
    return absl::InvalidArgumentError("--single-turn answers the -p (or -f) prompt: give one");
  }
  // llama.cpp's --reasoning-budget takes only these two values too.
  if (const int32_t budget = args["reasoning-budget"].as<int32_t>(); budget != -1 && budget != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reasoning-budget ", budget, ": only -1 (unrestricted thinking) and 0 (thinking off) "
        "are supported"));
  }
  // A bad --chat-template name or file is reported before the model loads.
  return dpl::tokenizer::CheckChatTemplateFlags(args["chat-template"].as<std::string>(),
                                                args["chat-template-file"].as<std::string>());
}

// Chat: render the whole conversation each turn; feed only what the cache lacks.
absl::Status RunChat(const cxxopts::ParseResult& args, Loaded& l, const std::string& prompt,
                     dpl::generate::Sampler& sampler, Timings* timings) {
  dpl::generate::Decoder& dec = *l.decoder;
  const dpl::tokenizer::Tokenizer& tok = *l.tok;
  std::string jinja;  // --chat-template-file's text
  if (const std::string file = args["chat-template-file"].as<std::string>(); !file.empty()) {
    DPL_ASSIGN_OR_RETURN(jinja, dpl::tokenizer::ReadChatTemplateFile(file));
  }
  DPL_ASSIGN_OR_RETURN(const dpl::tokenizer::ChatTemplate tmpl,
                       dpl::tokenizer::ChatTemplate::FromMetadata(
                           l.index->metadata(), args["chat-template"].as<std::string>(), jinja));
  std::fprintf(stderr, "chat template: %s\n", tmpl.Describe().c_str());
  dpl::tokenizer::ChatOptions options;
  options.enable_thinking = args["reasoning-budget"].as<int32_t>() != 0;  // checked: -1 or 0
  std::vector<dpl::tokenizer::ChatMessage> messages;
  if (args.count("system-prompt")) messages.push_back({"system", args["system-prompt"].as<std::string>()});
  std::vector<int32_t> history;  // ids in the decoder's cache
  const bool single = args.count("single-turn") > 0;
  const bool interactive = isatty(STDIN_FILENO);
  bool first = true;
  while (true) {
    std::string user;
    if (first && !prompt.empty()) {
      user = prompt;
    } else {
      if (single) break;
      if (interactive) std::fprintf(stdout, "\n> "), std::fflush(stdout);
      if (!std::getline(std::cin, user)) break;
      if (user.empty()) continue;
    }
    first = false;
    messages.push_back({"user", user});
    DPL_ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                         dpl::tokenizer::EncodeChat(tok, tmpl, messages, true, options));
    size_t common = 0;
    while (common < history.size() && common < ids.size() && history[common] == ids[common]) ++common;
    if (common == ids.size()) --common;  // always feed at least one token
    DPL_RETURN_IF_ERROR(dec.Rewind(common));
    history.resize(common);
    dpl::generate::GenerateRequest req;
    req.prompt = absl::MakeConstSpan(ids).subspan(common);
    req.n_predict = args["n-predict"].as<int32_t>();
    for (int32_t id : tmpl.StopTokens(tok)) req.stop.insert(id);
    DPL_ASSIGN_OR_RETURN(const std::vector<int32_t> out,
                         dpl::generate::Generate(dec, tok, sampler, req, PrintText, timings));
    std::fputc('\n', stdout);
    history.insert(history.end(), req.prompt.begin(), req.prompt.end());
    history.insert(history.end(), out.begin(), out.end());
    messages.push_back({"assistant", tok.Decode(out)});
    if (single) break;
  }
  return absl::OkStatus();
}

absl::Status Run(const cxxopts::ParseResult& args) {
  if (!args.count("model")) return absl::InvalidArgumentError("no model: use -m MODEL");
  DPL_RETURN_IF_ERROR(CheckFlags(args));
  DPL_ASSIGN_OR_RETURN(Loaded l, Load(args));
  if (const std::string report = l.decoder->LoadReport(); !report.empty()) {
    std::fprintf(stderr, "%s\n", report.c_str());
  }
  if (args.count("tokens")) return RunTokens(args, l);
  dpl::generate::Sampler sampler(SamplerFlags(args));
  DPL_ASSIGN_OR_RETURN(const std::string prompt, PromptText(args));
  if (!l.tok->has_vocab()) {
    return absl::FailedPreconditionError(
        "this model has no vocabulary (tokenizer.ggml.model = \"none\"); use --tokens");
  }
  Timings timings;
  const bool chat = args.count("conversation") || args.count("single-turn") || args.count("system-prompt");
  if (chat) {
    DPL_RETURN_IF_ERROR(RunChat(args, l, prompt, sampler, &timings));
  } else {
    if (prompt.empty()) {
      return absl::InvalidArgumentError("no prompt: use -p TEXT, -f FILE, --tokens or -cnv");
    }
    const dpl::tokenizer::Tokenizer& tok = *l.tok;
    // A text that cannot fit is refused before it is tokenized (a 10 MB
    // prompt takes seconds to encode; its byte count alone says it is too long).
    const int64_t at_least =
        tok.MinTokensFor(static_cast<int64_t>(prompt.size()), tok.adds_bos_by_default());
    if (at_least > l.decoder->n_ctx()) {
      return absl::OutOfRangeError(absl::StrCat(
          "the prompt (", prompt.size(), " bytes: at least ", at_least,
          " tokens) is longer than the context (", l.decoder->n_ctx(), " tokens; use -c to enlarge it)"));
    }
    const std::vector<int32_t> ids = tok.Encode(prompt, tok.adds_bos_by_default(), true);
    dpl::generate::GenerateRequest req;
    req.prompt = ids;
    req.n_predict = args["n-predict"].as<int32_t>();
    for (int32_t id : tok.end_of_generation_ids()) req.stop.insert(id);
    if (static_cast<int64_t>(ids.size()) > l.decoder->n_ctx()) {  // before echoing it
      return absl::OutOfRangeError(absl::StrCat("the prompt (", ids.size(),
                                                " tokens) is longer than the context (",
                                                l.decoder->n_ctx(), "); use -c"));
    }
    PrintText(prompt);
    DPL_RETURN_IF_ERROR(
        dpl::generate::Generate(*l.decoder, tok, sampler, req, PrintText, &timings).status());
  }
  PrintTimings(l, timings);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-run", "Generate text with a GGUF or .dpl model");
  AddFlags(cmd.options());
  cmd.AddSingleDashAlias("-cnv", "conversation");
  cmd.AddSingleDashAlias("-sys", "system-prompt");
  cmd.AddSingleDashAlias("-ub", "ubatch-size");
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  const absl::Status s = Run(cmd.args());
  return s.ok() ? 0 : cmd.Fail(s);
}
