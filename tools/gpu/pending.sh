# What is left unmeasured (docs/PERF.md names each and its prediction), as
# of the twentieth session (2026-12-08), which was lent no device at all:
# items 18-21 are its changes, written and built but never run. Stage the
# binaries the items use (stage.sh builds only those), e.g. for 18-21:
#   DPL_STAGE_ORACLES="" DPL_STAGE_BINS="dpl-bench dpl-synth dpl-convert \
#     prompt_gemm_gpu_test ops_gpu_test cuda_engine_gpu_test" tools/gpu/stage.sh
# plus, for item 18's A/B, a baseline dpl-bench (38972af, before the fused
# f16 norm) gzipped as .gpu/suite/base/dpl-bench.gz (30 MiB in all), or for
# the older items
#   DPL_STAGE_ORACLES="mini-qwen3moe-q4km small-qwen2-q4km" DPL_STAGE_BINS=\
#     "matvec_gpu_test cuda_decoder_gpu_test cuda_engine_gpu_test dpl-bench \
#     dpl-synth dpl-convert gemm_bench" tools/gpu/stage.sh
# (56 MiB: within a call's 64 MiB beside the tree); for the server loads
# (item 9) stage dpl-server in a second directory. A carried folder
# replaces the device's copy each call: unpack bin.tar.gz again.
# On the device, from the repository root (ITEMS picks):
#   ITEMS="18 19 21 20" bash tools/gpu/pending.sh .gpu/suite OUT_DIR (each
#   item runs within one call's 10 minutes; 18-21 together in ~6)
# 18. prompt passes on cuBLAS: RMSNorm and SwiGLU straight to f16 (landed,
#     on the default path, never run on a GPU): ops_gpu_test (the bits
#     against the float32 kernels rounded), prompt_gemm_gpu_test, and pp512 /
#     pp2048 against the baseline dpl-bench. Predicted +4-5% at pp512.
# 19. the dequant-ahead probe sharing the SMs out (DPL_GEMM_SMS,
#     DPL_GEMM_AHEAD_CTAS, DPL_GEMM_AHEAD_SIDE_FIRST): pp512 sweep. Predicted
#     +10-15% if the dequant on the SMs the GEMM leaves keeps up, else none.
# 20. q4_K on the f16 form from 4 tokens: DPL_MMA_F16_MIN=9 (today) / 4 /
#     2 with DPL_MMA_F16_MIN_Q6K=2, 2 / 4 / 8 sequences. Predicted 4
#     sequences ~1,226 -> ~1,260 t/s. Landing it needs cuda_engine_gpu_test
#     on a build with mma_f16_min_tokens 4 (batched rows keep one stream's
#     greedy tokens).
# 22. a wide pass's Q/K/V, O and q6_K down on dequantize + cuBLAS
#     (DPL_WIDE_GEMM_QKV / _O / _DOWN6, off by default): cuda_decoder_gpu_test's
#     chunking case (its wide pass with all three from 65 rows, against the
#     reference and one chunk), then pp128 / 192 / 256 / 320 and the shared
#     start's x2 and x16 rows with the three off, at 192 / 128 / 192, and all
#     at 65. Predicted pp256 +7-8%, pp128 +5%. Stage cuda_decoder_gpu_test and
#     the oracle small-qwen2-q4km too.
# 21. ncu of one 64-row 7B step (dpl-bench now brackets a batched row's
#     last run for --profile-from-start off): where issue 29's 5.9 ms goes.
# 17. issues 30 and 29: ncu of the wide launch's products (gemm_bench 7B at
#     128 and 256 tokens; or in a pass: dpl-bench -p 128 under ncu
#     --profile-from-start off, which dpl-bench now brackets): L2 bytes and
#     throughput, DRAM bytes, SM throughput. The nineteenth session's reading: every row tile re-reads
#     its 64-token activation tile (272 MB of L2 reads for gate/up at 128
#     tokens beside 153 MB of weights, ~5.9 TB/s in 72 us), and refitting
#     the splits to whole waves lost 8%. If L2 is the bound, 256-row CTAs
#     (two warpgroups sharing one activation stage) halve those reads; the
#     tenth session's such CTAs lost 6-7% at 32-64 tokens (docs/PERF.md),
#     so at 128-320 tokens they need a measurement of their own.
# 16. the server loads (item 9) with DPL_MMA_F16_MAX=0 against the build's
#     default (320 since the nineteenth session).
#  7. issue 32: tools/gpu/structured.sh (json_schema against free text, -np 1;
#     the bar is the H200's; the H100 gave +3.2-3.9%).
#  9. issue 30: dpl-server's step trace (DPL_TRACE_STEPS, summed by
#     tools/perf/step_trace.py) under the 64-stream burst and the 16-stream
#     shared start (at each -ub of UB_LIST, default 512, and DPL_MIXED_STEPS
#     of MIXED_LIST, default 0), and dpl-bench's 16 and 64 rows; the bars are
#     the H200's, where it has not run yet.
# 12. issue 30: the shared start's packed passes alone: dpl-bench --shared
#     2000 -npp 50 at -ub 512 beside pp512 and pp512 @ d2000, then ncu of the
#     x16 row's last run (--profile-from-start off: dpl-bench brackets it).
#  8. issue 31: the 30B-A3B's rows at 4 / 16 / 64 sequences, then ncu of
#     three 4-row steps alone (the batched row's last run, bracketed),
#     summed by kernel and grid.
# 11. cuda_engine_gpu_test and cuda_decoder_gpu_test, whole, on the build's
#     defaults (a change of a default needs them before it lands).
#  5. issue 29: q5_K and q8_0 on the f16 form: matvec_gpu_test, matvec_bench,
#     Q8_0 and Q5_K_M 7B steps at 16-64 sequences, each threshold 65 / 9
#     (stage matvec_gpu_test and matvec_bench too).
# 10. issue 34: ncu of the persistent probe's products, whose third round
#     (PROBE_PREQ=1, nineteenth session) reached 1.64 TB/s in the PDL graph
#     (79.9 us a layer; persistent 84.8): why not ~2.5. nvcc on the device
#     takes over a minute: build it here and carry it.
set -u
suite=${1:?usage: pending.sh SUITE_DIR OUT_DIR}
out=${2:-/tmp/pending}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee "$out/pending.log") 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
root=$PWD
cd "$suite" || exit 1
[[ -f bin.tar.gz && ! -x dpl-bench ]] && tar -xzf bin.tar.gz
source ./env.sh
export DPL_SHARED_DIR=$PWD/shared
T=${TMPDIR:-/tmp}
want() { [[ " ${ITEMS:-18 19 21 20} " == *" $1 "* ]]; }
rows() {  # "ENV..." DPL_BENCH_ARGS...: each md row's test and t/s on one line
  local v=$1; shift
  echo "-- $v: $(env $v timeout 100 ./dpl-bench "$@" 2>&1 | grep -E '^\| *[^ |-]|rror' | grep -v '| test' |
    awk -F'|' '{printf "%s %s;", $2, $3}')"
}
ncu_sum() {  # NAME ROWS TIMEOUT DPL_BENCH_ARGS...: ncu of dpl-bench's bracketed run, summed by kernel and grid
  local name=$1 top=$2 limit=$3; shift 3
  timeout "$limit" ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    ./dpl-bench "$@" >"$out/$name.csv" 2>"$out/$name.err"
  tail -2 "$out/$name.err"
  python3 "$root/tools/gpu/ncu_agg.py" "$out/$name.csv" "$top"
}
pp() {  # LABEL BIN MODEL P UB ENV...: the pass's t/s
  local label=$1 bin=$2 model=$3 p=$4 ub=$5; shift 5
  echo "$label pp$p: $(env "$@" timeout 50 "$bin" -m "$model" -p "$p" -n 0 -d 0 -ub "$ub" -r 3 2>&1 |
    grep -E 'pp[0-9]|rror' | awk -F'|' '{print $3}')"
}
if want 18; then
echo "[${SECONDS}s] == 18. RMSNorm and SwiGLU straight to f16 in cuBLAS passes"
m=$(q7_model) || exit 1
timeout 60 ./ops_gpu_test 2>&1 | grep -E "ERROR|test cases|assertions" | tail -3
timeout 90 ./prompt_gemm_gpu_test 2>&1 | grep -E "ERROR|test cases|assertions" | tail -3
if [[ -f base/dpl-bench.gz || -x base/dpl-bench ]]; then
  [[ -x base/dpl-bench ]] || { gunzip -f base/dpl-bench.gz && chmod +x base/dpl-bench; }
  for round in 1 2; do
    for b in ./base/dpl-bench ./dpl-bench; do
      pp "$b" "$b" "$m" 512 512 X=0
      pp "$b" "$b" "$m" 2048 2048 X=0
    done
  done
fi
fi
if want 19; then
echo "[${SECONDS}s] == 19. the dequant beside the GEMMs on SMs of its own"
m=$(q7_model) || exit 1
for round in 1 2; do
  pp off ./dpl-bench "$m" 512 512 X=0
  pp ahead ./dpl-bench "$m" 512 512 DPL_GEMM_AHEAD=1
  pp gemm-first-sms116 ./dpl-bench "$m" 512 512 DPL_GEMM_AHEAD=1 DPL_GEMM_AHEAD_SIDE_FIRST=0 DPL_GEMM_SMS=116
  pp gemm-first-sms100 ./dpl-bench "$m" 512 512 DPL_GEMM_AHEAD=1 DPL_GEMM_AHEAD_SIDE_FIRST=0 DPL_GEMM_SMS=100
  pp gemm-first-sms100-c256 ./dpl-bench "$m" 512 512 DPL_GEMM_AHEAD=1 DPL_GEMM_AHEAD_SIDE_FIRST=0 DPL_GEMM_SMS=100 DPL_GEMM_AHEAD_CTAS=256
  pp side-first-sms108 ./dpl-bench "$m" 512 512 DPL_GEMM_AHEAD=1 DPL_GEMM_SMS=108
done
fi
if want 21; then
echo "[${SECONDS}s] == 21. ncu of one 64-row 7B step"
m=$(q7_model) || exit 1
ncu_sum ncu64 32 120 -m "$m" -p 0 -n 1 -d 0 -npl 64 -npp 1 -r 0
fi
if want 22; then
echo "[${SECONDS}s] == 22. a wide pass's Q/K/V, O and q6_K down on cuBLAS"
m=$(q7_model) || exit 1
[[ -x ./cuda_decoder_gpu_test ]] && timeout 240 ./cuda_decoder_gpu_test --test-case="*prompts on tensor cores*" 2>&1 |
  grep -E "worst relative|wide pass with|ERROR|test cases|assertions" | tail -12
for round in 1 2; do
  for v in "X=0" "DPL_WIDE_GEMM_QKV=192 DPL_WIDE_GEMM_O=128 DPL_WIDE_GEMM_DOWN6=192" \
           "DPL_WIDE_GEMM_QKV=65 DPL_WIDE_GEMM_O=65 DPL_WIDE_GEMM_DOWN6=65"; do
    for p in 128 192 256 320; do pp "$v" ./dpl-bench "$m" $p 512 $v; done
    rows "$v" -m "$m" -p 0 -n 0 -d 0 -ub 512 -r 3 -npl 2,16 -npp 50 --shared 2000
  done
done
fi
if want 20; then
echo "[${SECONDS}s] == 20. q4_K on the f16 form from 4 tokens"
m=$(q7_model) || exit 1
for round in 1 2; do
  for v in "DPL_MMA_F16_MIN=9" "DPL_MMA_F16_MIN=4" "DPL_MMA_F16_MIN=2 DPL_MMA_F16_MIN_Q6K=2"; do
    rows "$v" -m "$m" -p 0 -n 128 -d 0 -npl 2,4,8 -npp 128 -r 1
  done
done
fi
if want 17; then
echo "[${SECONDS}s] == 17. ncu of the wide launch's products (issues 30, 29)"
for t in 128 256; do
  DPL_GEMM_BENCH_ONLY="7B ffn_gate" DPL_GEMM_BENCH_TOKENS=$t timeout 120 ncu --clock-control none \
    -k regex:MatVecMmaF16 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics lts__t_bytes.sum,dram__bytes_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed \
    ./gemm_bench 2>&1 | grep -E "Grid Size|Duration|Throughput|lts__|dram__|L2 Hit|Mem Busy|Max Bandwidth" | tail -24
done
fi
if want 16; then
echo "[${SECONDS}s] == 16. the server loads with the wide launch (issue 30)"
for v in 0 default; do  # DPL_MMA_F16_MAX=0 (cuBLAS past 64) against the build's default
  mkdir -p "$out/w$v"
  ( [[ $v == default ]] && unset DPL_MMA_F16_MAX || export DPL_MMA_F16_MAX=$v
    cd "$root" && ITEMS=9 bash tools/gpu/pending.sh "$suite" "$out/w$v" 2>&1 | grep -vE "^NVIDIA|done$" )
done
fi
if want 5; then
echo "[${SECONDS}s] == 5. q5_K and q8_0 on the f16 form (issue 29): the GPU test, the products, the step"
timeout 300 ./matvec_gpu_test --test-case="*f16 mma form*" 2>&1 | grep -E "q5_K|q8_0|ERROR|test cases|assertions" | tail -40
DPL_MATVEC_BENCH_ONLY="mma 7B ffn_gate/up q" timeout 120 ./matvec_bench 2>&1 | grep -E "(q5_K|q8_0).*int8 form"
for f in q8_0 q5_k_m; do
  ( cd "${TMPDIR:-/tmp}" && [[ -f 7b-$f.dpl ]] || { "$OLDPWD/dpl-synth" qwen2.5-7b 7b-$f.gguf --ftype $f >/dev/null &&
      "$OLDPWD/dpl-convert" -q 7b-$f.gguf 7b-$f.dpl >/dev/null; rm -f 7b-$f.gguf; } )
  for r in 1 2; do
    for v in 65 9; do
      echo "-- $f, f16 form from $v: $(DPL_MMA_F16_MIN_Q5K=$v DPL_MMA_F16_MIN_Q8_0=$v timeout 150 ./dpl-bench -m "${TMPDIR:-/tmp}/7b-$f.dpl" -p 0 -n 128 -d 0 -npl 16,32,64 -npp 128 -r 1 2>&1 |
        grep -E '^\| tg|rror' | awk -F'|' '{printf "%s %s;", $2, $3}')"
    done
  done
done
fi
if want 7; then
echo "[${SECONDS}s] == 7. json_schema against free text through dpl-server (issue 32)"
timeout 240 bash "$root/tools/gpu/structured.sh" "$PWD"
fi
if want 8; then
echo "[${SECONDS}s] == 8. where a 4-sequence 30B-A3B step's time goes (issue 31)"
[[ -f $T/q30.dpl ]] || { ./dpl-synth qwen3-30b-a3b "$T/q30.gguf" --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
  ./dpl-convert -q "$T/q30.gguf" "$T/q30.dpl" >/dev/null; rm -f "$T/q30.gguf"; }
timeout 200 ./dpl-bench -m "$T/q30.dpl" -p 512 -n 128 -d 0 -npl 4,16,64 -npp 128 -r 1 2>&1 | grep -E '^\||rror'
ncu_sum ncu30x4 30 300 -m "$T/q30.dpl" -p 0 -n 3 -d 0 -npl 4 -npp 16 -r 0
fi
if want 12; then
echo "[${SECONDS}s] == 12. the shared start's packed passes (issue 30)"
m=$(q7_model) || exit 1
timeout 200 ./dpl-bench -m "$m" -p 512 -n 0 -d 0,2000 -ub 512 -r 3 -npl 1,2,11,16 -npp 50 --shared 2000 2>&1 | grep -E '^\||rror'
ncu_sum ncu-shared16 30 240 -m "$m" -p 0 -n 0 -d 0 -ub 512 -r 1 -npl 16 -npp 50 --shared 2000
grep -E '^\|' "$out/ncu-shared16.csv"
fi
if want 9; then
echo "[${SECONDS}s] == 9. where a server load's time goes: the step trace (issue 30)"
m=$(q7_model) || exit 1
trace() {  # NAME SERVER_ARGS -- LOAD_ARGS
  local name=$1; shift
  local sargs=() largs=()
  while [[ $1 != -- ]]; do sargs+=("$1"); shift; done; shift
  largs=("$@")
  DPL_TRACE_STEPS="$out/trace-$name.tsv" ./dpl-server -m "$m" --device cuda --port 18090 "${sargs[@]}" 2>"$out/server-$name.err" &
  local pid=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:18090/health >/dev/null && break; sleep 0.5; done
  echo "-- $name: dpl-server ${sargs[*]}; server_load.sh ${largs[*]}"
  bash "$root/tools/server_load.sh" --url http://127.0.0.1:18090 "${largs[@]}" | grep -E "aggregate|decode|slowest|median|turn"
  kill -TERM $pid; wait $pid
  python3 "$root/tools/perf/step_trace.py" "$out/trace-$name.tsv"
}
for mx in ${MIXED_LIST:-0}; do  # MIXED_LIST="0 1": DPL_MIXED_STEPS off and on
for ub in ${UB_LIST:-512}; do  # UB_LIST="512 1024": the same loads at each -ub
  export DPL_MIXED_STEPS=$mx
  trace burst64-ub$ub-mixed$mx -np 64 -c 32768 --queue 256 -ub $ub -- -n 64 --prompt 128 --gen 128
  trace shared16-ub$ub-mixed$mx -np 16 -c 65536 -ub $ub -- -n 16 --prompt 50 --gen 32 --shared 2000 --warm
done
done
unset DPL_MIXED_STEPS
timeout 120 ./dpl-bench -m "$m" -p 0 -n 128 -d 0 -npl 16,64 -npp 128 -r 1 2>&1 | grep -E "^\| tg|rror"
fi
if want 11; then
echo "[${SECONDS}s] == 11. the GPU tests on the f16 forms' new thresholds and the load's warm-up"
timeout 200 ./cuda_engine_gpu_test 2>&1 | grep -E "ERROR|FAIL|test cases|assertions" | tail -8
timeout 300 ./cuda_decoder_gpu_test 2>&1 | grep -E "ERROR|FAIL|RMS|test cases|assertions" | tail -30
fi
if want 10; then
echo "[${SECONDS}s] == 10. ncu of the persistent probe's products: why 1.1 TB/s (issue 34)"
nvcc -O3 -std=c++17 -arch=sm_90a -o "$T/persistprobe" "$root/tools/perf/persistent_probe.cu" || exit 1
timeout 60 "$T/persistprobe"
PROBE_PREQ=1 timeout 60 "$T/persistprobe"
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
# The correctness pass's first graph (G = 1 CTA a SM): ops 2 and 3 are layer 0's gate/up and down.
timeout 120 ncu --clock-control none -k regex:OpKernel --launch-skip 2 --launch-count 2 $S "$T/persistprobe" 2>&1 |
  grep -vE "^==PROF==|^ +-+$|^$" | tail -120
fi
echo "[${SECONDS}s] done"
