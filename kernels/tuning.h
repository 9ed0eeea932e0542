// Everything the decode kernels' launch choices depend on beyond the model's
// shapes: facts of the GPU (from cudaDeviceProp and the occupancy API, queried
// once at load by DecodeTuningForDevice, kernels/device_tuning.h) and the
// measured policy constants. Plain data, no CUDA: the planners that read it
// (matvec_plan.cc, attention.cu's PlanDecodeAttention) are tested on the CPU
// with a hand-made tuning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpl::kernels {

struct DecodeTuning {
  // Streaming multiprocessors (H200: 132).
  int num_sms = 0;
  // CTAs of the q6_K single-token kernel (ksplit 4, depth 1, pipelined; 72
  // registers per thread on sm_90a) resident per SM: 7 on an H200. Sets how
  // many rows one wave covers, which decides the q6_K k-split.
  int q6k_ctas_per_sm = 0;
  // Split-attention blocks per SM at most. Measured on the H200: 14B (group
  // 5, 3 blocks/SM fit) at depth 3254 takes 16.6 us with 50 splits and 13.9 us
  // with 33: a split's rows are cheap next to the combine cost (partials
  // written, read and merged per split), so fewer, fuller splits win.
  // Re-measured with the tensor-core split kernel (2026-12-03, half the
  // splits via DPL_ATTN_SPLITS): the 14B +1.2% at depth 3254, the 7B -1.5%
  // at tg128 and -3% at depth 32768, so it stays 2 (docs/PERF.md).
  int attn_max_blocks_per_sm = 2;
  // > 0: split-attention blocks per kv head, instead of one wave's worth
  // (benchmark sweeps).
  int attn_splits = 0;
  // Fewest keys an active attention split takes: a KV length L works
  // min(max_splits, ceil(L / attn_min_chunk)) splits (attention_split.h).
  // Measured on the H200 with the tensor-core split kernel (2026-12-03,
  // dpl-bench DPL_ATTN_MIN_CHUNK, two rounds): 7B tg128 / @d3254 509.7 /
  // 462.2 at 32, 516.0 / 472.5 at 64, 500.3 / 472.5 at 128; the 14B within
  // 0.3% at 32 and 64 (docs/PERF.md).
  int attn_min_chunk = 64;
  // Threads per head dim in the attention combine kernel, 4 or 8: each sums
  // the splits s = part (mod parts). Measured on the H200 (2026-12-03, 7B,
  // dpl-bench DPL_ATTN_COMBINE_PARTS, two rounds): tg128 519.9 with 4,
  // 517.4 with 8; @ d3254 471.4 / 470.2 (docs/PERF.md).
  int attn_combine_parts = 4;
  // The attention combine kernel goes out as a programmatic dependent launch
  // (Hopper PDL), overlapping its launch with the split kernel's tail.
  // Measured neutral; false launches it plainly (A/B).
  bool attn_pdl = true;
  // Under PDL, the split kernel's blocks whose keys end before the current
  // position issue their first K/V tiles before waiting on RoPE (the rows
  // they read were written by earlier steps); false: every block waits first
  // (A/B: dpl-bench DPL_ATTN_EARLY=0).
  bool attn_early_kv = true;
  // The decode step's attention combine also writes Wo's int8 activation
  // blocks (one quantize launch fewer per layer); false: a separate
  // QuantizeActivations launch (A/B: dpl-bench DPL_ATTN_QUANT=0). Measured
  // on the H200 (2026-12-02, builds 8908a8e -> 2e478de, two rounds): 14B
  // tg128 261.3 -> 262.7, but tg128 @ d3254 227.8 -> 217.2; the 7B gained
  // at both depths (docs/PERF.md). Why the 14B loses at depth is open.
  bool attn_quantize_output = true;
  // Products over at least this many tokens multiply on tensor cores
  // (weights dequantized to f16, cuBLAS); fewer run the dp4a matvec in
  // token tiles. gemm_bench on the H200 (7B/14B q4_K and q6_K dpl shapes):
  // dequant + GEMM wins from 2..8 tokens on depending on the shape (7B
  // ffn_gate, 8 tokens: 97 us vs 118 us), the dp4a kernel at 1.
  int gemm_min_tokens = 8;
  // Mixture-of-experts passes whose routes (rows x k) number at least this
  // percentage of the experts group them by expert (kernels/matvec/moe.h:
  // RouteGroups + ExpertMatVecGrouped, each expert's weights read once per
  // tile of its routes, on the int8 tensor cores) instead of a CTA column
  // per route (an expert read once per route); 0: never (dpl-bench
  // DPL_MOE_GROUPED=N). Measured on an H100 (2026-12-07, Qwen3-30B-A3B
  // Q4_K_M, 128 experts, k 8; dpl-bench, per route -> grouped): pp512 1,965 ->
  // 12,673 t/s; 64 sequences 1,770 -> 3,686; 16 (128 routes: 100%) 1,175 ->
  // 1,313; but 4 (32 routes: 25%) 598 -> 553, where most tiles hold one
  // route and the mma's 8-token tile idles: hence 100 (docs/PERF.md).
  int moe_grouped_min_fill_pct = 100;
  // A MoE model's prompt passes (not its decode steps) of more rows than
  // this run their dense products on dequantize + cuBLAS (f16 activations)
  // instead of the int8 and f16 mma forms. Why: a router near-tie turns
  // activation noise into another expert, and the int8 activations of the
  // q8_0 / q5_K products (no f16 form) are the noise. The MoE oracle's
  // 48-token prompt (H100, docs/PERF.md, 2026-12-07): 2.886% RMS from
  // float64 with the mma forms (position 11, margin 0.005, took the other
  // expert: 12.95% there), 0.631% this way. dpl-bench takes DPL_MOE_PROMPT_MMA.
  int moe_prompt_mma_max_rows = 8;
  // f32 matrices of few row blocks (a MoE router) multiply 2-64 tokens on
  // the token tile split 8 ways, 4 steps deep (kF32WideTile,
  // matvec_geometry.h) instead of 4 ways, 2 deep. Measured (H100,
  // 2026-12-07, nineteenth session, dpl-bench 30B-A3B Q4_K_M, off / on,
  // two rounds, t/s): 4 sequences 839.9 / 916.2 (+9%), 16 1,724 / 1,827
  // (+6%), one sequence 430.8 / 430.7 (not on this path). dpl-bench takes
  // DPL_F32_WIDE_TILE=0 (an A/B).
  bool f32_wide_tile = true;
  // When every matrix of a model has the int8 mma form (q4_K, q6_K:
  // MatVecMmaSupports), products of 2 up to this many tokens (at most
  // kMmaMaxTokens) keep int8 activations and run it instead of dequantize +
  // GEMM: a batched decode step and short prompt chunks. matvec_bench on the
  // H200 (2026-12-04, 7B q4_K ffn_gate/up, us): the mma form (activations
  // staged per CTA) 25.3 / 32.6 / 48.7 / 73.8 at 4 / 16 / 32 / 64 tokens
  // against dequant + GEMM's flat ~96; dpl-bench's batched rows agree (7B,
  // 32 sequences: 5216 t/s with mma, 2669 with GEMM; 64: 6592 vs 5211).
  int mma_max_tokens = 64;
  // Of those products, q4_K ones over at least mma_f16_min_tokens tokens and
  // q6_K (dpl) ones over at least mma_f16_min_tokens_q6k run the f16 mma
  // form (matvec_mma_f16.cu: weights dequantized in registers into f16
  // fragments, f32 accumulation over the whole row, a cp.async pipeline of
  // weights and activations) instead of the int8 form; > kMmaMaxTokens:
  // never. Measured on an H100 (2026-12-06, second session: whole-block
  // stages; matvec_bench, 7B shapes, int8 time / f16 time at 4 / 16 / 32 /
  // 64 tokens): q4_K gate/up 0.98 / 1.13 / 1.21 / 1.17x, down 0.91 / 1.02 /
  // 1.31 / 1.90x, q/o 1.03 / 1.09 / 1.22 / 1.49x; q6_K down 1.13 / 1.22 /
  // 1.44 / 1.98x, lm head 1.51 / 1.45 / 1.64 / 1.86x. dpl-bench 7B, q4_K on
  // from 2 against 33: 4 sequences 1,215 -> 1,145 t/s, 8 2,334 -> 2,200, 16
  // 3,982 -> 4,124, 32 5,774 -> 6,900 (docs/PERF.md); hence q4_K from 9 (the
  // 16-token n-tiles' first count). q6_K from 9 as well (third session,
  // the form on wgmma: dpl-bench 7B, 16 sequences 3,964 t/s with q6_K from
  // 17, 4,097 from 9), not from 2: its f16 activations move a random-weight
  // model's greedy tokens off the single-stream ones (cuda_engine_gpu_test,
  // 3 rows), which the int8 form (the same integer dots as the one-row
  // kernel) kept then. q6_K from 4 since the sixteenth session (2026-12-07,
  // H100): 4 sequences 1,206 -> 1,226 t/s, 8 2,312 -> 2,326 (fifteenth
  // session's A/B), and cuda_engine_gpu_test on a build with it, 12/12:
  // batched rows keep one stream's greedy tokens.
  int mma_f16_min_tokens = 9;
  int mma_f16_min_tokens_q6k = 4;
  // q5_K and q8_0 (dpl) on the f16 form (Q5KF16: q4_K's arithmetic with
  // the fifth bit in the mantissa; Q8_0F16: int8 weights exact in f16, one
  // multiply by d) from this many tokens. Measured on an H100 (2026-12-07,
  // sixteenth session; docs/PERF.md): matvec_gpu_test's f16 case 6.4-6.9e-5
  // (q8_0) and 1.8-2.4e-4 (q5_K) from the f16-x reference where the int8 form
  // is 1.5-1.9e-3; matvec_bench 7B gate/up int8 / f16 time at 4 / 16 / 32 /
  // 64 tokens q5_K 1.21 / 1.28 / 1.25 / 1.38x, q8_0 1.04 / 1.07 / 1.16 /
  // 1.38x; dpl-bench 7B, from 9 against never, 16 / 32 / 64 sequences:
  // Q8_0 2,874 -> 3,349 / 4,436 -> 6,307 / 5,964 -> 9,714 t/s, Q5_K_M 3,725
  // -> 3,681 (-1.2%) / 5,537 -> 6,653 / 6,567 -> 9,419. Hence q5_K from 17
  // (the 32-token n-tiles' first count). q8_0 from 9 since the seventeenth
  // session: held back a session because cuda_decoder_gpu_test's MoE
  // batched steps of 12 sequences moved 0.179 (relative RMS) from the
  // single-sequence step with it (the mini MoE model's q8_0 K/V on f16
  // activations flip a near-tie expert choice, an honest difference of
  // routes, not of arithmetic); that case now checks each batched row
  // against the CPU reference on the row's own routes, and passed with q8_0
  // from 9 (H100: RMS 0.71-1.16% over 12 sequences, limit 3%; the whole
  // test 26/26). dpl-bench takes DPL_MMA_F16_MIN_Q5K and DPL_MMA_F16_MIN_Q8_0.
  int mma_f16_min_tokens_q5k = 17;
  int mma_f16_min_tokens_q8_0 = 9;
  // CTAs a SM of the f16 form up to 16 tokens: 2 (whole-block stages, three
  // or four of them), 3 (whole-block stages, two: the same bits) or 4
  // (half-block stages, registers capped at 128), taken only by launches of
  // more CTAs than two a SM hold (MatVecPlan::num_sms; 7B's
  // gate/up). Measured on an H100 (docs/PERF.md, "Three or four f16-form
  // CTAs a SM up to 16 tokens"): on every launch, 3 won in matvec_bench
  // (gate/up at 16 tokens 30.7 -> 25.7 us, the others level) and under ncu
  // (0-13% a launch) but lost in the captured step, 4,083 -> 3,804 t/s at
  // 16 sequences (with PDL off it won: 3,926 -> 3,987); on the big grids
  // only, dpl-bench 7B, two calls, 12 / 16 sequences +1.1-1.7%
  // (4,108 -> 4,176; 4,077-4,100 -> 4,144-4,147), 32 and 64 level; 4 lost
  // everywhere. dpl-bench and matvec_bench take DPL_F16_CTAS.
  int mma_f16_small_ctas_per_sm = 3;
  // The f16 form's k splits added inside thread block clusters of a row
  // tile's CTAs (MmaF16Options::cluster_sum: the same bits, no second
  // launch) instead of partials through global memory and MmaSumSplits.
  // 0: never; 1: launches of more CTAs than one wave holds (7B's gate/up);
  // 2: every split launch. Measured on an H100 (docs/PERF.md, "The f16
  // form's k splits summed inside clusters"): every product gained alone,
  // but in the step clusters on the one-wave launches lost 3-7% at 12-64
  // sequences, and on every split launch (with 3 CTAs a SM) won at 12, 16
  // and 64 (+2.6%, +2.6%, +3.5%) and lost 6.5% at 32; 1 is the rule those
  // numbers point to, not yet measured. Measured again after the stage's
  // instruction cuts (H100, 2026-12-07, thirteenth session, dpl-bench 7B,
  // two rounds, 12 / 16 / 32 / 64 sequences, t/s): 0 3,192 / 4,239 / 7,197
  // / 10,606; 1 3,248 / 4,316 / 7,240 / 10,692; 2 3,284 / 4,363 / 7,186 /
  // 10,817: 2 wins at 12, 16 and 64 (+2.0-2.9%) and is level at 32.
  // dpl-bench and matvec_bench take DPL_F16_CLUSTER.
  int mma_f16_cluster_sum = 2;
  // About how many CTAs the f16 form's k splits aim at for one matrix
  // (MmaF16Splits: ceil(target / row tiles) splits, at most 8): 224 puts
  // 7B's Q, O and down (28 row tiles) at 8 splits, so a Q/K/V launch has
  // 288 CTAs, 1.09 waves of 264 at two a SM; 196 gives them 7 (260 CTAs,
  // one wave). dpl-bench and matvec_bench take DPL_F16_TARGET.
  int mma_f16_target_ctas = 224;
  // The same for products of more than 16 tokens. Measured with cluster sums
  // (H100, 2026-12-07, thirteenth session, dpl-bench 7B, two rounds, t/s at
  // 12 / 16 / 32 / 64 sequences): 224 3,281 / 4,356 / 7,151 / 10,809; 196
  // 3,204 / 4,263 / 7,363 / 10,905: 196 wins past 16 tokens (+3.0%, +0.9%),
  // 224 up to 16 (+2.4%, +2.2%). dpl-bench takes DPL_F16_TARGET_WIDE.
  int mma_f16_target_ctas_wide = 196;
  // Products of more than kMmaMaxTokens (64) and up to this many tokens (a
  // prompt pass, a server's packed or mixed pass) on the f16 form's wide
  // launch: one CTA a 64-token tile of a row tile, grid.x the tiles, so the
  // CTAs of a row tile run side by side and read its weights from HBM about
  // once (the rest from L2); no f16 copy of the weights. Past it, and for
  // files with a matrix that has no f16 form, dequantize + cuBLAS
  // (gemm_min_tokens). 0 (or <= 64): never. Why: a 512-token 7B pass
  // spends ~6 ms of its ~22 writing and reading back f16 weights, and a
  // 65-128-token pass pays all of it (docs/PERF.md, "Seventeenth
  // session"). Measured (H100, 2026-12-07, nineteenth session, dpl-bench 7B
  // Q4_K_M -ub 512, two rounds, t/s, cuBLAS / wide with the k split below):
  // pp128 8,643-8,601 / 16,033-16,168 (+87%), pp192 11,775-11,718 /
  // 14,804-14,866 (+26%), pp256 15,107-15,259 / 18,641-18,624 (+23%),
  // pp320 15,306-15,379 / 16,911-16,769 (+10%), pp384 19,660-19,737 /
  // 18,500-18,344 (-6%), pp512 23,329-23,473 / 20,355-20,311 (-13%): the
  // crossover lies between 320 and 384 (docs/PERF.md, "Nineteenth
  // session"). dpl-bench and dpl-server take DPL_MMA_F16_MAX (0: never).
  int mma_f16_max_tokens = 320;
  // The wide launch's 64-token CTAs split k alike over a group's parts
  // (about mma_f16_target_ctas_wide CTAs a token tile), the splits added
  // in clusters, where unsplit a 3584-row matrix has 56 CTAs at 128 tokens.
  // Measured (H100, nineteenth session, gemm_bench 7B, us, unsplit ->
  // split): ffn_down q4_K at 128 tokens 199 -> 71, gate/up 78 -> 72; the
  // pass pp128 9,594-9,829 -> 16,033-16,168 t/s. dpl-bench and gemm_bench
  // take DPL_F16_WIDE_SPLIT=0 (an A/B).
  bool mma_f16_wide_split = true;
  // In a pass on the wide launch, the products of one input go to
  // dequantize + cuBLAS instead from this many rows (0: never): Q/K/V (the
  // normed x), O (the attention's output), and ffn_down where it is q6_K
  // (gate/up and a q4_K down stay on the wide launch). The input is then
  // prepared as cuBLAS reads it (f16, row-major) and not as the wide launch
  // does. Why: gemm_bench (nineteenth session, H100, 7B, us, wide with k
  // split against dequantize + cuBLAS) has q/o losing on the wide launch
  // from 128 tokens (31.5 against 23.6; 35.1 / 27.9 at 256), Q/K/V
  // together from ~190 (at 256: 35.1 + 2 x 18.9 against 27.9 + 2 x 16.2)
  // and q6_K down from ~190 (93.1 / 132.9 at 128, 175.2 / 140.5 at 256),
  // while gate/up and q4_K down win to ~256-320. Predicted (counted from
  // that table, thresholds 192 / 128 / 192): ~1 ms of a ~13.7 ms 256-row
  // pass, pp256 +7-8%, pp128 +5%. Off until measured (tools/gpu/pending.sh
  // item 22); dpl-bench takes DPL_WIDE_GEMM_QKV, DPL_WIDE_GEMM_O and
  // DPL_WIDE_GEMM_DOWN6.
  int wide_gemm_qkv_rows = 0;
  int wide_gemm_o_rows = 0;
  int wide_gemm_q6k_down_rows = 0;
  // A packed prompt pass's chunks (the server's prompts of several
  // sequences in one pass) go through prompt attention in one launch a
  // layer (PromptAttentionBatch) instead of one launch a chunk. dpl-server
  // takes DPL_PROMPT_ONE_LAUNCH=0 (an A/B; docs/PERF.md has the numbers).
  bool prompt_attn_one_launch = true;
  // Prompt passes on tensor cores dequantize the next matrix to f16 on a
  // second stream while this one's GEMM runs (kernels::F16WeightsAhead, a
  // second f16 scratch of the largest layer matrix: 136 MB on a 7B). A
  // probe, off until measured: dpl-bench and dpl-server take
  // DPL_GEMM_AHEAD=1.
  bool gemm_dequant_ahead = false;
  // With gemm_dequant_ahead, a probe of sharing the SMs out instead of
  // taking turns for them: cuBLAS plans its GEMMs for this many SMs (0: all;
  // PromptGemm::SetSmCountTarget), the dequant's launches are capped at
  // gemm_ahead_dequant_ctas CTAs (0: a full grid), and with
  // gemm_ahead_side_first false the GEMMs' stream has the high priority
  // instead of the dequant's. dpl-bench and dpl-server take DPL_GEMM_SMS,
  // DPL_GEMM_AHEAD_CTAS and DPL_GEMM_AHEAD_SIDE_FIRST.
  int gemm_ahead_sm_target = 0;
  int gemm_ahead_dequant_ctas = 0;
  bool gemm_ahead_side_first = true;
  // The decode step's kernels go out as programmatic dependent launches
  // (kernels/launch.cuh): each starts while the previous one drains, and a
  // matvec loads its first weights before waiting for its input. Measured
  // on the H200 (2026-12-02, dpl-bench, Qwen2.5-7B Q4_K_M, same binary,
  // DPL_PDL=0/1 interleaved): tg128 450.9 -> 489.6 t/s, tg128 @ d3254
  // 410.1 -> 448.2 (+8.6%, +9.3%).
  bool pdl = true;
  // Matrices that read the same activations (Q/K/V, gate/up) share one
  // matvec launch per weight kernel (PlanMatVecGroups); false: one launch
  // per matrix (A/B). Measured as above (no PDL): tg128 409.7 -> 450.9 t/s;
  // matvec_bench, 7B q/k/v q4_K: 16.7 us in 3 launches, 6.5 us in one.
  bool group_matvecs = true;
  // Single-token matvec geometries forced on the launches of one kernel and
  // shape, instead of the planner's (in-graph geometry sweeps: dpl-bench
  // DPL_MATVEC_GEOM). Empty unless a benchmark sets it.
  struct MatVecGeometryOverride {
    std::string kernel;  // MatVecKernelName, e.g. "q4_K"
    int64_t n_rows = 0;  // the launch's height (a group's total rows)
    int64_t n_cols = 0;
    int ksplit = 0;
    int depth = 0;
    bool pipe = false;
  };
  std::vector<MatVecGeometryOverride> matvec_geometry;
  // Single-token steps fold RoPE and the KV-cache write into the Q/K/V
  // matvec's epilogue (kernels/matvec/matvec_rope.h: the same bits, one
  // launch fewer per layer) where the model allows it (RoPE over the whole
  // head, no per-head q/k norms); false: the RoPE kernel (A/B: dpl-bench
  // DPL_ROPE_FOLD=0).
  bool rope_in_matvec = true;
};

}  // namespace dpl::kernels
