#!/usr/bin/env bash
# install_consume: installs a gma build tree into a fresh prefix, checks the
# installed file list, then builds tests/install/consumer/main.c against the
# prefix four ways and runs each:
#   CMake find_package(gma CONFIG) + gma::gma          (RPATH, NEEDED libgma.so.0)
#   CMake find_package(gma CONFIG) + gma::gma_static   (no libgma in NEEDED)
#   cc $(pkg-config --cflags --libs gma)               (LD_LIBRARY_PATH; the same flags
#                                                       with no ck.pc on the search
#                                                       path, and no -D from ck.pc)
#   cc $(pkg-config --static --cflags --libs gma), libgma.a
# Exit 0 when all pass, 1 on a failure, 77 (skip) when no C compiler, or when
# pkg-config or readelf is missing (after running every check that can run).
# Arguments (--name=value) come from tests/install/install.cmake.
set -euo pipefail

for arg in "$@"; do
  case "$arg" in
    --build=*) build=${arg#*=} ;;
    --source=*) source=${arg#*=} ;;
    --work=*) work=${arg#*=} ;;
    --config=*) config=${arg#*=} ;;
    --cmake=*) cmake=${arg#*=} ;;
    --generator=*) generator=${arg#*=} ;;
    --make-program=*) make_program=${arg#*=} ;;
    --cc=*) cc=${arg#*=} ;;
    --cflags=*) san_flags=${arg#*=} ;;
    --pkg-config=*) pkg_config=${arg#*=} ;;
    --version=*) version=${arg#*=} ;;
    *) echo "test_install.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
for v in build source work cmake cc version; do
  [ -n "${!v:-}" ] || { echo "test_install.sh: --$v is required" >&2; exit 2; }
done
# The install directories as the build configured them (cmake/install.cmake).
cache_var() {
  local v
  v=$(sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt")
  [ -n "$v" ] || { echo "test_install.sh: $1 is not in $build/CMakeCache.txt" >&2; exit 1; }
  printf '%s\n' "$v"
}
libdir=$(cache_var CMAKE_INSTALL_LIBDIR)
includedir=$(cache_var CMAKE_INSTALL_INCLUDEDIR)
cmakedir=$(cache_var GMA_INSTALL_CMAKEDIR)
config=${config:-} generator=${generator:-} make_program=${make_program:-}
san_flags=${san_flags:-} pkg_config=${pkg_config:-}
major=${version%%.*}
consumer_src="$source/tests/install/consumer"

start=$SECONDS
skipped=()
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- [$((SECONDS - start))s] $*"; }

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP: no C compiler ('$cc' not found); cannot build a consumer of the installed gma"
  exit 77
fi
readelf=$(command -v readelf || true)
[ -n "$readelf" ] || skipped+=("readelf not found: SONAME, NEEDED and RUNPATH checks")
if [ -z "$pkg_config" ] || ! command -v "$pkg_config" >/dev/null 2>&1; then
  pkg_config=$(command -v pkg-config || true)
fi

# Runs a consumer binary; its last line of output must be "ok".
run_consumer() {
  local what=$1 out
  shift
  out=$("$@" 2>&1) || fail "$what exited with $?:"$'\n'"$out"
  [ "$(printf '%s\n' "$out" | tail -n 1)" = ok ] || fail "$what did not print ok:"$'\n'"$out"
  echo "$what: $(printf '%s\n' "$out" | head -n 1)"
}
# readelf -d lines of one kind (NEEDED, SONAME, RUNPATH, RPATH), values only.
dyn() { "$readelf" -d "$2" | sed -n "s/.*(\($1\)).*\[\(.*\)\]/\2/p"; }

rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

# --- Install ------------------------------------------------------------------------
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" ${config:+--config "$config"} >"$work/install.log" 2>&1 ||
  fail "cmake --install failed:"$'\n'"$(cat "$work/install.log")"

# --- Installed files ------------------------------------------------------------------
step "installed files"
lib="$prefix/$libdir"
files=$(cd "$prefix" && find . -mindepth 1 ! -type d | sed 's|^\./||' | LC_ALL=C sort)
while read -r f; do echo "  $f"; done <<<"$files"
for f in "$includedir/gma.h" "$includedir/gma/version.h" "$libdir/libgma.so.$version" \
         "$libdir/libgma.so.$major" "$libdir/libgma.so" "$libdir/libgma.a" \
         "$cmakedir/gmaConfig.cmake" "$cmakedir/gmaConfigVersion.cmake" \
         "$cmakedir/gmaTargets.cmake" "$libdir/pkgconfig/gma.pc"; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
ls "$prefix/$cmakedir"/gmaTargets-*.cmake >/dev/null 2>&1 || fail "not installed: $cmakedir/gmaTargets-<config>.cmake"
if [ ! -f "$lib/libgma.so.$version" ] || [ -L "$lib/libgma.so.$version" ]; then
  fail "$libdir/libgma.so.$version should be the library file itself"
fi
[ "$(readlink "$lib/libgma.so.$major")" = "libgma.so.$version" ] ||
  fail "$libdir/libgma.so.$major should link to libgma.so.$version, links to '$(readlink "$lib/libgma.so.$major")'"
[ "$(readlink "$lib/libgma.so")" = "libgma.so.$major" ] ||
  fail "$libdir/libgma.so should link to libgma.so.$major, links to '$(readlink "$lib/libgma.so")'"
# Everything installed must be one of these; anything else (a test binary, the
# fake CUDA driver, a benchmark, the demo) is a mistake in the install rules.
# The plug-ins and the four commands are install_prefix's to check.
for f in $files; do
  case "$f" in
    "$includedir"/*.h) ;;
    "$libdir/libgma.so" | "$libdir/libgma.so.$major" | "$libdir/libgma.so.$version" | "$libdir/libgma.a") ;;
    "$cmakedir"/gmaConfig.cmake | "$cmakedir"/gmaConfigVersion.cmake | "$cmakedir"/gmaTargets*.cmake) ;;
    "$libdir/pkgconfig/gma.pc") ;;
    "$libdir/libgma_torch.so" | "$libdir/libgma_torch_shim.so") ;;
    bin/gma-replay | bin/gma-estimate | bin/gma-viz | bin/gma-import-torch | bin/gma-torch-policy-model) ;;
    *) fail "unexpected installed file: $f (only headers, libgma, the CMake package, gma.pc, the PyTorch plug-ins and the five tools belong)" ;;
  esac
done
# The package files must not point back into the source or build tree.
for f in "$prefix/$cmakedir"/*.cmake "$lib/pkgconfig/gma.pc"; do
  if sed "s|$prefix||g" "$f" | grep -qF -e "$build" -e "$source"; then
    fail "$f refers to the build or source tree:"$'\n'"$(grep -nF -e "$build" -e "$source" "$f")"
  fi
done
if grep -nE 'PkgConfig::CK|gma_objects|[^:]gma_ck[^a-zA-Z_]|BUILD_INTERFACE' "$prefix/$cmakedir"/gmaTargets*.cmake; then
  fail "the exported targets name build-only targets (above)"
fi
if [ -n "$readelf" ]; then
  soname=$(dyn SONAME "$lib/libgma.so.$version")
  [ "$soname" = "libgma.so.$major" ] || fail "libgma.so.$version has SONAME '$soname', not libgma.so.$major"
  if dyn 'RUNPATH\|RPATH' "$lib/libgma.so.$version" | grep -qF "$build"; then
    fail "the installed libgma.so has an RPATH into the build tree: $(dyn 'RUNPATH\|RPATH' "$lib/libgma.so.$version")"
  fi
fi

# --- CMake consumer ---------------------------------------------------------------------
step "CMake consumer: find_package(gma CONFIG) with CMAKE_PREFIX_PATH=$prefix"
cmake_args=(-S "$consumer_src" -B "$work/cmake-consumer"
  -DCMAKE_BUILD_TYPE=Debug
  -DCMAKE_C_COMPILER="$cc"
  "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror $san_flags"
  "-DCMAKE_EXE_LINKER_FLAGS=$san_flags"
  -DCMAKE_PREFIX_PATH="$prefix"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DGMA_EXPECTED_VERSION="$version")
[ -z "$generator" ] || cmake_args+=(-G "$generator")
[ -z "$make_program" ] || cmake_args+=(-DCMAKE_MAKE_PROGRAM="$make_program")
"$cmake" "${cmake_args[@]}" >"$work/cmake-consumer.log" 2>&1 ||
  fail "configuring the CMake consumer failed:"$'\n'"$(cat "$work/cmake-consumer.log")"
grep -qF "gma_consumer: gma $version from $prefix/$cmakedir" "$work/cmake-consumer.log" ||
  fail "the consumer did not find gma $version in $prefix/$cmakedir:"$'\n'"$(grep gma_consumer "$work/cmake-consumer.log")"
"$cmake" --build "$work/cmake-consumer" >>"$work/cmake-consumer.log" 2>&1 ||
  fail "building the CMake consumer failed:"$'\n'"$(cat "$work/cmake-consumer.log")"
shared="$work/cmake-consumer/consumer_shared" static="$work/cmake-consumer/consumer_static"
if [ -n "$readelf" ]; then
  dyn NEEDED "$shared" | grep -qx "libgma.so.$major" ||
    fail "gma::gma consumer does not need libgma.so.$major: $(dyn NEEDED "$shared" | tr '\n' ' ')"
  dyn 'RUNPATH\|RPATH' "$shared" | tr ':' '\n' | grep -qx "$lib" ||
    fail "gma::gma consumer has no RUNPATH to $lib: $(dyn 'RUNPATH\|RPATH' "$shared")"
  if dyn NEEDED "$static" | grep -q libgma; then
    fail "gma::gma_static consumer needs a shared libgma: $(dyn NEEDED "$static" | tr '\n' ' ')"
  fi
fi
# The shared one finds libgma through the RUNPATH CMake gave it.
run_consumer "cmake gma::gma" env -u LD_LIBRARY_PATH "$shared"
run_consumer "cmake gma::gma_static" env -u LD_LIBRARY_PATH "$static"

# --- pkg-config consumer ---------------------------------------------------------------
if [ -z "$pkg_config" ]; then
  skipped+=("pkg-config not found: the pkg-config consumers")
else
  step "pkg-config consumer: PKG_CONFIG_PATH=$lib/pkgconfig"
  export PKG_CONFIG_PATH="$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  pc_version=$("$pkg_config" --modversion gma) || fail "pkg-config does not accept gma.pc"
  [ "$pc_version" = "$version" ] || fail "pkg-config --modversion gma says '$pc_version', not $version"
  pc_cflags=$("$pkg_config" --cflags gma)
  pc_libs=$("$pkg_config" --libs gma)
  pc_static_libs=$("$pkg_config" --static --libs gma)
  echo "  --cflags: $pc_cflags"
  echo "  --libs: $pc_libs"
  echo "  --static --libs: $pc_static_libs"
  case " $pc_cflags " in *" -I$prefix/$includedir "*) ;; *) fail "--cflags lacks -I$prefix/$includedir" ;; esac
  case " $pc_libs " in *" -L$lib "*"-lgma "*) ;; *) fail "--libs lacks -L$lib -lgma" ;; esac
  case " $pc_static_libs " in *" -lck "*) ;; *) fail "--static --libs lacks -lck" ;; esac
  # gma.h needs nothing of ck, so none of ck.pc's flags (Debian's has
  # -D__x86_64__) may reach a user's compiler, and gma.pc must not name ck.pc:
  # pkg-config (pkgconf) resolves Requires.private for --cflags too, and
  # fails without the named .pc file.
  case " $pc_cflags " in *" -D"*) fail "--cflags passes a definition on: '$pc_cflags'" ;; esac
  if grep -n '^Requires' "$lib/pkgconfig/gma.pc"; then
    fail "gma.pc names other .pc files (above); users would need them"
  fi
  # With gma.pc alone on the search path (no ck.pc), the flags are the same:
  # the shared consumer below is built with them.
  pc_alone() { env -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR="$lib/pkgconfig" "$pkg_config" "$@"; }
  pc_alone_flags=$(pc_alone --cflags --libs gma 2>&1) ||
    fail "pkg-config --cflags --libs gma fails without ck.pc on the search path: $pc_alone_flags"
  [ "$pc_alone_flags" = "$("$pkg_config" --cflags --libs gma)" ] ||
    fail "without ck.pc, pkg-config --cflags --libs gma says '$pc_alone_flags', not '$("$pkg_config" --cflags --libs gma)'"
  pc_alone_static=$(pc_alone --static --libs gma 2>&1) ||
    fail "pkg-config --static --libs gma fails without ck.pc on the search path: $pc_alone_static"
  case " $pc_alone_static " in *" -lck "*) ;; *) fail "without ck.pc, --static --libs lacks -lck: $pc_alone_static" ;; esac
  cc_flags="-std=c11 -Wall -Wextra -Werror $san_flags"

  # shellcheck disable=SC2086 # the flags are meant to split
  "$cc" $cc_flags $pc_cflags "$consumer_src/main.c" -o "$work/pc_shared" $pc_libs $san_flags \
    >"$work/pc.log" 2>&1 || fail "cc with pkg-config --libs gma failed:"$'\n'"$(cat "$work/pc.log")"
  # -lgma would pick libgma.so next to libgma.a; -l:libgma.a names the archive
  # and keeps the rest of what --static gave (ck, threads, dl) as it is.
  pc_static_libs_a=$(printf '%s\n' " $pc_static_libs " | sed 's/ -lgma / -l:libgma.a /')
  # shellcheck disable=SC2086
  "$cc" $cc_flags $pc_cflags "$consumer_src/main.c" -o "$work/pc_static" $pc_static_libs_a $san_flags \
    >>"$work/pc.log" 2>&1 || fail "cc with pkg-config --static --libs gma failed:"$'\n'"$(cat "$work/pc.log")"
  if [ -n "$readelf" ]; then
    dyn NEEDED "$work/pc_shared" | grep -qx "libgma.so.$major" ||
      fail "pkg-config consumer does not need libgma.so.$major: $(dyn NEEDED "$work/pc_shared" | tr '\n' ' ')"
    if dyn NEEDED "$work/pc_static" | grep -q libgma; then
      fail "pkg-config --static consumer needs a shared libgma: $(dyn NEEDED "$work/pc_static" | tr '\n' ' ')"
    fi
  fi
  run_consumer "pkg-config shared" env LD_LIBRARY_PATH="$lib" "$work/pc_shared"
  run_consumer "pkg-config static" env -u LD_LIBRARY_PATH "$work/pc_static"
fi

step "done"
if [ ${#skipped[@]} -ne 0 ]; then
  printf 'SKIP: %s\n' "${skipped[@]}"
  exit 77
fi
echo "install_consume: all checks passed"
