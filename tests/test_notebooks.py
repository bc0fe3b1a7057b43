"""Every notebook of notebooks/ runs top to bottom headless on small parameters and draws its figures.

The notebooks are executed as ``jobs/refresh_notebooks.py`` executes them (a fresh kernel from the
repository root), with their parameter cell overridden: tiny renders, short episodes, a 1-home
memory built once under a temporary folder and shared by 03-05, no ``runs/`` folder read, and
06 measuring only the collectors. A cell that raises fails the test with its traceback; a cell
tagged ``figure`` that leaves no PNG fails it too, and so does a warning or log line among the outputs.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("refresh_notebooks", REPO / "jobs" / "refresh_notebooks.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)

# The quick bench's renders (configs/pipeline_bench.yaml quick_overrides): mapping still works.
TINY_SIM = ["sim.width=64", "sim.height=48", "mapping.pixel_stride=1"]
# No `make run` output is read: the notebooks build what they show.
NO_RUN = "runs/none-for-the-notebook-test"
# Cells per notebook: one small kernel each, the shared memory built by the first that needs it.
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """The parameters 03-06 share: a memory of 3 oracle walks in one train home under a temp folder."""
    return {"RUN": NO_RUN, "WORK": str(tmp_path_factory.mktemp("notebooks")),
            "SMALL_SCENES": "procedural:train:1", "SMALL_EPISODES": 3, "OVERRIDES": TINY_SIM, "FIG_DPI": 40}


def parameters(stem: str, small: dict) -> dict:
    if stem.startswith("01"):
        return {"OVERRIDES": TINY_SIM, "MAX_STEPS": 60, "SNAPSHOTS": 2, "FIG_DPI": 40}
    if stem.startswith("02"):
        return {"OVERRIDES": TINY_SIM, "MAX_STEPS": 80, "FIG_DPI": 40}
    if stem.startswith("03"):
        return small
    if stem.startswith("04"):
        return {**small, "MAX_STEPS": 60}
    if stem.startswith("05"):
        return {**small, "SMALL_EVAL_SCENES": "procedural:val:1", "SMALL_EVAL_EPISODES": "generated:1",
                "SMALL_AGENTS": ["trajrag", "frontier"], "MAX_STEPS": 40}
    if stem.startswith("06"):
        return {**small, "BENCH_JSON": f"{NO_RUN}/pipeline.json", "ENCODER": f"{NO_RUN}/model",
                "SWEEP": f"{NO_RUN}/sweep", "MEASURE": "collectors"}
    raise AssertionError(f"notebooks/{stem}.ipynb has no small parameters in this test: add them")


def test_the_six_notebooks_are_there_in_order():
    stems = [p.stem for p in refresh.notebook_paths()]
    assert [s[:2] for s in stems] == ["01", "02", "03", "04", "05", "06"], stems


@pytest.mark.parametrize("path", refresh.notebook_paths(), ids=lambda p: p.stem)
def test_notebook_runs_and_draws_its_figures(path, small, monkeypatch):
    monkeypatch.setenv("TRAJRAG_SHARED_DATA", str(SHARED_DATA))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "platform"),
                                                                    os.environ.get("PYTHONPATH")])))
    nb = refresh.execute(path, parameters(path.stem, small), timeout=CELL_TIMEOUT_S)
    assert not refresh.missing_figures(nb), f"{path.name}: cells tagged 'figure' drew nothing"
    pngs = sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))
    assert pngs >= 1
    assert refresh.logged_lines(nb) == {}, f"{path.name}: warnings or log lines among the outputs"


def test_unknown_parameter_is_refused():
    import nbformat

    nb = nbformat.read(refresh.notebook_paths(["01"])[0], as_version=4)
    with pytest.raises(ValueError, match="unknown parameters"):
        refresh.inject_parameters(nb, {"MAX_STEPZ": 1})


def test_a_warning_among_the_outputs_is_found_and_printed_text_is_not():
    import nbformat

    cell = nbformat.v4.new_code_cell("import ray")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="find sofa: success\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="INFO util.py:155 -- Missing packages\n")]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# title"), cell])
    assert refresh.logged_lines(nb) == {1: "INFO util.py:155 -- Missing packages\n"}
