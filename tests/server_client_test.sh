#!/usr/bin/env bash
# One unmodified npm client against dpl-server on the CPU device (issue 32):
# tests/BUILD.bazel runs it once per client script of tools/server-test
# (openai_client.js, ai_sdk_client.js, langchain_client.js, and
# chat_page_client.js: the chat page at / in headless chromium), each with the
# tiny Qwen2 model of ../shared (its real vocabulary, a Qwen-style template
# with Hermes tool calls). The clients are the versions package-lock.json
# pins, installed by tools/setup.sh (npm ci) into tools/server-test/node_modules;
# a missing or stale install is a failure naming the fix, never a pass.
#   server_client_test.sh CLIENT.js [--no-api-key]   (the server without --api-key)
set -u
repo=$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/.." && pwd)
shared=${DPL_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
node_modules=${DPL_SERVER_TEST_NODE_MODULES:-$repo/tools/server-test/node_modules}
client=$repo/tools/server-test/$1
server=runtime/dpl-server
model="$shared/oracle/tiny-qwen2-vocab-q4km.gguf"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
key=test-key
[[ ${2-} == --no-api-key ]] && key=
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# Every package of package.json at its pinned version.
if ! command -v node >/dev/null; then
  echo "FAIL no node on PATH (tools/setup.sh installs nodejs)"; exit 1
fi
if ! node -e '
const [pkg, dir] = process.argv.slice(1);
const want = require(pkg).dependencies, wrong = [];
for (const [name, version] of Object.entries(want)) {
  let got = "missing";
  try { got = require(`${dir}/${name}/package.json`).version; } catch (e) {}
  if (got !== version) wrong.push(`${name} ${got} (want ${version})`);
}
if (wrong.length) { console.log(`npm packages in ${dir}: ${wrong.join(", ")}`); process.exit(1); }
' "$repo/tools/server-test/package.json" "$node_modules" >"$tmp/npm.err" 2>&1; then
  echo "FAIL $(cat "$tmp/npm.err"); run tools/setup.sh (npm ci from tools/server-test/package-lock.json; it needs npm's registry)"
  exit 1
fi

source "$repo/tests/server_test_lib.sh"
start_server --device cpu -np 1 -c 1024 -t 2 -ub 16
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && break
  sleep 0.1
done

start=$SECONDS
NODE_PATH="$node_modules" timeout 300 node "$client" "$url/v1" "$key" tiny-qwen2-vocab-q4km.gguf >"$tmp/node.out" 2>&1
rc=$?
cat "$tmp/node.out"
fails=$((fails + $(grep -c '^FAIL' "$tmp/node.out")))
[[ $rc == 0 ]] || bad "$1 exit $rc"
grep -q '^ok ' "$tmp/node.out" || bad "$1: no check ran"
echo "$1: $((SECONDS - start)) s"

kill -TERM "$pid"; wait "$pid"
rc=$?
[[ $rc == 0 ]] && ok "the server exits 0 on SIGTERM" || { bad "server exit $rc"; tail -20 "$tmp/server.err"; }
echo "$fails failures"
[[ $fails -eq 0 ]]
