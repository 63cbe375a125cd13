#!/usr/bin/env bash
# install_prefix: installs a gma build tree into a fresh prefix and uses what
# it installed from there, outside the source tree, with no environment
# variable pointing anywhere (no GMA_LIBRARY, GMA_TORCH_LIBRARY,
# LD_LIBRARY_PATH or PYTHONPATH into the build or source tree):
#   the commands in PREFIX/bin: gma-import-torch converts a small PyTorch
#   snapshot (tests/data/small_snapshot.pickle), gma-replay replays it (and
#   writes a timeline and a peak snapshot), gma-estimate finds its smallest
#   capacity, gma-viz draws them (SVG, and PNG where rsvg-convert is
#   installed), gma-torch-policy-model sizes it;
#   the PyTorch plug-in: the Python package (python/gma) copied where
#   pip install --prefix PREFIX would put it finds libgma in PREFIX/lib* and
#   gma.torch finds libgma_torch.so beside it and loads it (ctypes only; torch
#   is not needed for that), and the source tree's package given only
#   GMA_LIBRARY=PREFIX/lib/libgma.so does the same.
# What needs a real torch and a GPU (gma.torch.use()) is not run here; the
# test says so. Exit 0 when all pass, 1 on a failure, 77 (skip) when the build
# has no gma-replay or no libgma_torch (nothing to install).
# Arguments (--name=value) come from tests/install/install.cmake.
set -euo pipefail

for arg in "$@"; do
  case "$arg" in
    --build=*) build=${arg#*=} ;;
    --source=*) source=${arg#*=} ;;
    --work=*) work=${arg#*=} ;;
    --config=*) config=${arg#*=} ;;
    --cmake=*) cmake=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    *) echo "test_install_prefix.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
for v in build source work cmake python; do
  [ -n "${!v:-}" ] || { echo "test_install_prefix.sh: --$v is required" >&2; exit 2; }
done
config=${config:-}
libdir=$(sed -n "s/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p" "$build/CMakeCache.txt")
bindir=$(sed -n "s/^CMAKE_INSTALL_BINDIR:[A-Z]*=//p" "$build/CMakeCache.txt")
[ -n "$libdir" ] && [ -n "$bindir" ] || { echo "FAIL: no CMAKE_INSTALL_LIBDIR/BINDIR in $build/CMakeCache.txt" >&2; exit 1; }

start=$SECONDS
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- [$((SECONDS - start))s] $*"; }
[ -x "$build/gma-replay" ] || { echo "SKIP: this build has no gma-replay"; exit 77; }
[ -e "$build/libgma_torch.so" ] || { echo "SKIP: this build has no libgma_torch.so"; exit 77; }

rm -rf "$work"
mkdir -p "$work/run"
prefix="$work/prefix"
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" ${config:+--config "$config"} >"$work/install.log" 2>&1 ||
  fail "cmake --install failed:"$'\n'"$(cat "$work/install.log")"
lib="$prefix/$libdir" bin="$prefix/$bindir"
for f in "$bin/gma-replay" "$bin/gma-viz" "$bin/gma-import-torch" "$bin/gma-torch-policy-model"; do
  [ -x "$f" ] || fail "not installed as a command: $f"
done
if [ -x "$build/gma-estimate" ] && [ ! -x "$bin/gma-estimate" ]; then
  fail "the build has gma-estimate but the install lacks $bin/gma-estimate"
fi
[ -f "$lib/libgma_torch.so" ] || fail "the plug-in is not installed beside libgma: $lib/libgma_torch.so"
if [ -e "$build/libgma_torch_shim.so" ] && [ ! -f "$lib/libgma_torch_shim.so" ]; then
  fail "the build has libgma_torch_shim.so but the install lacks $lib/libgma_torch_shim.so"
fi

# Everything below runs in $work/run with a plain environment: the commands
# from PATH, nothing pointing into the build or source tree.
clean_env=(env -u GMA_LIBRARY -u GMA_TORCH_LIBRARY -u GMA_TORCH_SHIM_LIBRARY -u LD_LIBRARY_PATH
           -u PYTHONPATH -u GMA_CONF "PATH=$bin:/usr/local/bin:/usr/bin:/bin"
           "PYTHONDONTWRITEBYTECODE=1")
run() { (cd "$work/run" && "${clean_env[@]}" "$@"); }
cp "$source/tests/data/small_snapshot.pickle" "$work/run/small.pickle"

step "gma-import-torch small.pickle"
out=$(run gma-import-torch small.pickle -o small.csv 2>&1) || fail "gma-import-torch failed:"$'\n'"$out"
[ -s "$work/run/small.csv" ] || fail "gma-import-torch wrote no small.csv:"$'\n'"$out"
head -n 1 "$work/run/small.csv" | grep -qx 'Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status' ||
  fail "small.csv does not start with the trace header"

step "gma-replay small.csv"
out=$(run gma-replay --quiet --timeline-dir tl --snapshot-dir snap small.csv 2>&1) ||
  fail "gma-replay failed:"$'\n'"$out"
printf '%s\n' "$out" | grep -E '^small +default +22\.0 MiB' >/dev/null ||
  fail "gma-replay's summary has no 'small default 22.0 MiB' row (the pickle's peak):"$'\n'"$out"
tl="$work/run/tl/small.default.timeline.csv"
[ -s "$tl" ] || fail "gma-replay wrote no timeline $tl (it has: $(ls "$work/run/tl" 2>&1))"
snap=$(ls "$work/run/snap"/small.default.*json 2>/dev/null | head -n 1)
[ -n "$snap" ] || fail "gma-replay wrote no peak snapshot (it has: $(ls "$work/run/snap" 2>&1))"
if command -v readelf >/dev/null; then
  rp=$(readelf -d "$bin/gma-replay" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  case "$rp" in *'$ORIGIN'*) ;; *) fail "the installed gma-replay's RUNPATH is '$rp', not \$ORIGIN-relative" ;; esac
  case "$rp" in *"$build"*) fail "the installed gma-replay has a RUNPATH into the build tree: $rp" ;; esac
fi

if [ -x "$bin/gma-estimate" ]; then
  step "gma-estimate --trace small.csv"
  out=$(run gma-estimate --trace small.csv --precision 5 2>&1) || fail "gma-estimate failed:"$'\n'"$out"
  printf '%s\n' "$out" | grep -E '^  ordinary ' >/dev/null ||
    fail "gma-estimate printed no ordinary row:"$'\n'"$out"
fi

step "gma-viz"
set +e
out=$(run gma-viz --title small --timeline "default=$tl" --snapshot "$snap" --svg small.svg \
      --html small.html --png small.png 2>&1)
rc=$?
set -e
[ -s "$work/run/small.svg" ] && [ -s "$work/run/small.html" ] || fail "gma-viz wrote no SVG/HTML (exit $rc):"$'\n'"$out"
if [ $rc -eq 0 ]; then
  [ "$(head -c 8 "$work/run/small.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    fail "small.png is not a PNG"
elif [ $rc -eq 3 ] && ! command -v rsvg-convert >/dev/null; then
  echo "  (no PNG: rsvg-convert is not installed; the SVG and HTML were checked)"
else
  fail "gma-viz exited $rc:"$'\n'"$out"
fi

step "gma-torch-policy-model small.csv"
out=$(run gma-torch-policy-model small.csv 2>&1) || fail "gma-torch-policy-model failed:"$'\n'"$out"
printf '%s\n' "$out" | grep -q 'small' || fail "gma-torch-policy-model printed no row for small.csv:"$'\n'"$out"
printf '%s\n' "$out" | sed 's/^/  /'

# --- The Python package and the plug-in -----------------------------------------------
# Where pip install --prefix PREFIX puts the package: PREFIX/<libdir>/pythonX.Y/site-packages.
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
site="$lib/python$pyver/site-packages"
mkdir -p "$site"
cp -r "$source/python/gma" "$site/gma"
probe='
import os, sys, gma, gma.torch
lib = gma._lib.load()
want = os.path.realpath(sys.argv[1])
got = os.path.realpath(lib.file)
assert os.path.dirname(got) == want, "libgma loaded from %s, not from %s" % (got, want)
p = gma.torch.library_path()
assert os.path.realpath(os.path.dirname(p)) == want, "gma.torch found %s, not the one in %s" % (p, want)
pl = gma.torch.plugin()
pl.gma_torch_last_error()
print("  libgma %s; libgma_torch %s" % (lib.file, p))
'
step "the package in PREFIX/$libdir/python$pyver/site-packages: libgma and the plug-in from PREFIX/$libdir"
out=$(run env "PYTHONPATH=$site" "$python" -c "$probe" "$lib" 2>&1) || fail "$out"
printf '%s\n' "$out"
step "the source tree's package with GMA_LIBRARY=PREFIX/$libdir/libgma.so: the plug-in beside it"
out=$(run env "PYTHONPATH=$source/python" "GMA_LIBRARY=$lib/libgma.so" "$python" -c "$probe" "$lib" 2>&1) ||
  fail "$out"
printf '%s\n' "$out"
if "$python" -c 'import torch' >/dev/null 2>&1; then
  echo "  (torch is installed: gma.torch.use() itself needs a GPU and runs in the python tests, not here)"
else
  echo "  (no torch here: the plug-in was found and loaded with ctypes; gma.torch.use() was not run)"
fi
step "passed"
