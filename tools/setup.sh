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
  nodejs               # (and its npm; 20 or later) tests/server_*_client_test drive dpl-server with npm clients
  chromium             # headless, driven by puppeteer-core: tests/server_chat_page_client_test (the chat page at /)
  prometheus           # its promtool checks dpl-server's /metrics in tests/server_e2e_test
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

# The npm clients of tests/server_*_client_test (openai, Vercel's AI SDK,
# LangChain JS, zod, puppeteer-core; exact versions in package.json, the whole tree pinned by
# package-lock.json), into the git-ignored tools/server-test/node_modules:
# npm ci whenever the lock file differs from the one last installed (a copy
# kept in node_modules), so a stale tree is replaced. They need Node 20 or
# later (Debian 12's nodejs is 18: install a newer one, e.g. NodeSource's).
server_test="$(cd "$(dirname "$0")" && pwd)/server-test"
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if ((node_major < 20)); then
  echo "setup: error: the npm clients of tests/server_*_client_test need Node 20 or later; found $(node --version 2>/dev/null || echo none)" >&2
  exit 1
fi
if ! cmp -s "$server_test/package-lock.json" "$server_test/node_modules/.dpl-package-lock.json"; then
  echo "setup: installing the npm clients (package-lock.json) into tools/server-test/node_modules"
  if ! (cd "$server_test" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
    echo "setup: error: npm ci in tools/server-test failed (is npm's registry reachable?); the server client tests need it" >&2
    exit 1
  fi
  cp "$server_test/package-lock.json" "$server_test/node_modules/.dpl-package-lock.json"
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: warning: no CUDA Toolkit at /usr/local/cuda (nvcc); the GPU kernels cannot be built" >&2
fi
