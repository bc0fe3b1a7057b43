#!/usr/bin/env bash
# The Gibson cross-validation of docs/results.md (history: docs/notes/2026-12-02-value-dagger-gibson.md,
# "The cross-validation again, with crop positives by default"): TrajRAG (scoring planner + a frontier value fitted on procedural homes only)
# against nearest frontier on unseen Gibson homes, every one of the 25 train scenes held out once.
#
#   jobs/gibson_crossval.sh [OUT]          (default OUT: runs/gibson_cv; relative paths are from the repo root)
#
# 1. The frontier value: nearest-frontier walks in 440 procedural train homes, their decisions
#    fitted into OUT/value/V_P.json (+ its experience table). It never sees a Gibson scene, so one
#    file serves every fold.
# 2. Per fold k (configs/presets/gibson_foldK.yaml): a memory built from the 20 other scenes
#    (OUT/Fk/M), its encoder (OUT/Fk/E) and the encoder's embeddings written into the memory
#    (with its held-out recall, OUT/Fk/E/eval.json).
# 3. Per fold and episode seed: both planners on the 5 held-out scenes x 10 episodes
#    (OUT/Fk/O<seed>), then `trajrag compare` pools the 15 folders: 750 paired episodes, and draws
#    the episodes TrajRAG lost and won against nearest frontier (OUT/pictures/LABEL-vs-frontier).
#
# Every step skips what an earlier run finished (evaluations resume episode by episode), so the
# same command continues after an interruption. On 2 cores: about 90 minutes (decisions 40,
# memories and encoders 20, evaluations 35). Environment:
#   WORKERS  Ray actors per step (default 2)        SEEDS  episode seeds (default "0 1 2")
#   GIBSON   the Gibson train_info.pbz2 (default ../shared/data/gibson-objectnav-v1.1/train/train_info.pbz2)
#   LABEL    the TrajRAG run's name (default trajrag)
#   WALKS    corpus walks per training scene in each fold's memory (default 30); a copy of a smaller
#            fold memory grows to this (the build skips the episodes it already holds)
#   EXTRA    more `--set section.key=value` options for the TrajRAG runs only (a variant to compare)
#   WORLD    more `--set section.key=value` options for both planners' runs (a world setting, e.g.
#            "--set episodes.goal_region=line_of_sight"; use a new OUT, the episodes differ)
#   ROLLOUT_HOMES  refine V_P on its own rollouts before the evaluations (default 0: off): the value
#            planner walks this many procedural train homes from 400 on (2 episodes each), each
#            candidate of 3 decisions a walk costed by the metres walked to success after taking
#            it; fitted with V_P as prior into OUT/value/VR.json, which TrajRAG then uses (with
#            V_P's experience table). docs/notes/2026-12-02-value-dagger-gibson.md, "The value refined on its own rollouts":
#            120 homes gave +0.6 SPL, too few to tell; thousands need a cluster, about 21
#            core-seconds a decision: WORKERS=64 ROLLOUT_HOMES=2000 RAY_ADDRESS=auto, and a LABEL
#            of its own (a label keeps the settings it was first run with). An interrupted walk
#            resumes with the homes it had not finished (`value fit --save-decisions` keeps each)
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-runs/gibson_cv}
WORKERS=${WORKERS:-2}
SEEDS=${SEEDS:-0 1 2}
GIBSON=${GIBSON:-${TRAJRAG_SHARED_DATA:-../shared/data}/gibson-objectnav-v1.1/train/train_info.pbz2}
LABEL=${LABEL:-trajrag}
WALKS=${WALKS:-30}
ROLLOUT_HOMES=${ROLLOUT_HOMES:-0}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
read -r -a WORLD_ARGS <<< "${WORLD:-}"
[ -f "$GIBSON" ] || { echo "no Gibson file at $GIBSON (set GIBSON=...)" >&2; exit 2; }
mkdir -p "$OUT/value"
source jobs/steps.sh  # T, say, run, step

V=$OUT/value
walk() {  # nearest-frontier walks in procedural homes, their decisions kept for the fit
  step "$V/$1.npz" "decisions-$1" $T value fit --scenes "$2" --episodes "$3" --out "$V/$1.json" \
    --save-decisions "$V/$1.npz" --workers "$WORKERS" --json
}
walk D_A procedural:train:0-20 generated:5
walk D_B procedural:train:20-40 generated:5
walk DP procedural:train:100 generated:5:11
walk DP2 procedural:train:100-400 generated:2:11
step "$V/V_P.json" value-fit $T value fit --decisions "$V/DP.npz,$V/DP2.npz,$V/D_A.npz,$V/D_B.npz" \
  --out "$V/V_P.json" --json
VALUE=$V/V_P.json
if [ "$ROLLOUT_HOMES" -gt 0 ]; then
  R=$V/R$ROLLOUT_HOMES
  step "$R.npz" "rollouts-$ROLLOUT_HOMES" $T value fit --scenes "procedural:train:400-$((400 + ROLLOUT_HOMES))" \
    --episodes generated:2:21 --set value.target=rollout --set value.walker=value \
    --set "scoring.value_model=$V/V_P.json" --save-decisions "$R.npz" --out "$R.json" --workers "$WORKERS" --json
  # l2 0.1: chosen by cross-fitted regret on the 618 rollout decisions of docs/notes/2026-12-02-value-dagger-gibson.md. The
  # experience table stays V_P's: the refit keeps V_P's standardisation, and its own table would
  # hold only the rollout decisions, whose "metres behind" are whole walks, not one decision's.
  step "$V/VR$ROLLOUT_HOMES.experience" "value-refit-$ROLLOUT_HOMES" bash -c "$T value fit --decisions '$R.npz' \
    --out '$V/VR$ROLLOUT_HOMES.json' --set 'value.prior_model=$V/V_P.json' --set value.l2=0.1 --json \
    && rm -rf '$V/VR$ROLLOUT_HOMES.experience' && ln -s V_P.experience '$V/VR$ROLLOUT_HOMES.experience'"
  VALUE=$V/VR$ROLLOUT_HOMES.json
fi

for k in 0 1 2 3 4; do
  F=$OUT/F$k
  step "$F/M.done" "memory-F$k" bash -c "$T corpus build --scenes '$GIBSON@rest' --episodes-per-scene $WALKS \
    --policy mix --store '$F/M' --workers $WORKERS --json --preset gibson_fold$k && touch '$F/M.done'"
  step "$F/E/encoder.json" "encoder-F$k" $T encoder train --store "$F/M" --out "$F/E" --workers "$WORKERS" \
    --preset "gibson_fold$k"
  # writes the trained embeddings into the memory's chunks (TrajRAG retrieves by them) and its recall
  step "$F/E/eval.json" "encoder-eval-F$k" bash -c "$T encoder eval --store '$F/M' --model '$F/E' --json \
    --preset gibson_fold$k > '$F/E/eval.json.tmp' && mv '$F/E/eval.json.tmp' '$F/E/eval.json'"
done

for seed in $SEEDS; do
  for k in 0 1 2 3 4; do
    F=$OUT/F$k; common=(--scenes "$GIBSON@held_out" --episodes "generated:10:$seed" --out "$F/O$seed"
                       --workers "$WORKERS" --json --preset "gibson_fold$k" "${WORLD_ARGS[@]}")
    # Evaluations resume episode by episode, so they always run (a finished one only summarises).
    run "eval-F$k-O$seed-frontier" $T eval "${common[@]}" --planner frontier
    run "eval-F$k-O$seed-$LABEL" $T eval "${common[@]}" --planner trajrag \
      --label "$LABEL" --store "$F/M" --model "$F/E" --set "scoring.value_model=$VALUE" "${EXTRA_ARGS[@]}"
  done
done

folders=(); for seed in $SEEDS; do for k in 0 1 2 3 4; do folders+=("$OUT/F$k/O$seed"); done; done
$T compare "${folders[@]}" --baseline frontier --runs "$LABEL" --pictures "$OUT/pictures" --scenes "$GIBSON" \
  | tee "$OUT/compare-$LABEL.md"
