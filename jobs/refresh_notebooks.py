"""Execute the notebooks of ``notebooks/`` top to bottom and write them back with their outputs.

    PYTHONPATH=platform .venv/bin/python jobs/refresh_notebooks.py [NAME ...] [--set NAME.PARAM=VALUE]

Every notebook runs in a fresh kernel from the repository root, on this checkout's code, so the
committed figures come from the code of the commit that holds them. ``--set 05_results.BASELINE=...``
replaces a value of a notebook's parameter cell (the cell tagged ``parameters``; VALUE is a
Python literal) through a cell inserted after it, as papermill does. What the notebooks build
small (their ``WORK`` parameter) goes to one fresh temporary folder per refresh, so no memory or
evaluation made by older code reaches the figures. ``tests/test_notebooks.py`` runs the same
``execute`` on small parameters.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
# A cell tagged so must leave at least one PNG: the figure it exists for.
FIGURE_TAG = "figure"
# The parameter naming the folder a notebook builds its small runs in (refreshed: a fresh one).
WORK_PARAMETER = "WORK"
# Seconds one cell may run: the longest is a quick bench or a small memory build on 2 busy cores.
CELL_TIMEOUT_S = 900


def notebook_paths(names: list[str] | None = None) -> list[Path]:
    """``notebooks/*.ipynb`` in order, or those whose stem starts with one of ``names``."""
    paths = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in names)]
    return paths


def _parameter_cell(nb: nbformat.NotebookNode) -> int:
    index = next((i for i, c in enumerate(nb.cells) if PARAMETERS_TAG in c.metadata.get("tags", [])), None)
    if index is None:
        raise ValueError("notebook has no cell tagged 'parameters'")
    return index


def parameter_names(nb: nbformat.NotebookNode) -> set[str]:
    """The names the notebook's parameter cell assigns."""
    return {t.id for node in ast.parse(nb.cells[_parameter_cell(nb)].source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def inject_parameters(nb: nbformat.NotebookNode, parameters: dict) -> None:
    """Insert ``NAME = repr(VALUE)`` lines after the notebook's parameter cell (ValueError
    when it has none or when a name is not one of its parameters: a typo would run silently)."""
    index, known = _parameter_cell(nb), parameter_names(nb)
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; the parameter cell sets {sorted(known)}")
    source = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
    nb.cells.insert(index + 1, cell)


def execute(path: Path, parameters: dict | None = None, timeout: int = CELL_TIMEOUT_S) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` in a fresh kernel from the repository root; return it with its
    outputs (nbclient raises ``CellExecutionError`` on the first cell that fails)."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if INJECTED_TAG not in c.metadata.get("tags", [])]
    if parameters:
        inject_parameters(nb, parameters)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO)}}).execute()
    return nb


def missing_figures(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the cells tagged ``figure`` that left no PNG."""
    return [i for i, cell in enumerate(nb.cells)
            if FIGURE_TAG in cell.metadata.get("tags", [])
            and not any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))]


def logged_lines(nb: nbformat.NotebookNode) -> dict[int, str]:
    """Cell index -> the first warning or log text a cell left among its outputs (stderr): a
    committed notebook shows what it draws and prints, not its libraries' notes."""
    logged: dict[int, str] = {}
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                logged.setdefault(i, out["text"][:300])
    return logged


def _parse_sets(values: list[str]) -> dict[str, dict]:
    """``NAME.PARAM=VALUE`` options -> {notebook prefix: {param: value}}."""
    sets: dict[str, dict] = {}
    for item in values:
        key, sep, value = item.partition("=")
        notebook, dot, param = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set {item!r}: expected NOTEBOOK.PARAM=VALUE, e.g. 05_results.EVAL_FOLDERS=['runs/mp3d/six']")
        try:
            sets.setdefault(notebook, {})[param] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            sets.setdefault(notebook, {})[param] = value  # a bare string
    return sets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 05_results (default: all)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NOTEBOOK.PARAM=VALUE",
                        help="replace a parameter of one notebook (a Python literal)")
    args = parser.parse_args(argv)
    sets = _parse_sets(args.sets)
    paths = notebook_paths(args.names)
    if not paths:
        raise SystemExit(f"no notebook in {NOTEBOOKS} matches {args.names}")
    # What the notebooks build small (memory, evaluation, sweep) goes to one fresh folder shared by
    # this refresh: nothing built by older code is read back into the committed figures.
    with tempfile.TemporaryDirectory(prefix="trajrag-notebooks-") as work:
        for path in paths:
            started = time.perf_counter()
            parameters = {k: v for prefix, values in sets.items() if path.stem.startswith(prefix)
                          for k, v in values.items()}
            if WORK_PARAMETER in parameter_names(nbformat.read(path, as_version=4)):
                parameters.setdefault(WORK_PARAMETER, work)
            try:
                nb = execute(path, parameters)
            except ValueError as exc:  # a --set naming no parameter of this notebook
                raise SystemExit(f"{path.name}: {exc}") from None
            missing = missing_figures(nb)
            if missing:
                raise SystemExit(f"{path.name}: cells {missing} are tagged 'figure' and drew none")
            logged = logged_lines(nb)
            if logged:
                raise SystemExit(f"{path.name}: not written, warnings or log lines among the outputs: {logged}")
            nbformat.write(nb, path)
            print(f"{path.relative_to(REPO)}: {time.perf_counter() - started:.0f} s, "
                  f"{path.stat().st_size / 1024:.0f} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
