#!/usr/bin/env bash
# The command-line tools end to end: synth -> convert --verify -> inspect, and
# bad input -> exit status 1 with a message that names the problem, never a
# crash or a partial output file.
set -u
convert=converter/dpl-convert
inspect=converter/dpl-inspect
synth=tools/dpl-synth
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0

check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

# expect_error NAME PATTERN CMD...: exit status 1 and PATTERN on stderr.
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -q -- "$pattern" "$tmp/err.txt"; then
    echo "ok   $name"
  else
    echo "FAIL $name (rc=$rc)"; cat "$tmp/err.txt"; fails=$((fails + 1))
  fi
}

"$synth" tiny-qwen2 "$tmp/m.gguf" --seed 7 >/dev/null
check "synth writes a model" test -s "$tmp/m.gguf"
"$convert" "$tmp/m.gguf" "$tmp/m.dpl" --verify >"$tmp/conv.txt" 2>&1
check "convert --verify succeeds" grep -q "verify: OK" "$tmp/conv.txt"
check "convert prints one line per tensor" grep -q "token_embd.weight" "$tmp/conv.txt"
check "convert prints a summary" grep -q "MB/s" "$tmp/conv.txt"
"$convert" "$tmp/m.gguf" "$tmp/mz.dpl" --compress --verify >"$tmp/convz.txt" 2>&1
check "convert --compress reports the ratio" grep -q "ratio" "$tmp/convz.txt"
check "compressed form verifies" grep -q "verify: OK" "$tmp/convz.txt"
check "convert --layout auto stays format version 1" grep -q "format version 1" "$tmp/conv.txt"
"$convert" "$tmp/m.gguf" "$tmp/md.dpl" --layout dpl --verify >"$tmp/convd.txt" 2>&1
# tiny-qwen2 is q4_K and q6_K: q4_K has no dpl planes, so still version 1.
check "convert --layout dpl: q6_K only has planes here" grep -q "(3 -> dpl: q6_K 3; format version 1)" "$tmp/convd.txt"
check "convert --layout dpl verifies" grep -q "verify: OK" "$tmp/convd.txt"
"$convert" -q "$tmp/m.gguf" "$tmp/mr.dpl" --layout raw >"$tmp/convr.txt" 2>&1
check "convert --layout raw: no dpl tensor" grep -q "(0 -> dpl: none; format version 1)" "$tmp/convr.txt"
"$inspect" "$tmp/m.dpl" --verify-checksums >"$tmp/insp.txt" 2>&1
check "inspect verifies checksums" grep -q "checksums: all" "$tmp/insp.txt"
"$inspect" "$tmp/m.gguf" --json >"$tmp/insp.json" 2>&1
check "inspect --json on GGUF" grep -q '"container": "gguf"' "$tmp/insp.json"

expect_error "convert: missing input" "cannot open" "$convert" "$tmp/nope.gguf" "$tmp/x.dpl"
check "convert: no partial output" test ! -e "$tmp/x.dpl"
expect_error "convert: missing arguments" "expected IN.gguf and OUT.dpl" "$convert" "$tmp/m.gguf"
expect_error "convert: unknown flag" "Option" "$convert" --bogus "$tmp/m.gguf" "$tmp/x.dpl"
expect_error "convert: bad --layout" "--layout 'planes' is not one of raw, dpl, auto" \
  "$convert" --layout planes "$tmp/m.gguf" "$tmp/x.dpl"
check "convert: no output after a bad --layout" test ! -e "$tmp/x.dpl"
head -c 3000 "$tmp/m.gguf" >"$tmp/trunc.gguf"
expect_error "convert: truncated GGUF" "trunc.gguf" "$convert" "$tmp/trunc.gguf" "$tmp/x.dpl"
check "convert: no partial output after a bad input" test ! -e "$tmp/x.dpl"
expect_error "inspect: not a model" "not a model file" "$inspect" "$tmp/conv.txt"
head -c 5000 "$tmp/m.dpl" >"$tmp/trunc.dpl"
expect_error "inspect: truncated .dpl" "file size mismatch" "$inspect" "$tmp/trunc.dpl"
expect_error "inspect: checksums of a GGUF" "no checksums" "$inspect" "$tmp/m.gguf" --verify-checksums
expect_error "synth: unknown preset" "unknown preset" "$synth" no-such-model "$tmp/y.gguf"
expect_error "synth: bad ftype" "ftype" "$synth" tiny-llama "$tmp/y.gguf" --ftype q9
check "synth: no partial output" test ! -e "$tmp/y.gguf"

echo "cli_test: $fails failure(s)"
[[ $fails -eq 0 ]]
