"""Joining or starting the Ray cluster that every Ray job of the platform runs on."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any


def ensure_ray(address: str | None = None, num_cpus: float | None = None, quiet: bool = False) -> bool:
    """Connect to ``address`` (or ``$RAY_ADDRESS``), or use the Ray already initialised in this
    process, or start a local one with ``num_cpus`` CPUs (None: Ray counts them). Returns True
    when this call started or joined it, so the caller knows to shut it down.

    Locally the dashboard stays off and usage stats are disabled (DESIGN.md: offline), and the
    session lives in a temporary folder of this process, removed when it exits (``_own_session``).
    ``quiet`` keeps the workers' output off the driver's terminal (Ray Train prints a report per step).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its processes with subprocess (fork, then exec at once): the child never runs
    # lancedb's runtime, so lancedb's fork warning, five per start, says nothing here. A fork
    # without exec (multiprocessing) still warns.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning,
                            module="subprocess")
    log_options = {"log_to_driver": False, "logging_level": "warning"} if quiet else {"log_to_driver": True}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        # Joining a cluster: local-instance options (num_cpus, include_dashboard) are not allowed.
        ray.init(address=address, **log_options)
    else:
        # Token auth is Ray's default for a new local cluster: a warning that it is on, at every
        # command, tells the user nothing (Ray's warnings that auth is off or failing stay).
        logging.getLogger(_TOKEN_SETUP_LOGGER).addFilter(_drop_token_auth_enabled)
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=_own_session(), **log_options)
    return True


_TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def _drop_token_auth_enabled(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _own_session() -> str:
    """A temporary folder for a local Ray's session (logs, sockets, spilled objects), removed
    with Ray's shutdown when this process exits: one-shot commands leave no ``/tmp/ray/session_*``."""
    folder = tempfile.mkdtemp(prefix="trajrag-ray-")
    atexit.register(_end_session, folder)
    return folder


def _end_session(folder: str) -> None:
    import ray

    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def import_wandb(folder: str | Path) -> ModuleType:
    """``import wandb`` in a Ray worker, with wandb's import-time temporary folders made inside
    ``folder`` (the run's or the trial's own folder) instead of the system temp dir.

    wandb creates two folders when imported (``tmp*wandb-media``, ``tmp*wandb-artifacts``) and
    removes them at interpreter exit, which a Ray worker never reaches: Ray kills it. Made in
    /tmp, every training run and every sweep trial would leave two behind for good.
    """
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        import wandb
    finally:
        tempfile.tempdir = saved
    return wandb


def finish_wandb(run: Any) -> None:
    """Finish ``run`` (None: nothing to do), then stop this process's wandb service.

    The service (a child process, wandb-core) keeps a socket folder, ``/tmp/wandb-<pid>-<pid>-<n>/``,
    that it removes when it shuts down: at wandb's teardown, normally an ``atexit`` hook, or when
    its parent exits. A Ray worker reaches neither: Ray ends it without interpreter exit and kills
    its child processes with it, so every training run and every sweep trial would leave one in
    /tmp. Call it from a ``finally``, so that a failed or stopped run cleans up too; a worker Ray
    kills in the middle of its work (a Ray Train restart after another worker died) still leaves
    its folder.

    The teardown waits for the service to exit, yet on a loaded machine the folder has been seen
    to outlive it (CI, 2 cores); it is this process's own (named after its pid) and nothing uses
    it once the service is gone, so what is left of it is removed here.
    """
    if run is None:
        return
    import wandb  # imported already (``import_wandb``): no new temporary folders

    try:
        run.finish()
    finally:
        try:
            wandb.teardown()
        finally:
            _remove_service_folders(os.getpid())


def _remove_service_folders(pid: int) -> None:
    """Remove the wandb-core socket folders of the process ``pid`` from the system temp dir."""
    for folder in Path(tempfile.gettempdir()).glob(f"wandb-{pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)
