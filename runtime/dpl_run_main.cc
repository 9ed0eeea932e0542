// dpl-run: generate text with a GGUF or .dpl model. Flag names and defaults
// follow llama.cpp's llama-cli where they apply.
//
//   dpl-run -m MODEL -p "text" [-n N] [--temp T] [--top-k K] ...
//   dpl-run -m MODEL --tokens 1,2,3 --all-logits --dump-logits OUT.f32
//   dpl-run -m MODEL -cnv [-sys "..."] [--single-turn -p "..."]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "absl/strings/str_format.h"
#include "formats/model_file.h"
#include "runtime/device.h"
#include "runtime/generate/generate.h"
#include "runtime/generate/sampler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using dpl::generate::Timings;

int Fail(absl::string_view message) {
  std::fprintf(stderr, "dpl-run: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return 1;
}

void PrintText(absl::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

absl::Status WriteLogits(const std::string& path, const std::vector<float>& rows) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::NotFoundError(absl::StrCat("cannot create ", tmp));
    out.write(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void PrintTimings(double load_s, const Timings& t) {
  std::fprintf(stderr, "\n\ntimings:\n");
  std::fprintf(stderr, "  load:      %10.2f ms\n", load_s * 1e3);
  std::fprintf(stderr, "  prompt:    %10.2f ms / %5lld tokens (%8.2f tokens/s)\n",
               t.prompt_seconds * 1e3, static_cast<long long>(t.n_prompt),
               t.prompt_seconds > 0 ? t.n_prompt / t.prompt_seconds : 0.0);
  std::fprintf(stderr, "  generated: %10.2f ms / %5lld tokens (%8.2f tokens/s)\n",
               t.generate_seconds * 1e3, static_cast<long long>(t.n_generated),
               t.generate_seconds > 0 ? t.n_generated / t.generate_seconds : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-run", "Generate text with a GGUF or .dpl model");
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
      ("chat-template", "chat: chatml or llama3 (default: from the model)",
       cxxopts::value<std::string>()->default_value(""))
      ("tokens", "evaluate these token ids (comma-separated) instead of a prompt",
       cxxopts::value<std::string>())
      ("all-logits", "with --tokens: keep the logits of every position")
      ("dump-logits", "write float32 logits [positions][n_vocab] to this file",
       cxxopts::value<std::string>())
      ("device", "cuda (the GPU runtime) or cpu (the float64 reference)",
       cxxopts::value<std::string>()->default_value("cuda"))
      ("t,threads", "CPU threads (0: all)", cxxopts::value<int>()->default_value("0"))
      ("h,help", "show this help");
  // llama.cpp spells two long options with one dash (-cnv, -sys); cxxopts
  // would read them as -c nv and -s ys, so they are renamed before parsing.
  std::vector<std::string> renamed(argv, argv + argc);
  for (std::string& a : renamed) {
    if (a == "-cnv") a = "--conversation";
    if (a == "-sys") a = "--system-prompt";
  }
  std::vector<char*> args_v;
  for (std::string& a : renamed) args_v.push_back(a.data());
  cxxopts::ParseResult args;
  try {
    args = options.parse(static_cast<int>(args_v.size()), args_v.data());
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  if (!args.unmatched().empty()) return Fail("unexpected argument '" + args.unmatched()[0] + "'");
  if (!args.count("model")) return Fail("no model: use -m MODEL");

  const auto t_load = std::chrono::steady_clock::now();
  const std::string model_path = args["model"].as<std::string>();
  auto model = dpl::formats::ModelFile::OpenIndex(model_path);  // metadata only
  if (!model.ok()) return Fail(model.status().message());
  auto tok = dpl::tokenizer::Tokenizer::FromMetadata((*model)->metadata());
  if (!tok.ok()) return Fail(tok.status().message());
  dpl::runtime::DeviceOptions dopt;
  dopt.device = args["device"].as<std::string>();
  dopt.threads = args["threads"].as<int>();
  dopt.n_ctx = args["ctx-size"].as<int64_t>();
  auto decoder = dpl::runtime::CreateDecoder(model_path, dopt);
  if (!decoder.ok()) return Fail(decoder.status().message());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  dpl::generate::Decoder& dec = **decoder;
  if (const std::string report = dec.LoadReport(); !report.empty()) {
    std::fprintf(stderr, "%s\n", report.c_str());
  }

  // --tokens: evaluate ids, optionally dump logits.
  if (args.count("tokens")) {
    auto ids = dpl::tokenizer::Tokenizer::ParseIdList(args["tokens"].as<std::string>(), dec.n_vocab());
    if (!ids.ok()) return Fail(ids.status().message());
    if (ids->empty()) return Fail("--tokens: no ids");
    std::vector<float> last, all;
    const bool want_all = args.count("all-logits") > 0;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = dec.Eval(*ids, &last, want_all ? &all : nullptr);
    if (!s.ok()) return Fail(s.message());
    Timings t;
    t.n_prompt = ids->size();
    t.prompt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (args.count("dump-logits")) {
      s = WriteLogits(args["dump-logits"].as<std::string>(), want_all ? all : last);
      if (!s.ok()) return Fail(s.message());
    }
    int32_t best = 0;
    for (int32_t i = 1; i < dec.n_vocab(); ++i) best = last[i] > last[best] ? i : best;
    std::printf("evaluated %zu tokens; argmax of the last logits: %d %s\n", ids->size(), best,
                tok->TokenToPiece(best).c_str());
    PrintTimings(load_s, t);
    return 0;
  }

  dpl::generate::SamplerParams sp;
  sp.temperature = args["temp"].as<float>();
  sp.top_k = args["top-k"].as<int32_t>();
  sp.top_p = args["top-p"].as<float>();
  sp.min_p = args["min-p"].as<float>();
  sp.repeat_penalty = args["repeat-penalty"].as<float>();
  sp.repeat_last_n = args["repeat-last-n"].as<int32_t>();
  const int64_t seed = args["seed"].as<int64_t>();
  sp.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  dpl::generate::Sampler sampler(sp);
  const int32_t n_predict = args["n-predict"].as<int32_t>();

  std::string prompt;
  if (args.count("prompt")) prompt = args["prompt"].as<std::string>();
  if (args.count("file")) {
    std::ifstream in(args["file"].as<std::string>(), std::ios::binary);
    if (!in) return Fail("cannot read prompt file " + args["file"].as<std::string>());
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }
  if (!tok->has_vocab()) {
    return Fail("this model has no vocabulary (tokenizer.ggml.model = \"none\"); use --tokens");
  }

  Timings timings;
  const bool chat = args.count("conversation") || args.count("single-turn") || args.count("system-prompt");
  if (!chat) {
    if (prompt.empty()) return Fail("no prompt: use -p TEXT, -f FILE, --tokens or -cnv");
    const std::vector<int32_t> ids = tok->Encode(prompt, tok->adds_bos_by_default(), true);
    dpl::generate::GenerateRequest req;
    req.prompt = ids;
    req.n_predict = n_predict;
    for (int32_t id : tok->end_of_generation_ids()) req.stop.insert(id);
    PrintText(prompt);
    auto out = dpl::generate::Generate(dec, *tok, sampler, req, PrintText, &timings);
    if (!out.ok()) return Fail(out.status().message());
    PrintTimings(load_s, timings);
    return 0;
  }

  // Chat: render the whole conversation each turn; feed only what the cache lacks.
  auto tmpl = dpl::tokenizer::ChatTemplate::FromMetadata((*model)->metadata(),
                                                         args["chat-template"].as<std::string>());
  if (!tmpl.ok()) return Fail(tmpl.status().message());
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
    auto ids = dpl::tokenizer::EncodeChat(*tok, *tmpl, messages, true);
    if (!ids.ok()) return Fail(ids.status().message());
    size_t common = 0;
    while (common < history.size() && common < ids->size() && history[common] == (*ids)[common]) ++common;
    if (common == ids->size()) --common;  // always feed at least one token
    absl::Status s = dec.Rewind(common);
    if (!s.ok()) return Fail(s.message());
    history.resize(common);
    dpl::generate::GenerateRequest req;
    req.prompt = absl::MakeConstSpan(*ids).subspan(common);
    req.n_predict = n_predict;
    for (int32_t id : tmpl->StopTokens(*tok)) req.stop.insert(id);
    auto out = dpl::generate::Generate(dec, *tok, sampler, req, PrintText, &timings);
    if (!out.ok()) return Fail(out.status().message());
    std::fputc('\n', stdout);
    history.insert(history.end(), req.prompt.begin(), req.prompt.end());
    history.insert(history.end(), out->begin(), out->end());
    messages.push_back({"assistant", tok->Decode(*out)});
    if (single) break;
  }
  PrintTimings(load_s, timings);
  return 0;
}
