#!/usr/bin/env bash
# Installs what dpl needs on a Debian 12 machine, and nothing if it is all
# there already. Safe to run repeatedly.
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4.2.3; WORKSPACE mode, offline (third_party/ stands in for downloads)
  g++
  libabsl-dev          # Status/StatusOr, strings, containers (linked statically)
  libzstd-dev          # .dpl metadata and the --compress shipping form
  libxxhash-dev        # XXH3-64 tensor checksums
  libcxxopts-dev       # command-line parsing
  doctest-dev          # unit tests
  nlohmann-json3-dev   # dpl-inspect --json, dpl-server (header-only)
  libboost1.81-dev     # dpl-server's HTTP transport (Boost.Beast and Asio, header-only)
  zlib1g-dev           # gzip and deflate request bodies (linked statically)
  curl                 # tests/server_e2e_test
  nodejs               # (and its npm) tests/server_e2e_test drives dpl-server with the npm openai client
  clang                # libFuzzer targets (formats/fuzz)
  libclang-rt-14-dev   # libFuzzer and sanitizer runtimes
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The official OpenAI client (npm "openai", pinned by package-lock.json) for
# tests/server_e2e_test, into the git-ignored tools/server-test/node_modules.
server_test="$(cd "$(dirname "$0")" && pwd)/server-test"
if [[ ! -f $server_test/node_modules/openai/package.json ]]; then
  echo "setup: installing the npm openai client into tools/server-test/node_modules"
  (cd "$server_test" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: warning: no CUDA Toolkit at /usr/local/cuda (nvcc); the GPU kernels cannot be built" >&2
fi
