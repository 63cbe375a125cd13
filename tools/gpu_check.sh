#!/usr/bin/env bash
# Everything gma has to check on a GPU machine, in one command that fits a
# 15-minute GPU loan with room for a rerun: one build, then steps under one
# deadline (GPU_CHECK_BUDGET, 360 s, build included).
#
#  0. looks for a GPU: the CUDA driver (libcuda.so.1, or $GMA_CUDA_DRIVER as gma
#     itself would load it) must load, cuInit and see a device; nvidia-smi -L
#     names it. Without one it prints "gpu_check: no GPU (why): nothing to
#     check" and exits 0, having built and written nothing;
#  1. build: one Release tree with the tests and benchmarks (build/gpu), the
#     kernels for GPU_CHECK_ARCH only (sm_90). Without cmake or
#     concurrencykit, only the driver probe is built (with cc) and the steps
#     that need gma say they were skipped and why;
#  2. probe: gma-driver-probe, the cost of each driver call gma uses and
#     which calls wait for the device (the cost model's calibration);
#  3. ctest -L gpu: gma's CUDA backend on the real driver (a test Skipped on
#     a machine with a GPU counts as a failure), held-stream test included;
#  4. bench: gma-bench-gpu (gma, growable, gma with the peers' cross-stream
#     wait, against cuMemAlloc, cudaMallocAsync and CUB; gma's statistics
#     deltas per side in the JSON), then bench/gpu/torch_bench.py when torch
#     is there, merged into one table;
#  5. torch_train: bench/gpu/torch_train.py, PyTorch's allocator against gma
#     through the plug-in (losses, steps/s, peak memory, an OOM);
#  6. writes RESULTS.md: date, GPU, versions, commit, each step's status and
#     time, the probe's table, the tests, the benchmark and training tables,
#     and what was skipped and why.
#
# Output: GPU_CHECK_OUT (default build/gpu/out) gets RESULTS.md, the JSON of
# each step and logs.tgz (every log); RESULTS.md is also copied to
# GPU_CHECK_RESULTS (docs/gpu/RESULTS.md). Exit status: 0 when every step ran
# or was skipped for a stated reason; 1 when one failed or ran out of time.
# It installs nothing. Environment: NVIDIA_SMI, GMA_CUDA_DRIVER,
# GPU_CHECK_BUILD_DIR, GPU_CHECK_OUT, GPU_CHECK_RESULTS, GPU_CHECK_ARCH,
# GPU_CHECK_BUDGET, GPU_CHECK_FAKE. Arguments go to gma-bench-gpu.
#
# GPU_CHECK_FAKE=1 runs every step against the fake CUDA driver (tests/
# fakecuda, the simulated device behind the driver API, with the h100 cost
# preset) instead of a GPU, as CI does: the build makes only the library,
# the fake, the probe and the GPU tests (no nvcc), the probe and the tests
# run on the fake, and the steps that need a real GPU (the CUDA runtime's
# kernels, PyTorch) are recorded as skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

budget_s=${GPU_CHECK_BUDGET:-360}
build=${GPU_CHECK_BUILD_DIR:-build/gpu}
out=${GPU_CHECK_OUT:-$build/out}
results=${GPU_CHECK_RESULTS:-docs/gpu/RESULTS.md}
arch=${GPU_CHECK_ARCH:-sm_90}
smi=${NVIDIA_SMI:-nvidia-smi}
driver=${GMA_CUDA_DRIVER:-libcuda.so.1}
python=$(command -v python3 || true)
fake=${GPU_CHECK_FAKE:-0}
if [ "$fake" = 1 ]; then
  driver="fake CUDA driver (built in step 1)"
  gpu_only="GPU-only step, skipped on the fake driver"
fi

# ---- 0. is there a GPU? -------------------------------------------------------------------
# The driver decides, as it does for gma; nvidia-smi only names what it sees.
# The fake driver is there by construction: it is built in step 1.
if [ "$fake" = 1 ]; then
  drv_gpus=1
else
smi_gpus=0
smi_why=""
if ! command -v "$smi" >/dev/null 2>&1; then
  smi_why="$smi not found"
elif ! smi_list=$(timeout 60 "$smi" -L 2>&1); then
  smi_why="$smi -L failed: $(head -n 1 <<<"$smi_list")"
else
  smi_gpus=$(grep -c '^GPU [0-9]' <<<"$smi_list" || true)
  [ "$smi_gpus" -gt 0 ] || smi_why="$smi -L lists no GPU"
fi

drv_gpus=0
drv_why=""
if [ -z "$python" ]; then
  drv_why="no python3 to probe $driver with"
else
  # cuInit and cuDeviceGetCount through ctypes: what gma's CUDA backend does first.
  probe=$(timeout 60 "$python" - "$driver" 2>&1 <<'EOF'
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as e:
    print("%s does not load (%s)" % (sys.argv[1], e)); sys.exit(1)
rc = lib.cuInit(0)
if rc:
    print("%s: cuInit failed (CUresult %d)" % (sys.argv[1], rc)); sys.exit(1)
n = ctypes.c_int(0)
rc = lib.cuDeviceGetCount(ctypes.byref(n))
if rc:
    print("%s: cuDeviceGetCount failed (CUresult %d)" % (sys.argv[1], rc)); sys.exit(1)
print(n.value)
EOF
  ) || true
  if [[ "$probe" =~ ^[0-9]+$ ]]; then
    drv_gpus=$probe
    [ "$drv_gpus" -gt 0 ] || drv_why="the CUDA driver sees no device"
  else
    drv_why=$(tail -n 1 <<<"${probe:-$driver: probe gave no answer}")
  fi
fi

if [ "$drv_gpus" -eq 0 ] && { [ -n "$python" ] || [ "$smi_gpus" -eq 0 ]; }; then
  if [ "$smi_gpus" -gt 0 ]; then
    # nvidia-smi sees a GPU that the driver API cannot use: a broken setup, not "no GPU".
    echo "gpu_check: $smi lists $smi_gpus GPU(s), but the CUDA driver is not usable ($drv_why):" \
         "gma could not use the GPU"
    exit 1
  fi
  echo "gpu_check: no GPU ($smi_why; $drv_why): nothing to check"
  exit 0
fi
fi

# ---- steps ----------------------------------------------------------------------------------
start_all=$SECONDS
mkdir -p "$out" "$build/logs"
out=$(cd "$out" && pwd)
logs=$build/logs
names=() states=() secs=() notes=()
failed=0
record() { # name state seconds note
  names+=("$1"); states+=("$2"); secs+=("$3"); notes+=("$4")
  [ "$2" != failed ] || failed=1
  echo "gpu_check: [$1] $2 in ${3}s${4:+: $4}"
}
# limit_for WANT: seconds a step may take, WANT or what is left of the budget.
limit_for() {
  local left=$((budget_s - (SECONDS - start_all)))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
begin() { step_start=$SECONDS; step_limit=$(limit_for "$3"); echo; echo "gpu_check: [$1] $2 (limit ${step_limit}s)"; }
no_time() { [ "$step_limit" -lt 10 ]; }
# run_logged LOG CMD...: runs CMD under the step's limit, output to the
# terminal and LOG; sets rc (124: ran out of time).
run_logged() {
  local log=$1
  shift
  set +e
  timeout --kill-after=10 "$step_limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
}
# run_quiet LOG CMD...: the same, output to LOG only; its last lines on failure.
run_quiet() {
  local log=$1
  shift
  rc=0
  timeout --kill-after=10 "$step_limit" "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || tail -n 40 "$log"
}
why_rc() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ] && echo "ran out of time" || echo "exit $1"; }

if [ "$fake" = 1 ]; then
  gpu_info="0, gma fake CUDA device (simulated, sim_costs h100), -, 8192 MiB"
  cuda_driver_version="fake"
else
gpu_info=$(timeout 60 "$smi" --query-gpu=index,name,driver_version,memory.total \
           --format=csv,noheader 2>/dev/null || echo "($smi --query-gpu failed)")
cuda_driver_version=$(timeout 60 "$smi" 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1 || true)
fi
echo "gpu_check: $drv_gpus GPU(s) through $driver:"
while IFS= read -r line; do echo "  $line"; done <<<"$gpu_info"

# 1. build
begin build "one Release tree with tests and benchmarks in $build, kernels for $arch" 180
toolkit=""
built=0
probe_bin=$build/bench/gma-driver-probe
cuda_inc=""
for d in ${CUDA_HOME:-} /usr/local/cuda /usr; do
  [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && { cuda_inc=$d/include; break; }
done
ck_why=""
if ! command -v cmake >/dev/null 2>&1; then
  ck_why="no cmake"
elif ! { [ -f /usr/include/ck_ring.h ] || pkg-config --exists ck 2>/dev/null; }; then
  ck_why="no concurrencykit (tools/pack_ck.sh packs it for a machine without it)"
fi
if [ -n "$ck_why" ]; then
  mkdir -p "$build/bench"
  if [ -n "$cuda_inc" ] && cc -O2 -std=gnu11 -I"$cuda_inc" bench/gpu/driver_probe.c -o "$probe_bin" \
       -ldl -lpthread >"$logs/build.log" 2>&1; then
    record build skipped $((SECONDS - step_start)) "$ck_why: only gma-driver-probe was built (cc)"
  else
    record build failed $((SECONDS - step_start)) "$ck_why, and the driver probe did not build (cuda.h: ${cuda_inc:-not found})"
  fi
else
  run_quiet "$logs/configure.log" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DGMA_BUILD_TESTS=ON -DGMA_BUILD_BENCH=ON -DGMA_BENCH_GPU_ARCH="$arch" \
    ${python:+"-DGMA_TORCH_PYTHON=$python"}
  if [ "$rc" -ne 0 ]; then
    record build failed $((SECONDS - step_start)) "cmake configure: $(why_rc "$rc") (log: $logs/configure.log)"
  elif grep -q 'gma: no CUDA Toolkit found' "$logs/configure.log"; then
    record build failed $((SECONDS - step_start)) \
      "CMake found no CUDA Toolkit, so libgma has no CUDA backend and nothing of gma's can run on the GPU (install the toolkit's headers)"
  else
    toolkit=$(sed -n 's/.*gma: CUDA Toolkit \([^ ]*\) headers.*/\1/p' "$logs/configure.log" | head -n 1)
    step_limit=$(limit_for $((180 - (SECONDS - step_start))))
    targets=()
    [ "$fake" = 1 ] && targets=(--target gma gma_fakecuda gma-driver-probe gpu_api gpu_stress
                                gpu_pipeline gpu_capture gpu_held)
    run_quiet "$logs/build.log" cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" "${targets[@]}"
    if [ "$rc" -ne 0 ]; then
      record build failed $((SECONDS - step_start)) "cmake --build: $(why_rc "$rc") (log: $logs/build.log)"
    else
      built=1
      if [ "$fake" = 1 ]; then
        driver=$(cd "$build" && pwd)/tests/libgma_fakecuda.so
        export GMA_CUDA_DRIVER=$driver GMA_FAKECUDA_DEVICES=1 GMA_FAKECUDA_MEM=8G \
               GMA_FAKECUDA_GRANULARITY=2M GMA_FAKECUDA_COSTS=h100
      fi
      shim_note=$(sed -n 's/.*gma: \(libgma_torch_shim.so [^:]*\).*/\1/p' "$logs/configure.log" | head -n 1)
      record build ok $((SECONDS - step_start)) "CUDA Toolkit $toolkit headers, kernels $arch; ${shim_note:-libgma_torch_shim.so: not reported}"
    fi
  fi
fi
plugin=$(cd "$build" 2>/dev/null && pwd)/libgma_torch.so

# 2. the driver probe
probe_table=""
if [ "$fake" = 1 ] && [ "$built" -eq 0 ]; then
  record probe skipped 0 "not run: the fake driver was not built"
elif [ ! -x "$probe_bin" ]; then
  record probe failed 0 "not run: gma-driver-probe was not built"
else
  begin probe "gma-driver-probe: driver call costs, which calls wait for the device" 90
  run_logged "$logs/probe.log" "$probe_bin" --json "$out/driver_probe.json" --limit $((step_limit > 15 ? step_limit - 5 : 10))
  probe_table=$(grep -vE '^gma-driver-probe: stopped' "$logs/probe.log" || true)
  if [ "$rc" -eq 0 ]; then
    record probe ok $((SECONDS - step_start)) "$(tail -n 1 "$logs/probe.log")"
  elif [ "$rc" -eq 77 ]; then
    record probe skipped $((SECONDS - step_start)) "$(grep -m 1 'no GPU' "$logs/probe.log" || echo "no GPU")"
  else
    record probe failed $((SECONDS - step_start)) "$(why_rc "$rc") (log: $logs/probe.log)"
  fi
fi

# 3. ctest -L gpu
ctest_summary="not run"
ctest_lines=""
held_lines=""
if [ "$built" -eq 0 ]; then
  record "ctest -L gpu" skipped 0 "not run: gma was not built${ck_why:+ ($ck_why)}"
else
  if [ "$fake" = 1 ]; then
    # The same tests, registered as fakecuda_* with the fake's environment.
    begin "ctest -L gpu" "gma's CUDA backend on the fake driver" 90
    run_logged "$logs/ctest.log" ctest --test-dir "$build" -R '^fakecuda_(api|stress|pipeline|capture|held)$' \
      --output-on-failure -V --timeout 80
  else
    begin "ctest -L gpu" "gma's CUDA backend on the real driver" 90
    run_logged "$logs/ctest.log" ctest --test-dir "$build" -L gpu --output-on-failure -V --timeout 80
  fi
  total=$(sed -n -e 's/.* tests* failed out of \([0-9]*\).*/\1/p' \
                 -e 's/.*% tests passed out of \([0-9]*\).*/\1/p' "$logs/ctest.log" | tail -n 1)
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$logs/ctest.log" || true)
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$logs/ctest.log" || true)
  ctest_lines=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$logs/ctest.log" || true)
  held_lines=$(grep -oE 'held \(.*' "$logs/ctest.log" || true)
  if [ -z "$total" ] || [ "$total" -eq 0 ]; then
    ctest_summary="no test ran ($(why_rc "$rc"))"
    record "ctest -L gpu" failed $((SECONDS - step_start)) "$ctest_summary (log: $logs/ctest.log)"
  else
    nfailed=$((total - passed - skipped))
    ctest_summary="$total tests: $passed passed, $nfailed failed, $skipped skipped"
    if [ "$rc" -ne 0 ] || [ "$nfailed" -ne 0 ]; then
      record "ctest -L gpu" failed $((SECONDS - step_start)) "$ctest_summary ($(why_rc "$rc"))"
    elif [ "$skipped" -ne 0 ]; then
      record "ctest -L gpu" failed $((SECONDS - step_start)) \
        "$ctest_summary: a GPU test skipped on a machine with a GPU means gma could not use it"
    else
      record "ctest -L gpu" ok $((SECONDS - step_start)) "$ctest_summary"
    fi
  fi
fi

# 4. gma-bench-gpu, torch_bench.py, the merged table
bench_table=$out/bench_gpu_table.txt
torch_bench_note=""
rm -f "$bench_table"
if [ "$fake" = 1 ]; then
  record bench skipped 0 "$gpu_only: gma-bench-gpu's kernels need the CUDA runtime on a GPU (gma-bench-costs runs these scenarios on the simulated device)"
  record torch_bench skipped 0 "$gpu_only: PyTorch needs a GPU"
elif [ "$built" -eq 0 ] || [ ! -x "$build/bench/gma-bench-gpu" ]; then
  record bench skipped 0 "not run: gma-bench-gpu was not built${ck_why:+ ($ck_why)}"
else
  begin bench "gma-bench-gpu" 150
  run_logged "$logs/bench_gpu.log" "$build/bench/gma-bench-gpu" --json "$out/bench_gpu.json" "$@"
  if [ "$rc" -eq 77 ]; then
    record bench skipped $((SECONDS - step_start)) "$(grep -m 1 -iE 'no (GPU|CUDA)|skip' "$logs/bench_gpu.log" || echo "gma-bench-gpu found no GPU")"
  elif [ "$rc" -ne 0 ]; then
    record bench failed $((SECONDS - step_start)) "$(why_rc "$rc") (log: $logs/bench_gpu.log)"
  else
    record bench ok $((SECONDS - step_start)) "gma, gma-growable, gma-wait, direct, cudaMallocAsync, CUB"
  fi
  torch_json=""
  if [ -n "$python" ]; then
    begin torch_bench "bench/gpu/torch_bench.py: PyTorch's allocator, and gma through the plug-in" 60
    if no_time; then
      torch_bench_note="no time left in the budget"
      record torch_bench skipped 0 "$torch_bench_note"
    else
      run_logged "$logs/torch_bench.log" env GMA_TORCH_PLUGIN="$plugin" "$python" bench/gpu/torch_bench.py \
        --json "$out/bench_gpu_torch.json" --reps 10 --timeout $((step_limit / 3 + 1))
      torch_bench_note=$(grep -m 1 '^torch_bench: skipped: ' "$logs/torch_bench.log" || true)
      if [ "$rc" -ne 0 ]; then
        record torch_bench failed $((SECONDS - step_start)) "$(why_rc "$rc") (log: $logs/torch_bench.log)"
      elif [ -n "$torch_bench_note" ]; then
        record torch_bench skipped $((SECONDS - step_start)) "${torch_bench_note#torch_bench: skipped: }"
      else
        record torch_bench ok $((SECONDS - step_start)) "PyTorch's allocator, expandable, gma through the plug-in"
        torch_json=$out/bench_gpu_torch.json
      fi
    fi
    if [ -s "$out/bench_gpu.json" ]; then
      "$python" bench/gpu/merge_table.py "$out/bench_gpu.json" $torch_json >"$bench_table" 2>>"$logs/bench_gpu.log" || true
    fi
  fi
fi

# 5. the training loop, PyTorch's allocator against gma through the plug-in
train_md=$out/torch_train.md
train_json=$out/torch_train.json
rm -f "$train_md" "$train_json"
torch_why=""
if [ -z "$python" ]; then
  torch_why="no python3"
elif ! torch_why=$(timeout 60 "$python" -c '
import sys
try:
    import torch
except Exception as e:
    print("PyTorch is not installed (import torch: %s)" % e); sys.exit(1)
if not torch.cuda.is_available():
    print("torch %s sees no CUDA device" % torch.__version__); sys.exit(1)
print(torch.__version__)' 2>&1); then
  torch_why=$(tail -n 1 <<<"$torch_why")
else
  torch_version=$torch_why
  torch_why=""
fi
if [ "$fake" = 1 ]; then
  record torch_train skipped 0 "$gpu_only: PyTorch needs a GPU"
elif [ -n "$torch_why" ]; then
  record torch_train skipped 0 "no torch: $torch_why"
elif [ "$built" -eq 0 ]; then
  record torch_train skipped 0 "not run: gma was not built (no plug-in)"
else
  begin torch_train "bench/gpu/torch_train.py: torch $torch_version, native allocator and gma" 75
  if no_time; then
    record torch_train skipped 0 "no time left in the budget"
  else
    run_logged "$logs/torch_train.log" "$python" bench/gpu/torch_train.py --plugin "$plugin" \
      --strict --steps 200 --timeout $((step_limit / 2)) --json "$train_json" --markdown "$train_md"
    if [ "$rc" -ne 0 ]; then
      record torch_train failed $((SECONDS - step_start)) \
        "$(why_rc "$rc"): $(grep -m 1 -E '^torch_train: .*(failed|differ)' "$logs/torch_train.log" || echo "see $logs/torch_train.log")"
    else
      record torch_train ok $((SECONDS - step_start)) "losses match; an OOM raised torch.OutOfMemoryError"
    fi
  fi
fi

total_s=$((SECONDS - start_all))

# 6. RESULTS.md
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
{
  echo "# gma on a GPU: tools/gpu_check.sh"
  echo
  echo "Written by \`tools/gpu_check.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); every figure below was"
  echo "measured in that run on this GPU. Overall: $([ "$failed" -eq 0 ] && echo "**passed**" || echo "**FAILED**"),"
  echo "${total_s}s wall time (budget ${budget_s}s)."
  echo
  echo "- GPU (index, name, driver, memory): $(paste -sd ';' <<<"$gpu_info" | sed 's/;/; /g')"
  echo "- CUDA version (driver, nvidia-smi): ${cuda_driver_version:-unknown}; CUDA Toolkit (build): ${toolkit:-unknown}"
  echo "- PyTorch: ${torch_version:-not used (${torch_why:-unknown})}"
  echo "- git commit: $commit"
  echo "- host: $(uname -srm), $(nproc 2>/dev/null || echo '?') CPUs"
  echo
  echo "## Steps"
  echo
  echo "| step | status | wall time (s) | note |"
  echo "|---|---|---:|---|"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${states[$i]} | ${secs[$i]} | ${notes[$i]//|//} |"
  done
  echo
  echo "## Driver call costs (gma-driver-probe)"
  echo
  if [ -n "$probe_table" ]; then
    echo "Each row: calls timed one at a time on the host, p50/p99/max in ns (JSON: driver_probe.json)."
    echo
    echo '```'
    echo "$probe_table"
    echo '```'
  else
    echo "Not measured: see the probe step above."
  fi
  echo
  echo "## ctest -L gpu"
  echo
  echo "$ctest_summary."
  if [ -n "$ctest_lines" ]; then
    echo
    echo '```'
    echo "$ctest_lines"
    echo '```'
  fi
  if [ -n "$held_lines" ]; then
    echo
    echo "A stream held on the host after its thread freed a block there (test_gpu_held):"
    echo
    echo '```'
    echo "$held_lines"
    echo '```'
  fi
  echo
  echo "## GPU benchmark (gma-bench-gpu, torch_bench.py)"
  echo
  if [ -s "$bench_table" ]; then
    echo "Median ns per alloc+free pair and ratios against gma (JSON: bench_gpu.json, bench_gpu_torch.json;"
    echo "gma's statistics deltas per side are in bench_gpu.json's gma_deltas)."
    echo
    echo '```'
    cat "$bench_table"
    echo '```'
  elif [ -s "$logs/bench_gpu.log" ]; then
    echo '```'
    sed -n '/^scenario \/ allocator/,$p' "$logs/bench_gpu.log"
    echo '```'
  else
    echo "No table: see the bench step above."
  fi
  echo
  echo "## Training loop (bench/gpu/torch_train.py)"
  echo
  if [ -s "$train_md" ]; then
    cat "$train_md"
    echo
    echo "Peak memory: PyTorch's from torch.cuda.max_memory_reserved/allocated, gma's from its own"
    echo "statistics (gma.torch.stats); JSON: torch_train.json."
  else
    echo "Not measured: see the torch_train step above."
  fi
  echo
  echo "## Skipped"
  echo
  any=0
  for i in "${!names[@]}"; do
    if [ "${states[$i]}" = skipped ]; then
      echo "- ${names[$i]}: ${notes[$i]}"
      any=1
    fi
  done
  [ "$any" -eq 1 ] || echo "Nothing."
} >"$out/RESULTS.md"
tar -czf "$out/logs.tgz" -C "$build" logs 2>/dev/null || true
if [ "$results" != "$out/RESULTS.md" ]; then
  mkdir -p "$(dirname "$results")"
  cp "$out/RESULTS.md" "$results"
fi
echo
echo "gpu_check: wrote $out/RESULTS.md and $results (${total_s}s): $([ "$failed" -eq 0 ] && echo passed || echo FAILED)"
exit "$failed"
