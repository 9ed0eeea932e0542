// Decode attention throughput: KV bytes read per call / time, with the KV of
// several layers rotated (more bytes than the 60 MB L2) so HBM is measured.
// Timed twice: plain stream launches and CUDA-graph replay (the decoder's
// way). A/B switches of one binary (environment, read here only):
//   DPL_ATTN_PDL=0       plain (non-programmatic) combine launch
//   DPL_ATTN_SPLITS=N    N split blocks per kv head instead of one wave's worth
//   DPL_ATTN_PAGED=B     the cache as a paged pool of blocks of B positions
//                        (kernels/kv_pages.h), one sequence whose table takes
//                        the blocks in a scattered order
// Prompt attention (PromptAttention, a chunk of tokens on tensor cores) is
// timed after the decode rows, in TFLOP/s; DPL_ATTN_BENCH_PROMPT=1 runs only
// those rows. Then a packed pass's chunks (a server's step: several
// sequences' prompt chunks together), launched chunk by chunk against
// PromptAttentionBatch's one launch.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/prompt_attention.h"
#include "kernels/device_tuning.h"

namespace {

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));            \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

dpl::kernels::DecodeTuning g_tuning;
int g_page = 0;  // DPL_ATTN_PAGED: positions a block, 0: regions

// A table over the n_ctx positions of one sequence in blocks of g_page
// (block i -> (i * 7919) mod n, a permutation for n a power of two), on
// the device; regions without DPL_ATTN_PAGED.
dpl::kernels::KvPages MakePages(int n_ctx) {
  dpl::kernels::KvPages pages;
  if (g_page == 0) return pages;
  const int n = n_ctx / g_page;
  std::vector<int> table(n);
  for (int i = 0; i < n; ++i) table[i] = static_cast<int>((int64_t{i} * 7919) % n);
  int* d = nullptr;
  CK(cudaMalloc(&d, n * sizeof(int)));
  CK(cudaMemcpy(d, table.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  pages.tables = d;
  pages.max_blocks = n;
  while ((1 << pages.block_shift) < g_page) ++pages.block_shift;
  return pages;
}

void Bench(const char* name, int n_head, int n_head_kv, int depth, int n_layers) {
  const int hd = 128, n_ctx = 32768;
  auto plan = dpl::kernels::PlanDecodeAttention(n_head, n_head_kv, hd, n_ctx, /*window=*/0, g_tuning);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  const size_t per_array = size_t(n_head_kv) * n_ctx * hd;
  std::vector<uint16_t*> k(n_layers), v(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    CK(cudaMalloc(&k[l], per_array * 2));
    CK(cudaMalloc(&v[l], per_array * 2));
    CK(cudaMemset(k[l], 0x11, per_array * 2));  // f16 ~ 5e-4, finite
    CK(cudaMemset(v[l], 0x22, per_array * 2));
  }
  float *q, *ws, *out;
  int* pos;
  CK(cudaMalloc(&q, n_head * hd * 4));
  CK(cudaMemset(q, 0, n_head * hd * 4));
  CK(cudaMalloc(&ws, plan->workspace_floats * 4));
  CK(cudaMalloc(&out, n_head * hd * 4));
  CK(cudaMalloc(&pos, 4));
  const int p = depth - 1;
  CK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const dpl::kernels::KvPages pages = MakePages(n_ctx);
  auto run = [&](int l, cudaStream_t stream) {
    auto st = dpl::kernels::DecodeAttention(*plan, q, k[l], v[l], pos, ws, out, stream, nullptr, nullptr, pages);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  for (int i = 0; i < 3 * n_layers; ++i) run(i % n_layers, 0);
  // Stream launches: each call's host launch cost is included when the
  // kernels are shorter than it.
  const int iters = 50 * n_layers;
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) run(i % n_layers, 0);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double us = ms * 1000.0 / iters;
  // Graph replay, as the decoder runs it: one graph holds all n_layers calls
  // (back to back, like the layers of one token), replayed 50 times.
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < n_layers; ++l) run(l, st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(a, st));
  for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float gms = 0;
  CK(cudaEventElapsedTime(&gms, a, b));
  const double gus = gms * 1000.0 / (50.0 * n_layers);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(st);
  const double bytes = 2.0 * n_head_kv * double(depth) * hd * 2;
  std::printf("%-4s heads %2d/%d depth %5d: stream %7.2f us/call %7.1f GB/s | graph %7.2f us/call "
              "%7.1f GB/s | KV %6.2f MB/call (max_splits %d, %d layers rotated)\n",
              name, n_head, n_head_kv, depth, us, bytes / (us * 1e3), gus, bytes / (gus * 1e3),
              bytes / 1e6, plan->max_splits, n_layers);
  for (int l = 0; l < n_layers; ++l) cudaFree(k[l]), cudaFree(v[l]);
  cudaFree(q), cudaFree(ws), cudaFree(out), cudaFree(pos), cudaFree(const_cast<int*>(pages.tables));
}

// Microseconds a call of run() (stream launches on the default stream),
// after 5 warm-up calls, over 50.
template <typename Run>
double TimeUs(Run&& run) {
  for (int i = 0; i < 5; ++i) run();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int iters = 50;
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) run();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms * 1000.0 / iters;
}

// Prompt attention for one chunk of n tokens at positions p0..p0+n-1 (each
// attends keys 0..its position). FLOPs = 4 * head_dim * n_head * sum over the
// chunk's queries of the keys each attends (2 for Q K^T and 2 for P V per
// multiply-add). Compute-bound (the 7B chunk at p0 3254 reads 7.7 MB of K/V
// per call and does 25.8 GFLOP), so the cache is not rotated through HBM.
void BenchPrompt(const char* name, int n_head, int n_head_kv, int p0, int n) {
  const int hd = 128, n_ctx = 32768;
  const size_t per_array = size_t(n_head_kv) * n_ctx * hd;
  uint16_t *k, *v;
  float *q, *out;
  CK(cudaMalloc(&k, per_array * 2));
  CK(cudaMalloc(&v, per_array * 2));
  CK(cudaMemset(k, 0x11, per_array * 2));  // f16 ~ 5e-4, finite
  CK(cudaMemset(v, 0x22, per_array * 2));
  const size_t n_q = size_t(n) * n_head * hd;
  CK(cudaMalloc(&q, n_q * 4));
  CK(cudaMemset(q, 0, n_q * 4));
  CK(cudaMalloc(&out, n_q * 4));
  const dpl::kernels::PromptAttentionShape shape{n_head, n_head_kv, hd, n_ctx};
  const dpl::kernels::KvPages pages = MakePages(n_ctx);
  auto run = [&] {
    auto st = dpl::kernels::PromptAttention(shape, q, k, v, p0, n, out, 0, pages, 0);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  const double us = TimeUs(run);
  // sum_{t < n} (p0 + t + 1) keys attended.
  const double keys = double(n) * (p0 + 1) + double(n) * (n - 1) / 2;
  const double flops = 4.0 * hd * n_head * keys;
  std::printf("prompt %-4s heads %2d/%d p0 %5d n %4d: %8.2f us/call %6.1f TFLOP/s (%.1f GFLOP)\n",
              name, n_head, n_head_kv, p0, n, us, flops / (us * 1e6), flops / 1e9);
  cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(out), cudaFree(const_cast<int*>(pages.tables));
}

// A packed pass of n_chunks chunks of n tokens at p0, each its own sequence
// (regions, or with DPL_ATTN_PAGED tables over one pool), launched one chunk
// at a time (what the decoder did before PromptAttentionBatch) and as one
// launch of every chunk's tiles. Same FLOPs as n_chunks BenchPrompt chunks.
void BenchPromptPass(const char* name, int n_head, int n_head_kv, int n_chunks, int p0, int n) {
  const int hd = 128, n_ctx = 4096;
  const size_t per_seq = size_t(n_head_kv) * n_ctx * hd;
  uint16_t *k, *v;
  float *q, *out;
  CK(cudaMalloc(&k, per_seq * n_chunks * 2));
  CK(cudaMalloc(&v, per_seq * n_chunks * 2));
  CK(cudaMemset(k, 0x11, per_seq * n_chunks * 2));
  CK(cudaMemset(v, 0x22, per_seq * n_chunks * 2));
  const size_t row = size_t(n_head) * hd, n_q = row * n * n_chunks;
  CK(cudaMalloc(&q, n_q * 4));
  CK(cudaMemset(q, 0, n_q * 4));
  CK(cudaMalloc(&out, n_q * 4));
  const dpl::kernels::PromptAttentionShape shape{n_head, n_head_kv, hd, n_ctx};
  dpl::kernels::KvPages pages;
  if (g_page > 0) {  // sequence s: blocks s * per + (i * 7919) mod per, a scattered order
    const int per = n_ctx / g_page;
    std::vector<int> tables(size_t(per) * n_chunks);
    for (int s = 0; s < n_chunks; ++s) {
      for (int i = 0; i < per; ++i) tables[size_t(s) * per + i] = s * per + static_cast<int>((int64_t{i} * 7919) % per);
    }
    int* d = nullptr;
    CK(cudaMalloc(&d, tables.size() * sizeof(int)));
    CK(cudaMemcpy(d, tables.data(), tables.size() * sizeof(int), cudaMemcpyHostToDevice));
    pages.tables = d;
    pages.max_blocks = per;
    while ((1 << pages.block_shift) < g_page) ++pages.block_shift;
  }
  std::vector<dpl::kernels::PromptChunk> chunks;
  for (int c = 0; c < n_chunks; ++c) chunks.push_back({c, p0, c * n, n});
  const std::vector<dpl::kernels::PromptTile> tiles = dpl::kernels::PlanPromptTiles(chunks);
  dpl::kernels::PromptTile* dev_tiles = nullptr;
  CK(cudaMalloc(&dev_tiles, tiles.size() * sizeof(tiles[0])));
  CK(cudaMemcpy(dev_tiles, tiles.data(), tiles.size() * sizeof(tiles[0]), cudaMemcpyHostToDevice));
  auto check = [](const absl::Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  auto alone = [&] {
    for (int c = 0; c < n_chunks; ++c) {
      const size_t region = g_page > 0 ? 0 : per_seq * c;
      check(dpl::kernels::PromptAttention(shape, q + row * n * c, k + region, v + region, p0, n,
                                          out + row * n * c, 0, pages, c));
    }
  };
  auto batch = [&] {
    check(dpl::kernels::PromptAttentionBatch(shape, q, k, v, tiles, dev_tiles, out, 0, pages));
  };
  const double us_alone = TimeUs(alone), us_batch = TimeUs(batch);
  const double keys = double(n) * (p0 + 1) + double(n) * (n - 1) / 2;
  const double flops = 4.0 * hd * n_head * keys * n_chunks;
  std::printf("pass   %-4s heads %2d/%d %2d chunks p0 %5d n %4d: chunk by chunk %8.2f us (%5.1f TFLOP/s), "
              "one launch %8.2f us (%5.1f TFLOP/s), %zu tiles\n",
              name, n_head, n_head_kv, n_chunks, p0, n, us_alone, flops / (us_alone * 1e6), us_batch,
              flops / (us_batch * 1e6), tiles.size());
  cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(out), cudaFree(dev_tiles);
  cudaFree(const_cast<int*>(pages.tables));
}

void BenchPromptRows() {
  BenchPrompt("7B", 28, 4, 2000, 50);  // a 50-token question after a 2,000-token system prompt
  BenchPrompt("7B", 28, 4, 0, 512);
  BenchPrompt("7B", 28, 4, 3254, 512);
  BenchPrompt("14B", 40, 8, 0, 512);
  BenchPrompt("14B", 40, 8, 3254, 512);
  BenchPromptPass("7B", 28, 4, 16, 2000, 50);  // 16 requests' questions after one shared start
  BenchPromptPass("7B", 28, 4, 4, 0, 128);     // 64 streams' 128-token prompts, 4 a pass of 512
  BenchPromptPass("7B", 28, 4, 8, 0, 64);
  BenchPromptPass("14B", 40, 8, 16, 2000, 50);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB;", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  auto tuning = dpl::kernels::DecodeTuningForDevice();
  if (!tuning.ok()) {
    std::fprintf(stderr, "%s\n", tuning.status().ToString().c_str());
    return 1;
  }
  g_tuning = *tuning;
  if (const char* e = std::getenv("DPL_ATTN_PDL")) g_tuning.attn_pdl = std::atoi(e) != 0;
  if (const char* e = std::getenv("DPL_ATTN_SPLITS")) g_tuning.attn_splits = std::atoi(e);
  if (const char* e = std::getenv("DPL_ATTN_MIN_CHUNK")) g_tuning.attn_min_chunk = std::atoi(e);
  if (const char* e = std::getenv("DPL_ATTN_COMBINE_PARTS")) g_tuning.attn_combine_parts = std::atoi(e);
  if (const char* e = std::getenv("DPL_ATTN_PAGED")) g_page = std::atoi(e);
  std::printf(" pdl %d, splits %s, %s\n", g_tuning.attn_pdl ? 1 : 0,
              g_tuning.attn_splits > 0 ? std::to_string(g_tuning.attn_splits).c_str() : "one wave",
              g_page > 0 ? ("paged, blocks of " + std::to_string(g_page)).c_str() : "regions");
  if (const char* e = std::getenv("DPL_ATTN_BENCH_PROMPT"); e && e[0] == '1') {
    BenchPromptRows();
    return 0;
  }
  // DPL_ATTN_BENCH_QUICK=1: only the depth-3254 rows and depth 1024 (sweeps).
  const char* quick = std::getenv("DPL_ATTN_BENCH_QUICK");
  if (quick && quick[0] == '1') {
    Bench("7B", 28, 4, 3254, 28);
    Bench("14B", 40, 8, 3254, 16);
    Bench("7B", 28, 4, 1024, 28);
    return 0;
  }
  // Caches of n_ctx = 32768 per layer (K+V: 7B 67 MB, 14B 134 MB). At depth
  // 3254 the live rows of 28 (7B) / 16 (14B) rotated layers are 187 / 213 MB,
  // at 32768 four layers are 268 / 537 MB: all well past the 60 MB L2.
  Bench("7B", 28, 4, 3254, 28);
  Bench("14B", 40, 8, 3254, 16);
  Bench("7B", 28, 4, 32768, 4);
  Bench("14B", 40, 8, 32768, 4);
  Bench("7B", 28, 4, 1024, 28);
  Bench("7B", 28, 4, 16384, 4);
  BenchPromptRows();
  return 0;
}
