#!/usr/bin/env bash
# The test command (README; CI runs it through .ci/run): installs what is
# missing, runs every Bazel test (no GPU needed), then each fuzzer for a
# bounded time. Ends with one line "N passed, N failed": one unit per Bazel
# test target and per fuzzer.
#
#   tools/test.sh [FUZZ_SECONDS_PER_TARGET]   (default 60; 0 skips fuzzing)
set -uo pipefail
cd "$(dirname "$0")/.."
fuzz_secs=${1:-60}

tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp /tmp/dpl-test.XXXXXX)
trap 'rm -f "$log"' EXIT
bazel test //... --test_output=errors 2>&1 | tee "$log" | grep -vE "^(INFO|Loading|Analyzing|\[)" 
passed=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log")
failed=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS)|FAILED TO BUILD" "$log")
if grep -q "FAILED: Build did NOT complete successfully" "$log" && [[ $failed -eq 0 ]]; then
  failed=1  # a build error before any test ran
fi

if [[ $fuzz_secs -gt 0 ]]; then
  tools/fuzz.sh "$fuzz_secs" 2>&1 | tee "$log.fuzz"
  passed=$((passed + $(grep -c "^fuzz-result: .* passed" "$log.fuzz")))
  failed=$((failed + $(grep -c "^fuzz-result: .* FAILED" "$log.fuzz")))
  rm -f "$log.fuzz"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
