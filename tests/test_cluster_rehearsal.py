"""A rehearsal of cluster/ on this machine: a Ray head and a second node started with `ray start`
(the head holds the drivers and no actor, num-cpus 0 as cluster/'s heads; the second node every
actor that needs a CPU, so the node kill always takes the collectors at work), the RayJobs'
entrypoints submitted with `ray job submit` as KubeRay submits them (taken from
cluster/rayjob-*.yaml with their runtime env; sizes made tiny, two of the evaluation's three
planners, `BUCKET` a bucket on moto's S3 server), every artefact in that bucket. Before each job
(or pair of jobs run side by side) both nodes' artefact caches are wiped: a job can only find what
an earlier one left in the bucket, never on a disk. The second node is killed in the middle of the
corpus build (its raylet, SIGKILL: a spot node gone) and the memory still holds every planned
trajectory exactly once.

Loopback only; every Ray process is this test's own (its session folder) and is ended by pid.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import REPO
from test_distributed_corpus import assert_exactly_once
from trajrag import config
from trajrag.agent.collect import collector_settings, episode_policy, trajectory_id
from trajrag.world.datasets import load_scenes
from trajrag.world.episode_gen import generate_episodes
from trajrag.world.geodesic import Motion

pytestmark = pytest.mark.slow

BUCKET = "trajrag-rehearsal"
VENV_BIN = Path(sys.executable).parent
# Tiny renders and short evaluation walks: the pipeline and the plumbing are under test, not the
# images. The corpus walks keep configs/episodes.yaml's step budget: see EXTRA.
TINY = ["sim.width=64", "sim.height=48", "mapping.pixel_stride=1"]
SHORT_WALKS = ["episodes.max_steps=120"]
# 8 walks a home: on quiet cores 3 were all collected before the first chunk reached the bucket,
# so the node kill found no collector at work.
CORPUS_SCENES, CORPUS_EPISODES = "procedural:train:4", 8
# Each RayJob's options made tiny for this machine (same option names, same URIs).
SIZES = {
    # One writer: the sharded writers' CPUs would not fit beside 2 collectors on 3 rehearsal CPUs.
    "build-corpus": {"--scenes": CORPUS_SCENES, "--episodes-per-scene": str(CORPUS_EPISODES), "--workers": "2",
                     "--writers": "1"},
    "train-encoder": {"--workers": "1", "encoder.train.use_gpu": "false"},
    "fit-value": {},
    "evaluate": {"--scenes": "procedural:val:1", "--episodes": "generated:2", "--workers": "1",
                 "--planner": "trajrag,frontier"},
    "sweep": {"--samples": "1"},
}
EXTRA = {
    # Batches of 2 and walks of the full step budget: the first chunks land while most walks are
    # still to come, so the node kill always finds collectors at work.
    "build-corpus": ["corpus_job.writer_batch=2"],
    "train-encoder": ["encoder.train.epochs=2"],
    "fit-value": SHORT_WALKS,
    "evaluate": SHORT_WALKS,
    "sweep": ["sweep.scenes=procedural:train:40-41", "sweep.episodes=generated:1", "sweep.chunk_episodes=1",
              "sweep.max_concurrent_trials=1", "sweep.wandb=false", *SHORT_WALKS],
}


# `ray start`, kept on loopback. Ray turns 127.0.0.1 into the machine's routable address for a
# multi-node cluster; its single-machine switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, in every
# process of the rehearsal's nodes: drivers, workers) keeps 127.0.0.1 but refuses worker nodes, so
# the `ray start` process itself allows them and leaves 127.0.0.1 as it is.
RAY_START_ON_LOOPBACK = """
import sys
import ray._private.ray_constants as constants
import ray._private.services as services
constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv[0] = "ray"
sys.exit(main())
"""


# Ports handed out by this module (a port drawn but not yet bound is still free to the OS).
_HANDED_OUT: set[int] = set()


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _free_range(width: int) -> int:
    """The first port of ``width`` consecutive free ports, none handed out before."""
    for _ in range(200):
        start = _free_port()
        block = range(start, start + width)
        if start + width < 65000 and all(p == start or p not in _HANDED_OUT for p in block) \
                and all(_port_free(p) for p in block):
            _HANDED_OUT.update(block)
            return start
    raise RuntimeError("no free port range")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# A node's own ports: Ray's worker range, then one port each for the rest, all from one block of
# consecutive free ports (ports drawn one by one could land inside the range: Ray then refuses).
_WORKER_PORTS = 30
_NODE_PORT_OPTIONS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                      "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")


def _node_ports(*head_options: str) -> list[str]:
    """``ray start`` port options for one node; ``head_options`` (e.g. ``ray-client-server-port``)
    take ports from the same block."""
    names = (*_NODE_PORT_OPTIONS, *head_options)
    first = _free_range(_WORKER_PORTS + len(names))
    singles = range(first + _WORKER_PORTS, first + _WORKER_PORTS + len(names))
    return [f"--min-worker-port={first}", f"--max-worker-port={first + _WORKER_PORTS - 1}",
            *(f"--{name}={port}" for name, port in zip(names, singles))]


class LocalCluster:
    """A head and one worker node of ``ray start --block``, each with its own environment."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        # Ray's socket paths must stay short: the session folder is under /tmp, named for this test.
        self.temp_dir = tempfile.mkdtemp(prefix="trh-", dir="/tmp")
        self.gcs_port, self.dashboard_port = _free_port(), _free_port()
        self.procs: list[subprocess.Popen] = []
        self.worker: subprocess.Popen | None = None

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def node_env(self, name: str) -> dict[str, str]:
        cache = self.root / name / "artefacts"
        cache.mkdir(parents=True, exist_ok=True)
        return {**self.env, "TRAJRAG_ARTEFACT_CACHE": str(cache), "HOME": str(self.root / name)}

    def start_head(self) -> None:
        self._start("head", ["--head", "--node-ip-address=127.0.0.1", f"--port={self.gcs_port}", "--num-cpus=0",
                             "--include-dashboard=true",
                             "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                             f"--temp-dir={self.temp_dir}"], head=True)
        self._wait(lambda: self._api_up(), 90, "the head's dashboard")

    def start_worker(self) -> None:
        self.worker = self._start("worker", [f"--address=127.0.0.1:{self.gcs_port}", "--node-ip-address=127.0.0.1",
                                             "--num-cpus=3"])
        self._wait(lambda: self.alive_nodes() == 2, 90, "the second node")

    def _start(self, name: str, options: list[str], head: bool = False) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-c", RAY_START_ON_LOOPBACK, "start", "--block",
                                 "--disable-usage-stats", *options,
                                 *_node_ports(*(["ray-client-server-port"] if head else []))],
                                env=self.node_env(name), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=self.root / name)
        self.procs.append(proc)
        return proc

    def _api_up(self) -> bool:
        from ray.job_submission import JobSubmissionClient

        try:
            JobSubmissionClient(self.dashboard).list_jobs()
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return True

    def alive_nodes(self) -> int:
        from ray.util.state import list_nodes

        try:
            return sum(n.state == "ALIVE" for n in list_nodes(address=self.dashboard))
        except Exception:  # noqa: BLE001 - the API is not answering yet
            return 0

    def node_ips(self) -> set[str]:
        from ray.util.state import list_nodes

        return {n.node_ip for n in list_nodes(address=self.dashboard) if n.state == "ALIVE"}

    def kill_worker_node(self) -> None:
        """SIGKILL the second node's raylet (its `ray start --block` then ends the rest of it)."""
        raylets = [p for p in psutil.Process(self.worker.pid).children(recursive=True) if "raylet" in p.name()]
        assert raylets, "the second node has no raylet"
        for raylet in raylets:
            raylet.kill()
        self.worker.wait(timeout=60)
        self._wait(lambda: self.alive_nodes() == 1, 90, "the head to see the node gone")

    def stop(self) -> None:
        """End every process of this cluster, by pid: the `ray start` processes and anything
        that runs in its session folder (drivers, workers, agents), never another Ray."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        ours = [p for p in psutil.process_iter(["pid", "cmdline"])
                if any(self.temp_dir in part for part in (p.info["cmdline"] or []))]
        for proc in ours:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if any(self.temp_dir in part for part in (p.info["cmdline"] or []))]

    @staticmethod
    def _wait(ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up after {timeout_s} s")
            time.sleep(1)


def rayjob_command(name: str, serve_port: int) -> tuple[list[str], dict]:
    """The entrypoint of cluster/rayjob-<name>.yaml as KubeRay submits it (`ray job submit
    -- ENTRYPOINT`, its runtimeEnvYAML), with this checkout's jobs/ for the image's
    /opt/trajrag/jobs, the test bucket for BUCKET and tiny sizes."""
    manifest = yaml.safe_load((REPO / "cluster" / f"rayjob-{name}.yaml").read_text())
    args = shlex.split(manifest["spec"]["entrypoint"].replace("/opt/trajrag/", f"{REPO}/")
                       .replace("s3://BUCKET/", f"s3://{BUCKET}/"))
    sizes = SIZES[name]
    for i, arg in enumerate(args[:-1]):
        if arg in sizes:
            args[i + 1] = sizes[arg]
        key = arg.split("=", 1)[0]
        if key in sizes and "=" in arg:
            args[i] = f"{key}={sizes[key]}"
    for override in [*TINY, f"eval_job.serve.port={serve_port}", *EXTRA.get(name, [])]:
        args += ["--set", override]
    return args, yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])


def submit(cluster: LocalCluster, name: str, serve_port: int, wait: bool = True) -> subprocess.Popen | str:
    """`ray job submit` of the RayJob ``name``; waits and returns its output (the job must
    succeed), or with ``wait=False`` returns the running submit process (output in
    ``<root>/<name>.out``)."""
    entrypoint, runtime_env = rayjob_command(name, serve_port)
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", cluster.dashboard,
               "--submission-id", f"{name}-{time.time_ns()}", "--runtime-env-json", json.dumps(runtime_env),
               "--", *entrypoint]
    env = {**os.environ, "RAY_ADDRESS": cluster.dashboard}
    if not wait:
        with open(cluster.root / f"{name}.out", "w") as out:
            return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    print(f"rehearsal: {name} {time.monotonic() - started:.0f} s", file=sys.stderr)
    return done.stdout


def finish(cluster: LocalCluster, name: str, job: subprocess.Popen) -> None:
    """Wait for a job ``submit`` started with ``wait=False``: it must succeed."""
    assert job.wait(timeout=600) == 0, f"{name} failed:\n{(cluster.root / f'{name}.out').read_text()[-4000:]}"
    print(f"rehearsal: {name} finished", file=sys.stderr)


def _last_json(output: str) -> dict:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in:\n{output[-3000:]}")


def _keys(s3, prefix: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"][len(prefix):] for page in pages for o in page.get("Contents", [])}


@pytest.fixture
def moto_s3(s3_endpoint):
    """The bucket on moto's S3 server (loopback, conftest); (endpoint URL, boto3 client)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)
    return s3_endpoint, s3


@pytest.fixture
def cluster(moto_s3, tmp_path):
    endpoint, _s3 = moto_s3
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "RAY_"))}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1", RAY_USAGE_STATS_ENABLED="0",
               WANDB_MODE="offline", PYTHONPATH=str(REPO / "platform"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    local = LocalCluster(tmp_path, env)
    try:
        local.start_head()
        local.start_worker()
        yield local
    finally:
        local.stop()
        assert local.leftovers() == [], "Ray processes of the rehearsal left running"


def _wipe_caches(cluster: LocalCluster) -> None:
    """Forget every node's copies: the next job finds only what is in the bucket."""
    for node in ("head", "worker"):
        shutil.rmtree(cluster.root / node / "artefacts", ignore_errors=True)
        (cluster.root / node / "artefacts").mkdir(parents=True)


def _planned_ids() -> set[str]:
    settings = config.settings(TINY)
    scenes = load_scenes(CORPUS_SCENES, settings)
    episodes_cfg, corpus_cfg = settings.episodes, settings.corpus
    motion = Motion.from_sim_config(collector_settings(settings).sim)
    return {trajectory_id(e, episode_policy(e, "mix", corpus_cfg.oracle_fraction, corpus_cfg.seed))
            for e in generate_episodes(scenes, CORPUS_EPISODES, episodes_cfg, episodes_cfg.seed, motion)}


def test_the_rayjobs_run_on_two_nodes_with_every_artefact_in_the_bucket(cluster, moto_s3, monkeypatch):
    endpoint, s3 = moto_s3
    serve_port = _free_port()
    started = time.monotonic()
    assert cluster.node_ips() == {"127.0.0.1"}  # both nodes on loopback

    # Corpus, with the collectors' node killed once the first trajectories are in the memory.
    corpus = submit(cluster, "build-corpus", serve_port, wait=False)

    def corpus_output() -> str:
        return (cluster.root / "build-corpus.out").read_text()

    deadline = time.monotonic() + 300
    while not any(k.startswith("chunks.lance/data/") for k in _keys(s3, "trajrag/memory/")):
        assert corpus.poll() is None, f"the corpus job ended before the kill:\n{corpus_output()[-3000:]}"
        assert time.monotonic() < deadline, "no trajectory reached the memory"
        time.sleep(0.5)
    cluster.kill_worker_node()
    cluster.start_worker()  # the replacement node (a new pod / spot instance)
    assert corpus.wait(timeout=600) == 0, corpus_output()[-4000:]
    print(f"rehearsal: build-corpus (a node killed and replaced) {time.monotonic() - started:.0f} s", file=sys.stderr)
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="trajrag/memory-summary.json")["Body"].read())
    # The node held the collectors at work: the job saw them go and carried on.
    assert summary["faults"]["collector_interruptions"] >= 1, summary["faults"]
    for name, value in (("AWS_ENDPOINT_URL", endpoint), ("AWS_ALLOW_HTTP", "true"), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    assert_exactly_once(f"s3://{BUCKET}/trajrag/memory", _planned_ids())

    # The encoder and the value read only the memory, the evaluation and the sweep only what those
    # two wrote: each pair runs side by side, as a cluster runs RayJobs that do not wait on each other.
    _wipe_caches(cluster)
    encoder = submit(cluster, "train-encoder", serve_port, wait=False)
    submit(cluster, "fit-value", serve_port)
    finish(cluster, "train-encoder", encoder)
    model = _keys(s3, "trajrag/model/")
    assert {"encoder.json", "model.safetensors"} <= model
    assert any(k.startswith("runs/") and "/checkpoint_" in k for k in model), "Train checkpoints in the bucket"
    assert "value.json" in _keys(s3, "trajrag/")
    assert _keys(s3, "trajrag/value.experience/")

    _wipe_caches(cluster)
    sweep = submit(cluster, "sweep", serve_port, wait=False)
    evaluation = _last_json(submit(cluster, "evaluate", serve_port))
    assert set(evaluation["runs"]) == {"trajrag", "frontier"}
    assert all(run["episodes"] == 2 for run in evaluation["runs"].values())
    eval_keys = _keys(s3, "trajrag/eval/")
    assert {"results.md", "trajrag/episodes.jsonl", "frontier/episodes.jsonl", "trajrag/run.json"} <= eval_keys

    finish(cluster, "sweep", sweep)
    assert {"best_config.json", "results.csv"} <= _keys(s3, "trajrag/sweep/")
    best = json.loads(s3.get_object(Bucket=BUCKET, Key="trajrag/sweep/best_config.json")["Body"].read())
    assert best["trials"] == 1 and best["trial_errors"] == 0
    # Nothing written beside the nodes' working folders: every artefact went to the bucket.
    for node in ("head", "worker"):
        assert not list((cluster.root / node).glob("s3:*"))
    print(f"rehearsal: all jobs {time.monotonic() - started:.0f} s", file=sys.stderr)
