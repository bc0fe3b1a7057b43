# Shared by the jobs/*.sh scripts (sourced, after they set OUT): logged, resumable steps.
# say MSG: a timestamped line on stdout and in OUT/logs/progress.
# run LOG CMD...: CMD with its output in OUT/logs/LOG.out and .err; a failure stops the job and names the log.
# step DONE LOG CMD...: run, unless DONE (the file the command writes last) exists.
mkdir -p "$OUT/logs"
say() { echo "$(date +%H:%M:%S) $*" | tee -a "$OUT/logs/progress"; }
run() {
  local log=$1; shift
  "$@" > "$OUT/logs/$log.out" 2> "$OUT/logs/$log.err" || { echo "failed: $* (see $OUT/logs/$log.err)" >&2; exit 1; }
  say "$log"
}
step() { local done=$1; shift; [ -e "$done" ] || run "$@"; }
