"""Edges a new user runs into (issue 49): output paths that cannot be written, hostile pickles that
ask for huge allocations, rejected walks walked twice, the small-store dead end, noisy stderr."""

from __future__ import annotations

import bz2
import io
import json
import os
import shutil
import pickle
import struct
import tracemalloc
from pathlib import Path

import numpy as np
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


# -- hostile pickles ----------------------------------------------------------------------------
class _Calls:
    """Pickles as ``func(*args)`` (REDUCE)."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _ndarray_reconstruct():
    from trajrag.safe_pickle import _numpy_core

    return _numpy_core("multiarray", "_reconstruct")()


HOSTILE = {
    "bytes(2**50)": lambda: pickle.dumps(_Calls(bytes, 2**50), protocol=4),
    "bytes.__new__(bytes, 2**50)": lambda: b"\x80\x02c__builtin__\nbytes\n\x8a\x07" + (2**50).to_bytes(7, "little")
    + b"\x85\x81.",  # NEWOBJ
    "ndarray((2**40,), object)": lambda: pickle.dumps(_Calls(np.ndarray, (2**40,), np.dtype(object)), protocol=4),
    "_reconstruct(ndarray, (2**40,), b'b')": lambda: pickle.dumps(
        _Calls(_ndarray_reconstruct(), np.ndarray, (2**40,), b"b"), protocol=2),
    "BYTEARRAY8 of 2**50": lambda: b"\x80\x05\x96" + struct.pack("<Q", 2**50) + b".",
    "BINBYTES8 of 2**50": lambda: b"\x80\x04\x8e" + struct.pack("<Q", 2**50) + b".",
    "array state of 2**40 floats": lambda: pickle.dumps(np.zeros(3), protocol=2).replace(
        b"K\x03\x85", b"\x8a\x06" + (2**40).to_bytes(6, "little") + b"\x85"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_pickle_asking_for_a_huge_allocation_is_refused_before_it_is_made(name, tmp_path):
    from trajrag.safe_pickle import UnsafePickleError, load_pbz2

    path = tmp_path / "hostile_info.pbz2"
    path.write_bytes(bz2.compress(HOSTILE[name]()))
    tracemalloc.start()
    try:
        with pytest.raises(UnsafePickleError) as refused:
            load_pbz2(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(refused.value)
    assert message.startswith(str(path)) and "refusing" in message and "\n" not in message
    assert peak < 50 * 2**20, f"{name}: {peak / 2**20:.0f} MiB allocated before refusing"


def test_the_82_byte_pbz2_of_the_issue_is_one_line_naming_bytes(tmp_path):
    from trajrag.safe_pickle import UnsafePickleError, load_pbz2

    path = tmp_path / "evil_info.pbz2"
    path.write_bytes(bz2.compress(pickle.dumps(_Calls(bytes, 2**50))))
    assert len(path.read_bytes()) == 82
    with pytest.raises(UnsafePickleError, match=r"evil_info.pbz2: refusing to call builtins.bytes"):
        load_pbz2(path)


def test_one_memoised_list_built_into_sets_over_and_over_is_refused_by_the_size_bound():
    from trajrag.safe_pickle import UnsafePickleError, restricted_load

    shared = list(range(1000))
    payload = pickle.dumps([_Calls(set, shared) for _ in range(2000)], protocol=2)  # 2,000 sets, one list
    assert len(payload) < 40_000  # 32 MB of sets
    with pytest.raises(UnsafePickleError, match="more than the 1,000,000"):
        restricted_load(io.BytesIO(payload), "sets.pkl", max_bytes=10**6)
    few = pickle.dumps([_Calls(set, shared) for _ in range(2)], protocol=2)
    assert restricted_load(io.BytesIO(few), "sets.pkl", max_bytes=10**6) == [set(shared)] * 2


# -- the small-store dead end -------------------------------------------------------------------
@pytest.mark.slow
def test_encoder_eval_embeds_a_store_too_small_for_recall_and_trajrag_then_evaluates_on_it(tmp_path, capsys):
    """One walk: no held-out chunk shares its group, so recall cannot be measured; the embeddings
    are written all the same and the JSON says why recall is missing."""
    from trajrag import config
    from trajrag.agent.corpus import build_corpus
    from trajrag.encoder.model import build_model, save_model_dir
    from trajrag.encoder.node_encoder import NodeEncoder

    fast = ["sim.width=160", "sim.height=120"]
    store, model = str(tmp_path / "memory"), str(tmp_path / "model")
    assert build_corpus("procedural:train:1", 1, "oracle", store, config.settings(fast), progress=False)["chunks"] == 1
    cfg = config.load("encoder", fast)
    node_encoder = NodeEncoder(cfg.node)
    save_model_dir(model, build_model(cfg.model, node_encoder.dim, seed=0), cfg.model, node_encoder.info(),
                   extra={"seed": 0, "train_scenes": []})
    capsys.readouterr()

    assert main(["encoder", "eval", "--store", store, "--model", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["recall_measured"] is False
    assert "shares its group" in report["recall_not_measured_because"]
    assert report["held_out"]["written"] == 1

    assert main(["eval", "--scenes", "procedural:val:1", "--episodes", "generated:1", "--planner", "trajrag",
                 "--store", store, "--model", model, "--out", str(tmp_path / "eval"), "--json",
                 *[f"--set={o}" for o in fast]]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1


# -- quieter output -----------------------------------------------------------------------------
RAY_COMMAND = """
import sys
import lancedb
from trajrag.ray_cluster import ensure_ray
import ray

lancedb.connect(sys.argv[1]).create_table("t", [{"x": 1}])  # lancedb in use before Ray forks, as in the commands
assert ensure_ray(None, 1)
print(ray.get(ray.remote(lambda: 41 + 1).remote()))
"""


@pytest.mark.slow
def test_a_command_that_starts_ray_says_nothing_needless_and_leaves_no_session_behind(tmp_path):
    import subprocess
    import sys
    import tempfile

    import trajrag

    store = str(tmp_path / "memory")
    # A short temp folder: Ray's socket paths must stay under 108 bytes.
    temp = Path(tempfile.mkdtemp(prefix="th-", dir="/tmp"))
    try:
        env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(Path(trajrag.__file__).parents[1])}
        env.pop("RAY_ADDRESS", None)
        done = subprocess.run([sys.executable, "-c", RAY_COMMAND, store], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "42"
        assert "lancedb fork support" not in done.stderr
        assert "Token authentication is enabled" not in done.stderr
        assert list(temp.rglob("*")) == [], "the Ray session was left behind"
    finally:
        shutil.rmtree(temp, ignore_errors=True)
