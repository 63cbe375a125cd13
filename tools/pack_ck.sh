#!/usr/bin/env bash
# Packs this machine's concurrencykit (headers, libck, ck.pc) into DIR
# (default .gpudeps/, which git ignores when listed in .git/info/exclude)
# with an install script, for a machine that has no libck-dev and cannot
# fetch it (the lent GPU machines): carry DIR there and run
# `bash DIR/setup.sh` (as root) before tools/gpu_check.sh. x86-64 only, like
# those machines.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpudeps}
lib=/usr/lib/x86_64-linux-gnu
[ -f /usr/include/ck_ring.h ] && [ -e "$lib/libck.so" ] ||
  { echo "pack_ck: no concurrencykit here (run tools/bootstrap.sh first)"; exit 1; }
mkdir -p "$dir/inc" "$dir/lib"
cp -a /usr/include/ck_*.h /usr/include/gcc /usr/include/spinlock "$dir/inc/"
cp -a "$lib"/libck.* "$dir/lib/"
cp "$lib/pkgconfig/ck.pc" "$dir/"
cat >"$dir/setup.sh" <<'EOS'
# Installs the packed concurrencykit (run as root on the machine that lacks it).
set -e
d=$(dirname "$0")
cp -a "$d"/inc/* /usr/include/
mkdir -p /usr/lib/x86_64-linux-gnu/pkgconfig
cp -a "$d"/lib/* /usr/lib/x86_64-linux-gnu/
cp "$d/ck.pc" /usr/lib/x86_64-linux-gnu/pkgconfig/
ldconfig
EOS
echo "pack_ck: packed concurrencykit into $dir ($(du -sh "$dir" | cut -f1)); there: bash $dir/setup.sh"
