#!/usr/bin/env bash
# Finds the traces tools/main.sh replays and makes them ready to read: the
# real workloads shipped in traces/*.csv.gz (gma's trace CSV, gzip-compressed;
# traces/README.md says where each comes from), decompressed into OUTDIR, plus
# the PyTorch snapshots (*.pickle) in $GMA_TRACES_DIR, when it is set, imported
# into OUTDIR with tools/gma-import-torch. A snapshot named like a shipped
# trace (cnn_latent_eor.pickle) replaces it: the list keeps one entry per name.
#
# Usage: bash tools/traces.sh OUTDIR
# Prints the CSV paths to replay on stdout, one a line, in order (shipped
# traces by name, then the snapshots' own by name); what it does goes to
# stderr. Exit status 0, or 2 when an input cannot be read (a message says
# which). It reads only the repository and $GMA_TRACES_DIR, so a fresh clone
# (no ../shared beside it) gets the shipped traces; tests/tools/
# test_main_traces.py checks that from a copy of the repository.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -ne 1 ]; then
  echo "usage: bash tools/traces.sh OUTDIR" >&2
  exit 2
fi
outdir=$1
mkdir -p "$outdir"

names=()   # trace names, in order
declare -A csv_of=()

shopt -s nullglob
shipped=("$root"/traces/*.csv.gz)
if [ ${#shipped[@]} -gt 0 ]; then
  if ! command -v gzip >/dev/null 2>&1; then
    echo "traces.sh: gzip is missing (it is part of every Debian/Ubuntu system): apt-get install gzip" >&2
    exit 2
  fi
  echo "=== the real workloads shipped in traces/ (gma trace CSV, gzip): decompressing into $outdir" >&2
  for gz in "${shipped[@]}"; do
    name=$(basename "$gz" .csv.gz)
    out="$outdir/$name.csv"
    # Through a temporary file, so an interrupted run never leaves a cut trace.
    if ! gzip -dc "$gz" >"$out.tmp"; then
      rm -f "$out.tmp"
      echo "traces.sh: cannot decompress $gz" >&2
      exit 2
    fi
    mv -f "$out.tmp" "$out"
    names+=("$name")
    csv_of[$name]=$out
    echo "  $name -> $out" >&2
  done
else
  echo "traces.sh: no traces/*.csv.gz in $root (the shipped workloads are missing)" >&2
fi

if [ -n "${GMA_TRACES_DIR:-}" ]; then
  pickles=("$GMA_TRACES_DIR"/*.pickle)
  if [ ${#pickles[@]} -eq 0 ]; then
    echo "traces.sh: GMA_TRACES_DIR=$GMA_TRACES_DIR has no *.pickle: nothing added" >&2
  else
    echo "=== importing the PyTorch snapshots in GMA_TRACES_DIR=$GMA_TRACES_DIR" >&2
    for f in "${pickles[@]}"; do
      name=$(basename "$f" .pickle)
      out="$outdir/$name.csv"
      # A snapshot of several devices gives NAME.devN.csv, one per device
      # (gma-import-torch --help); clear what an earlier run left first.
      rm -f "$out" "$outdir/$name".dev*.csv
      if ! "$root/tools/gma-import-torch" --quiet -o "$out" "$f"; then
        echo "traces.sh: could not import $f (the line above says why)" >&2
        exit 2
      fi
      if [ -f "$out" ]; then
        made="$out"
      else
        made=$(printf '%s\n' "$outdir/$name".dev*.csv)
      fi
      if [ -n "${csv_of[$name]:-}" ]; then
        echo "  $name -> $(echo $made) (replaces the shipped trace of that name)" >&2
      else
        names+=("$name")
        echo "  $name -> $(echo $made)" >&2
      fi
      csv_of[$name]=$made
    done
  fi
fi

for name in ${names[@]+"${names[@]}"}; do
  printf '%s\n' "${csv_of[$name]}"
done
