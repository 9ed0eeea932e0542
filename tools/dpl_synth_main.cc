// dpl-synth PRESET OUT.gguf [--vocab VOCAB.gguf | --no-vocab N] [--tied]
//           [--ftype FTYPE] [--seed N] [--threads N]
// FTYPE: q4_k_m (default), q5_k_m, q6_k, q8_0, q4_0, q4_1, q5_0, q5_1,
// iq4_nl, iq4_xs, q3_k_m, q2_k, bf16, f16, f32 (llama-quantize's mixes).
// Writes a random-weight GGUF v3 model of a known shape; see tools/synth.h.
// OUT.gguf appears whole or not at all (formats/output_file.h): an error or
// a terminating signal removes the unfinished temporary file.
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cxxopts.hpp"
#include "formats/output_file.h"
#include "model/model.h"
#include "tools/synth.h"

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "dpl-synth: %s\n", msg.c_str());
  return 1;
}

void ListPresets() {
  std::printf("%-14s %-6s %6s %6s %9s %7s %7s %8s %6s  %s\n", "preset", "arch", "embd", "layers",
              "heads(kv)", "hd", "ffn", "vocab", "head", "note");
  for (const dpl::synth::Preset& p : dpl::synth::Presets()) {
    std::string heads = absl::StrFormat("%u(%u)", p.n_head, p.n_head_kv);
    const std::string arch(dpl::model::ArchName(p.arch));
    std::printf("%-14s %-6s %6u %6u %9s %7u %7u %8u %6s  %s\n", p.name.c_str(), arch.c_str(),
                p.n_embd, p.n_layer, heads.c_str(), p.head_dim, p.n_ff, p.n_vocab,
                p.tied ? "tied" : "own", p.note.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-synth",
                           "Writes a random-weight GGUF with llama.cpp's tensor set, metadata and "
                           "type mix for a model shape.");
  const std::string ftype_help =
      "llama-quantize's type mix: " + dpl::synth::KnownFtypeNames();
  options.positional_help("PRESET OUT.gguf");
  options.add_options()
      ("list", "list the presets and exit")
      ("vocab", "copy every tokenizer.* key from this GGUF; n_vocab = its token count",
       cxxopts::value<std::string>())
      ("no-vocab", "no tokenizer, vocabulary of N tokens (default: the preset's)",
       cxxopts::value<uint32_t>())
      ("tied", "no output.weight: the lm head is token_embd")
      ("untied", "give a tied preset its own output.weight")
      ("ftype", ftype_help, cxxopts::value<std::string>()->default_value("q4_k_m"))
      ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("1"))
      ("threads", "generator threads (0: all cores, or 1..1024); the output does not depend on it",
       cxxopts::value<unsigned>()->default_value("0"))
      ("h,help", "this help")
      ("positional", "", cxxopts::value<std::vector<std::string>>());
  options.parse_positional({"positional"});

  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    return Fail(std::string(e.what()) + " (see --help)");
  }
  if (args.count("help")) {
    std::printf("%s\n", options.help().c_str());
    return 0;
  }
  if (args.count("list")) {
    ListPresets();
    return 0;
  }
  std::vector<std::string> pos;
  if (args.count("positional")) pos = args["positional"].as<std::vector<std::string>>();
  if (pos.size() != 2) return Fail("expected PRESET OUT.gguf (see --help, --list)");

  absl::StatusOr<dpl::synth::Preset> preset = dpl::synth::FindPreset(pos[0]);
  if (!preset.ok()) return Fail(std::string(preset.status().message()));
  absl::StatusOr<dpl::synth::Ftype> ftype =
      dpl::synth::ParseFtype(args["ftype"].as<std::string>());
  if (!ftype.ok()) return Fail(std::string(ftype.status().message()));
  if (args.count("vocab") && args.count("no-vocab")) {
    return Fail("--vocab and --no-vocab exclude each other");
  }
  if (args.count("tied") && args.count("untied")) {
    return Fail("--tied and --untied exclude each other");
  }

  dpl::synth::SynthOptions opts;
  opts.preset = *preset;
  opts.ftype = *ftype;
  if (args.count("tied")) opts.preset.tied = true;
  if (args.count("untied")) opts.preset.tied = false;
  if (args.count("no-vocab")) {
    const uint32_t n = args["no-vocab"].as<uint32_t>();
    if (n == 0) return Fail("--no-vocab needs a positive vocabulary size");
    opts.preset.n_vocab = n;
  }
  if (args.count("vocab")) opts.vocab_path = args["vocab"].as<std::string>();
  opts.seed = args["seed"].as<uint64_t>();
  opts.threads = args["threads"].as<unsigned>();

  // A closed stdout is an EPIPE, not a death; every other terminating signal
  // removes the unfinished output.
  std::signal(SIGPIPE, SIG_IGN);
  dpl::formats::InstallSignalCleanup();
  absl::StatusOr<dpl::synth::SynthResult> res = dpl::synth::WriteSyntheticModel(opts, pos[1]);
  if (!res.ok()) return Fail(std::string(res.status().message()));
  const double mb = static_cast<double>(res->file_bytes) / 1e6;
  std::printf("dpl-synth: %s %s -> %s: %llu tensors, %llu bytes (%.2f GiB) in %.2f s (%.0f MB/s)\n",
              opts.preset.name.c_str(), std::string(dpl::synth::FtypeName(opts.ftype)).c_str(),
              pos[1].c_str(), static_cast<unsigned long long>(res->n_tensors),
              static_cast<unsigned long long>(res->file_bytes),
              static_cast<double>(res->file_bytes) / (1ull << 30), res->seconds,
              res->seconds > 0 ? mb / res->seconds : 0.0);
  return 0;
}
