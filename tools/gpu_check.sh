#!/usr/bin/env bash
# Everything gma has to check on a GPU machine, in one command (issue 16):
#
#  0. looks for a GPU: the CUDA driver (libcuda.so.1, or $GMA_CUDA_DRIVER as gma
#     itself would load it) must load, cuInit and see a device; nvidia-smi -L
#     names it. Without one it prints "gpu_check: no GPU (why): nothing to
#     check" and exits 0, having built and written nothing;
#  1. configures and builds a Release tree with the tests in build/gpu (not
#     build/release or build/debug, which main.sh and test.sh use);
#  2. runs ctest -L gpu there (gma's CUDA backend on the real driver: API,
#     stress, pipeline); a test that is Skipped on a machine with a GPU counts
#     as a failure, since it means gma could not use that GPU;
#  3. runs tools/bench_gpu.sh (gma-bench-gpu against cuMemAlloc,
#     cudaMallocAsync and CUB; bench/gpu/torch_bench.py when torch is present,
#     with gma's plug-in from step 1 as GMA_TORCH_PLUGIN) and takes its table;
#  4. runs bench/gpu/torch_train.py (a small training loop built in code, on
#     PyTorch's allocator and on gma through the plug-in: loss, steps/s, peak
#     memory; then a tensor larger than the GPU must raise
#     torch.OutOfMemoryError through libgma_torch_shim.so, which step 1 builds
#     against that python's torch) when torch imports and sees CUDA, else says
#     why it skipped;
#  5. writes docs/gpu/RESULTS.md: date, GPU, driver and CUDA versions, the git
#     commit, every step's status and wall time, the ctest summary, the
#     benchmark table and the training table, and what was skipped and why.
#
# Each step has a time limit (timeout), so the whole cannot hang; it aims to
# finish within 15 minutes and warns when it did not. Logs go to
# build/gpu/logs/. Exit status: 0 when every step ran, or was skipped for a
# stated reason; 1 when a test failed, a step failed, crashed or ran out of
# time. It installs nothing (run tools/bootstrap.sh first on a fresh machine).
#
# Environment: NVIDIA_SMI (the nvidia-smi to run), GMA_CUDA_DRIVER (the
# driver file, as for gma), GPU_CHECK_BUILD_DIR (build/gpu) and
# GPU_CHECK_RESULTS (docs/gpu/RESULTS.md), TORCH_BENCH_ARGS (to torch_bench.py,
# through bench_gpu.sh). Arguments go to tools/bench_gpu.sh (gma-bench-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."

budget_s=900
build=${GPU_CHECK_BUILD_DIR:-build/gpu}
results=${GPU_CHECK_RESULTS:-docs/gpu/RESULTS.md}
smi=${NVIDIA_SMI:-nvidia-smi}
driver=${GMA_CUDA_DRIVER:-libcuda.so.1}
python=$(command -v python3 || true)

# ---- 0. is there a GPU? -------------------------------------------------------------------
# The driver decides, as it does for gma; nvidia-smi only names what it sees.
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

# ---- steps ----------------------------------------------------------------------------------
start_all=$SECONDS
mkdir -p "$build/logs"
logs=$build/logs
names=() states=() secs=() notes=()
failed=0
record() { # name state seconds note
  names+=("$1"); states+=("$2"); secs+=("$3"); notes+=("$4")
  [ "$2" != failed ] || failed=1
  echo "gpu_check: [$1] $2 in ${3}s${4:+: $4}"
}
begin() { echo; echo "gpu_check: [$1] $2 (limit ${3}s)"; step_start=$SECONDS; }
# run_logged LOG LIMIT CMD...: runs CMD under timeout, output to the terminal and
# LOG; sets rc (124: ran out of time).
run_logged() {
  local log=$1 limit=$2
  shift 2
  set +e
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
}
# run_quiet LOG LIMIT CMD...: the same, output to LOG only; its last lines on failure.
run_quiet() {
  local log=$1 limit=$2
  shift 2
  rc=0
  timeout --kill-after=30 "$limit" "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || tail -n 40 "$log"
}
why_rc() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ] && echo "ran out of time" || echo "exit $1"; }

gpu_info=$(timeout 60 "$smi" --query-gpu=index,name,driver_version,memory.total \
           --format=csv,noheader 2>/dev/null || echo "($smi --query-gpu failed)")
cuda_driver_version=$(timeout 60 "$smi" 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1 || true)
echo "gpu_check: $drv_gpus GPU(s) through $driver:"
while IFS= read -r line; do echo "  $line"; done <<<"$gpu_info"

# 1. build
begin build "configure and build a Release tree with the tests in $build" 600
toolkit=""
# GMA_TORCH_PYTHON: the python whose torch libgma_torch_shim.so is built against
# (the OOM shim; torch_train.py's OOM check needs it when torch is there).
run_quiet "$logs/configure.log" 300 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DGMA_BUILD_TESTS=ON -DGMA_BUILD_BENCH=OFF ${python:+"-DGMA_TORCH_PYTHON=$python"}
built=0
if [ "$rc" -ne 0 ]; then
  record build failed $((SECONDS - step_start)) "cmake configure: $(why_rc "$rc") (log: $logs/configure.log)"
elif grep -q 'gma: no CUDA Toolkit found' "$logs/configure.log"; then
  record build failed $((SECONDS - step_start)) \
    "CMake found no CUDA Toolkit, so libgma has no CUDA backend and nothing of gma's can run on the GPU (install the toolkit's headers)"
else
  toolkit=$(sed -n 's/.*gma: CUDA Toolkit \([^ ]*\) headers.*/\1/p' "$logs/configure.log" | head -n 1)
  run_quiet "$logs/build.log" $((600 - (SECONDS - step_start))) \
    cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"
  if [ "$rc" -ne 0 ]; then
    record build failed $((SECONDS - step_start)) "cmake --build: $(why_rc "$rc") (log: $logs/build.log)"
  else
    built=1
    shim_note=$(sed -n 's/.*gma: \(libgma_torch_shim.so [^:]*\).*/\1/p' "$logs/configure.log" | head -n 1)
    record build ok $((SECONDS - step_start)) "CUDA Toolkit $toolkit headers; ${shim_note:-libgma_torch_shim.so: not reported}"
  fi
fi
plugin=$PWD/$build/libgma_torch.so

# 2. ctest -L gpu
ctest_summary="not run"
ctest_lines=""
if [ "$built" -eq 0 ]; then
  record "ctest -L gpu" failed 0 "not run: the build failed"
else
  begin "ctest -L gpu" "gma's CUDA backend on the real driver" 600
  run_logged "$logs/ctest.log" 600 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300
  # "N% tests passed, M tests failed out of T", or (newer CTest, none failed)
  # "100% tests passed out of T".
  total=$(sed -n -e 's/.* tests* failed out of \([0-9]*\).*/\1/p' \
                 -e 's/.*% tests passed out of \([0-9]*\).*/\1/p' "$logs/ctest.log" | tail -n 1)
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$logs/ctest.log" || true)
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$logs/ctest.log" || true)
  ctest_lines=$(grep -E 'Test +#[0-9]+: ' "$logs/ctest.log" || true)
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

# 3. tools/bench_gpu.sh (builds gma-bench-gpu in build/release; torch_bench.py when torch is there)
begin bench_gpu "tools/bench_gpu.sh: gma-bench-gpu, torch_bench.py, the merged table" 480
bench_table=build/release/bench_gpu_table.txt
rm -f "$bench_table"
if [ -f "$plugin" ]; then
  run_logged "$logs/bench_gpu.log" 480 env GMA_TORCH_PLUGIN="$plugin" bash tools/bench_gpu.sh "$@"
else
  run_logged "$logs/bench_gpu.log" 480 bash tools/bench_gpu.sh "$@"
fi
torch_bench_note=$(grep -m 1 '^torch_bench: skipped: ' "$logs/bench_gpu.log" || true)
if [ "$rc" -ne 0 ]; then
  record bench_gpu failed $((SECONDS - step_start)) "$(why_rc "$rc") (log: $logs/bench_gpu.log)"
elif grep -q '^bench_gpu: no GPU available' "$logs/bench_gpu.log"; then
  record bench_gpu failed $((SECONDS - step_start)) \
    "gma-bench-gpu found no usable GPU on a machine with one: $(grep -m 1 '^gma-bench-gpu: ' "$logs/bench_gpu.log" || true)"
elif [ ! -s "$bench_table" ]; then
  record bench_gpu skipped $((SECONDS - step_start)) \
    "no table: $(grep -m 1 -E '^bench_gpu: ' "$logs/bench_gpu.log" || echo "see $logs/bench_gpu.log")"
else
  record bench_gpu ok $((SECONDS - step_start)) "${torch_bench_note:-torch_bench.py ran}"
fi

# 4. the training loop, PyTorch's allocator against gma through the plug-in
train_md=$build/torch_train.md
train_json=$build/torch_train.json
rm -f "$train_md" "$train_json"
torch_why=""
if [ -z "$python" ]; then
  torch_why="no python3"
elif ! torch_why=$(timeout 120 "$python" -c '
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
if [ -n "$torch_why" ]; then
  record torch_train skipped 0 "no torch: $torch_why"
elif [ "$built" -eq 0 ]; then
  record torch_train failed 0 "not run: the build failed (no plug-in)"
else
  begin torch_train "bench/gpu/torch_train.py: torch $torch_version, native allocator and gma" 420
  run_logged "$logs/torch_train.log" 420 "$python" bench/gpu/torch_train.py --plugin "$plugin" \
    --strict --timeout 180 --json "$train_json" --markdown "$train_md"
  if [ "$rc" -ne 0 ]; then
    record torch_train failed $((SECONDS - step_start)) \
      "$(why_rc "$rc"): $(grep -m 1 -E '^torch_train: .*(failed|differ)' "$logs/torch_train.log" || echo "see $logs/torch_train.log")"
  else
    record torch_train ok $((SECONDS - step_start)) "losses match; an OOM raised torch.OutOfMemoryError"
  fi
fi

total_s=$((SECONDS - start_all))
over=""
if [ "$total_s" -gt "$budget_s" ]; then
  over="took ${total_s}s, more than the ${budget_s}s (15 minute) budget"
  echo "gpu_check: warning: $over"
fi

# 5. docs/gpu/RESULTS.md
mkdir -p "$(dirname "$results")"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
{
  echo "# gma on a GPU: tools/gpu_check.sh"
  echo
  echo "Written by \`tools/gpu_check.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); every figure below was"
  echo "measured in that run on this GPU. Overall: $([ "$failed" -eq 0 ] && echo "**passed**" || echo "**FAILED**")," \
       "${total_s}s wall time${over:+ (warning: $over)}."
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
  echo "Logs: \`$logs/\`."
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
  echo
  echo "## GPU benchmark (tools/bench_gpu.sh)"
  echo
  if [ -s "$bench_table" ]; then
    echo "Median ns per alloc+free pair and ratios against gma (\`$bench_table\`; JSON beside it)."
    echo
    echo '```'
    cat "$bench_table"
    echo '```'
  else
    echo "No table: see the bench_gpu step above."
  fi
  echo
  echo "## Training loop (bench/gpu/torch_train.py)"
  echo
  if [ -s "$train_md" ]; then
    cat "$train_md"
    echo
    echo "Peak memory: PyTorch's from torch.cuda.max_memory_reserved/allocated, gma's from its own"
    echo "statistics (gma.torch.stats); JSON: \`$train_json\`."
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
  [ -z "${torch_bench_note:-}" ] || { echo "- torch_bench.py (in bench_gpu): ${torch_bench_note#torch_bench: skipped: }"; any=1; }
  [ "$any" -eq 1 ] || echo "Nothing."
} >"$results.tmp"
mv "$results.tmp" "$results"
echo
echo "gpu_check: wrote $results (${total_s}s): $([ "$failed" -eq 0 ] && echo passed || echo FAILED)"
exit "$failed"
