#!/usr/bin/env bash
# dpl-server end to end on the CPU device and the tiny Qwen2 model of
# ../shared (its real vocabulary and ChatML template): /health while loading
# and after, curl streaming and not, every hostile request with its status,
# several clients at once, a full queue (503), killed clients freeing their
# slots, and SIGTERM with a stream open
# (the stream ends with [DONE], exit status 0); tools with Qwen's template
# and, through --chat-template-file, Llama 3.1's and Mistral Nemo's
# (tests/templates).
set -u
repo=$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/.." && pwd)
shared=${DPL_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
server=runtime/dpl-server
model="$shared/oracle/tiny-qwen2-vocab-q4km.gguf"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
key=test-key
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

source "$repo/tests/server_test_lib.sh"
# Two slots of 256 positions, two requests may wait.
start_server --device cpu -np 2 -c 256 --queue 2 -t 2 -ub 16

# CODE NAME CURL-ARGS...: the status and the body (in $tmp/body).
expect() {
  local want=$1 name=$2; shift 2
  local got
  got=$(curl -s -o "$tmp/body" -w '%{http_code}' -H "Authorization: Bearer $key" "$@")
  if [[ $got == "$want" ]]; then ok "$name: $want"; else bad "$name: got $got, want $want: $(head -c 300 "$tmp/body")"; fi
}
body_has() {  # NAME PATTERN
  if grep -q -- "$2" "$tmp/body"; then ok "$1"; else bad "$1: no '$2' in $(head -c 300 "$tmp/body")"; fi
}

# Listening before the model is in: 503 "Loading model", then 200.
first=$(curl -s -w ' %{http_code}' "$url/health")
case $first in
  *'"Loading model"'*' 503' | '{"status":"ok"} 200') ok "/health answers while loading: $first" ;;
  *) bad "/health while loading: $first" ;;
esac
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && break
  sleep 0.1
done
expect 200 "/health after loading" "$url/health"
body_has "/health body" '"status":"ok"'

chat() { echo "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"temperature\":0${1:-}}"; }
C="$url/v1/chat/completions"
expect 200 "chat, not streamed" "$C" -d "$(chat ',"max_tokens":4')"
body_has "chat response shape" '"object":"chat.completion"'
body_has "chat usage" '"completion_tokens":4'
body_has "chat finish_reason" '"finish_reason":"length"'
body_has "chat usage: nothing cached yet" '"prompt_tokens_details":{"cached_tokens":0}'
# The same chat again: the slot that answered it still holds the prompt
# (llama-server's prompt cache); cache_prompt false runs it all.
expect 200 "chat again" "$C" -d "$(chat ',"max_tokens":4')"
if grep -qE '"cached_tokens":[1-9]' "$tmp/body"; then ok "chat again: usage.prompt_tokens_details.cached_tokens > 0"
else bad "chat again: $(head -c 400 "$tmp/body")"; fi
expect 200 "chat, cache_prompt false" "$C" -d "$(chat ',"max_tokens":4,"cache_prompt":false')"
body_has "cache_prompt false: nothing cached" '"cached_tokens":0'
# Tools (issue 32): offered tools go into the prompt (more prompt tokens), a
# conversation with an assistant's calls and their results is accepted, and
# a streamed answer with tools still ends with [DONE]; a bad tool_choice is a 400.
tools='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]'
expect 200 "chat with tools" "$C" -d "$(chat ",\"max_tokens\":2,$tools")"
with_tools=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
expect 200 "chat without them" "$C" -d "$(chat ',"max_tokens":2')"
without=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
if [[ -n $with_tools && -n $without && $with_tools -gt $((without + 50)) ]]; then ok "tools reach the prompt ($without -> $with_tools tokens)"
else bad "tools in the prompt: $without -> $with_tools tokens"; fi
turns='{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"21 C"}],"max_tokens":2,'"$tools"'}'
expect 200 "tool results continue the conversation" "$C" -d "$turns"
expect 200 "tools, streamed" -N "$C" -d "$(chat ",\"max_tokens\":3,\"stream\":true,$tools")"
[[ $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] && ok "tools, streamed: ends with [DONE]" || bad "tools streamed: $(tail -c 300 "$tmp/body")"
expect 200 "/v1/responses with function tools and call items" "$url/v1/responses" -d '{"input":[{"role":"user","content":"Weather?"},{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"21 C"}],"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"max_output_tokens":2}'
body_has "/v1/responses with tools: a response" '"object":"response"'
expect 400 "tool_choice naming no tool" "$C" -d "$(chat ",\"max_tokens\":2,$tools,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}")"
# tool_choice "required" (issue 32) is a grammar of the template's calls:
# even this random-weight model answers one call (parallel_tool_calls
# false) of the tool, its arguments with the schema's keys and types (no
# strings: bounded), finish_reason "tool_calls"; with response_format it is a 400.
light='"tools":[{"type":"function","function":{"name":"set_light","parameters":{"type":"object","properties":{"on":{"type":"boolean"},"color":{"enum":["red","green"]}},"required":["on","color"]}}}]'
check_light_call() {  # NAME: the body holds one set_light call with valid arguments
  if python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
assert c["finish_reason"] == "tool_calls", c
calls = c["message"]["tool_calls"]
assert len(calls) == 1 and calls[0]["function"]["name"] == "set_light", calls
a = json.loads(calls[0]["function"]["arguments"])
assert isinstance(a["on"], bool) and a["color"] in ("red", "green") and len(a) == 2, a
' "$tmp/body" 2>"$tmp/py.err"; then ok "$1: one set_light call, its arguments valid"
  else bad "$1: $(head -c 300 "$tmp/py.err") $(head -c 600 "$tmp/body")"; fi
}
expect 200 "tool_choice required" "$C" -d "$(chat ".8,\"seed\":3,\"parallel_tool_calls\":false,$light,\"tool_choice\":\"required\"")"
check_light_call "tool_choice required"
expect 400 "tool_choice required with response_format" "$C" -d "$(chat ",\"max_tokens\":2,$light,\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}")"
body_has "required with response_format: names both" "'tool_choice' forces a tool call (a grammar of calls), and 'response_format' constrains"
# Structured output (issue 32): a JSON schema's answer parses and has its
# required keys with their types (no strings in it: every value is bounded,
# so even this random-weight model completes it, then only the end of
# generation may follow); a GBNF grammar on completions; a bad schema and
# two grammars at once are 400s naming the field.
schema='{"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"},"c":{"enum":["red","green"]}},"required":["n","ok","c"]}'
expect 200 "response_format json_schema" "$C" -d "$(chat ".8,\"seed\":3,\"max_tokens\":200,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"strict\":true,\"schema\":$schema}}")"
if python3 -c '
import json, sys
b = json.load(open(sys.argv[1]))
c = b["choices"][0]
assert c["finish_reason"] == "stop", c["finish_reason"]
a = json.loads(c["message"]["content"])
assert isinstance(a["n"], int) and isinstance(a["ok"], bool) and a["c"] in ("red", "green"), a
' "$tmp/body" 2>"$tmp/py.err"; then ok "json_schema: the answer parses, with n, ok and c"
else bad "json_schema answer: $(head -c 300 "$tmp/py.err") $(head -c 400 "$tmp/body")"; fi
expect 200 "completions with a GBNF grammar" "$url/v1/completions" -d '{"prompt":"Is it?","max_tokens":20,"temperature":1,"seed":1,"grammar":"root ::= \"yes\" | \"no\""}'
grep -qE '"text":"(yes|no)"' "$tmp/body" && ok "grammar: the text is yes or no" || bad "grammar: $(head -c 300 "$tmp/body")"
expect 400 "response_format with an unsupported schema" "$C" -d "$(chat ",\"max_tokens\":2,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":{\"type\":\"string\",\"pattern\":\"^a\"}}}")"
body_has "bad schema: names the field" "response_format.json_schema.schema' is not usable"
body_has "bad schema: an OpenAI error" '"type":"invalid_request_error"'
expect 400 "grammar and json_schema both" "$C" -d "$(chat ',"max_tokens":2,"grammar":"root ::= [a]","json_schema":{}')"
body_has "two grammars: names the field" "'grammar' and 'json_schema' are both given"
expect 200 "chat, streamed" -N "$C" -d "$(chat ',"max_tokens":3,"stream":true')"
if [[ $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] && grep -q '"chat.completion.chunk"' "$tmp/body" &&
   grep -q '"finish_reason":"length"' "$tmp/body"; then ok "SSE chunks end with data: [DONE]"
else bad "SSE stream: $(cat "$tmp/body")"; fi
# Logprobs (issue 32). Echo scoring: the prompt's tokens, each (but the
# first, null) scored from the logits before it, against the CPU reference's
# own logits of the same ids through dpl-run (log-softmax computed here).
ids=$(tr -d ' \n' <"$shared/oracle/tiny-qwen2-vocab-q4km.tokens" | cut -d, -f1-12)
expect 200 "completions, echo + logprobs 1 + max_tokens 0" "$url/v1/completions" -d "{\"prompt\":[$ids],\"echo\":true,\"logprobs\":1,\"max_tokens\":0}"
cp "$tmp/body" "$tmp/echo.json"
if runtime/dpl-run -m "$model" --device cpu -c 256 -t 2 --tokens "$ids" --all-logits --dump-logits "$tmp/echo.f32" >/dev/null 2>&1 &&
   python3 -c '
import array, json, math, sys
b = json.load(open(sys.argv[1]))
ids = [int(x) for x in sys.argv[3].split(",")]
c = b["choices"][0]
assert c["finish_reason"] == "length" and b["usage"]["completion_tokens"] == 0, b
lp = c["logprobs"]
assert len(lp["tokens"]) == len(ids) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]), lp
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]), lp["text_offset"]
assert c["text"] == "".join(lp["tokens"]), (c["text"], lp["tokens"])
logits = array.array("f")
logits.frombytes(open(sys.argv[2], "rb").read())
n = len(logits) // len(ids)
for i in range(1, len(ids)):
    row = logits[(i - 1) * n:i * n]
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
    want = row[ids[i]] - lse
    got = lp["token_logprobs"][i]
    assert abs(got - want) < 1e-3, (i, got, want)
    top = lp["top_logprobs"][i]
    assert len(top) == 1 and abs(list(top.values())[0] - (m - lse)) < 1e-3, (i, top, m - lse)
' "$tmp/echo.json" "$tmp/echo.f32" "$ids" 2>"$tmp/py.err"; then ok "echo scoring: $(echo "$ids" | tr ',' '\n' | wc -l) entries, the first null, the rest the CPU reference's"
else bad "echo scoring: $(head -c 600 "$tmp/py.err") $(head -c 600 "$tmp/echo.json")"; fi
# Chat: every generated token with its top 3; top_logprobs alone is a 400.
expect 200 "chat with logprobs and top_logprobs 3" "$C" -d "$(chat ',"max_tokens":3,"ignore_eos":true,"logprobs":true,"top_logprobs":3')"
if python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
content = c["logprobs"]["content"]
assert len(content) == 3, content
for e in content:
    assert isinstance(e["token"], str) and isinstance(e["bytes"], list) and e["logprob"] <= 0, e
    top = e["top_logprobs"]
    assert len(top) == 3 and top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"], top
    assert top[0]["token"] == e["token"] and top[0]["logprob"] == e["logprob"], e  # greedy
assert "".join(e["token"] for e in content) == c["message"]["content"], c
' "$tmp/body" 2>"$tmp/py.err"; then ok "chat logprobs: 3 entries with their top 3, greedy picks the top"
else bad "chat logprobs: $(head -c 300 "$tmp/py.err") $(head -c 600 "$tmp/body")"; fi
expect 400 "top_logprobs without logprobs" "$C" -d "$(chat ',"max_tokens":2,"top_logprobs":2')"
expect 200 "chat logprobs, streamed" -N "$C" -d "$(chat ',"max_tokens":3,"ignore_eos":true,"logprobs":true,"stream":true')"
n_lp=$(grep -o '"logprobs":{"content":\[{' "$tmp/body" | wc -l)
[[ $n_lp -ge 1 && $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] && ok "chat logprobs streamed: $n_lp chunks carry them" ||
  bad "chat logprobs streamed: $(head -c 600 "$tmp/body")"
expect 200 "completions echo + logprobs 2, streamed" -N "$url/v1/completions" -d '{"prompt":"Once upon","max_tokens":2,"ignore_eos":true,"echo":true,"logprobs":2,"stream":true}'
if python3 -c '
import json, sys
chunks = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: {")]
lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
assert chunks[0]["choices"][0]["text"].startswith("Once upon"), chunks[0]
first = lps[0]
assert first["token_logprobs"][0] is None and "".join(first["tokens"]) == "Once upon", first
gen = [t for l in lps[1:] for t in l["token_logprobs"]]
assert len(gen) == 2 and all(t <= 0 for t in gen), lps
assert all(len(l["top_logprobs"][-1]) == 2 for l in lps[1:]), lps
offsets = [o for l in lps for o in l["text_offset"]]
assert offsets == sorted(offsets) and offsets[len(first["tokens"])] == len("Once upon"), offsets
' "$tmp/body" 2>"$tmp/py.err"; then ok "completions echo streamed: the prompt entries first, then one per token"
else bad "completions echo streamed: $(head -c 300 "$tmp/py.err") $(head -c 900 "$tmp/body")"; fi
expect 200 "completions echo without logprobs" "$url/v1/completions" -d '{"prompt":"Once upon","max_tokens":0,"echo":true}'
body_has "echo: the prompt's text" '"text":"Once upon"'
expect 200 "completions max_tokens 0 without echo" "$url/v1/completions" -d '{"prompt":"Once upon","max_tokens":0}'
body_has "max_tokens 0: an empty completion" '"text":""'
expect 200 "completions, text prompt" "$url/v1/completions" -d '{"prompt":"Once upon","max_tokens":2}'
body_has "completion shape" '"object":"text_completion"'
expect 200 "completions, token ids" "$url/v1/completions" -d '{"prompt":[9707,1879],"max_tokens":2,"stop":["\n"]}'
# A list of prompts: one choice each (index in order), usage summed; a
# greedy choice is what the prompt alone gives.
expect 200 "completions, one prompt" "$url/v1/completions" -d '{"prompt":[9707,1879],"max_tokens":3,"temperature":0,"ignore_eos":true}'
alone=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$tmp/body")
expect 200 "completions, a list of prompts" "$url/v1/completions" -d '{"prompt":["Once upon",[9707,1879]],"max_tokens":3,"temperature":0,"ignore_eos":true}'
body_has "two choices, index 1" '"index":1'
body_has "usage summed" '"completion_tokens":6'
grep -qF "\"index\":1,\"logprobs\":null,\"text\":\"$alone\"" "$tmp/body" && ok "choice 1 is the prompt's own answer" ||
  bad "choice 1 vs alone '$alone': $(head -c 400 "$tmp/body")"
expect 200 "completions, a list streamed" -N "$url/v1/completions" -d '{"prompt":["a","b"],"max_tokens":2,"stream":true,"ignore_eos":true,"stream_options":{"include_usage":true}}'
[[ $(grep -c '"finish_reason":"length"' "$tmp/body") == 2 && $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] &&
  grep -q '"index":1' "$tmp/body" && grep -q '"completion_tokens":4' "$tmp/body" &&
  ok "a streamed list: both choices end, usage summed, [DONE]" || bad "a streamed list: $(tail -c 400 "$tmp/body")"
# n samples of one prompt: a choice each; seeded, sample j uses seed + j.
expect 200 "chat, n = 2" "$C" -d "$(chat ',"n":2,"max_tokens":3,"ignore_eos":true,"seed":5')"
body_has "two chat choices" '"index":1,"message"'
body_has "n = 2 usage" '"completion_tokens":6'
n2_prompt=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
[[ -n $n2_prompt && $n2_prompt == "$without" ]] && ok "n = 2 usage: the prompt counted once ($n2_prompt tokens)" ||
  bad "n = 2 usage: prompt_tokens $n2_prompt, the prompt has $without"
expect 200 "chat, n = 2 streamed" -N "$C" -d "$(chat ',"n":2,"max_tokens":2,"ignore_eos":true,"stream":true')"
[[ $(grep -c '"finish_reason":"length"' "$tmp/body") == 2 ]] && grep -q '"index":1' "$tmp/body" &&
  ok "n = 2 streamed: both choices end" || bad "n = 2 streamed: $(tail -c 400 "$tmp/body")"
expect 200 "completions, seed 5, alone" "$url/v1/completions" -d '{"prompt":"Once","max_tokens":4,"ignore_eos":true,"seed":6}'
seeded=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$tmp/body")
expect 200 "completions, seed 5, n = 2" "$url/v1/completions" -d '{"prompt":"Once","max_tokens":4,"ignore_eos":true,"seed":5,"n":2}'
grep -qF "\"index\":1,\"logprobs\":null,\"text\":\"$seeded\"" "$tmp/body" && ok "sample 1 of seed 5 is seed 6's answer" ||
  bad "sample 1 vs seed 6 '$seeded': $(head -c 400 "$tmp/body")"
expect 200 "responses, not streamed" "$url/v1/responses" -d '{"input":"Hi","instructions":"Be brief","max_output_tokens":3,"temperature":0}'
body_has "responses object" '"object":"response"'
body_has "responses output_text" '"type":"output_text"'
expect 200 "responses, streamed" -N "$url/v1/responses" -d '{"input":[{"role":"user","content":"Hi"}],"max_output_tokens":3,"stream":true}'
body_has "responses stream opens" '^event: response.created'
body_has "responses stream deltas" '^event: response.output_text.delta'
grep -q '^event: response.\(completed\|incomplete\)' <(tail -n 3 "$tmp/body") && ok "responses stream closes" ||
  bad "responses stream close: $(tail -c 300 "$tmp/body")"
expect 400 "responses, an item it does not take" "$url/v1/responses" -d '{"input":[{"type":"reasoning","summary":[]}]}'
body_has "names the item" 'input\[0\].type'
expect 200 "tokenize" "$url/tokenize" -d '{"content":"Hello world"}'
body_has "tokenize ids" '"tokens":\[9707,1879\]'
expect 200 "detokenize" "$url/detokenize" -d '{"tokens":[9707,1879]}'
body_has "detokenize text" '"content":"Hello world"'
expect 200 "/v1/models" "$url/v1/models"
body_has "/v1/models id" '"id":"tiny-qwen2-vocab-q4km.gguf"'
expect 200 "/v1/models/{id}" "$url/v1/models/tiny-qwen2-vocab-q4km.gguf"
body_has "/v1/models/{id} object" '"object":"model"'
expect 404 "/v1/models/{another id}" "$url/v1/models/gpt-9"
code=$(curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' "$url/")  # no key: the page asks for it
[[ $code == 200 ]] && grep -qi '^content-type: text/html' "$tmp/head" && ok "the chat page at /: 200, html" ||
  bad "the chat page: $code $(head -c 200 "$tmp/head")"
body_has "the chat page's title" '<title>dpl chat</title>'
grep -qE '(src|href)="(https?:)?//' "$tmp/body" && bad "the chat page loads something from elsewhere" ||
  ok "the chat page is self-contained (no CDN)"
sed -n '/^<script>$/,/^<\/script>$/p' "$tmp/body" | sed '1d;$d' >"$tmp/page.js"
if command -v node >/dev/null; then
  [[ -s $tmp/page.js ]] && node --check "$tmp/page.js" 2>"$tmp/page.err" && ok "the chat page's script parses" ||
    bad "the chat page's script: $(head -c 300 "$tmp/page.err")"
fi
expect 200 "/props" "$url/props"
body_has "/props slots" '"total_slots":2'
body_has "/props sampling defaults" '"presence_penalty":0.0'
expect 200 "/slots" "$url/slots"
body_has "/slots: two, idle" '\[{"id":0,"is_processing":false,"n_ctx":256},{"id":1,"is_processing":false,"n_ctx":256}\]'
expect 200 "model by its file stem" "$C" -d '{"model":"tiny-qwen2-vocab-q4km","messages":[{"role":"user","content":"Hi"}],"max_tokens":1}'

# Hostile requests: each status, an OpenAI error body naming the problem.
for auth in "" "Authorization: Bearer nope" "Authorization: $key"; do
  code=$(curl -s -o "$tmp/body" -w '%{http_code}' ${auth:+-H "$auth"} "$C" -d "$(chat ',"max_tokens":1')")
  [[ $code == 401 ]] && ok "API key '$auth': 401" || bad "API key '$auth': $code"
done
body_has "401 error shape" '"type":"authentication_error"'
# A browser page on another origin: the preflight passes without the key,
# every answer names the origin it allows.
code=$(curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' -X OPTIONS -H 'Origin: http://ui.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type' "$C")
[[ $code == 204 ]] && grep -qi '^access-control-allow-headers: authorization, content-type' "$tmp/head" &&
  ok "CORS preflight: 204" || bad "CORS preflight: $code $(cat "$tmp/head")"
curl -s -o /dev/null -D "$tmp/head" -H "Authorization: Bearer $key" "$url/v1/models"
grep -qi '^access-control-allow-origin: \*' "$tmp/head" && ok "CORS origin on answers" || bad "CORS origin: $(cat "$tmp/head")"
expect 400 "bad JSON" "$C" -d '{"messages": ['
body_has "bad JSON error shape" '"type":"invalid_request_error"'
expect 400 "not an object" "$C" -d '[1,2]'
expect 400 "no messages" "$C" -d '{}'
body_has "names messages" "'messages' is required"
expect 400 "messages of the wrong type" "$C" -d '{"messages":"hi"}'
expect 400 "a message without a role" "$C" -d '{"messages":[{"content":"hi"}]}'
expect 400 "temperature a string" "$C" -d "$(chat ',"temperature":"hot"')"
body_has "names temperature" "'temperature'"
expect 400 "max_tokens negative" "$C" -d "$(chat ',"max_tokens":-3')"
expect 400 "n = 65" "$C" -d "$(chat ',"n":65')"
expect 200 "presence and frequency penalties" "$C" -d "$(chat ',"presence_penalty":0.5,"frequency_penalty":0.5,"max_tokens":2')"
expect 400 "presence_penalty out of range" "$C" -d "$(chat ',"presence_penalty":3')"
body_has "names presence_penalty" "'presence_penalty' must be in"
expect 200 "any model name (one model a process, as llama-server)" "$C" -d '{"model":"gpt-9","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
body_has "answers with the served model" '"model":"tiny-qwen2-vocab-q4km.gguf"'
expect 200 "max_tokens -1: until the context ends" "$url/v1/completions" -d '{"prompt":[9707,1879],"max_tokens":-1,"stop":["\n"]}'
expect 400 "prompt + max_tokens beyond the context" "$C" -d "$(chat ',"max_tokens":1000')"
body_has "names the context" "context of a slot"
long=$(head -c 20000 /dev/zero | tr '\0' 'a')
expect 400 "prompt longer than the context" "$url/v1/completions" -d "{\"prompt\":\"$long\"}"
expect 400 "token id outside the vocabulary" "$url/v1/completions" -d '{"prompt":[1,999999999]}'
expect 400 "detokenize outside the vocabulary" "$url/detokenize" -d '{"tokens":[999999999]}'
expect 404 "unknown endpoint" "$url/v2/anything"
head -c 4096 "$model" >"$tmp/garbage"
expect 400 "binary garbage" "$C" --data-binary @"$tmp/garbage"
expect 413 "a body over 16 MiB" "$C" --data-binary @"$model"
expect 200 "still serving after all that" "$C" -d "$(chat ',"max_tokens":1')"

# Several clients at once: 2 slots and 2 waiting, all answered.
for i in 1 2 3 4; do
  curl -s -o "$tmp/multi$i" -w '%{http_code}' -H "Authorization: Bearer $key" "$url/v1/completions" \
    -d "{\"prompt\":\"Story $i\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true}" >"$tmp/multi$i.code" &
done
wait_ok=1
for i in 1 2 3 4; do
  while [[ ! -s $tmp/multi$i.code ]]; do sleep 0.1; done
done
sleep 0.2
for i in 1 2 3 4; do
  [[ $(cat "$tmp/multi$i.code") == 200 ]] && grep -q '"completion_tokens":6' "$tmp/multi$i" || wait_ok=0
done
[[ $wait_ok == 1 ]] && ok "4 clients on 2 slots: all 200 with 6 tokens" || bad "4 clients: $(cat "$tmp"/multi*.code)"

# A full queue: 2 long streams hold the slots, 2 wait, the 5th gets 503;
# then the 4 clients are killed and every slot frees.
metric() { curl -s -H "Authorization: Bearer $key" "$url/metrics" | sed -n "s/^dpl_$1 //p"; }
long_pids=()
for i in 1 2 3 4; do
  curl -sN -H "Authorization: Bearer $key" "$url/v1/completions" \
    -d '{"prompt":"Long","max_tokens":200,"ignore_eos":true,"stream":true}' >"$tmp/long$i" &
  long_pids+=($!)
done
for _ in $(seq 100); do
  [[ $(metric requests_processing) == 2 && $(metric requests_deferred) == 2 ]] && break
  sleep 0.1
done
expect 503 "queue full" "$C" -d "$(chat ',"max_tokens":1')"
body_has "queue full error" '"type":"unavailable_error"'
kill "${long_pids[@]}" 2>/dev/null
wait "${long_pids[@]}" 2>/dev/null
freed=0
for _ in $(seq 100); do
  [[ $(metric requests_processing) == 0 && $(metric requests_deferred) == 0 ]] && { freed=1; break; }
  sleep 0.1
done
[[ $freed == 1 ]] && ok "killed clients free their slots (processing 0, deferred 0)" ||
  bad "killed clients: processing $(metric requests_processing), deferred $(metric requests_deferred)"
generated=$(metric tokens_predicted_total)
# 4 x 200 tokens would be 800 more; the cancelled streams stopped early.
[[ -n $generated && ${generated%.*} -lt 600 ]] && ok "cancelled streams stopped generating ($generated tokens in all)" ||
  bad "cancelled streams: $generated tokens"
expect 200 "/metrics" "$url/metrics"
for m in prompt_tokens_total prompt_tokens_cached_total prompt_tokens_copied_total prompt_tokens_adopted_total \
         tokens_predicted_total requests_total requests_processing requests_deferred \
         predicted_tokens_seconds kv_cache_usage_ratio kv_cache_tokens kv_blocks_cached; do
  grep -q "^dpl_$m " "$tmp/body" || bad "/metrics lacks dpl_$m"
done
# The text is valid Prometheus exposition, names and all (Debian's prometheus
# package, installed by tools/setup.sh).
if command -v promtool >/dev/null; then
  promtool check metrics <"$tmp/body" >"$tmp/promtool.out" 2>&1 && ok "/metrics: promtool check metrics passes" ||
    bad "/metrics: promtool check metrics: $(head -c 600 "$tmp/promtool.out")"
else
  bad "/metrics: no promtool (tools/setup.sh installs Debian's prometheus)"
fi
# Histograms: the +Inf bucket holds every observation; counts > 0 by now.
for h in time_to_first_token_seconds time_per_output_token_seconds e2e_request_latency_seconds; do
  inf=$(sed -n "s/^dpl_${h}_bucket{le=\"+Inf\"} //p" "$tmp/body")
  count=$(sed -n "s/^dpl_${h}_count //p" "$tmp/body")
  [[ -n $count && $inf == "$count" && $count -gt 0 ]] && ok "/metrics $h: $count observations" ||
    bad "/metrics $h: +Inf $inf, count $count"
done

# The npm clients (openai, AI SDK, LangChain) are tests of their own:
# tests/server_client_test.sh.

# The curl load script (the GPU machine has no Node): 3 streams on 2 slots,
# every stream its 6 tokens, the aggregate counts all 18.
if "$repo/tools/server_load.sh" --url "$url" --api-key "$key" -n 3 --prompt 8 --gen 6 >"$tmp/load.out" 2>&1 &&
   grep -q "aggregate: 3 streams, 18 tokens" "$tmp/load.out" && [[ $(grep -c " 6 tokens" "$tmp/load.out") == 3 ]]; then
  ok "tools/server_load.sh: 3 streams of 6 tokens"
else
  bad "tools/server_load.sh: $(cat "$tmp/load.out")"
fi

# A shared start (a system prompt) in a slot's cache after a warm-up
# request: each stream finds its 12 tokens cached, the one that lands on the
# other slot by a copy (dpl_prompt_tokens_copied_total counts them).
copied_before=$(metric prompt_tokens_copied_total)
if "$repo/tools/server_load.sh" --url "$url" --api-key "$key" -n 2 --prompt 4 --shared 12 --warm --gen 3 >"$tmp/load.out" 2>&1 &&
   [[ $(grep -c " 12 prompt tokens cached" "$tmp/load.out") == 2 ]] &&
   (( $(metric prompt_tokens_copied_total) >= copied_before + 12 )); then
  ok "tools/server_load.sh --shared 12 --warm: both streams start from the cached 12, copied to the other slot"
else
  bad "tools/server_load.sh --shared: $(cat "$tmp/load.out")"
fi

# A chat replay: the second turn resends the first turn's prompt and answer,
# which the slot's cache holds (all but the answer's last token, never run).
if "$repo/tools/server_load.sh" --url "$url" --api-key "$key" -n 1 --prompt 4 --gen 3 --turns 2 >"$tmp/load.out" 2>&1 &&
   grep -q "turn 1: .* 0 prompt tokens cached" "$tmp/load.out" &&
   grep -Eq "turn 2: .* ([6-9]|[1-9][0-9]+) prompt tokens cached" "$tmp/load.out"; then
  ok "tools/server_load.sh --turns 2: the second turn finds its history cached"
else
  bad "tools/server_load.sh --turns: $(cat "$tmp/load.out")"
fi

# SIGTERM with a stream open: it ends with [DONE], the server exits 0.
# (The pattern waits for a generated token: the first chunk's "content" is
# the empty role delta.)
signal_ends_stream TERM /v1/chat/completions "$(chat ',"max_tokens":200,"ignore_eos":true,"stream":true')" \
  '"content":"[^"]'

# --strict-model refuses other names (404); --cors-origin lists the origins
# answered (the origin itself, Vary: Origin), others' preflights are 403;
# the Authorization scheme is case-insensitive.
start_server --device cpu -np 1 -c 64 -t 1 --strict-model --cors-origin http://a.example,http://b.example
C="$url/v1/chat/completions"
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && break
  sleep 0.1
done
expect 404 "--strict-model: unknown model" "$C" -d '{"model":"gpt-9","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
body_has "names the served model" "this server serves 'tiny-qwen2-vocab-q4km.gguf'"
expect 200 "--strict-model: the file stem" "$C" -d '{"model":"tiny-qwen2-vocab-q4km","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
used=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
expect 200 "completion, 3 tokens" "$url/v1/completions" -d '{"prompt":[9707,1879],"max_tokens":3,"ignore_eos":true}'
used=$((used + $(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/body")))
[[ $(metric tokens_predicted_total) == "$used" ]] && ok "tokens_predicted_total == the usage's sum ($used)" ||
  bad "tokens_predicted_total $(metric tokens_predicted_total), usage $used"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: bearer $key" "$url/v1/models")
[[ $code == 200 ]] && ok "Authorization scheme case-insensitive: 200" || bad "lower-case bearer: $code"
curl -s -o /dev/null -D "$tmp/head" -H "Authorization: Bearer $key" -H 'Origin: http://b.example' "$url/v1/models"
grep -qi '^access-control-allow-origin: http://b.example' "$tmp/head" && grep -qi '^vary: origin' "$tmp/head" &&
  ok "--cors-origin: a listed origin is named" || bad "--cors-origin listed: $(cat "$tmp/head")"
curl -s -o /dev/null -D "$tmp/head" -H "Authorization: Bearer $key" -H 'Origin: http://evil.example' "$url/v1/models"
grep -qi '^access-control-allow-origin' "$tmp/head" && bad "--cors-origin: an unlisted origin got a header" ||
  ok "--cors-origin: an unlisted origin gets no header"
code=$(curl -s -o /dev/null -w '%{http_code}' -X OPTIONS -H 'Origin: http://evil.example' "$C")
[[ $code == 403 ]] && ok "--cors-origin: an unlisted origin's preflight is 403" || bad "unlisted preflight: $code"
kill -TERM "$pid"; wait "$pid"

# Tools with Llama 3.1's and Mistral Nemo's own templates (issue 32; given
# with --chat-template-file, the tiny model's vocabulary writing their
# control texts as text): tools reach the prompt, a call and its result
# continue the conversation (Nemo's template takes only 9-letter call ids:
# OpenAI-style ones, or none, are fitted, not a 400), the template's own
# refusal is a 400 naming it, a streamed answer with tools ends with [DONE];
# the built-in llama3 renderer refuses tools with a 400 saying why.
wait_healthy() {
  for _ in $(seq 300); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && break
    sleep 0.1
  done
}
call_turns() {  # CALL_ID RESULT_ID [MORE_CALLS]: a call to get_weather, its result
  echo '{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{'"$1"'"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}'"${3:-}"']},{"role":"tool",'"$2"'"content":"21 C"}],"max_tokens":2,'"$tools"'}'
}
templates="$repo/tests/templates"
start_server --device cpu -np 1 -c 512 -t 1 --chat-template-file "$templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
C="$url/v1/chat/completions"
wait_healthy
grep -q "chat template: jinja (minja), family llama3" "$tmp/server.err" && ok "Llama 3.1 template: jinja, family llama3" ||
  bad "Llama 3.1 template: $(cat "$tmp/server.err")"
expect 200 "Llama 3.1: chat with tools" "$C" -d "$(chat ",\"max_tokens\":2,$tools")"
with_tools=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
expect 200 "Llama 3.1: chat without them" "$C" -d "$(chat ',"max_tokens":2')"
without=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")
if [[ -n $with_tools && -n $without && $with_tools -gt $((without + 50)) ]]; then ok "Llama 3.1: tools reach the prompt ($without -> $with_tools tokens)"
else bad "Llama 3.1: tools in the prompt: $without -> $with_tools tokens"; fi
expect 200 "Llama 3.1: a call and its result continue the conversation" "$C" -d "$(call_turns '"id":"call_1",' '"tool_call_id":"call_1",')"
expect 400 "Llama 3.1: two calls in one message (the template's refusal)" "$C" \
  -d "$(call_turns '' '' ',{"type":"function","function":{"name":"get_time","arguments":"{}"}}')"
body_has "Llama 3.1: the template's message" "only supports single tool-calls"
expect 200 "Llama 3.1: tools, streamed" -N "$C" -d "$(chat ",\"max_tokens\":3,\"stream\":true,$tools")"
[[ $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] && ok "Llama 3.1: tools, streamed: ends with [DONE]" || bad "Llama 3.1 tools streamed: $(tail -c 300 "$tmp/body")"
expect 200 "Llama 3.1: a named tool_choice" "$C" -d "$(chat ".8,\"seed\":3,$light,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"set_light\"}}")"
check_light_call "Llama 3.1: a named tool_choice (its {\"name\", \"parameters\"} form)"
kill -TERM "$pid"; wait "$pid"

start_server --device cpu -np 1 -c 512 -t 1 --chat-template-file "$templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"
C="$url/v1/chat/completions"
wait_healthy
grep -q "chat template: jinja (minja), family mistral-v3-tekken" "$tmp/server.err" && ok "Nemo template: jinja, family mistral-v3-tekken" ||
  bad "Nemo template: $(cat "$tmp/server.err")"
expect 200 "Nemo: chat with tools" "$C" -d "$(chat ",\"max_tokens\":2,$tools")"
expect 200 "Nemo: OpenAI-style call ids fitted" "$C" -d "$(call_turns '"id":"call_abc123",' '"tool_call_id":"call_abc123",')"
expect 200 "Nemo: 9-letter call ids" "$C" -d "$(call_turns '"id":"aB3dE5gH9",' '"tool_call_id":"aB3dE5gH9",')"
expect 200 "Nemo: no call ids at all" "$C" -d "$(call_turns '' '')"
expect 200 "Nemo: tools, streamed" -N "$C" -d "$(chat ",\"max_tokens\":3,\"stream\":true,$tools")"
[[ $(tail -c 20 "$tmp/body") == *'data: [DONE]'* ]] && ok "Nemo: tools, streamed: ends with [DONE]" || bad "Nemo tools streamed: $(tail -c 300 "$tmp/body")"
kill -TERM "$pid"; wait "$pid"

start_server --device cpu -np 1 -c 256 -t 1 --chat-template llama3
C="$url/v1/chat/completions"
wait_healthy
expect 400 "--chat-template llama3: tools refused" "$C" -d "$(chat ",\"max_tokens\":2,$tools")"
body_has "--chat-template llama3: says why" "the built-in llama3 renderer writes no tools"
expect 400 "--chat-template llama3: tool_choice required refused" "$C" -d "$(chat ",\"max_tokens\":2,$light,\"tool_choice\":\"required\"")"
body_has "--chat-template llama3: tool_choice required says why" "chat template writes no tools"
expect 200 "--chat-template llama3: chat without tools" "$C" -d "$(chat ',"max_tokens":2')"
kill -TERM "$pid"; wait "$pid"

# The scheduler's KV block pool (issue 30, DPL_KV_POOL, development): 96
# positions for two slots of 256. A request the pool can never hold is
# refused (400); two that do not fit together both complete, the newer one
# preempted and recomputed, each answer the one it gets alone.
DPL_KV_POOL=96 DPL_KV_BLOCK=16 start_server --device cpu -np 2 -c 256 -t 1
C="$url/v1/chat/completions"
wait_healthy
expect 400 "KV pool: a request it can never hold" "$C" -d "$(chat ',"max_tokens":200')"
body_has "KV pool: says why" "the KV pool has 96"
expect 200 "KV pool: a request alone" "$C" -d "$(chat ',"max_tokens":60')"
cp "$tmp/body" "$tmp/pool_alone.json"
for i in 1 2; do
  curl -s -H "Authorization: Bearer $key" "$C" -d "$(chat ',"max_tokens":60')" >"$tmp/pool_$i.json" &
  pids[$i]=$!
done
wait "${pids[1]}" "${pids[2]}"
if python3 -c '
import json, sys
alone, a, b = (json.load(open(p)) for p in sys.argv[1:])
text = lambda r: r["choices"][0]["message"]["content"]
assert a["usage"]["completion_tokens"] == 60 and b["usage"]["completion_tokens"] == 60, (a["usage"], b["usage"])
assert text(a) == text(alone) and text(b) == text(alone)
' "$tmp/pool_alone.json" "$tmp/pool_1.json" "$tmp/pool_2.json"; then
  ok "KV pool: two requests that do not fit together both complete as alone"
else
  bad "KV pool: $(head -c 300 "$tmp/pool_1.json") / $(head -c 300 "$tmp/pool_2.json")"
fi
preempted=$(metric preemptions_total)
[[ ${preempted:-0} -ge 1 ]] && ok "KV pool: /metrics counts the preemption ($preempted)" || bad "KV pool: preemptions_total ${preempted:-none}"
kill -TERM "$pid"; wait "$pid"

# Without a GPU (CI), loading the GPU engine (four slots) fails: exit 1 with
# the reason, nothing left running.
if ! nvidia-smi -L >/dev/null 2>&1; then
  timeout 60 "$server" -m "$model" --device cuda -np 4 --port 0 >/dev/null 2>"$tmp/nogpu.err"
  rc=$?
  if [[ $rc == 1 ]] && grep -qi "cuda\|gpu" "$tmp/nogpu.err"; then ok "--device cuda without a GPU: exit 1 with the reason"
  else bad "--device cuda without a GPU: exit $rc: $(head -c 300 "$tmp/nogpu.err")"; fi
fi

# A bad --weights-upload is refused before anything loads.
timeout 60 "$server" -m "$model" --weights-upload mmap --port 0 >/dev/null 2>"$tmp/upload.err"
rc=$?
if [[ $rc == 1 ]] && grep -q "expected auto, pin or staged" "$tmp/upload.err"; then ok "--weights-upload mmap: exit 1 naming the choices"
else bad "--weights-upload mmap: exit $rc: $(head -c 300 "$tmp/upload.err")"; fi

echo "$fails failures"
[[ $fails -eq 0 ]]
