#!/usr/bin/env bash
# The Matterport3D results of docs/results.md ("Matterport3D homes"): planners on the held-out MP3D
# scans (configs/mp3d.yaml held_out_scans) with a memory, encoder and frontier value built from the
# other scans only.
#
#   jobs/mp3d_eval.sh [OUT]          (default OUT: runs/mp3d; relative paths are from the repo root)
#
# 1. A memory of the @rest scans (WALKS walks each, goals of MP3D's 21 categories so that the walks
#    see every goal), its encoder and the encoder's embeddings; the frontier value fitted on the
#    decisions the memory's exploration walks kept (`value fit --store`).
# 2. Per vocabulary (six: configs/episodes.yaml; 21: --preset mp3d21) and episode seed, on the
#    held-out scans x PER_SCAN episodes: nearest frontier, random frontier, the frontier oracle
#    (the ceiling of any frontier ranking), TrajRAG as the paper scores (no value: label
#    trajrag-paper) and TrajRAG with the value as shipped (label trajrag), then `trajrag compare`
#    with pictures of lost and won episodes.
#
# Every step skips what an earlier run finished, so the same command continues after an
# interruption. Environment: WORKERS (default 2), WALKS (default 12), PER_SCAN (default 23),
# SEEDS (default "0"), VOCABS (default "six mp3d21"), BASELINES (default
# "frontier,random,frontier-oracle"), MP3D (the scans folder, default
# ../shared/data/mp3d-bev/scenes), WORLD (more --set options for every run; default 320x240
# frames, as `make run`).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-runs/mp3d}
WORKERS=${WORKERS:-2}
WALKS=${WALKS:-12}
PER_SCAN=${PER_SCAN:-23}
SEEDS=${SEEDS:-0}
VOCABS=${VOCABS:-six mp3d21}
BASELINES=${BASELINES:-frontier,random,frontier-oracle}
MP3D=${MP3D:-${TRAJRAG_SHARED_DATA:-../shared/data}/mp3d-bev/scenes}
read -r -a WORLD_ARGS <<< "${WORLD:---set sim.width=320 --set sim.height=240}"
[ -d "$MP3D" ] || { echo "no MP3D scans at $MP3D (set MP3D=...)" >&2; exit 2; }
source jobs/steps.sh  # T, say, run, step, memory_encoder_value

memory_encoder_value "$MP3D@rest" --preset mp3d21 "${WORLD_ARGS[@]}"

for vocab in $VOCABS; do
  preset=(); [ "$vocab" = six ] || preset=(--preset "$vocab")
  for seed in $SEEDS; do
    O=$OUT/$vocab/O$seed
    common=(--scenes "$MP3D@held_out" --episodes "generated:$PER_SCAN:$seed" --out "$O" --workers "$WORKERS"
            --json "${preset[@]}" "${WORLD_ARGS[@]}")
    run "eval-$vocab-O$seed-baselines" $T eval "${common[@]}" --planner "$BASELINES"
    run "eval-$vocab-O$seed-trajrag-paper" $T eval "${common[@]}" --planner trajrag --label trajrag-paper \
      --store "$M" --model "$E"
    run "eval-$vocab-O$seed-trajrag" $T eval "${common[@]}" --planner trajrag --label trajrag \
      --store "$M" --model "$E" --set "scoring.value_model=$V"
  done
  folders=(); for seed in $SEEDS; do folders+=("$OUT/$vocab/O$seed"); done
  $T compare "${folders[@]}" --baseline frontier --runs trajrag --pictures "$OUT/pictures-$vocab" \
    --scenes "$MP3D" | tee "$OUT/compare-$vocab.md"
done
