#!/usr/bin/env bash
# The figures of docs/known_homes_planners.md: the Embodied-RAG and NavProbe comparison planners
# against nearest frontier and TrajRAG (as shipped: with the frontier value) on procedural val
# homes, once with the default memory (train homes only: every evaluated home is unseen) and once
# with a memory of WALKS earlier walks of each evaluated home (corpus policies, episode seed
# CORPUS_SEED: other episodes than the evaluated ones; labels *-known).
#
#   jobs/known_homes_planners.sh [OUT]     (default OUT: runs/known_homes)
#
# BASE is a `make run` folder (default runs/default): its memory is the default memory, its
# encoder and value are TrajRAG's in both settings (the known-home memory's chunks are embedded
# with that encoder at start-up). Each eval resumes; `trajrag compare` then pairs every run with
# nearest frontier (OUT/compare.json) and the known-home planners with TrajRAG on the same memory
# (OUT/compare_known.json), and jobs/known_homes_stats.py counts retrievals, their milliseconds and
# the forests' size (OUT/stats.json). Environment: BASE, HOMES (default 10), PER_HOME (default 3), WALKS
# (default 5), CORPUS_SEED (default 4711), WORLD (more --set options for every run; default
# 320x240 frames, as `make run`).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-runs/known_homes}
BASE=${BASE:-runs/default}
HOMES=${HOMES:-10}
PER_HOME=${PER_HOME:-3}
WALKS=${WALKS:-5}
CORPUS_SEED=${CORPUS_SEED:-4711}
read -r -a WORLD_ARGS <<< "${WORLD:---set sim.width=320 --set sim.height=240}"
for need in "$BASE/memory" "$BASE/model" "$BASE/value.json"; do
  [ -e "$need" ] || { echo "no $need: run 'make run' first, or set BASE" >&2; exit 2; }
done
source jobs/steps.sh  # T, say, run, step

SCENES=procedural:val:$HOMES
K=$OUT/K
step "$K.done" memory-known bash -c "$T corpus build --scenes $SCENES --episodes-per-scene $WALKS --policy mix \
  --store '$K' --seed $CORPUS_SEED --json ${WORLD_ARGS[*]} && touch '$K.done'"

EVAL=(--scenes "$SCENES" --episodes "generated:$PER_HOME" --model "$BASE/model" --out "$OUT/eval"
      --set "scoring.value_model=$BASE/value.json" "${WORLD_ARGS[@]}" --json)
run eval-unseen $T eval --planner frontier,trajrag,embodied-rag,navprobe --store "$BASE/memory" "${EVAL[@]}"
for planner in trajrag embodied-rag navprobe; do
  run "eval-$planner-known" $T eval --planner "$planner" --label "$planner-known" --store "$K" \
    --set retrieval.embed_missing=true "${EVAL[@]}"
done
# TrajRAG with the remembered goal projected where it recognises the place (docs/results.md, "Homes
# the memory has seen": its best setting there).
run eval-trajrag-known-goal $T eval --planner trajrag --label trajrag-known-goal --store "$K" \
  --set retrieval.embed_missing=true --set retrieval.project_goal=true --set memory.min_inliers=3 "${EVAL[@]}"
run compare bash -c "$T compare '$OUT/eval' --baseline frontier --json > '$OUT/compare.json'"
run compare-known bash -c "$T compare '$OUT/eval' --baseline trajrag-known \
  --runs embodied-rag-known,navprobe-known,trajrag-known-goal --json > '$OUT/compare_known.json'"
run stats bash -c ".venv/bin/python jobs/known_homes_stats.py '$OUT' > '$OUT/stats.json'"
say "done: $OUT/compare.json, $OUT/compare_known.json, $OUT/stats.json"
