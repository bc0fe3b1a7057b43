"""Shared test fixtures. The Gibson and MP3D data are used in place from ../shared/data (never copied)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TRAJRAG_SHARED_DATA", REPO.parent / "shared" / "data"))
GIBSON_TRAIN = SHARED_DATA / "gibson-objectnav-v1.1" / "train" / "train_info.pbz2"
MP3D_SCANS = SHARED_DATA / "mp3d-bev" / "scenes"


@pytest.fixture(scope="session")
def gibson_train_path() -> Path:
    if not GIBSON_TRAIN.is_file():
        pytest.fail(f"Gibson semantic maps not found at {GIBSON_TRAIN}; set TRAJRAG_SHARED_DATA")
    return GIBSON_TRAIN


@pytest.fixture(scope="session")
def mp3d_scans_path() -> Path:
    if not MP3D_SCANS.is_dir():
        pytest.fail(f"MP3D semantic maps not found at {MP3D_SCANS}; set TRAJRAG_SHARED_DATA")
    return MP3D_SCANS


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (started on first use, ~8 s; shut down at the
    end). Loopback only, no dashboard, no usage stats. Returns the ``ray`` module.

    2 logical CPUs: two 1-CPU actors (collectors, trainer workers) run side by side, as on the
    2-core dev machine; tests that need more must ask for fewer resources per actor.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
        started = True
    yield ray
    if started:
        ray.shutdown()


# Small renders keep the fixture corpus fast; mapping works the same at 160x120.
FAST_SIM = ("sim.width=160", "sim.height=120")


@pytest.fixture(scope="session")
def nav_memory(tmp_path_factory) -> tuple[str, str]:
    """A small real memory for retrieval and planner tests: (store URI, encoder folder).

    Oracle walks of 3 procedural train homes (5 episodes each) converted and grouped by the real
    memory; an *untrained* encoder folder (architecture + MiniLM node encoder, seed 0; training is
    tested in test_encoder.py) whose embeddings are written to every chunk.
    """
    from trajrag import config
    from trajrag.bench.pipeline import small_memory

    return small_memory(tmp_path_factory.mktemp("nav-memory"), "procedural:train:3", 5, config.settings(FAST_SIM))


# -- a local S3 endpoint (moto's server, loopback only) for object-store URIs --------------------
S3_BUCKET = "trajrag-test"


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 (a free port); its URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """Endpoint and (fake) credentials in the environment, read alike by LanceDB (object_store)
    and boto3, and pyarrow.fs; then the bucket (shared by the session's tests: each writes under a
    prefix of its own). Returns a boto3 client on the endpoint."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")  # object_store refuses http:// without it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    s3 = boto3.client("s3")
    if S3_BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=S3_BUCKET)
    return s3
