#!/usr/bin/env bash
# gma's main job: build a Release gma, replay real workloads and a synthetic
# one on it, and show what gma does with them, in numbers and pictures.
#
#  1. takes the sixteen real workloads shipped in traces/ (PyTorch memory
#     snapshots already converted to gma's trace CSV, gzip-compressed;
#     traces/README.md) and decompresses them into build/release/traces/,
#     and imports the PyTorch snapshots (*.pickle) in $GMA_TRACES_DIR, if set,
#     with tools/gma-import-torch (tools/traces.sh does both);
#  2. replays them, and the synthetic 1F1B pipeline workload, with
#     tools/gma-replay under two configurations side by side (the default,
#     growable segments, and ordinary ones) on the SIMULATED device (no GPU needed), next to the
#     reserved memory PyTorch recorded for the same workload, with failed
#     allocations counted and PyTorch's own failed requests (oom rows)
#     attempted; and, per trace and configuration, the smallest simulated
#     device capacity it replays in with no failed allocation (--min-capacity:
#     a bisection to 0.05%, about fifteen fast replays each), next to PyTorch's
#     peak reserved and the trace's peak live bytes; and the smallest device
#     a model of PyTorch's own policy needs for each (tools/torch-policy-model);
#  3. draws memory over time and the segment map at the peak with
#     tools/gma-viz (PNG, SVG and HTML under build/release/pictures/; the PNG
#     needs rsvg-convert, which tools/bootstrap.sh installs);
#  4. runs the demo and the benchmarks (simulated device; gma-bench-scenarios:
#     a training loop, a pipeline, a service and varying sequence lengths;
#     gma-bench-costs: the GPU benchmark's scenarios with a GPU's call costs),
#     then the GPU benchmarks, which say so and skip when there is no GPU;
#  5. ends with a summary (tools/main_summary.py): gma against PyTorch on the
#     traces' memory (this run's figures: peak reserved, and the capacity
#     table of every trace: peak live, PyTorch's peak reserved, its policy's
#     smallest device, gma's under both configurations and their ratio to
#     the peak live bytes), the benchmarks' goals met or
#     missed, and gma against cudaMallocAsync, CUB and PyTorch on a GPU from
#     docs/gpu/RESULTS.md (that run's date and commit, read from the file).
#
# Output: one stream. stderr is joined to stdout (exec 2>&1) and the programs
# write stdout a line at a time (stdbuf -oL, PYTHONUNBUFFERED), so lines
# never interleave when the output goes to a file; progress bars appear only
# on a terminal. Each table is followed by a legend of its columns.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 2>&1
export PYTHONUNBUFFERED=1
lb=()
if command -v stdbuf >/dev/null 2>&1; then lb=(stdbuf -oL -eL); fi
bash tools/bootstrap.sh
jobs=$(nproc 2>/dev/null || echo 2)
out=build/release
start=$SECONDS
echo "=== building gma (Release, $out, -j$jobs); progress by target, full log in $out/build.log"
mkdir -p "$out"
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Release -DGMA_BUILD_TESTS=OFF >"$out/configure.log" 2>&1 ||
  { tail -n 30 "$out/configure.log"; echo "configure failed (log: $out/configure.log)"; exit 1; }
# A line per finished target as it comes (and every error line); the whole
# output goes to build.log. With pipefail a failed build fails the pipeline.
build_progress() {
  local line n=0 t0=$SECONDS last=0 pct
  : >"$out/build.log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$out/build.log"
    pct=${line#\[}; pct=${pct%%%]*}; pct=${pct// /}
    if [[ $line == \[*%\]* && $pct =~ ^[0-9]+$ ]] && ((pct >= last + 10)); then
      last=$pct
      printf '  [%3ds] %d%% compiled\n' $((SECONDS - t0)) "$pct"
    fi
    case "$line" in
      *"Built target "*) n=$((n + 1)); printf '  [%3ds] built %s (%d targets)\n' $((SECONDS - t0)) "${line##*Built target }" "$n" ;;
      *error:* | *"Error "[0-9]*) printf '  %s\n' "$line" ;;
    esac
  done
}
if ! cmake --build "$out" -j "$jobs" 2>&1 | build_progress; then
  echo "build failed: the last lines of $out/build.log:"
  tail -n 30 "$out/build.log"
  exit 1
fi
echo "built in $((SECONDS - start)) s"
echo
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
echo "=== replaying on the simulated device: the default (growable segments) and ordinary segments;"
echo "    the smallest capacity each replays in (bisection, --min-capacity)"
${lb[@]+"${lb[@]}"} "$out/gma-replay" --config default= --config ordinary=expandable_segments:false \
  --recorded-label PyTorch --min-capacity --precision 0.05 \
  --json "$out/replay.json" --timeline-dir "$out/replay" --snapshot-dir "$out/replay" \
  --workload pipeline ${inputs[@]+"${inputs[@]}"}
rm -f "$out/torch_policy.json"
if [ ${#inputs[@]} -gt 0 ]; then
  echo
  echo "=== PyTorch's policy on the same traces: the smallest device a model of PyTorch's"
  echo "    caching allocator (expandable_segments off) needs, from gma-replay's start (tools/torch-policy-model)"
  ${lb[@]+"${lb[@]}"} python3 tools/torch-policy-model --precision 0.05 --json "$out/torch_policy.json" "${inputs[@]}"
fi

cat <<'LEGEND'

Legend of the replay tables (docs/tools.md#gma-replay, docs/stats.md):
  default / ordinary     gma's configurations: growable segments (the default) / ordinary
                         segments (expandable_segments:false); PyTorch: what PyTorch's allocator
                         recorded for the same workload (imported from its snapshot)
  trace peak live        the most bytes the program held at once (the floor for any allocator)
  peak requested         the most bytes asked for at once; allocated (blocks): after gma's
                         rounding to block sizes
  peak reserved          the most device memory the allocator held (segments)
  reserved / allocated   res/all: peak reserved over peak allocated; 1.000x wastes nothing
  reserved / recorded    res/rec: gma's peak reserved over PyTorch's; below 1 gma needed less
  fragmentation at peak  frag: share of the cached (reserved, unused) bytes in free regions
                         smaller than the median live block, at the peak (docs/stats.md)
  device allocs / frees  calls to the device's allocator (cuMemAlloc/map and free/unmap)
  hits bin/stream/pool/dev  where allocations were served: the lock-free per-stream bins,
                         the stream's own cache, the shared pool, or a new device allocation
  alloc/free ns p50/p99/p99.9  latency percentiles of gma_alloc / gma_free on this CPU
  failed / oom r/g       allocations that failed in the replay (the trace served them);
                         requests PyTorch itself failed (oom rows) / of those, failed by gma
  unmatched frees        frees of pointers the trace never allocated (ignored)
  Mev/s, replay rate     trace events replayed per second
  min cap / min capacity the smallest simulated device the trace replays in with no failed
                         allocation (bisection); / rec: over PyTorch's peak reserved,
                         / live: over the trace's peak live bytes (1.000x is the floor)
  replays, time          replays the bisection ran, and their wall time
  torch-policy-model     peak live; peak reserved of the model on a roomy device; min capacity:
                         the smallest device the model fits in (docs/tools.md#torch-policy-model)
LEGEND

echo
echo "=== pictures"
for tl in "$out"/replay/*.default.timeline.csv; do
  name=$(basename "$tl" .default.timeline.csv)
  # Exit status 3: no PNG (gma-viz said why), the SVG and HTML were written.
  rc=0
  python3 tools/gma-viz --title "$name" --recorded-label PyTorch \
    --timeline default="$tl" --timeline ordinary="$out/replay/$name.ordinary.timeline.csv" \
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
${lb[@]+"${lb[@]}"} "$out/gma-demo"
echo
${lb[@]+"${lb[@]}"} "$out/bench/gma-bench-alloc" --json "$out/bench_alloc.json"
echo
${lb[@]+"${lb[@]}"} "$out/bench/gma-bench-hotpath" --json "$out/bench_hotpath.json"
echo
${lb[@]+"${lb[@]}"} "$out/bench/gma-bench-worker" --json "$out/bench_worker.json"
echo
# Five scenarios (training loop, pipeline, service, varying length, cross-stream
# hand-off), medians of 5 runs, about 3 min; exits 3 if a simulated kernel
# found a buffer overwritten while in use.
${lb[@]+"${lb[@]}"} "$out/bench/gma-bench-scenarios" --json "$out/bench_scenarios.json"
echo
# The GPU benchmark's ten scenarios with the h100 cost preset, against one
# device allocation per request and a model of cudaMallocAsync's pool
# (docs/gpu/cost-model.md), about 2 min.
${lb[@]+"${lb[@]}"} "$out/bench/gma-bench-costs" --json "$out/bench_costs.json"
cat <<'LEGEND'

Legend of the benchmark tables (docs/benchmarks.md):
  ns, p50/p99            time per call or per alloc+free pair: median / 99th percentile
  ratio, Nx              one figure over another, as the row says; goals are in brackets or
                         "(goal ...)" and are marked MET or MISSED in the summary below
  dev allocs 1st / after device allocations in the first iteration / in all later ones
                         (goal 0 after the first: a warm cache serves every request)
  bin hits               share of allocations served by the lock-free per-stream bins
  peak reserved / MiB    the most device memory held
  floor without waits    the least any allocator can reserve in the training loop's first
                         iteration if it never waits for device work (neither on the host nor
                         by making a stream wait for another's), computed from the requests;
                         / peak active: that floor over what gma had in use at its peak
  failed                 allocations that got no memory
LEGEND
echo
echo "results (JSON): $out/replay.json (replays and smallest capacities), $out/torch_policy.json," \
     "$out/bench_alloc.json, $out/bench_hotpath.json," \
     "$out/bench_worker.json, $out/bench_scenarios.json, $out/bench_costs.json;" \
     "pictures: $out/pictures/"
echo
echo "=== GPU benchmarks (tools/bench_gpu.sh)"
bash tools/bench_gpu.sh
echo
echo "=== summary: gma against PyTorch and the GPU allocators"
python3 tools/main_summary.py --replay "$out/replay.json" --policy-model "$out/torch_policy.json" --hotpath "$out/bench_hotpath.json" \
  --worker "$out/bench_worker.json" --costs "$out/bench_costs.json" --gpu-results docs/gpu/RESULTS.md
echo
echo "main.sh took $((SECONDS - start)) s"
