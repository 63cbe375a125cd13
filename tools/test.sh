#!/usr/bin/env bash
# Builds gma and runs the whole test suite three times: a Debug build with full
# structure validation (GMA_DEBUG=2), an ASan+UBSan build and a TSan build.
# Usage: bash tools/test.sh [ctest args...]   (e.g. -L api, -R pool)
# Set GMA_TEST_BUILDS="debug asan" to run a subset of the builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh

jobs=$(nproc 2>/dev/null || echo 2)
builds=${GMA_TEST_BUILDS:-"debug asan tsan"}
failed=()
summary=()
t_all=$SECONDS
logdir=build/test-logs
mkdir -p "$logdir"

# counts LOG: "N passed, N failed, N skipped of N" from a ctest log.
counts() {
  local total passed skipped
  total=$(sed -n -e 's/.* tests* failed out of \([0-9]*\).*/\1/p' "$1" | tail -n 1)
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*(Skipped|Not Run \(Disabled\))' "$1" || true)
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$1" || true)
  echo "$passed passed, $(( ${total:-0} - passed - skipped )) failed, $skipped skipped of ${total:-0}"
}

for b in $builds; do
  case "$b" in
    debug) opts=(-DCMAKE_BUILD_TYPE=Debug) ;;
    asan)  opts=(-DCMAKE_BUILD_TYPE=Debug -DGMA_SANITIZE=address) ;;
    tsan)  opts=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMA_DEBUG=1 -DGMA_SANITIZE=thread) ;;
    *) echo "unknown build '$b' (debug, asan, tsan)"; exit 2 ;;
  esac
  t0=$SECONDS
  echo "=== build/$b: ${opts[*]} (building; log: $logdir/$b-build.log)"
  cmake -S . -B "build/$b" -DGMA_BUILD_BENCH=OFF "${opts[@]}" >"$logdir/$b-build.log"
  if ! cmake --build "build/$b" -j "$jobs" >>"$logdir/$b-build.log" 2>&1; then
    tail -n 30 "$logdir/$b-build.log"
    failed+=("$b (build)")
    summary+=("$(printf '%-6s build failed after %ds' "$b" $((SECONDS - t0)))")
    continue
  fi
  t1=$SECONDS
  echo "=== build/$b: built in $((t1 - t0))s; tests"
  set +e
  ctest --test-dir "build/$b" -j "$jobs" --output-on-failure -LE '^stress$' "$@" 2>&1 |
    tee "$logdir/$b-ctest.log"
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" -eq 0 ] || failed+=("$b")
  line="$(counts "$logdir/$b-ctest.log"); build $((t1 - t0))s, tests $((SECONDS - t1))s"
  summary+=("$(printf '%-6s %s' "$b" "$line")")
  echo "=== build/$b: $line"
done

# ---- fuzz: begin (tests/fuzz; separate from the three builds above) -------------
# A fourth build, build/fuzz, with clang: the libFuzzer targets fuzz_gma and
# fuzz_trace (gma-replay's trace reader) and a 30 s fuzzing run of each on a
# copy of its seed corpus (`ctest -L fuzz`: fuzz_corpus, fuzz_short,
# fuzz_trace_corpus and fuzz_trace_short, about two minutes in all plus the
# build). It runs only where
# clang can link -fsanitize=fuzzer, and only for a full run (no ctest
# arguments); GMA_TEST_FUZZ=0 skips it, GMA_TEST_FUZZ=1 runs it even with
# ctest arguments. The three builds above replay the corpus (fuzz_corpus) anyway.
fuzz_mode=${GMA_TEST_FUZZ:-auto}
fuzz_skip=""
if [ "$fuzz_mode" = 0 ]; then
  fuzz_skip="GMA_TEST_FUZZ=0"
elif [ "$fuzz_mode" = auto ] && [ $# -ne 0 ]; then
  fuzz_skip="ctest arguments were given (GMA_TEST_FUZZ=1 runs it anyway)"
elif ! command -v clang >/dev/null 2>&1; then
  fuzz_skip="no clang on PATH (libFuzzer needs clang)"
else
  fuzz_probe=$(mktemp -d)
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return d && n ? 0 : 0; }\n' >"$fuzz_probe/p.c"
  if ! clang -fsanitize=fuzzer,address,undefined "$fuzz_probe/p.c" -o "$fuzz_probe/p" >/dev/null 2>&1; then
    fuzz_skip="clang cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing)"
  fi
  rm -rf "$fuzz_probe"
fi
if [ -n "$fuzz_skip" ]; then
  echo "=== build/fuzz: short fuzz run skipped: $fuzz_skip"
  summary+=("fuzz   skipped: $fuzz_skip")
else
  echo "=== build/fuzz: CC=clang, libFuzzer targets fuzz_gma and fuzz_trace"
  if CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMA_DEBUG=2 \
       -DGMA_BUILD_BENCH=OFF >/dev/null &&
     cmake --build build/fuzz -j "$jobs" --target fuzz_gma fuzz_replay fuzz_trace \
       fuzz_trace_replay >/dev/null; then
    echo "=== build/fuzz: ctest -L fuzz"
    # The reproducers (fuzz_repro_*) run in the three builds above; this
    # build makes only the fuzzer and the corpus replay.
    t1=$SECONDS
    set +e
    ctest --test-dir build/fuzz --output-on-failure -L fuzz -E '^fuzz_repro_' 2>&1 |
      tee "$logdir/fuzz-ctest.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || failed+=("fuzz")
    summary+=("$(printf '%-6s %s; tests %ds' fuzz "$(counts "$logdir/fuzz-ctest.log")" $((SECONDS - t1)))")
  else
    failed+=("fuzz (build)")
  fi
fi
# ---- fuzz: end --------------------------------------------------------------------

echo
echo "=== summary ($((SECONDS - t_all))s in all; logs in $logdir)"
for line in "${summary[@]}"; do echo "  $line"; done
if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED builds: ${failed[*]}"
  exit 1
fi
echo "all test builds passed: $builds"
