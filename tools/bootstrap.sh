#!/usr/bin/env bash
# Installs what gma needs to build and test on a fresh Debian/Ubuntu machine:
# a C compiler, CMake, pkg-config, concurrencykit (libck-dev), Python 3
# (the trace importer, the pictures and their tests), and a C++ compiler and
# Python's headers (g++, python3-dev: the PyTorch plug-in's OOM shim and the
# stand-in torch its tests build; without them those tests skip). The CUDA
# Toolkit is optional (headers only; without it gma builds the simulated
# device alone). Safe to run again: it installs only what is missing.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for p in libck-dev cmake pkg-config gcc g++ make python3 python3-dev; do
  have_pkg "$p" || need+=("$p")
done

if [ ${#need[@]} -eq 0 ]; then
  echo "bootstrap: all dependencies present (libck-dev, cmake, pkg-config, gcc, g++, make, python3, python3-dev)"
  exit 0
fi

echo "bootstrap: installing ${need[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
