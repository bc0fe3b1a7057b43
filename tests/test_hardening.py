"""Edges a new user runs into (issue 49): output paths that cannot be written, hostile pickles that
ask for huge allocations, rejected walks walked twice, the small-store dead end, noisy stderr."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trajrag.cli import main


def _tree(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` with its size (folders: -1)."""
    return {str(p.relative_to(root)): (-1 if p.is_dir() else p.stat().st_size) for p in sorted(root.rglob("*"))}


# {file}: an existing file, {dir}: an existing folder (holding one file), both in a scratch folder.
CLASHES = [
    ("corpus build --scenes procedural:train:1 --episodes-per-scene 1 --store {file}", "--store"),
    ("corpus build --scenes procedural:train:1 --episodes-per-scene 1 --store {file}/memory", "--store"),
    ("corpus regroup --store {dir} --out {file}", "--out"),
    ("corpus show --store {dir} --out {dir}", "--out"),
    ("encoder train --store {dir} --out {file}", "--out"),
    ("encoder cv --store {dir} --out {file}", "--out"),
    ("eval --scenes procedural:val:1 --episodes generated:1 --planner frontier --out {file}", "--out"),
    ("eval --scenes procedural:val:1 --episodes generated:1 --planner trajrag --store {file} --model {dir} "
     "--out {scratch}/eval", "--store"),
    ("value fit --store {dir} --out {dir}", "--out"),
    ("value fit --scenes procedural:train:1 --episodes generated:1 --out {scratch}/v.json "
     "--save-decisions {dir}", "--save-decisions"),
    ("run --out {file}", "--out"),
    ("compare {dir} --pictures {file} --scenes procedural:val:1", "--pictures"),
    ("bench perception --curves {file}", "--curves"),
]


@pytest.mark.parametrize("command, option", CLASHES, ids=[c.split(" --")[0] + " " + o for c, o in CLASHES])
def test_an_output_path_that_cannot_be_written_is_one_line_and_writes_nothing(command, option, tmp_path, capsys):
    scratch = tmp_path / "scratch"
    (scratch / "folder").mkdir(parents=True)
    (scratch / "folder" / "kept.txt").write_text("kept")
    (scratch / "file").write_text("a file")
    before = _tree(tmp_path)
    argv = command.format(file=scratch / "file", dir=scratch / "folder", scratch=scratch).split()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err and "Traceback" not in err
    assert _tree(tmp_path) == before
