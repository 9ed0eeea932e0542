# Shared by the dpl-server tests (sourced): starting a server and stopping it
# with a signal while a stream is open. Needs $server, $model, $tmp, $key and
# the ok/bad functions of the sourcing test.

# start_server ARGS...: dpl-server on a free port (--port 0) with the API key
# (none if $key is empty); sets pid, port and url.
start_server() {
  "$server" -m "$model" --port 0 ${key:+--api-key "$key"} "$@" >"$tmp/server.out" 2>"$tmp/server.err" &
  pid=$!
  port=
  for _ in $(seq 100); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/server.err")
    [[ -n $port ]] && break
    sleep 0.1
  done
  [[ -n $port ]] || { echo "FAIL the server did not start"; cat "$tmp/server.err"; exit 1; }
  url="http://127.0.0.1:$port"
}

# signal_ends_stream SIGNAL PATH BODY TEXT_PATTERN: opens a stream, waits for
# a generated token (a chunk matching TEXT_PATTERN), sends the server SIGNAL;
# the stream must end with an error chunk and [DONE], the server with exit 0.
signal_ends_stream() {
  local sig=$1 path=$2 body=$3 pattern=$4 cpid rc
  curl -sN -H "Authorization: Bearer $key" "$url$path" -d "$body" >"$tmp/signal.sse" &
  cpid=$!
  for _ in $(seq 100); do grep -qs "$pattern" "$tmp/signal.sse" && break; sleep 0.1; done
  kill "-$sig" "$pid"
  wait "$pid"
  rc=$?
  wait "$cpid"
  [[ $rc == 0 ]] && ok "$sig: exit 0" || bad "$sig: exit $rc"
  if [[ $(tail -c 20 "$tmp/signal.sse") == *'data: [DONE]'* ]] && grep -q 'shutting down' "$tmp/signal.sse"; then
    ok "$sig: the open stream ends with an error chunk and [DONE]"
  else
    bad "$sig stream: $(tail -c 300 "$tmp/signal.sse")"
  fi
}
