#!/usr/bin/env bash
# The tspemu command's BLAS kernel selection, end to end (the real binary, which re-executes
# itself): with OpenBLAS forced onto its Prescott fallback, TSPEMU_BLAS_AUTO=0 keeps it and says
# so, TSPEMU_BLAS_AUTO=force selects the processor's best core and says so; both runs pass with the
# same traffic, memory and per-tensor verdicts (their errors differ only by the kernels' rounding).
# Exit 77 (skipped) on a processor with no core better than Prescott.
# Usage: blas_selection.sh TSPEMU
set -u
tspemu=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "blas_selection.sh: FAILED: $*" >&2; exit 1; }
small=(run -q --layers 1 --seq 256 --hidden 64 --heads 4 --kv-heads 4 --ffn 128 --vocab 64)
run_with() {  # NAME ENV...: the report in $dir/NAME.txt, the JSON in $dir/NAME.json
  local name=$1; shift
  env -u OPENBLAS_CORETYPE -u TSPEMU_BLAS_AUTO -u TSPEMU_BLAS_DETECTED -u TSPEMU_BLAS_REJECTED \
    "$@" "$tspemu" "${small[@]}" --json "$dir/$name.json" >"$dir/$name.txt" 2>&1 ||
    fail "$* tspemu ${small[*]}: exit $?: $(cat "$dir/$name.txt")"
}

run_with kept OPENBLAS_CORETYPE=Prescott TSPEMU_BLAS_AUTO=0
kept=$(sed -n 's/^blas: //p' "$dir/kept.txt")
case $kept in
  *" Prescott (OPENBLAS_CORETYPE=Prescott; processor supports "*")") ;;
  *" Prescott (OPENBLAS_CORETYPE=Prescott)") echo "no core better than Prescott here"; exit 77 ;;
  *) fail "forced Prescott, TSPEMU_BLAS_AUTO=0: report says <blas: $kept>" ;;
esac
best=${kept##*processor supports }
best=${best%)}

run_with selected OPENBLAS_CORETYPE=Prescott TSPEMU_BLAS_AUTO=force
selected=$(sed -n 's/^blas: //p' "$dir/selected.txt")
[ "$selected" = "${kept%% Prescott (*} $best (selected; detected Prescott)" ] ||
  fail "forced Prescott, TSPEMU_BLAS_AUTO=force: report says <blas: $selected>, want $best selected"

python3 - "$dir/kept.json" "$dir/selected.json" "$kept" "$selected" <<'PY' ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
if a["blas"] != sys.argv[3] or b["blas"] != sys.argv[4]:
    sys.exit(f"JSON blas {a['blas']!r} / {b['blas']!r} differ from the reports' lines")
if a["verdict"] != "pass" or b["verdict"] != "pass":
    sys.exit(f"verdicts {a['verdict']} / {b['verdict']}")
PY
  fail "the JSON reports (above)"
# Equal but for timings, the kernel's name and the error values, which differ by rounding.
python3 "$(dirname "$0")/same_json.py" "$dir/kept.json" "$dir/selected.json" \
  seconds tokens_per_s time blas _err bound max_err_ratio ||
  fail "the two kernels' runs differ (above)"
echo "kept: $kept"
echo "selected: $selected"
