#!/usr/bin/env bash
# Regenerates the shipped real workloads, traces/NAME.csv.gz, from a
# directory of PyTorch memory snapshots (NAME.pickle): each is converted by
# tools/gma-import-torch and compressed with `gzip -9 -n` (no name or time
# in the header), so the same snapshot and importer give the same bytes.
#
# Usage: bash tools/traces_regen.sh [--check] SNAPSHOT_DIR [OUTDIR]
#   OUTDIR defaults to the repository's traces/.
#   --check  writes nothing: compares each import with OUTDIR/NAME.csv.gz
#            (decompressed) and exits 1 when one differs or is missing.
# Prints a line per snapshot (events, CSV rows, peak allocated and PyTorch's
# peak reserved in GiB, as traces/README.md's table gives them, and the
# compressed size), then the total size. Exit status 0; 1 (--check) a file
# differs; 2 bad usage, or a snapshot that does not import or holds more than
# one device (traces/ ships one CSV per workload).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ ! -d "$1" ]; then
  echo "usage: bash tools/traces_regen.sh [--check] SNAPSHOT_DIR [OUTDIR]" >&2
  exit 2
fi
src=$1
outdir=${2:-$root/traces}
mkdir -p "$outdir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

shopt -s nullglob
pickles=("$src"/*.pickle)
if [ ${#pickles[@]} -eq 0 ]; then
  echo "traces_regen.sh: $src has no *.pickle" >&2
  exit 2
fi
printf '%-42s %7s %6s %9s %9s %9s\n' "trace" "events" "rows" "alloc GiB" "res GiB" "gz bytes"
total=0 differ=0
for f in "${pickles[@]}"; do
  name=$(basename "$f" .pickle)
  csv="$tmp/$name.csv"
  if ! "$root/tools/gma-import-torch" --quiet --json "$tmp/$name.json" -o "$csv" "$f"; then
    echo "traces_regen.sh: could not import $f (the line above says why)" >&2
    exit 2
  fi
  if [ ! -f "$csv" ]; then
    echo "traces_regen.sh: $f holds several devices ($(cd "$tmp" && echo "$name".dev*.csv));" \
         "traces/ ships one CSV per workload" >&2
    exit 2
  fi
  gzip -9 -n -c "$csv" >"$tmp/$name.csv.gz"
  size=$(wc -c <"$tmp/$name.csv.gz")
  total=$((total + size))
  read -r events rows alloc res < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["devices"][0]
print(d["events_total"], d["rows_total"], "%.2f" % (d["peak_allocated_bytes"] / 2**30),
      "%.2f" % (d["peak_reserved_bytes"] / 2**30))' \
    "$tmp/$name.json")
  note=""
  if [ $check -eq 1 ]; then
    if [ ! -f "$outdir/$name.csv.gz" ]; then
      note="  MISSING from $outdir"; differ=1
    elif ! gzip -dc "$outdir/$name.csv.gz" | cmp -s - "$csv"; then
      note="  DIFFERS from $outdir/$name.csv.gz"; differ=1
    fi
  else
    # Through a temporary name, so an interrupted run never leaves a cut file.
    cp "$tmp/$name.csv.gz" "$outdir/$name.csv.gz.tmp"
    mv -f "$outdir/$name.csv.gz.tmp" "$outdir/$name.csv.gz"
  fi
  printf '%-42s %7s %6s %9s %9s %9s%s\n' "$name" "$events" "$rows" "$alloc" "$res" "$size" "$note"
done
printf '%d snapshots, %d bytes compressed in all%s\n' ${#pickles[@]} "$total" \
  "$([ $check -eq 1 ] && echo " (--check: nothing written)" || echo ", written to $outdir")"
exit $differ
