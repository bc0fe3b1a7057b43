# Shared by the jobs/*.sh scripts (sourced from the repository root, after they set OUT).
# T: the trajrag command of the project's .venv.
# say MSG: a timestamped line on stdout and in OUT/logs/progress.
# run LOG CMD...: CMD with its output in OUT/logs/LOG.out and .err; a failure stops the job and names the log.
# step DONE LOG CMD...: run, unless DONE (the file the command writes last) exists.
# memory_encoder_value SCENES [corpus build options...]: a memory of SCENES (WALKS walks each, WORKERS
#   collectors) in OUT/M, its encoder in OUT/E with the embeddings written back and the held-out
#   recall in OUT/E/eval.json, and the frontier value fitted on its walks' decisions in OUT/value.json;
#   sets M, E and V to those paths.
T=.venv/bin/trajrag
[ -x "$T" ] || { echo "no $T: run 'make test' or 'make run' once to build .venv" >&2; exit 2; }
mkdir -p "$OUT/logs"
say() { echo "$(date +%H:%M:%S) $*" | tee -a "$OUT/logs/progress"; }
run() {
  local log=$1; shift
  "$@" > "$OUT/logs/$log.out" 2> "$OUT/logs/$log.err" || { echo "failed: $* (see $OUT/logs/$log.err)" >&2; exit 1; }
  say "$log"
}
step() { local done=$1; shift; [ -e "$done" ] || run "$@"; }
memory_encoder_value() {
  local scenes=$1; shift
  M=$OUT/M; E=$OUT/E; V=$OUT/value.json
  step "$M.done" memory bash -c "$T corpus build --scenes '$scenes' --episodes-per-scene $WALKS --policy mix \
    --store '$M' --workers $WORKERS --json $* && touch '$M.done'"
  step "$E/encoder.json" encoder $T encoder train --store "$M" --out "$E" --workers "$WORKERS"
  step "$E/eval.json" encoder-eval bash -c "$T encoder eval --store '$M' --model '$E' --json > '$E/eval.json.tmp' \
    && mv '$E/eval.json.tmp' '$E/eval.json'"
  step "$V" value $T value fit --store "$M" --out "$V" --json
}
