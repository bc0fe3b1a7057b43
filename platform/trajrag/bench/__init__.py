"""bench stage: ``trajrag bench NAME`` measurements (see ``trajrag.cli.bench``)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from threadpoolctl import threadpool_info

# Small files written and renamed to time the folder's filesystem (see ``write_rename_ms``).
_PROBE_FILES = 200
_PROBE_BYTES = 4096


def work_dir(args: argparse.Namespace, prefix: str) -> str:
    """A new temporary folder for a bench's store, under ``--workdir`` when given."""
    parent = getattr(args, "workdir", None)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=parent or None)


def write_rename_ms(folder: str) -> float:
    """Median time (ms) to write a 4 KiB file and rename it in ``folder``: what a LanceDB commit
    does a few times (data file, transaction, manifest). Disk-bound benches report it, since a
    shared machine's disk can be several times slower from one hour to the next."""
    times = []
    for i in range(_PROBE_FILES):
        path = os.path.join(folder, f".probe-{i}")
        start = time.perf_counter()
        with open(path, "wb") as f:
            f.write(b"\0" * _PROBE_BYTES)
        os.replace(path, path + ".done")
        times.append(time.perf_counter() - start)
        os.remove(path + ".done")
    return round(float(np.median(times)) * 1e3, 3)


def blas_kernels() -> str:
    """The kernels numpy's BLAS picked for this CPU (OpenBLAS's core type, e.g. ``Haswell``):
    speed, and the last bits of products, differ between kernel families (FMA or not), so a
    bench's figures say which they are from."""
    found = [info.get("architecture") or info.get("internal_api", "") for info in threadpool_info()
             if info.get("user_api") == "blas"]
    return ", ".join(sorted(set(found))) or "unknown"


def load_average() -> float:
    """The machine's 1-minute load average: a bench on shared cores reports it beside its figures."""
    return round(os.getloadavg()[0], 2)
