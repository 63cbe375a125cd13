#!/usr/bin/env bash
# Installs what gma needs to build and test on a fresh Debian/Ubuntu machine:
# a C compiler, CMake, pkg-config, concurrencykit (libck-dev), Python 3
# (the trace importer, the pictures and their tests), and a C++ compiler and
# Python's headers (g++, python3-dev: the PyTorch plug-in's OOM shim and the
# stand-in torch its tests build; without them those tests skip). Then, if
# it can, rsvg-convert (librsvg2-bin), which gma-viz draws its PNG pictures
# with: a machine that cannot install it (no network) goes on without it,
# and gets SVG and HTML pictures only (the PNG test skips). The CUDA
# Toolkit is optional (headers only; without it gma builds the simulated
# device alone). Safe to run again: it installs only what is missing.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for p in libck-dev cmake pkg-config gcc g++ make python3 python3-dev; do
  have_pkg "$p" || need+=("$p")
done
png=yes
have_pkg librsvg2-bin || command -v rsvg-convert >/dev/null 2>&1 || png=""

if [ ${#need[@]} -eq 0 ] && [ -n "$png" ]; then
  echo "bootstrap: all dependencies present (libck-dev, cmake, pkg-config, gcc, g++, make," \
       "python3, python3-dev, librsvg2-bin)"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#need[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ -z "$png" ]; then
  echo "bootstrap: installing librsvg2-bin (rsvg-convert, for gma-viz's PNG pictures)"
  if ! { [ ${#need[@]} -gt 0 ] || $sudo apt-get update -qq; } ||
     ! $sudo apt-get install -y -qq --no-install-recommends librsvg2-bin; then
    echo "bootstrap: could not install librsvg2-bin: going on without it; gma-viz writes" \
         "SVG and HTML pictures, and says so where a PNG was asked for"
  fi
fi
