#!/usr/bin/env bash
# dpl-run's flags as a hostile user gives them (issue 11): each case ends with
# exit status 1 and a message naming the problem, within its time bound and
# under a 3 GB address-space limit, with no output echoed first; each has a
# clean twin that works. Runs the CPU device (CI has no GPU).
set -u
shared=${DPL_SHARED_DIR:-$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/../.." && pwd)/shared}
run=$(pwd)/runtime/dpl-run
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
model=$shared/oracle/small-llama-q4km.gguf
vocab=$shared/oracle/tiny-qwen2-vocab-q4km.gguf
fails=0

# expect_error NAME PATTERN CMD...: exit 1, PATTERN on stderr, nothing on
# stdout, done in 10 s with at most 3 GB of address space.
expect_error() {
  local name=$1 pattern=$2; shift 2
  (ulimit -v 3000000; timeout 10 "$@") >"$tmp/out.txt" 2>"$tmp/err.txt" </dev/null
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -q -- "$pattern" "$tmp/err.txt" && [[ ! -s $tmp/out.txt ]]; then
    echo "ok   $name"
  else
    echo "FAIL $name (rc=$rc, stdout $(wc -c <"$tmp/out.txt") bytes)"; head -c 300 "$tmp/err.txt"
    fails=$((fails + 1))
  fi
}
# expect_ok NAME CMD...: the clean twin.
expect_ok() {
  local name=$1; shift
  if (ulimit -v 3000000; timeout 30 "$@") >"$tmp/out.txt" 2>"$tmp/err.txt" </dev/null; then
    echo "ok   $name"
  else
    echo "FAIL $name (rc=$?)"; head -c 300 "$tmp/err.txt"; fails=$((fails + 1))
  fi
}

cpu=(--device cpu -t 2)
expect_ok "twin: --tokens with -c 64" "$run" -m "$model" "${cpu[@]}" -c 64 --tokens 1,2,3
expect_error "-c 16777216: memory refused, no bad_alloc" "-c" "$run" -m "$model" "${cpu[@]}" -c 16777216 --tokens 1,2,3
expect_error "-c beyond 2^24" "out of range" "$run" -m "$model" "${cpu[@]}" -c 16777217 --tokens 1
expect_error "-c negative" "out of range" "$run" -m "$model" "${cpu[@]}" -c -5 --tokens 1
expect_error "-t 100000" "-t 100000 is out of range" "$run" -m "$model" --device cpu -t 100000 --tokens 1
expect_error "-ub 0" "-ub 0 is out of range" "$run" -m "$model" "${cpu[@]}" -ub 0 --tokens 1
expect_error "--ubatch-size 9000" "-ub 9000 is out of range" "$run" -m "$model" "${cpu[@]}" --ubatch-size 9000 --tokens 1
expect_error "-n -5" "-n -5 is out of range" "$run" -m "$vocab" "${cpu[@]}" -p hi -n -5
expect_error "--temp -1" "--temp -1 is out of range" "$run" -m "$vocab" "${cpu[@]}" -p hi --temp -1
expect_error "--top-p 2" "--top-p 2 is out of range" "$run" -m "$vocab" "${cpu[@]}" -p hi --top-p 2
expect_error "--min-p 2" "--min-p 2 is out of range" "$run" -m "$vocab" "${cpu[@]}" -p hi --min-p 2
expect_error "--repeat-penalty 0" "--repeat-penalty 0 is out of range" "$run" -m "$vocab" "${cpu[@]}" -p hi --repeat-penalty 0
expect_error "-p and -f together" "-p and -f" "$run" -m "$vocab" "${cpu[@]}" -p hi -f /etc/hostname
expect_error "-f /dev/zero is capped" "larger than 64 MiB" "$run" -m "$vocab" "${cpu[@]}" -f /dev/zero
expect_error "-f a directory" "is a directory" "$run" -m "$vocab" "${cpu[@]}" -f "$tmp"
expect_error "-f a missing file" "cannot open prompt file" "$run" -m "$vocab" "${cpu[@]}" -f "$tmp/none.txt"
expect_error "an extra positional argument" "unexpected argument 'extra'" "$run" -m "$vocab" "${cpu[@]}" -p hi extra
expect_error "--single-turn without a prompt" "--single-turn" "$run" -m "$vocab" "${cpu[@]}" --single-turn
head -c 10000000 /dev/zero | tr '\0' 'a' >"$tmp/big.txt"
expect_error "a 10 MB prompt: refused before it is echoed" "longer than the context" "$run" -m "$vocab" "${cpu[@]}" -c 256 -f "$tmp/big.txt"
printf 'Hello' >"$tmp/small.txt"
expect_ok "twin: a small prompt file" "$run" -m "$vocab" "${cpu[@]}" -f "$tmp/small.txt" -n 2 --temp 0
expect_error "--dump-logits a directory" "directory" "$run" -m "$model" "${cpu[@]}" -c 8 --tokens 1 --dump-logits "$tmp"
expect_error "--dump-logits ''" "empty" "$run" -m "$model" "${cpu[@]}" -c 8 --tokens 1 --dump-logits ""
cp "$model" "$tmp/m.gguf"; sum=$(cksum <"$tmp/m.gguf")
expect_error "--dump-logits over the model" "input" "$run" -m "$tmp/m.gguf" "${cpu[@]}" -c 8 --tokens 1 --dump-logits "$tmp/m.gguf"
if [[ $(cksum <"$tmp/m.gguf") == "$sum" ]]; then echo "ok   the model is unchanged"; else echo "FAIL model changed"; fails=$((fails + 1)); fi
expect_ok "twin: --dump-logits to a new file" "$run" -m "$model" "${cpu[@]}" -c 8 --tokens 1 --dump-logits "$tmp/l.f32"
if ls -a "$tmp" | grep -q "dpl-tmp"; then echo "FAIL a temp file was left"; fails=$((fails + 1)); else echo "ok   no temp file left"; fi
mkfifo "$tmp/fifo"
expect_error "a FIFO as the model" "regular file" "$run" -m "$tmp/fifo" "${cpu[@]}" --tokens 1
[[ $fails -eq 0 ]]
