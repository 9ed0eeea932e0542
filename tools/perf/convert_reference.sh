#!/bin/bash
# Issue 2/3 measurements on the H200 box: synth + convert speed, reference speed.
# Usage: tools/perf/convert_reference.sh BIN_DIR (holding dpl-synth, dpl-convert,
# reference-bench, dpl-run and ggml-vocab-qwen2.gguf), run on the GPU machine.
cd "${1:?BIN_DIR}"
W=/tmp/w; mkdir -p $W
echo "== machine"; nproc; free -g | head -2; df -h /tmp | tail -1; nvidia-smi -L; date -u
echo "== synth 14B"; /usr/bin/time -f "%e s wall" ./dpl-synth qwen2.5-14b $W/q14.gguf --vocab ggml-vocab-qwen2.gguf
echo "== convert 14B x3"; for i in 1 2 3; do ./dpl-convert -q $W/q14.gguf $W/q14.dpl; done
echo "== convert 14B --verify"; /usr/bin/time -f "%e s wall" ./dpl-convert -q --verify $W/q14.gguf $W/q14.dpl
echo "== convert 14B --compress"; ./dpl-convert -q --compress $W/q14.gguf $W/q14z.dpl; rm -f $W/q14z.dpl
echo "== dd copy reference"; /usr/bin/time -f "%e s wall" dd if=$W/q14.gguf of=$W/copy bs=64M conv=fsync 2>&1 | tail -2; rm -f $W/copy
echo "== cat read"; /usr/bin/time -f "%e s wall" cat $W/q14.gguf > /dev/null
rm -f $W/q14.dpl
echo "== synth 7B"; /usr/bin/time -f "%e s wall" ./dpl-synth qwen2.5-7b $W/q7.gguf --vocab ggml-vocab-qwen2.gguf
echo "== convert 7B --verify"; ./dpl-convert -q --verify $W/q7.gguf $W/q7.dpl
echo "== reference 7B"; ./reference-bench $W/q7.dpl --threads 16 --tokens 6
./dpl-run -m $W/q7.dpl --device cpu -t 16 -p "The capital of France is" -n 4 -s 1 --temp 0
