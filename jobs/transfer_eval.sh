#!/usr/bin/env bash
# Memories across datasets (docs/notes/2026-12-06-mp3d-homes.md "Memories across datasets", the paper's Table 4 question):
# TrajRAG as the paper scores (no value) with the memory and encoder of the other dataset, next to
# the in-dataset one, on the same held-out episodes. Needs the outputs of jobs/mp3d_eval.sh (MP3D)
# and jobs/perception_curves.sh (GIBSON_RUN: its Gibson @rest memory and encoder).
#
#   jobs/transfer_eval.sh [MP3D_RUN] [GIBSON_RUN] [OUT]   (defaults: runs/mp3d runs/perception runs/transfer)
#
# On MP3D the Gibson-memory run joins MP3D_RUN/six/O0 (its first PER_SCAN episodes per scan pair with
# the table's); on Gibson, OUT/gibson holds nearest frontier and both memories on the 5 held-out
# scenes x PER_SCENE. Environment: WORKERS (2), PER_SCAN (8), PER_SCENE (10), WORLD (as the jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
MP3D_RUN=${1:-runs/mp3d}; GIBSON_RUN=${2:-runs/perception}; OUT=${3:-runs/transfer}
WORKERS=${WORKERS:-2}; PER_SCAN=${PER_SCAN:-8}; PER_SCENE=${PER_SCENE:-10}
MP3D=${MP3D:-${TRAJRAG_SHARED_DATA:-../shared/data}/mp3d-bev/scenes}
GIBSON=${GIBSON:-${TRAJRAG_SHARED_DATA:-../shared/data}/gibson-objectnav-v1.1/train/train_info.pbz2}
read -r -a WORLD_ARGS <<< "${WORLD:---set sim.width=320 --set sim.height=240}"
T=.venv/bin/trajrag
mkdir -p "$OUT"
common=(--workers "$WORKERS" --json "${WORLD_ARGS[@]}" --planner trajrag)
$T eval --scenes "$MP3D@held_out" --episodes "generated:$PER_SCAN:0" --out "$MP3D_RUN/six/O0" "${common[@]}" \
  --label trajrag-paper-gibson-memory --store "$GIBSON_RUN/M" --model "$GIBSON_RUN/E" > "$OUT/mp3d.json"
g=(--scenes "$GIBSON@held_out" --episodes "generated:$PER_SCENE:0" --out "$OUT/gibson" --workers "$WORKERS" --json
   "${WORLD_ARGS[@]}")
$T eval "${g[@]}" --planner frontier > /dev/null
$T eval "${g[@]}" --planner trajrag --label trajrag-paper --store "$GIBSON_RUN/M" --model "$GIBSON_RUN/E" > /dev/null
$T eval "${g[@]}" --planner trajrag --label trajrag-paper-mp3d-memory --store "$MP3D_RUN/M" --model "$MP3D_RUN/E" \
  > "$OUT/gibson.json"
$T compare "$MP3D_RUN/six/O0" --baseline trajrag-paper --runs trajrag-paper-gibson-memory | tee "$OUT/compare-mp3d.md"
$T compare "$OUT/gibson" --baseline trajrag-paper --runs trajrag-paper-mp3d-memory | tee "$OUT/compare-gibson.md"
