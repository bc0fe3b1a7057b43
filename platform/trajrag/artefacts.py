"""Artefacts that jobs hand to each other (an encoder folder, a frontier value file, an
evaluation's records, a sweep's results) at a location that is an object-store URI
(``s3://bucket/prefix``, ``gs://...``) or a local path.

URIs go through ``pyarrow.fs``: the filesystem layer Ray Train keeps its checkpoints with
(``RunConfig.storage_path``), configured by the same environment as LanceDB's object store for
the memory (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, or the instance profile / workload identity), so every node that can open the
memory opens these the same way. A local path is used as it is: on one machine nothing changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Iterator

import pyarrow.fs as pafs

CACHE_ENV = "TRAJRAG_ARTEFACT_CACHE"


def is_uri(location: str | Path) -> bool:
    """True for an object-store URI (``scheme://...``), False for a local path."""
    return "://" in str(location) and not str(location).startswith("file://")


def join(location: str | Path, *parts: str) -> str:
    """``location``/``parts``, keeping a URI's ``//`` (``Path`` would fold ``s3://b`` to ``s3:/b``)."""
    if not is_uri(location):
        return str(Path(location, *parts))
    return "/".join([str(location).rstrip("/"), *parts])


def sibling(uri: str, name: str) -> str:
    """The URI named ``name`` under the same prefix as ``uri``."""
    return str(uri).rstrip("/").rsplit("/", 1)[0] + "/" + name


def exists(location: str | Path) -> bool:
    """Whether a file or folder (a non-empty prefix) is at ``location``."""
    if not is_uri(location):
        return Path(location).exists()
    fs, path = pafs.FileSystem.from_uri(str(location))
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def local_copy(location: str | Path) -> Path:
    """A local path holding what ``location`` holds (a file or a folder): the path itself when
    local; for a URI, a copy in this node's cache (``$TRAJRAG_ARTEFACT_CACHE``, default
    ``~/.cache/trajrag/artefacts``) named after the URI and its objects' sizes and times, so an
    unchanged artefact is fetched once per node and a rewritten one again.

    Raises ``FileNotFoundError`` naming the location when nothing is there. The copy is shared by
    every process of the node: add caches to it (an encoder's node-encoding cache), change nothing.
    """
    if not is_uri(location):
        return Path(location)
    fs, path = pafs.FileSystem.from_uri(str(location))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{location}: no such object or prefix")
    entries = [info] if info.type == pafs.FileType.File else fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted((e.path, e.size, e.mtime_ns) for e in entries if e.type == pafs.FileType.File)
    key = hashlib.sha256(repr((str(location), files)).encode()).hexdigest()[:20]
    root = _cache_root()
    name = PurePosixPath(path).name
    final = root / key
    if not (final / name).exists():
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        for source, _size, _mtime in files:
            target = staging / name / source[len(path):].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(source) as stream, open(target, "wb") as out:
                shutil.copyfileobj(stream, out, 1 << 22)
        try:
            staging.rename(final)
        except OSError:  # another process of this node fetched it first: theirs is the same
            shutil.rmtree(staging, ignore_errors=True)
    return final / name


def publish(local: str | Path, location: str | Path) -> None:
    """Upload the file or folder ``local`` to the URI ``location`` (objects already there under
    other names stay). Nothing to do for a local ``location``: it was written in place."""
    if not is_uri(location):
        return
    fs, path = pafs.FileSystem.from_uri(str(location))
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


@contextlib.contextmanager
def output_folder(location: str | Path) -> Iterator[Path]:
    """A local folder to write ``location``'s contents in: the folder itself when local; for a
    URI a scratch folder filled first with what the URI already holds (a resumed evaluation reads
    its earlier records) and uploaded on the way out, also after an error, so whatever was
    finished is kept. Only the files this block created or changed are uploaded: jobs writing
    other files into the same URI (evaluation shards) do not overwrite each other's. A local
    folder this block made and left empty is removed when it fails: a refused command leaves no
    folder behind."""
    if not is_uri(location):
        folder = Path(location)
        made = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            yield folder
        except BaseException:
            if made and not any(folder.iterdir()):
                folder.rmdir()
            raise
        return
    with tempfile.TemporaryDirectory(prefix="trajrag-out-", dir=_cache_root()) as scratch:
        local = Path(scratch) / "out"
        if exists(location):
            shutil.copytree(local_copy(location), local)
        local.mkdir(exist_ok=True)
        fetched = _file_stamps(local)
        try:
            yield local
        finally:
            for relative, stamp in _file_stamps(local).items():
                if fetched.get(relative) != stamp:
                    publish(local / relative, join(location, *relative.parts))


@contextlib.contextmanager
def output_file(location: str | Path) -> Iterator[Path]:
    """A local path to write the file ``location`` at: the path itself when local; for a URI a
    path in a scratch folder whose every entry (the file and its side files, e.g. a value
    model's ``.experience`` table) is uploaded beside ``location`` once the block succeeds."""
    if not is_uri(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        yield Path(location)
        return
    with tempfile.TemporaryDirectory(prefix="trajrag-out-", dir=_cache_root()) as scratch:
        local = Path(scratch) / PurePosixPath(str(location).rstrip("/")).name
        yield local
        for entry in Path(scratch).iterdir():
            publish(entry, sibling(location, entry.name))


def _file_stamps(folder: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``folder`` (relative path) with its size and modification time (ns)."""
    return {p.relative_to(folder): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _cache_root() -> Path:
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "trajrag" / "artefacts")
    root.mkdir(parents=True, exist_ok=True)
    return root
