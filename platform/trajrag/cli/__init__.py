"""The ``trajrag`` command line: one subcommand module per capability.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its subcommand
and sets ``func`` on the parsed namespace. A command with ``--set`` / ``--preset`` finds its whole
configuration, loaded once, in ``args.settings`` (``apply_presets``) and hands it down. Errors a
user can fix (bad files, bad config) exit with status 2 and one clear line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from trajrag import config
from trajrag.errors import ConfigError, UserError

COMMAND_MODULES = (
    "trajrag.cli.run",
    "trajrag.cli.episodes",
    "trajrag.cli.corpus",
    "trajrag.cli.bench",
    "trajrag.cli.encoder",
    "trajrag.cli.eval",
    "trajrag.cli.compare",
    "trajrag.cli.value",
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by the user's input (bad files, specs, configs): no traceback for these."""
    from trajrag.agent.run_claims import RunClaimedError, RunSettingsError
    from trajrag.agent.run_records import RecordsError
    from trajrag.agent.value_parts import ValueWalkError
    from trajrag.memory.store import StoreError
    from trajrag.planners.chat import ChatError
    from trajrag.planners.frontier_value import ValueModelError
    from trajrag.planners.llm import LLMPlannerError
    from trajrag.retrieval.experience import ExperienceError
    from trajrag.world.datasets import DATA_ERRORS

    return (UserError, ConfigError, FileNotFoundError, StoreError, ValueModelError, RunSettingsError,
            RunClaimedError, RecordsError, ExperienceError, ChatError, LLMPlannerError, ValueWalkError, *DATA_ERRORS)


def output_folder(path: str | Path, option: str) -> None:
    """Refuse (``UserError``) a folder a command would write into that cannot be one: an existing
    file at ``path`` or above it. Called before the command reads or writes anything, so a refused
    command leaves nothing behind. Object-store URIs (``s3://...``) are not checked."""
    if "://" in str(path):
        return
    if Path(path).exists() and not Path(path).is_dir():
        raise UserError(f"{option} {path} is a file: give a folder")
    _parents_are_folders(Path(path), option)


def output_file(path: str | Path, option: str) -> None:
    """Refuse (``UserError``) a file a command would write that cannot be one: an existing folder
    at ``path``, or a file above it; checked as ``output_folder`` is."""
    if Path(path).is_dir():
        raise UserError(f"{option} {path} is a folder: give a file name")
    _parents_are_folders(Path(path), option)


def _parents_are_folders(path: Path, option: str) -> None:
    """The nearest existing folder above ``path`` must be a folder, not a file."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{option} {path}: {parent} is a file, not a folder")
            return


def add_override_arg(parser: argparse.ArgumentParser) -> None:
    """The common ``--set section.key=value`` and ``--preset NAME`` options (repeatable)."""
    parser.add_argument(
        "--preset",
        dest="presets",
        action="append",
        default=[],
        metavar="NAME",
        help="apply configs/presets/NAME.yaml (a named set of overrides, e.g. home_groups); "
        "--set values win over it",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value from configs/<section>.yaml, e.g. --set sim.width=160",
    )


def apply_presets(args: argparse.Namespace) -> None:
    """Expand ``--preset`` names into ``args.overrides``, ahead of the ``--set`` ones, check every
    override (``config.check_overrides``: a section and key that exist, a value of its type; a
    command reads only the sections it uses, so an unchecked typo would be ignored silently), and
    make the command's configuration, ``args.settings`` (``config.Settings``): the one the
    command and everything below it read."""
    if not hasattr(args, "overrides"):  # a command without --set / --preset
        return
    if getattr(args, "presets", None):
        args.overrides = config.preset_overrides(args.presets) + args.overrides
        args.presets = []
    config.check_overrides(args.overrides)
    args.settings = config.settings(args.overrides)


def wants_progress(args: argparse.Namespace) -> bool:
    """Progress bars and stage lines on stderr: always without ``--json``, and with it only when
    stderr is a terminal (the JSON is on stdout either way; a log file or a pipe stays quiet)."""
    return not getattr(args, "json", False) or sys.stderr.isatty()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trajrag",
        description="TrajRAG: retrieval-augmented zero-shot ObjectNav on Ray. "
        "Every command runs offline on the embedded defaults (procedural homes, oracle semantics).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.progress = wants_progress(args)
    try:
        apply_presets(args)
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`trajrag ... --json | head`): stop quietly, as Unix tools do, with
        # stdout pointed at /dev/null so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 - user errors become one line, the rest re-raise
        if not isinstance(exc, _user_errors()):
            raise
        print(f"trajrag {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
