"""cluster/: the KubeRay manifests against the CRDs and the controller's own validation rules
(KubeRay 1.6), the `ray up` file against Ray's autoscaler schema (the one in the installed wheel),
and the things a first deploy trips over that no schema sees: shared state only through the object
store, one Python patch version in every image, the LLM's accelerator on a node type that has it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from conftest import REPO

CLUSTER = REPO / "cluster"
SCHEMA = json.loads((Path(__file__).parent / "data" / "kuberay" / "kuberay-v1.6-structural-schema.json").read_text())
RAYJOBS = sorted(CLUSTER.glob("rayjob-*.yaml"))
# ray-operator/controllers/ray/utils/constant.go: MaxRayClusterNameLength, MaxRayJobNameLength.
MAX_NAME = {"RayCluster": 63, "RayJob": 47}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Where a job puts or finds what another job made: these options must name object-store URIs.
SHARED_OPTIONS = ("--store", "--model", "--out", "--summary", "--decisions")
SHARED_SETTINGS = ("scoring.value_model", "retrieval.store", "retrieval.model_dir", "encoder.train.init_model")
# GPU memory per accelerator type, GB (NVIDIA's data sheets), and Qwen3-32B's bf16 weights:
# 32.8e9 parameters x 2 bytes (the Qwen3 model card's parameter count).
GPU_MEMORY_GB = {"H100": 80, "H200": 141, "A100": 80, "L40S": 48, "A10G": 24}
QWEN3_32B_WEIGHTS_GB = 65.6


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def controller_errors(manifest: dict) -> list[str]:
    """The KubeRay 1.6 controller's validation (validation.go: ValidateRayJobSpec,
    ValidateRayClusterSpec, the metadata checks) that a CRD schema cannot express; what it
    would refuse, one line each."""
    kind, spec, errors = manifest["kind"], manifest["spec"], []
    name = manifest["metadata"]["name"]
    if len(name) > MAX_NAME[kind] or not DNS1035.match(name):
        errors.append(f"{kind} name {name!r} must be a DNS-1035 label of at most {MAX_NAME[kind]} characters")
    if kind == "RayJob":
        selector = spec.get("clusterSelector") or {}
        backoff = spec.get("backoffLimit", 0)
        mode = spec.get("submissionMode", "K8sJobMode")
        if not selector and "rayClusterSpec" not in spec:
            errors.append("one of rayClusterSpec or clusterSelector must be set")
        if selector:
            if not selector.get("ray.io/cluster"):
                errors.append("cluster name in clusterSelector should not be empty")
            if mode == "SidecarMode":
                errors.append("clusterSelector is not supported in SidecarMode")
            if backoff > 0:
                errors.append("BackoffLimit is incompatible with ClusterSelector mode")
            if spec.get("suspend"):
                errors.append("the ClusterSelector mode doesn't support the suspend operation")
        if mode == "InteractiveMode" and backoff > 0:
            errors.append("BackoffLimit is incompatible with InteractiveMode")
        if spec.get("ttlSecondsAfterFinished", 0) > 0 and not spec.get("shutdownAfterJobFinishes"):
            errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes")
        try:
            yaml.safe_load(spec.get("runtimeEnvYAML", "") or "{}")
        except yaml.YAMLError as exc:
            errors.append(f"runtimeEnvYAML is not YAML: {exc}")
        if "rayClusterSpec" in spec:
            errors += cluster_spec_errors(spec["rayClusterSpec"])
    else:
        errors += cluster_spec_errors(spec)
    return errors


def cluster_spec_errors(spec: dict) -> list[str]:
    errors = []
    groups = [("Head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
    autoscaling = spec.get("enableInTreeAutoscaling", False)
    for name, group in groups:
        params = group.get("rayStartParams") or {}
        if not group["template"]["spec"].get("containers"):
            errors.append(f"{name} group should have at least one container")
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            errors.append(f"resource fields set in both rayStartParams and resources for {name} group")
        if "labels" in params:
            errors.append(f"rayStartParams['labels'] is not supported for {name} group")
        if name == "Head":
            continue
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            errors.append(f"worker group {name} must set both minReplicas and maxReplicas without autoscaling")
        if low is not None and high is not None and low > high:
            errors.append(f"worker group {name} has minReplicas {low} greater than maxReplicas {high}")
        if autoscaling and group.get("suspend"):
            errors.append(f"worker group {name} cannot be suspended with autoscaling")
    return errors


def _validate(manifest: dict) -> list[str]:
    schema_errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                     for e in jsonschema.Draft202012Validator(SCHEMA[manifest["kind"]]).iter_errors(manifest)]
    return schema_errors + controller_errors(manifest)


@pytest.mark.parametrize("path", [CLUSTER / "raycluster.yaml", *RAYJOBS], ids=lambda p: p.name)
def test_every_kuberay_manifest_is_accepted_by_the_crd_schema_and_the_controller(path):
    assert _validate(_load(path)) == []


def test_the_checks_refuse_what_kuberay_refuses():
    """The checks fail where KubeRay 1.6 would: the RayJobs as they were (backoffLimit with a
    clusterSelector), a misspelt field, a number where the CRD wants a string."""
    job = _load(CLUSTER / "rayjob-build-corpus.yaml")
    job["spec"]["backoffLimit"] = 2
    assert "BackoffLimit is incompatible with ClusterSelector mode" in _validate(job)
    job = _load(CLUSTER / "rayjob-evaluate.yaml")
    job["spec"]["entryPoint"] = job["spec"].pop("entrypoint")
    assert any("entryPoint" in e for e in _validate(job))
    cluster = _load(CLUSTER / "raycluster.yaml")
    cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    assert any("rayStartParams/num-cpus" in e for e in _validate(cluster))
    cluster = _load(CLUSTER / "raycluster.yaml")
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = 99
    assert any("greater than maxReplicas" in e for e in _validate(cluster))


def test_the_ray_up_file_is_valid_for_the_installed_ray_autoscaler():
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    config = _load(CLUSTER / "ray-cluster.yaml")
    jsonschema.validate(config, json.loads(schema_path.read_text()))
    assert config["head_node_type"] in config["available_node_types"]
    assert sum(t.get("max_workers", 0) for t in config["available_node_types"].values()) >= config["max_workers"]


def test_the_files_are_written_for_the_installed_ray():
    cluster = _load(CLUSTER / "raycluster.yaml")
    assert cluster["spec"]["rayVersion"] == ray.__version__
    assert f'ray[default,train,tune,serve]=={".".join(ray.__version__.split(".")[:2])}.*' in (REPO / "pyproject.toml").read_text()


def _entrypoint_args(path: Path) -> list[str]:
    return shlex.split(_load(path)["spec"]["entrypoint"])


@pytest.mark.parametrize("path", RAYJOBS, ids=lambda p: p.name)
def test_every_artefact_a_job_reads_or_writes_is_an_object_store_uri(path):
    args = _entrypoint_args(path)
    shared = [value for option, value in zip(args, args[1:]) if option in SHARED_OPTIONS]
    shared += [arg.split("=", 1)[1] for arg in args if arg.split("=", 1)[0] in SHARED_SETTINGS]
    assert shared and all(value.startswith("s3://BUCKET/") for value in shared), shared
    assert "/mnt/" not in path.read_text()


def test_nothing_sets_an_environment_variable_of_ours_that_nothing_reads():
    set_names = set()
    for path in CLUSTER.glob("*.yaml"):
        set_names |= set(re.findall(r"\b(TRAJRAG_[A-Z_]+)", path.read_text()))
    source = "\n".join(p.read_text() for p in (REPO / "platform").rglob("*.py"))
    assert [name for name in set_names if name not in source] == []


def test_an_irsa_cluster_without_the_secret_still_starts_its_pods():
    groups = _load(CLUSTER / "raycluster.yaml")["spec"]
    templates = [groups["headGroupSpec"]["template"]] + [g["template"] for g in groups["workerGroupSpecs"]]
    for template in templates:
        for container in template["spec"]["containers"]:
            refs = [e["secretRef"] for e in container.get("envFrom", []) if "secretRef" in e]
            assert refs and all(ref.get("optional") is True for ref in refs)


def test_the_llm_accelerator_is_advertised_by_a_gpu_node_type_that_holds_the_weights():
    serve = _load(REPO / "configs" / "serve_llm_gpu.yaml")
    llm = serve["applications"][0]["args"]["llm_configs"][0]
    accelerator = llm["accelerator_type"]
    gpus_per_replica = llm["engine_kwargs"].get("tensor_parallel_size", 1)
    usable_gb = GPU_MEMORY_GB[accelerator] * gpus_per_replica * llm["engine_kwargs"]["gpu_memory_utilization"]
    assert usable_gb > QWEN3_32B_WEIGHTS_GB
    resource = f"accelerator_type:{accelerator}"
    ray_up = _load(CLUSTER / "ray-cluster.yaml")["available_node_types"]
    assert [n for n, t in ray_up.items() if t["resources"].get(resource) and t["resources"].get("GPU", 0) >= gpus_per_replica]
    # KubeRay: what Ray's own KubeRay autoscaler derives from the RayCluster.
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cluster = _load(CLUSTER / "raycluster.yaml")
    cluster["metadata"]["namespace"] = "default"
    node_types = _derive_autoscaling_config_from_ray_cr(cluster)["available_node_types"]
    assert [n for n, t in node_types.items() if t["resources"].get(resource) and t["resources"].get("GPU", 0) >= gpus_per_replica]
    # The proxy evaluators on CPU nodes can reach: the head's, exposed in the head pod.
    assert serve["proxy_location"] == "HeadOnly"
    head_ports = {p["containerPort"] for c in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
                  for p in c.get("ports", [])}
    assert serve["http_options"]["port"] in head_ports


def test_the_gpu_pods_keep_the_hugging_face_cache_on_a_volume():
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    gpu_stage = dockerfile.split(" AS gpu")[1].split("\nFROM ")[0]
    hf_home = re.search(r"HF_HOME=(\S+)", gpu_stage).group(1)
    for group in _load(CLUSTER / "raycluster.yaml")["spec"]["workerGroupSpecs"]:
        if "REGISTRY/trajrag:gpu" in group["template"]["spec"]["containers"][0]["image"]:
            mounts = {m["mountPath"] for m in group["template"]["spec"]["containers"][0].get("volumeMounts", [])}
            assert hf_home in mounts
    run_options = _load(CLUSTER / "ray-cluster.yaml")["available_node_types"]["gpu"]["docker"]["worker_run_options"]
    assert any(option.endswith(f":{hf_home}") for option in run_options)


def _stages(dockerfile: str) -> dict[str, str]:
    parts = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    return {part.split("\n", 1)[0].split(" AS ")[1].strip(): "FROM " + part for part in parts}


def test_every_image_runs_one_python_patch_version_and_has_what_ray_up_needs():
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    pinned = re.search(r"^ARG PYTHON_VERSION=(\d+\.\d+\.\d+)$", dockerfile, flags=re.M)
    assert pinned, "PYTHON_VERSION pinned to a patch release before the first stage"
    stages = _stages(dockerfile)
    assert set(stages) == {"cpu", "gpu", "habitat"}
    python_refs = {
        "cpu": r"FROM python:\$\{PYTHON_VERSION\}-slim",
        "gpu": r"uv venv --python \$\{PYTHON_VERSION\}",
        "habitat": r"python=\$\{PYTHON_VERSION\}",
    }
    for name, stage in stages.items():
        assert re.search(python_refs[name], stage), f"{name} image takes its Python from PYTHON_VERSION"
        assert "rsync" in stage and "openssh-client" in stage, f"{name} image has rsync and ssh for ray up"
        assert re.search(r'pip install[^\n]*-e "\.\[[^\]]*cluster', stage), f"{name} image installs the cluster extra"
        # Dependencies are installed before the source is copied: an edit reinstalls nothing.
        assert stage.index("COPY platform") > stage.index('-e "'), f"{name}: source copied before the install"
    assert re.search(r'^cluster = \["boto3', (REPO / "pyproject.toml").read_text(), flags=re.M)
    # The conda environment's ray is on PATH in login shells too (ray up / KubeRay use bash -l).
    assert "/etc/profile.d/" in stages["habitat"] and "/opt/conda/envs/trajrag/bin" in stages["habitat"]


def test_the_collector_count_is_the_same_everywhere():
    args = _entrypoint_args(CLUSTER / "rayjob-build-corpus.yaml")
    workers = int(args[args.index("--workers") + 1])
    group = next(g for g in _load(CLUSTER / "raycluster.yaml")["spec"]["workerGroupSpecs"] if g["groupName"] == "collectors")
    cpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    assert group["replicas"] * cpus == workers
    ray_up = _load(CLUSTER / "ray-cluster.yaml")["available_node_types"]["collectors"]
    assert ray_up["resources"]["CPU"] == workers
    for readme in (REPO / "README.md", CLUSTER / "README.md"):
        lines = readme.read_text().replace("\\\n", " ").splitlines()  # one line per shell command
        counts = {int(n) for line in lines if "build_corpus.py" in line for n in re.findall(r"--workers (\d+)", line)}
        assert counts <= {workers}, f"{readme.relative_to(REPO)}: corpus jobs with {counts} collectors, the plan is {workers}"
