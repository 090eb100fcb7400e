# Sourced by the benchmark scripts: run NAME ARGS... runs one compress command into $OUT/runs/NAME
# (its output in $OUT/runs/NAME.log), unless its summary.json (bench.json for a bench) or NAME.onnx
# is there already, so a stopped script can be run again. Needs OUT and PY.
run() {
  local name=$1; shift
  for marker in "$name/summary.json" "$name/bench.json" "$name.onnx"; do
    [ -f "$OUT/runs/$marker" ] && return 0
  done
  echo "$(date +%T) $name"
  "$PY" -m compress "$@" > "$OUT/runs/$name.log" 2>&1 || { tail -5 "$OUT/runs/$name.log"; exit 1; }
}
