#!/usr/bin/env bash
# dpl-server under a hostile client (issue 28), on the CPU device and the
# tiny Qwen2 model of ../shared: tools/server-test/hostile.js floods headers,
# holds 500 slowloris connections (and more than --max-connections), sends
# bodies short, long, malformed, compressed and bombed, abuses memory
# (/tokenize, /detokenize, deep and wide JSON, eight 15 MiB bodies at once),
# pipelines, speaks HTTP/1.0 and disconnects while queued and while waiting,
# with well-behaved streams running through it all, then sends SIGTERM with
# slow clients connected. Here: that run's exit status 0, and SIGHUP ending a
# stream with [DONE] and the server with exit 0.
set -u
repo=$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/.." && pwd)
shared=${DPL_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
server=runtime/dpl-server
model="$shared/oracle/tiny-qwen2-vocab-q4km.gguf"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
key=hostile-key
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

source "$repo/tests/server_test_lib.sh"

start_server --device cpu -t 2 -np 2 --queue 1 -c 512 --header-timeout 2 --body-timeout 2 --max-connections 700
timeout 300 node "$repo/tools/server-test/hostile.js" 127.0.0.1 "$port" "$key" "$pid"
rc=$?
[[ $rc == 0 ]] || bad "hostile.js exit $rc"
wait "$pid"
rc=$?
[[ $rc == 0 ]] && ok "SIGTERM under abuse: exit 0" || { bad "SIGTERM under abuse: exit $rc"; tail -5 "$tmp/server.err"; }

# SIGHUP (the terminal closed) stops the server as SIGTERM does.
start_server --device cpu -t 2 -np 1 -c 512
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && break
  sleep 0.1
done
signal_ends_stream HUP /v1/completions '{"prompt":"Long","max_tokens":400,"ignore_eos":true,"stream":true}' \
  '"text":"[^"]'

echo "$fails failures"
[[ $fails -eq 0 ]]
