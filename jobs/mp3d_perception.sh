#!/usr/bin/env bash
# The calibrated detector on Matterport3D homes (docs/results.md "Perception as it is in the field",
# "On Matterport3D homes"): nearest frontier and TrajRAG as shipped on the held-out MP3D scans, with
# exact semantics, with the calibrated detector and its defences (evidence in the map, verification
# before STOP), and with the detector and no defences (runs in OUT/eval); then `trajrag compare`
# against nearest frontier with the detector and defences (OUT/compare.md).
#
#   jobs/mp3d_perception.sh [OUT] [MP3D_RUN]    (defaults: runs/mp3d_perception, runs/mp3d)
#
# MP3D_RUN is a finished `jobs/mp3d_eval.sh` folder: its memory (M), encoder (E) and frontier value
# (value.json) of the @rest scans serve TrajRAG here, so the held-out scans stay unseen. Every eval
# resumes episode by episode. Environment: PER_SCAN (episodes per held-out scan, default 10: the
# first 10 of the MP3D table's 23), SEED (default 0), WORKERS (default 1: in this process), MP3D (the
# scans folder), WORLD (more --set options for every run; default 320x240 frames).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-runs/mp3d_perception}
MP3D_RUN=${2:-runs/mp3d}
PER_SCAN=${PER_SCAN:-10}
SEED=${SEED:-0}
WORKERS=${WORKERS:-1}
MP3D=${MP3D:-${TRAJRAG_SHARED_DATA:-../shared/data}/mp3d-bev/scenes}
read -r -a WORLD_ARGS <<< "${WORLD:---set sim.width=320 --set sim.height=240}"
[ -d "$MP3D" ] || { echo "no MP3D scans at $MP3D (set MP3D=...)" >&2; exit 2; }
for artefact in M E/encoder.json value.json; do
  [ -e "$MP3D_RUN/$artefact" ] || { echo "no $MP3D_RUN/$artefact: run jobs/mp3d_eval.sh $MP3D_RUN first" >&2; exit 2; }
done
source jobs/steps.sh  # T, say, run

common=(--scenes "$MP3D@held_out" --episodes "generated:$PER_SCAN:$SEED" --out "$OUT/eval" --json "${WORLD_ARGS[@]}")
[ "$WORKERS" -gt 1 ] && common+=(--workers "$WORKERS")
trajrag=(--planner trajrag --store "$MP3D_RUN/M" --model "$MP3D_RUN/E" --set "scoring.value_model=$MP3D_RUN/value.json")
detector=(--preset perception_calibrated)
no_defences=(--preset perception_calibrated --preset perception_unverified)

run frontier $T eval "${common[@]}" --planner frontier "${detector[@]}"
run frontier-unverified $T eval "${common[@]}" --planner frontier --label frontier-unverified "${no_defences[@]}"
run trajrag $T eval "${common[@]}" "${trajrag[@]}" --label trajrag "${detector[@]}"
run trajrag-unverified $T eval "${common[@]}" "${trajrag[@]}" --label trajrag-unverified "${no_defences[@]}"
run trajrag-oracle $T eval "${common[@]}" "${trajrag[@]}" --label trajrag-oracle
run frontier-oracle $T eval "${common[@]}" --planner frontier --label frontier-oracle-semantics
$T compare "$OUT/eval" --baseline frontier | tee "$OUT/compare.md"
