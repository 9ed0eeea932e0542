// reference-bench: times the CPU reference's decode steps on a model file.
//   reference-bench MODEL [--threads N] [--tokens N] [--resident-mb N]
// Prints the hyperparameters, load time and decode tokens/s (tokens
// 1, 2, 3, ... fed from position 0).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "formats/model_file.h"
#include "model/model.h"
#include "runtime/reference/reference_model.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [--threads N] [--tokens N] [--resident-mb N]\n", argv[0]);
    return 2;
  }
  dpl::reference::ReferenceOptions opts;
  int n_tokens = 8;
  for (int i = 2; i + 1 < argc; i += 2) {
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--threads") == 0) {
      opts.threads = static_cast<int>(v);
    } else if (std::strcmp(argv[i], "--tokens") == 0) {
      n_tokens = static_cast<int>(v);
    } else if (std::strcmp(argv[i], "--resident-mb") == 0) {
      opts.max_resident_bytes = static_cast<uint64_t>(v) << 20;
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  opts.n_ctx = n_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  auto file = dpl::formats::ModelFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  auto model = dpl::reference::ReferenceModel::Load(*file, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("%s\nthreads=%d resident=%d load %.2f s\n",
              dpl::model::HparamsDebugString((*model)->hparams()).c_str(),
              (*model)->threads(), (*model)->weights_resident() ? 1 : 0,
              std::chrono::duration<double>(t1 - t0).count());
  for (int pos = 0; pos < n_tokens; ++pos) {
    const auto a = std::chrono::steady_clock::now();
    auto logits = (*model)->Forward(1 + pos % ((*model)->n_vocab() - 1), pos);
    if (!logits.ok()) {
      std::fprintf(stderr, "%s\n", logits.status().ToString().c_str());
      return 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    std::printf("pos %d: %.3f s (%.2f tokens/s) logit[0]=%g\n", pos, s, 1.0 / s, (*logits)[0]);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("decode: %d tokens in %.2f s = %.2f tokens/s\n", n_tokens, total, n_tokens / total);
  return 0;
}
