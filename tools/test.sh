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

for b in $builds; do
  case "$b" in
    debug) opts=(-DCMAKE_BUILD_TYPE=Debug) ;;
    asan)  opts=(-DCMAKE_BUILD_TYPE=Debug -DGMA_SANITIZE=address) ;;
    tsan)  opts=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMA_DEBUG=1 -DGMA_SANITIZE=thread) ;;
    *) echo "unknown build '$b' (debug, asan, tsan)"; exit 2 ;;
  esac
  echo "=== build/$b: ${opts[*]}"
  cmake -S . -B "build/$b" -DGMA_BUILD_BENCH=OFF "${opts[@]}" >/dev/null
  cmake --build "build/$b" -j "$jobs" >/dev/null
  echo "=== build/$b: tests"
  if ! ctest --test-dir "build/$b" -j "$jobs" --output-on-failure -LE '^stress$' "$@"; then
    failed+=("$b")
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED builds: ${failed[*]}"
  exit 1
fi
echo "all test builds passed: $builds"
