#!/usr/bin/env bash
# dpl-run --device cpu and dpl-tokenize end to end: every oracle model through
# dpl-convert and dpl-run --tokens --all-logits --dump-logits, compared with
# llama.cpp's logits; the oracle prompt through dpl-tokenize; error cases.
set -u
shared=${DPL_SHARED_DIR:-$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/../.." && pwd)/shared}
run=runtime/dpl-run
tokenize=runtime/dpl-tokenize
convert=converter/dpl-convert
synth=tools/dpl-synth
compare=tests/compare_logits
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# NAME:LIMIT[:ROWS]: every oracle model, converted (the runtime's layouts);
# ROWS: the oracle holds the last ROWS positions only.
for spec in ora-llama-f32:0.002 ora-qwen2-f32:0.002 small-llama-q4km:0.03 small-qwen2-q4km:0.03 \
            small-qwen3-q4km:0.03 small-llama31-q4km:0.03:32 mini-llama-q5km:0.03 mini-llama-q6k:0.03 \
            mini-llama-q80:0.03 mini-llama-q40:0.03 mini-llama-iq4xs:0.03 mini-llama-q3km:0.03 \
            mini-qwen3moe-q4km:0.03; do
  IFS=: read -r name limit rows <<<"$spec"
  "$convert" -q "$shared/oracle/$name.gguf" "$tmp/$name.dpl" >/dev/null || { bad "convert $name"; continue; }
  tokens=$(tr -d ' \n' <"$shared/oracle/$name.tokens")
  if "$run" -m "$tmp/$name.dpl" --device cpu -c 4096 --tokens "$tokens" --all-logits \
      --dump-logits "$tmp/$name.f32" >/dev/null 2>&1 &&
     "$compare" "$tmp/$name.f32" "$shared/oracle/$name.logits.f32" "$limit" $rows; then
    ok "dpl-run --device cpu $name within $limit of llama.cpp"
  else
    bad "dpl-run --device cpu $name"
  fi
done

# The oracle prompt tokenizes to the ids llama.cpp gave (they start .tokens).
ids=$("$tokenize" -m "$shared/oracle/tiny-qwen2-vocab-q4km.gguf" -p "$(cat "$shared/oracle/tiny-qwen2-vocab-q4km.prompt")" | tr -d '[] ')
want=$(tr -d ' \n' <"$shared/oracle/tiny-qwen2-vocab-q4km.tokens")
if [[ -n $ids && $want == "$ids",* ]]; then ok "dpl-tokenize oracle prompt"; else bad "dpl-tokenize oracle prompt: $ids"; fi

# A SentencePiece vocabulary (Llama 2's and Mistral 7B's tokenizer) end to
# end: a tiny llama with llama.cpp's llama-spm vocabulary tokenizes "Hello
# world" as llama.cpp does (BOS, "▁Hello", "▁world": its test vectors) and
# runs a prompt on the CPU device.
if "$synth" tiny-llama "$tmp/spm.gguf" --vocab "$shared/vocab/ggml-vocab-llama-spm.gguf" >/dev/null &&
   "$convert" -q "$tmp/spm.gguf" "$tmp/spm.dpl" >/dev/null; then
  ids=$("$tokenize" -m "$tmp/spm.dpl" -p "Hello world" | tr -d '[] ')
  if [[ $ids == "1,15043,3186" ]]; then ok "dpl-tokenize SentencePiece"; else bad "dpl-tokenize SentencePiece: $ids"; fi
  "$run" -m "$tmp/spm.dpl" --device cpu -p "Hello world" -n 4 --temp 0 >"$tmp/spm.txt" 2>"$tmp/spm.err"
  if [[ $? -eq 0 ]] && grep -q "generated: .* 4 tokens" "$tmp/spm.err"; then ok "dpl-run SentencePiece model"; else
    bad "dpl-run SentencePiece model"; cat "$tmp/spm.err"; fi
else
  bad "synth + convert a SentencePiece llama"
fi

# Chat on the CPU device: a system prompt, two user turns from standard input,
# greedy; each turn's prompt extends the cached conversation.
"$convert" -q "$shared/oracle/tiny-qwen2-vocab-q4km.gguf" "$tmp/chat.dpl" >/dev/null
printf 'Hello there\nAnd again\n' |
  "$run" -m "$tmp/chat.dpl" --device cpu -cnv -sys "Be brief." -n 6 --temp 0 >"$tmp/chat.txt" 2>"$tmp/chat.err"
rc=$?
# Two answers of 6 tokens each, one line each.
if [[ $rc -eq 0 ]] && grep -q "generated: .* 12 tokens" "$tmp/chat.err" && [[ $(grep -c . "$tmp/chat.txt") -eq 2 ]]; then
  ok "dpl-run -cnv: two turns from stdin"
else
  bad "dpl-run -cnv (rc=$rc)"; cat "$tmp/chat.err"
fi
"$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p "Hi" -n 4 --temp 0 >"$tmp/single.txt" 2>"$tmp/single.err"
if [[ $? -eq 0 ]] && grep -q "generated: .* 4 tokens" "$tmp/single.err"; then ok "dpl-run --single-turn"; else
  bad "dpl-run --single-turn"; cat "$tmp/single.err"; fi

# --reasoning-budget 0 (thinking off): with the qwen3 template the prompt gains
# Qwen3's empty "<think>\n\n</think>\n\n"; ChatML has no thinking and
# accepts the flag unchanged.
prompt_tokens() {  # ARGS...: the prompt's token count from the timing block
  "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p "Hi" -n 1 --temp 0 "$@" 2>&1 >/dev/null |
    sed -n 's|.*prompt: .*/ *\([0-9]*\) tokens.*|\1|p'
}
think_on=$(prompt_tokens --chat-template qwen3)
think_off=$(prompt_tokens --chat-template qwen3 --reasoning-budget 0)
chatml_on=$(prompt_tokens)
chatml_off=$(prompt_tokens --reasoning-budget 0)
if [[ -n $think_on && -n $think_off && $think_off -gt $think_on && -n $chatml_on && $chatml_on == "$chatml_off" ]]; then
  ok "dpl-run --reasoning-budget 0: qwen3 prompt $think_on -> $think_off tokens, chatml unchanged ($chatml_on)"
else
  bad "dpl-run --reasoning-budget 0: qwen3 '$think_on' -> '$think_off', chatml '$chatml_on' -> '$chatml_off'"
fi

expect_error() {  # NAME PATTERN CMD...
  local name=$1 pattern=$2; shift 2
  "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -q -- "$pattern" "$tmp/err.txt"; then ok "$name"; else
    bad "$name (rc=$rc)"; cat "$tmp/err.txt"; fi
}
m="$tmp/ora-llama-f32.dpl"
expect_error "dpl-run: missing model file" "cannot open" "$run" -m "$tmp/none.dpl" -p hi
expect_error "dpl-run: no -m" "no model" "$run" -p hi
expect_error "dpl-run: text prompt on a vocabulary-less model" "no vocabulary" "$run" -m "$m" --device cpu -p hi
expect_error "dpl-run: token id out of range" "outside" "$run" -m "$m" --device cpu --tokens 1,99999
expect_error "dpl-run: prompt longer than the context" "context" "$run" -m "$m" --device cpu -c 2 --tokens 1,2,3
expect_error "dpl-run: unknown device" "unknown device" "$run" -m "$m" --device tpu --tokens 1
expect_error "dpl-run: unknown --weights-upload" "expected auto, pin or staged" "$run" -m "$m" --device cpu --weights-upload mmap --tokens 1
expect_error "dpl-run: corrupt model" "not a model file" "$run" -m "$tmp/out.txt" --tokens 1
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect_error "dpl-run: the default device needs a GPU" "no CUDA device" "$run" -m "$m" --tokens 1
fi
for budget in 5 -2 1024; do
  expect_error "dpl-run: --reasoning-budget $budget" \
    "--reasoning-budget $budget: only -1 (unrestricted thinking) and 0 (thinking off)" \
    "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi --reasoning-budget "$budget"
done
expect_error "dpl-run: unknown --chat-template" \
  'unknown chat template "vicuna"; choose one of: chatml, llama3, qwen3, mistral-v7' \
  "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi --chat-template vicuna
# The renderer dpl-run says it uses: the model's own template through minja,
# a family by --chat-template, a --chat-template-file through minja.
if grep -q "^chat template: jinja (minja), family chatml$" "$tmp/single.err"; then ok "dpl-run: the model's template through minja"; else
  bad "dpl-run: no 'chat template: jinja' line"; cat "$tmp/single.err"; fi
"$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi -n 1 --temp 0 --chat-template chatml >/dev/null 2>"$tmp/named.err"
if grep -q "^chat template: family chatml (built-in renderer)$" "$tmp/named.err"; then ok "dpl-run --chat-template: the family renderer"; else
  bad "dpl-run --chat-template: no family line"; cat "$tmp/named.err"; fi
printf '%s' "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\nSure, " >"$tmp/custom.jinja"
custom=$(prompt_tokens --chat-template-file "$tmp/custom.jinja")
if [[ -n $custom && -n $chatml_on && $custom -lt $chatml_on ]] &&
   "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi -n 1 --temp 0 --chat-template-file "$tmp/custom.jinja" 2>&1 >/dev/null |
     grep -q "^chat template: jinja (minja), family chatml$"; then
  ok "dpl-run --chat-template-file: rendered by minja ($custom prompt tokens, the model's template $chatml_on)"
else
  bad "dpl-run --chat-template-file: '$custom' prompt tokens, the model's template '$chatml_on'"
fi
expect_error "dpl-run: missing --chat-template-file" "--chat-template-file $tmp/none.jinja: cannot open" \
  "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi --chat-template-file "$tmp/none.jinja"
printf '%s' "{% for m in messages %}{{ m.content }}" >"$tmp/bad.jinja"
expect_error "dpl-run: --chat-template-file that does not parse" "bad.jinja: the chat template does not parse" \
  "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi --chat-template-file "$tmp/bad.jinja"
expect_error "dpl-run: --chat-template with --chat-template-file" "use one" \
  "$run" -m "$tmp/chat.dpl" --device cpu --single-turn -p hi --chat-template chatml --chat-template-file "$tmp/custom.jinja"
expect_error "dpl-tokenize: vocabulary-less model" "no vocabulary" "$tokenize" -m "$m" -p hi

echo "run_cli_test: $fails failure(s)"
[[ $fails -eq 0 ]]
