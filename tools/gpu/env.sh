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
