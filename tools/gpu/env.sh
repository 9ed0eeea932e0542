# Sourced by the GPU scripts: cuBLAS is linked dynamically (rpath
# /usr/local/cuda/lib64); where the machine keeps libcublas.so.13 elsewhere
# (a pip wheel's nvidia/cu13/lib), point the loader at it.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 ' && [[ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]]; then
  cublas=$(find /usr /opt /root /home -name libcublas.so.13 -print -quit 2>/dev/null)
  [[ -n $cublas ]] && export LD_LIBRARY_PATH=$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The qwen2 vocabulary travels gzipped (stage.sh).
v=shared/vocab/ggml-vocab-qwen2.gguf
[[ -f $v.gz && ! -f $v ]] && gunzip -k "$v.gz"

# q7_model: prints the path of a dpl-synth qwen2.5-7b Q4_K_M with the qwen2
# vocabulary, converted to .dpl, made once per machine in $TMPDIR (or /tmp).
q7_model() {
  local T=${TMPDIR:-/tmp}
  if [[ ! -f $T/q7.dpl ]]; then
    ./dpl-synth qwen2.5-7b "$T/q7.gguf" --vocab shared/vocab/ggml-vocab-qwen2.gguf >/dev/null &&
      ./dpl-convert -q "$T/q7.gguf" "$T/q7.dpl" >/dev/null && rm -f "$T/q7.gguf" || { echo "FAIL: model" >&2; return 1; }
  fi
  echo "$T/q7.dpl"
}
