#!/usr/bin/env bash
# gma's main job: build a Release gma, then run the demo workload and the
# benchmarks on the simulated device (host memory and host-thread streams),
# which runs on any machine, then the GPU benchmarks (tools/bench_gpu.sh),
# which say so and skip when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DGMA_BUILD_TESTS=OFF >/dev/null
cmake --build build/release -j "$jobs" >/dev/null
echo "gma $(sed -n 's/#define GMA_VERSION_STRING "\(.*\)"/\1/p' include/gma/version.h): demo and benchmarks on the SIMULATED device (no GPU needed); GPU benchmarks follow when a GPU is present"
echo
./build/release/gma-demo
echo
./build/release/bench/gma-bench-alloc --json build/release/bench_alloc.json
echo
./build/release/bench/gma-bench-hotpath --json build/release/bench_hotpath.json
echo
./build/release/bench/gma-bench-worker --json build/release/bench_worker.json
echo
echo "simulated-device results (JSON): build/release/bench_alloc.json, build/release/bench_hotpath.json, build/release/bench_worker.json"
echo
echo "=== GPU benchmarks (tools/bench_gpu.sh)"
bash tools/bench_gpu.sh
