"""``trajrag encoder train|eval``: the trajectory encoder of the fine index.

* ``trajrag encoder train --store PATH --out MODEL_DIR [--workers N]``: contrastive training on
  Ray Train over the store's chunks (scenes held out for evaluation); writes MODEL_DIR.
* ``trajrag encoder eval --store PATH --model MODEL_DIR [--json] [--no-write]``: recall@1/5/10 on
  the held-out scenes for the trained encoder, the text baseline and the untrained encoder, and the
  trained encoder's paired difference to each with a bootstrap interval (one JSON object), then
  the trained embeddings written into the store's chunks (also when recall cannot be measured:
  ``recall_measured`` false and ``recall_not_measured_because``).
* ``trajrag encoder cv --store PATH --out DIR [--folds K]``: the same recall over K folds that
  hold out every scene once, pooled, with paired bootstrap intervals (``encoder.crossval``).

Both share ``trajrag.encoder.train.train_encoder`` / ``trajrag.encoder.evaluate.evaluate_encoder``
with ``jobs/train_encoder.py``.
"""

from __future__ import annotations

import argparse
import json
import sys

from trajrag.cli import UserError, add_override_arg, output_folder


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("encoder", help="train and evaluate the trajectory encoder")
    actions = parser.add_subparsers(dest="encoder_command", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train", help="contrastive training on Ray Train",
        description="Train the trajectory encoder (frozen node encoder + GPT-2 sequence model, "
        "InfoNCE) on the chunks of a memory store; scenes are held out for `encoder eval`. "
        "To fine-tune a trained model instead of starting from random weights: "
        "--set encoder.train.init_model=MODEL_DIR.")
    train.add_argument("--store", required=True, help="memory store URI (a LanceDB folder or s3://...)")
    train.add_argument("--out", required=True, help="model folder or object-store URI (s3://...) to write")
    train.add_argument("--workers", type=int, default=None,
                       help="Ray Train workers (default: encoder.train.workers)")
    train.add_argument("--json", action="store_true",
                       help="print one JSON object (progress only on a terminal's stderr)")
    add_override_arg(train)
    train.set_defaults(func=train_command)

    ev = actions.add_parser(
        "eval", help="held-out recall@k vs the text baseline and the untrained encoder",
        description="recall@1/5/10 of same-group chunks on the scenes the model was not trained "
        "on, for the trained encoder, the MiniLM text baseline and the untrained encoder, and the "
        "trained encoder's paired difference to each with a 95% bootstrap interval over queries "
        "(one split holds few queries: `encoder cv` pools every scene); then writes the trained "
        "embeddings into the store (unless --no-write), which `trajrag eval --planner trajrag` needs. "
        "A store too small to measure recall on (no held-out chunk shares its group with another) "
        "is still embedded: the JSON says recall_measured false and why.")
    ev.add_argument("--store", required=True, help="memory store URI")
    ev.add_argument("--model", required=True, help="model folder or URI written by `encoder train`")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--no-write", action="store_true", help="do not write embeddings into the store")
    add_override_arg(ev)
    ev.set_defaults(func=eval_command)

    cv = actions.add_parser(
        "cv", help="cross-validated recall: every scene held out once",
        description="Train one encoder per fold (encoder.train.fold I/K; the folds partition the "
        "store's scenes), evaluate each on its held-out scenes as `encoder eval` does, and pool "
        "the queries of all folds: recall@1/5/10 of the trained encoder, the text baseline and the "
        "untrained encoder, and the trained encoder's paired difference to each with a 95% "
        "bootstrap interval over queries. Writes <out>/fold-I model folders; never writes the store.")
    cv.add_argument("--store", required=True, help="memory store URI")
    cv.add_argument("--out", required=True, help="folder for the fold models")
    cv.add_argument("--folds", type=int, default=5, help="number of folds (default 5)")
    cv.add_argument("--workers", type=int, default=None,
                    help="Ray Train workers (default: encoder.train.workers)")
    cv.add_argument("--json", action="store_true",
                    help="print one JSON object (progress only on a terminal's stderr)")
    add_override_arg(cv)
    cv.set_defaults(func=cv_command)


def _user_error(exc: Exception) -> UserError:
    return UserError(str(exc))


def train_command(args: argparse.Namespace) -> int:
    from trajrag.encoder import EncoderError
    from trajrag.encoder.train import train_encoder

    output_folder(args.out, "--out")
    log = (lambda msg: print(msg, file=sys.stderr)) if args.progress else None
    try:
        result = train_encoder(args.store, args.out, args.settings.encoder, workers=args.workers, log=log)
    except EncoderError as exc:
        raise _user_error(exc) from None
    last = result.history[-1] if result.history else {}
    summary = {"model_dir": result.model_dir, "encoder_version": result.encoder_version,
               "epochs": result.epochs, "final_loss": last.get("loss"), "resumes": result.resumes,
               "train_chunks": result.train_chunks, "held_out_scenes": len(result.held_out_scenes),
               "seconds": round(result.seconds, 1), "run_path": result.run_path}
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


def eval_command(args: argparse.Namespace) -> int:
    from trajrag.encoder import EncoderError
    from trajrag.encoder.evaluate import evaluate_encoder

    try:
        result = evaluate_encoder(args.store, args.model, args.settings.encoder, write=not args.no_write)
    except EncoderError as exc:
        raise _user_error(exc) from None
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0


def cv_command(args: argparse.Namespace) -> int:
    from trajrag.encoder import EncoderError
    from trajrag.encoder.crossval import cross_validate

    output_folder(args.out, "--out")
    log = (lambda msg: print(msg, file=sys.stderr)) if args.progress else None
    try:
        result = cross_validate(args.store, args.out, args.folds, args.settings.encoder, workers=args.workers,
                                log=log)
    except EncoderError as exc:
        raise _user_error(exc) from None
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0
