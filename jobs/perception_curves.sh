#!/usr/bin/env bash
# The robustness curves of docs/results.md ("Perception as it is in the field"): nearest frontier and
# TrajRAG (scoring planner + the value as shipped) on the held-out Gibson scenes, at each error level
# of the calibrated detector profile, with the defences (evidence in the map, verification before
# STOP) and without them.
#
#   jobs/perception_curves.sh [OUT]          (default OUT: runs/perception)
#
# 1. A memory of the Gibson @rest scenes (WALKS walks each, oracle semantics: the corpus is the
#    record of past walks), its encoder and embeddings, and the frontier value fitted on the
#    decisions its exploration walks kept.
# 2. Per error level x (perception.error_scale of configs/presets/perception_calibrated.yaml; 0:
#    exact semantics) into OUT/level-x: frontier and trajrag with the preset as it is, and
#    frontier-unverified and trajrag-unverified with --preset perception_unverified after it.
# 3. `trajrag bench perception --curves OUT --json` prints the curves and the share of the SR the
#    errors cost that the defences win back, and draws OUT/curves.png.
#
# Every step skips what an earlier run finished (evaluations resume episode by episode).
# Environment: WORKERS (default 2), WALKS (default 15), PER_SCENE (default 10), LEVELS (default
# "0 0.5 1 2"), SEED (default 0), GIBSON (the train_info.pbz2), WORLD (more --set options for every
# run; default 320x240 frames, as `make run`).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-runs/perception}
WORKERS=${WORKERS:-2}
WALKS=${WALKS:-15}
PER_SCENE=${PER_SCENE:-10}
LEVELS=${LEVELS:-0 0.5 1 2}
SEED=${SEED:-0}
GIBSON=${GIBSON:-${TRAJRAG_SHARED_DATA:-../shared/data}/gibson-objectnav-v1.1/train/train_info.pbz2}
read -r -a WORLD_ARGS <<< "${WORLD:---set sim.width=320 --set sim.height=240}"
[ -f "$GIBSON" ] || { echo "no Gibson file at $GIBSON (set GIBSON=...)" >&2; exit 2; }
source jobs/steps.sh  # T, say, run, step, memory_encoder_value

memory_encoder_value "$GIBSON@rest" "${WORLD_ARGS[@]}"

for level in $LEVELS; do
  O=$OUT/level-$level
  # level 0: the defences on exact semantics (what they cost when nothing is wrong)
  profile=(--preset perception_calibrated --set "perception.error_scale=$level")
  [ "$level" = 0 ] && profile+=(--set perception.profile=oracle)
  common=(--scenes "$GIBSON@held_out" --episodes "generated:$PER_SCENE:$SEED" --out "$O" --workers "$WORKERS"
          --json "${WORLD_ARGS[@]}" "${profile[@]}")
  trajrag=(--planner trajrag --store "$M" --model "$E" --set "scoring.value_model=$V")
  run "eval-$level-frontier" $T eval "${common[@]}" --planner frontier
  run "eval-$level-frontier-unverified" $T eval "${common[@]}" --planner frontier --label frontier-unverified \
    --preset perception_unverified
  run "eval-$level-trajrag" $T eval "${common[@]}" "${trajrag[@]}" --label trajrag
  run "eval-$level-trajrag-unverified" $T eval "${common[@]}" "${trajrag[@]}" --label trajrag-unverified \
    --preset perception_unverified
done
$T bench perception --curves "$OUT" --json | tee "$OUT/curves.json"
