#!/usr/bin/env bash
# gma's main job: build a Release gma, replay real workloads and a synthetic
# one on it, and show what gma does with them, in numbers and pictures.
#
#  1. takes the five real workloads shipped in traces/ (PyTorch memory
#     snapshots already converted to gma's trace CSV, gzip-compressed;
#     traces/README.md) and decompresses them into build/release/traces/,
#     and imports the PyTorch snapshots (*.pickle) in $GMA_TRACES_DIR, if set,
#     with tools/gma-import-torch (tools/traces.sh does both);
#  2. replays them, and the synthetic 1F1B pipeline workload, with
#     tools/gma-replay under two configurations side by side (default and
#     growable segments) on the SIMULATED device (no GPU needed), next to the
#     reserved memory PyTorch recorded for the same workload, with failed
#     allocations counted and PyTorch's own failed requests (oom rows)
#     attempted; and, per trace and configuration, the smallest simulated
#     device capacity it replays in with no failed allocation (--min-capacity:
#     a bisection to 0.05%, about fifteen fast replays each), next to PyTorch's
#     peak reserved and the trace's peak live bytes;
#  3. draws memory over time and the segment map at the peak with
#     tools/gma-viz (PNG, SVG and HTML under build/release/pictures/; the PNG
#     needs rsvg-convert, which tools/bootstrap.sh installs);
#  4. runs the demo and the benchmarks (simulated device; gma-bench-scenarios:
#     a training loop, a pipeline, a service and varying sequence lengths), then the GPU
#     benchmarks, which say so and skip when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
jobs=$(nproc 2>/dev/null || echo 2)
out=build/release
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Release -DGMA_BUILD_TESTS=OFF >/dev/null
cmake --build "$out" -j "$jobs" >/dev/null
echo "gma $(sed -n 's/#define GMA_VERSION_STRING "\(.*\)"/\1/p' include/gma/version.h): replays and" \
     "benchmarks on the SIMULATED device (no GPU needed); GPU benchmarks follow when a GPU is present"

mkdir -p "$out/traces" "$out/replay" "$out/pictures"
echo
# The shipped workloads, plus GMA_TRACES_DIR's snapshots: one CSV path a line.
bash tools/traces.sh "$out/traces" 2>&1 >"$out/traces/list.txt"   # its messages on our stdout
inputs=()
while IFS= read -r f; do
  [ -n "$f" ] && inputs+=("$f")
done <"$out/traces/list.txt"
if [ ${#inputs[@]} -eq 0 ]; then
  echo "no traces found (traces/*.csv.gz is missing): replaying the synthetic workload only"
fi

echo
echo "=== replaying on the simulated device: default segments and growable segments;"
echo "    the smallest capacity each replays in (bisection, --min-capacity)"
"$out/gma-replay" --config default= --config expandable=expandable_segments:true \
  --recorded-label PyTorch --min-capacity --precision 0.05 \
  --json "$out/replay.json" --timeline-dir "$out/replay" --snapshot-dir "$out/replay" \
  --workload pipeline "${inputs[@]}"

echo
echo "=== pictures"
for tl in "$out"/replay/*.default.timeline.csv; do
  name=$(basename "$tl" .default.timeline.csv)
  # Exit status 3: no PNG (gma-viz said why), the SVG and HTML were written.
  rc=0
  tools/gma-viz --title "$name" --recorded-label PyTorch \
    --timeline default="$tl" --timeline expandable="$out/replay/$name.expandable.timeline.csv" \
    --snapshot "$out/replay/$name.default.peak.json" --snapshot-label default \
    --svg "$out/pictures/$name.svg" --html "$out/pictures/$name.html" \
    --png "$out/pictures/$name.png" || rc=$?
  case $rc in
    0) echo "  $out/pictures/$name.png (and .svg, .html)" ;;
    3) echo "  $out/pictures/$name.svg (and .html; no PNG, see above)" ;;
    *) exit "$rc" ;;
  esac
done

echo
echo "=== demo"
"$out/gma-demo"
echo
"$out/bench/gma-bench-alloc" --json "$out/bench_alloc.json"
echo
"$out/bench/gma-bench-hotpath" --json "$out/bench_hotpath.json"
echo
"$out/bench/gma-bench-worker" --json "$out/bench_worker.json"
echo
# Five scenarios (training loop, pipeline, service, varying length, cross-stream
# hand-off), medians of 5 runs, about 3 min; exits 3 if a simulated kernel
# found a buffer overwritten while in use.
"$out/bench/gma-bench-scenarios" --json "$out/bench_scenarios.json"
echo
echo "results (JSON): $out/replay.json (replays and smallest capacities), $out/bench_alloc.json, $out/bench_hotpath.json," \
     "$out/bench_worker.json, $out/bench_scenarios.json; pictures: $out/pictures/"
echo
echo "=== GPU benchmarks (tools/bench_gpu.sh)"
bash tools/bench_gpu.sh
