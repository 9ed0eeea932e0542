#!/usr/bin/env bash
# Hostile command lines, outputs and signals against the real dpl-convert and
# dpl-synth (issue 11, cases 5, 8, 10, 11, 12). Every case ends within its
# bound with exit status 1 and a message naming the problem, or by the signal
# it was sent, or succeeds; no temporary file is ever left, no input changes,
# an existing output stays as it was unless the run succeeded. Every crafted
# input is made here, and every refusal has a clean twin that succeeds.
set -u
set -m       # background jobs keep SIGINT/SIGQUIT (a script's jobs ignore them otherwise)
ulimit -c 0  # SIGQUIT's default action dumps core
shared=${DPL_SHARED_DIR:-$(cd "$(dirname "$(readlink -f tests/shared_anchor.txt)")/../.." && pwd)/shared}
convert=converter/dpl-convert
inspect=converter/dpl-inspect
synth=tools/dpl-synth
tmp="${TEST_TMPDIR:-$(mktemp -d)}/hostile"
rm -rf "$tmp" && mkdir -p "$tmp"
logs="$tmp/logs" && mkdir -p "$logs"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# Temporary files anywhere in $tmp (formats/output_file.h: DIR/.NAME.dpl-tmp-PID-N),
# and anything else with "tmp" in its name.
no_temps() { [[ -z $(find "$tmp" -path "$logs" -prune -o -name '*tmp*' -print) ]]; }
has_temp() { compgen -G "$(dirname "$1")/.$(basename "$1").dpl-tmp-*" >/dev/null; }
same() { cmp -s "$1" "$2"; }

# refuse NAME PATTERN CMD...: exit status 1 within 60 s, PATTERN on stderr, no temp file.
refuse() {
  local name=$1 pattern=$2; shift 2
  timeout 60 "$@" >"$logs/out" 2>"$logs/err"
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -qF -- "$pattern" "$logs/err" && no_temps; then ok "$name"; else
    bad "$name (rc=$rc)"; cat "$logs/err"; fi
}
# twin NAME CMD...: the clean twin succeeds within 60 s and leaves no temp file.
twin() {
  local name=$1; shift
  timeout 60 "$@" >"$logs/out" 2>"$logs/err"
  local rc=$?
  if [[ $rc -eq 0 ]] && no_temps; then ok "twin: $name"; else bad "twin: $name (rc=$rc)"; cat "$logs/err"; fi
}

"$synth" tiny-llama "$tmp/in.gguf" --seed 3 >/dev/null || bad "synth tiny-llama"
"$synth" small-llama "$tmp/small.gguf" >/dev/null || bad "synth small-llama"
"$synth" qwen2.5-0.5b "$tmp/big.gguf" >/dev/null || bad "synth qwen2.5-0.5b"
cp "$shared/vocab/ggml-vocab-qwen2.gguf" "$tmp/vocab.gguf"
inputs_before=$(cd "$tmp" && cksum in.gguf small.gguf big.gguf vocab.gguf)

# --- case 5: option values, memory ------------------------------------------
refuse "convert --threads 100000" "--threads 100000 out of range (0 = all cores, or 1..1024)" \
  "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --threads 100000
twin "convert --threads 2" "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --threads 2
refuse "convert --threads 1024 --frame-mib 1024: memory" "GiB of buffers, over the" \
  "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --threads 1024 --frame-mib 1024
twin "convert --threads 1024 --frame-mib 1" "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --threads 1024 --frame-mib 1
refuse "convert --frame-mib 0" "--frame-mib 0 out of range (1..1024)" "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --frame-mib 0
refuse "convert --frame-mib 2048" "--frame-mib 2048 out of range" "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --frame-mib 2048
refuse "convert --level 23" "--level 23 out of range (zstd: " "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --level 23
twin "convert --level 22" "$convert" -q "$tmp/in.gguf" "$tmp/o.dpl" --compress --level 22
refuse "synth --threads 100000" "--threads 100000 out of range" "$synth" tiny-llama "$tmp/o.gguf" --threads 100000
twin "synth --threads 3" "$synth" tiny-llama "$tmp/o.gguf" --threads 3

# --- case 10: the output is never the input; read-only and odd outputs ------
ln -s in.gguf "$tmp/link.gguf"
ln "$tmp/in.gguf" "$tmp/hard.gguf"
refuse "convert IN IN" "is the input" "$convert" -q "$tmp/in.gguf" "$tmp/in.gguf"
refuse "convert LINK IN (symlink)" "is the input" "$convert" -q "$tmp/link.gguf" "$tmp/in.gguf"
refuse "convert IN LINK (symlink)" "is the input" "$convert" -q "$tmp/in.gguf" "$tmp/link.gguf"
refuse "convert IN HARDLINK" "is the input" "$convert" -q "$tmp/in.gguf" "$tmp/hard.gguf"
refuse "synth OUT = --vocab" "is the input" "$synth" tiny-qwen2 "$tmp/vocab.gguf" --vocab "$tmp/vocab.gguf"
twin "synth --vocab to another name" "$synth" tiny-qwen2 "$tmp/voc-model.gguf" --vocab "$tmp/vocab.gguf"
echo previous >"$tmp/ro.dpl" && chmod 0444 "$tmp/ro.dpl" && cp "$tmp/ro.dpl" "$logs/ro.want"
refuse "convert to a read-only file" "exists and is read-only; not replacing it" "$convert" -q "$tmp/in.gguf" "$tmp/ro.dpl"
refuse "synth to a read-only file" "read-only" "$synth" tiny-llama "$tmp/ro.dpl"
if same "$tmp/ro.dpl" "$logs/ro.want"; then ok "the read-only file is unchanged"; else bad "read-only file changed"; fi
chmod 0644 "$tmp/ro.dpl"
twin "convert to the file once writable" "$convert" -q "$tmp/in.gguf" "$tmp/ro.dpl"
mkdir "$tmp/dir.dpl"
refuse "convert to a directory" "is a directory" "$convert" -q "$tmp/in.gguf" "$tmp/dir.dpl"
refuse "convert to ''" "empty output path" "$convert" -q "$tmp/in.gguf" ""
refuse "convert to /dev/null" "not a regular file" "$convert" -q "$tmp/in.gguf" /dev/null
long="$tmp/$(printf 'n%.0s' {1..250}).dpl"  # 254 characters
twin "convert to a 254-character name" "$convert" -q "$tmp/in.gguf" "$long"
twin "synth to a 254-character name" "$synth" tiny-llama "${long%.dpl}.gguf"
[[ -s $long ]] && ok "the 254-character output exists" || bad "no 254-character output"

# --- case 11: write errors ---------------------------------------------------
refuse "convert over RLIMIT_FSIZE (EFBIG)" "fsize.dpl" \
  bash -c "ulimit -f 1024; exec $convert -q $tmp/small.gguf $tmp/fsize.dpl"
grep -q "File too large" "$logs/err" && ok "EFBIG message" || bad "EFBIG message: $(cat "$logs/err")"
mkdir "$tmp/full"
full_script='mount -t tmpfs -o size=2m tmpfs "$1" || exit 77
"$2" -q "$3" "$1/full.dpl" 2>&1; rc=$?
echo "left on it: [$(ls -A "$1")]"; exit $rc'
timeout 60 unshare -m sh -c "$full_script" sh "$tmp/full" "$convert" "$tmp/small.gguf" >"$logs/full" 2>&1
rc=$?
if [[ $rc -eq 77 || $rc -eq 125 ]] || grep -q "unshare failed\|Operation not permitted" "$logs/full"; then
  echo "skip full disk: no private tmpfs here (needs root): $(head -1 "$logs/full")"
elif [[ $rc -eq 1 ]] && grep -q "No space left on device" "$logs/full" && grep -qF "left on it: []" "$logs/full"; then
  ok "convert onto a full tmpfs: ENOSPC, nothing left on it"
else
  bad "convert onto a full tmpfs (rc=$rc)"; cat "$logs/full"
fi

# A closed standard output: an EPIPE, not a death; the conversion completes.
"$convert" "$tmp/small.gguf" "$tmp/head.dpl" | head -2 >/dev/null
rc=${PIPESTATUS[0]}
if [[ $rc -eq 0 ]] && "$inspect" "$tmp/head.dpl" --verify-checksums >/dev/null && no_temps; then
  ok "convert | head -2: completes, valid output"; else bad "convert | head -2 (rc=$rc)"; fi
exec {closed}> >(exec true)
wait $!  # the pipe's only reader is gone
"$convert" "$tmp/small.gguf" "$tmp/closed.dpl" >&$closed 2>"$logs/err"
rc=$?
"$synth" tiny-llama "$tmp/closed.gguf" >&$closed 2>>"$logs/err"
rc2=$?
exec {closed}>&-
if [[ $rc -eq 0 && $rc2 -eq 0 ]] && "$inspect" "$tmp/closed.dpl" --verify-checksums >/dev/null && no_temps; then
  ok "a closed stdout: convert and synth complete"; else bad "closed stdout (rc=$rc, $rc2)"; cat "$logs/err"; fi

# --- signals -------------------------------------------------------------------
# wait_until PID CONDITION...: CONDITION within 30 s while PID runs.
wait_until() {
  local pid=$1 i=0; shift
  until "$@"; do
    kill -0 "$pid" 2>/dev/null && ((i++ < 3000)) || return 1
    sleep 0.01
  done
}
# reap PID: its exit status; killed (137) if it runs past 30 s.
reap() {
  local i=0
  while kill -0 "$1" 2>/dev/null && ((i++ < 600)); do sleep 0.05; done
  kill -KILL "$1" 2>/dev/null
  wait -f "$1" 2>/dev/null  # (without bash's job report)
}

# trial NAME SIG OUT READY CMD...: runs CMD with an existing OUT, waits until
# READY (a function of OUT: it is writing), stops it, sends SIG, resumes it.
# Then: killed by SIG (or exit 1) with OUT as it was, or (SIGPIPE, which the
# tools ignore) success with a new valid OUT; never a temp file.
trial() {
  local name=$1 sig=$2 out=$3 ready=$4; shift 4
  echo previous >"$out"
  "$@" >"$logs/trial.out" 2>"$logs/trial.err" &
  local pid=$! mid=no
  wait_until "$pid" "$ready" "$out" && kill -STOP "$pid" && "$ready" "$out" && mid=yes
  kill "-$sig" "$pid"; kill -CONT "$pid"
  reap "$pid"
  local rc=$? want=$((128 + $(kill -l "$sig")))
  if [[ $mid != yes ]]; then
    bad "$name: the writer was not caught writing (rc=$rc)"
  elif [[ $rc -eq $want || $rc -eq 1 ]] && [[ $(cat "$out") == previous ]] && no_temps &&
       { [[ $rc -eq 1 ]] || grep -q "interrupted by SIG$sig; the unfinished output was removed" "$logs/trial.err"; }; then
    ok "$name: ended by SIG$sig (rc=$rc), nothing written"
  elif [[ $sig == PIPE && $rc -eq 0 ]] && "$inspect" "$out" >/dev/null && no_temps; then
    ok "$name: SIGPIPE ignored, completed"
  else
    bad "$name (rc=$rc)"; cat "$logs/trial.err"; ls -A "$tmp"
  fi
  rm -f "$out"
} 2>/dev/null  # bash's own report of each killed job
verifying() { has_temp "$1" && grep -q "^verifying" "$logs/trial.out" && ! grep -q "^converted" "$logs/trial.out"; }

for sig in INT TERM HUP QUIT USR1 USR2 ALRM PIPE; do
  trial "synth SIG$sig while writing" "$sig" "$tmp/sig.gguf" has_temp \
    "$synth" qwen2.5-0.5b "$tmp/sig.gguf" --threads 1
  trial "convert SIG$sig while writing" "$sig" "$tmp/sig.dpl" has_temp \
    "$convert" -q "$tmp/small.gguf" "$tmp/sig.dpl" --compress --level 19 --threads 1 --frame-mib 1
done
# case 12: a signal during --verify (before the rename) writes nothing.
trial "convert --verify SIGINT while verifying" INT "$tmp/verify.dpl" verifying \
  "$convert" "$tmp/big.gguf" "$tmp/verify.dpl" --verify
trial "convert --verify SIGTERM while verifying" TERM "$tmp/verify.dpl" verifying \
  "$convert" "$tmp/big.gguf" "$tmp/verify.dpl" --verify --compress --level 1
twin "convert --verify" "$convert" "$tmp/small.gguf" "$tmp/verified.dpl" --verify
grep -q "verify: OK" "$logs/out" && ok "twin: verify: OK" || bad "twin: no verify: OK"

# case 8: a FIFO as the input: refused, or ended by SIGINT while blocked.
mkfifo "$tmp/fifo.gguf"
"$convert" "$tmp/fifo.gguf" "$tmp/fifo.dpl" >"$logs/out" 2>"$logs/err" &
pid=$!
sleep 0.3
kill -INT "$pid" 2>/dev/null
reap "$pid"
rc=$?
if [[ $rc -eq 1 || $rc -eq 130 ]] && [[ ! -e $tmp/fifo.dpl ]] && no_temps; then
  ok "convert from a FIFO ends (rc=$rc)"; else bad "convert from a FIFO (rc=$rc)"; fi
rm -f "$tmp/fifo.gguf"

inputs_after=$(cd "$tmp" && cksum in.gguf small.gguf big.gguf vocab.gguf)
[[ $inputs_after == "$inputs_before" ]] && ok "no input changed" || bad "an input changed"
no_temps && ok "no temporary file anywhere" || { bad "temporary files left"; find "$tmp" -name '*tmp*'; }

echo "hostile_cli_test: $fails failure(s)"
[[ $fails -eq 0 ]] && rm -rf "$tmp"  # about 1 GB of models; kept for a look after a failure
[[ $fails -eq 0 ]]
