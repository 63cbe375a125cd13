#!/usr/bin/env bash
# Line coverage of gma's runtime/ reached by fuzzer inputs.
#
#   tests/fuzz/coverage.sh DIR|FILE...
#
# Builds fuzz_replay with clang source-based coverage in build/fuzz-cov
# (Release-like, GMA_DEBUG=2 so the invariant checks run as in the fuzzer),
# replays the inputs given (for example a long run's corpus, or
# tests/fuzz/corpus tests/fuzz/regressions) and prints llvm-cov's per-file
# line coverage of runtime/ with the total on the last line. Needs clang,
# llvm-profdata and llvm-cov (Debian's clang package brings them).
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: $0 DIR|FILE... (fuzzer inputs to replay)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build/fuzz-cov
for tool in clang llvm-profdata llvm-cov; do
  command -v $tool >/dev/null || { echo "$0: $tool not found (apt-get install clang llvm)" >&2; exit 2; }
done
flags="-fprofile-instr-generate -fcoverage-mapping"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMA_DEBUG=2 \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$build" --target fuzz_replay -j"$(nproc)" >/dev/null
rm -f "$build"/cov-*.profraw
echo "replaying $* ..." >&2
LLVM_PROFILE_FILE="$build/cov-%p.profraw" "$build/tests/fuzz_replay" "$@" >/dev/null
llvm-profdata merge -sparse "$build"/cov-*.profraw -o "$build/cov.profdata"
# device/cuda.c is left out: the fuzzer runs on the simulated device only.
llvm-cov report "$build/tests/fuzz_replay" -instr-profile="$build/cov.profdata" \
  -ignore-filename-regex='device/cuda\.c$' "$root/runtime" | awk '
    BEGIN { printf "%-22s %8s %8s %8s\n", "runtime/ file", "lines", "missed", "covered" }
    $1 ~ /\.[ch]$/ && $8 > 0 { printf "%-22s %8d %8d %8s\n", $1, $8, $9, $10 }
    $1 == "TOTAL" { printf "%-22s %8d %8d %8s\n", "total", $8, $9, $10 }'
