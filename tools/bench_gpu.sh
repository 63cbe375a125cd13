#!/usr/bin/env bash
# gma's GPU benchmarks in one command: builds gma-bench-gpu in the Release
# tree tools/main.sh uses (build/release), runs it (gma against cuMemAlloc,
# cudaMallocAsync and CUB), then bench/gpu/torch_bench.py (PyTorch's caching
# allocator, and gma through PyTorch's plug-in interface when GMA_TORCH_PLUGIN
# names the library), then merges both into one table. Results (JSON and the
# table) go next to main.sh's, under build/release/.
#
# It installs nothing (run tools/bootstrap.sh first on a fresh machine; the
# CUDA Toolkit and PyTorch are optional). Without a GPU, or without the CUDA
# Toolkit, it says so and exits 0. Arguments go to gma-bench-gpu (e.g.
# --reps 5, --scenarios same_4KiB,training_loop); TORCH_BENCH_ARGS, if set,
# go to torch_bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
out=build/release
configure=$(cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Release -DGMA_BUILD_TESTS=OFF \
                  -DGMA_BUILD_BENCH=ON)
if grep -q 'gma-bench-gpu (GPU benchmarks) is not built' <<<"$configure"; then
  echo "bench_gpu: CMake found no CUDA Toolkit, so gma-bench-gpu is not built: no GPU benchmark"
  exit 0
fi
grep 'gma-bench-gpu' <<<"$configure" | sed 's/^-- /bench_gpu: /' || true
cmake --build "$out" -j "$jobs" --target gma-bench-gpu >/dev/null
bench="$out/bench/gma-bench-gpu"
if [ ! -x "$bench" ]; then
  echo "bench_gpu: $bench was not built (no CUDA Toolkit?): no GPU benchmark"
  exit 0
fi

gpu_json="$out/bench_gpu.json"
torch_json="$out/bench_gpu_torch.json"
table="$out/bench_gpu_table.txt"
rm -f "$gpu_json" "$torch_json" "$table"

python=$(command -v python3 || true)
rc=0
"$bench" --json "$gpu_json" "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
  echo "bench_gpu: gma-bench-gpu failed (exit $rc)"
  exit "$rc"
fi
echo
if [ -z "$python" ]; then
  echo "bench_gpu: no python3: PyTorch comparison and merged table skipped"
else
  "$python" bench/gpu/torch_bench.py --json "$torch_json" ${TORCH_BENCH_ARGS:-}
  echo
  "$python" bench/gpu/merge_table.py "$gpu_json" "$torch_json" | tee "$table"
fi
echo
if [ "$rc" -eq 77 ]; then
  # gma-bench-gpu said why above (no driver, no device, or gma without CUDA).
  echo "bench_gpu: no GPU available: nothing measured (the skip is recorded in $gpu_json)"
  exit 0
fi
echo "benchmark results: $gpu_json, $torch_json; merged table: $table"
