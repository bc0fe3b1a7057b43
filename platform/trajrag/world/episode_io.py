"""Read and write ObjectNav episode files in habitat's layout (``content/<Scene>_episodes.json.gz``).

Reading accepts a directory in habitat's layout (``<split>/content/*.json.gz``, plus the split's
own ``*.json.gz``), a directory of ``*.json.gz`` files, or one file; every file holds
``{"episodes": [...]}``. Each episode needs ``episode_id``, ``scene_id``, ``start_position``
``[X, Y, Z]`` (m), ``start_rotation`` (a yaw-only quaternion in either ``[x, y, z, w]``, habitat-lab's
order, or ``[w, x, y, z]``, the SemExp Gibson release's) and ``object_category``; ``object_id``,
``floor_id`` (default 0), ``info`` and ``scene_key`` are optional and other keys (habitat's ``goals``,
``shortest_paths``, ...) are ignored. What the reader returns is normalised:

* ``start_rotation`` in habitat-lab's ``[x, y, z, w]`` order, unit length;
* ``object_category`` mapped to this package's names with the Gibson table
  (``configs/gibson.yaml: category_names``: couch -> sofa, potted plant -> plant, tv -> tv_monitor);
* ``object_id`` kept in ``info["object_id"]`` (``ObjectNavEpisode`` has no such field);
* ``scene_key`` from the file, else derived: ``gibson/<Scene>/<floor_id>`` for a ``.glb`` scene id
  such as ``gibson_semantic/Collierville.glb``, otherwise the scene id itself.

The file an episode came from is ``episode_source(episode)``. Every problem raises
``EpisodeError`` naming the file and the episode id.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
import zlib
from collections import defaultdict
from dataclasses import asdict
from numbers import Real
from pathlib import Path, PurePosixPath
from typing import Any, Collection, Iterable, Mapping

from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.frames import quaternion_to_yaw, yaw_to_quaternion_xyzw

EPISODES_SUFFIX = "_episodes.json.gz"
CONTENT_DIR = "content"
# habitat writes float32 unit quaternions; one further than this from unit length is not a rotation.
_UNIT_TOLERANCE = 1e-3
_SOURCE_ATTR = "_source_file"  # an instance attribute: outside asdict/eq/repr, kept by pickle


class EpisodeError(ValueError):
    """An episode file is unreadable, or an episode in it is malformed or unusable."""


def episode_source(episode: ObjectNavEpisode) -> str:
    """The file ``episode`` was read from, or ``""`` for an episode made in memory."""
    return getattr(episode, _SOURCE_ATTR, "")


def set_episode_source(episode: ObjectNavEpisode, source: str | Path) -> None:
    """Record the file ``episode`` came from (used in error messages and validation reports)."""
    setattr(episode, _SOURCE_ATTR, str(source))


def derive_scene_key(scene_id: str, floor_id: int) -> str:
    """The ``Scene.name`` an episode runs in, from habitat's ``scene_id`` and the floor.

    ``gibson_semantic/Collierville.glb`` (or ``gibson/Collierville.glb``, ``Collierville.glb``) and
    floor 0 -> ``gibson/Collierville/0``; another mesh dataset's ``<dataset>/.../<Scene>.glb`` ->
    ``<dataset>/<Scene>/<floor>``; a scene id that is not a mesh file is already a scene name.
    """
    path = PurePosixPath(scene_id)
    if path.suffix != ".glb":
        return scene_id
    stem = path.name[: -len(".glb")].removesuffix(".basis")
    parts = path.parts[:-1]
    dataset = "gibson" if not parts or "gibson" in scene_id.lower() else parts[0]
    return f"{dataset}/{stem}/{floor_id}"


# -- reading --------------------------------------------------------------------------------
def find_episode_files(path: Path | str) -> list[Path]:
    """The episode files under ``path``: the file itself, or ``content/*.json.gz`` and ``*.json.gz``."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such episode file or directory")
    files = sorted(path.glob(f"{CONTENT_DIR}/*.json.gz")) + sorted(path.glob("*.json.gz"))
    if not files:
        raise EpisodeError(f"{path}: no episode files (content/*.json.gz or *.json.gz) in this directory")
    return files


def read_episodes(path: Path | str, categories: Collection[str],
                  aliases: Mapping[str, str]) -> list[ObjectNavEpisode]:
    """All episodes under ``path`` (see ``find_episode_files``), in file order.

    ``aliases`` maps file category names to ours and ``categories`` is the set of names allowed
    after mapping (``world.datasets.known_categories``: the Gibson table of the ``gibson``
    section). Raises ``EpisodeError`` for a malformed file or episode, an unknown category or a
    repeated ``(scene_key, episode_id)``.
    """
    episodes: list[ObjectNavEpisode] = []
    seen: dict[tuple[str, str], str] = {}
    for file in find_episode_files(path):
        for episode in read_episode_file(file, categories, aliases):
            key = (episode.scene_key, episode.episode_id)
            if key in seen:
                raise EpisodeError(f"{file}: episode {episode.episode_id}: scene {episode.scene_key} "
                                   f"already has an episode with this id (in {seen[key]})")
            seen[key] = str(file)
            episodes.append(episode)
    return episodes


def read_episode_file(file: Path | str, categories: Collection[str] | None,
                      aliases: Mapping[str, str]) -> list[ObjectNavEpisode]:
    """The episodes of one ``{"episodes": [...]}`` file (``.json.gz`` or ``.json``).

    ``categories=None`` accepts any category name (after ``aliases``).
    """
    file = Path(file)
    data = _read_json(file)
    if not isinstance(data, dict) or not isinstance(data.get("episodes"), list):
        raise EpisodeError(f"{file}: expected a JSON object with an \"episodes\" list")
    episodes = []
    for index, raw in enumerate(data["episodes"]):
        episode = parse_episode(raw, categories, aliases, source=str(file), index=index)
        set_episode_source(episode, file)
        episodes.append(episode)
    return episodes


def _read_json(file: Path) -> Any:
    opener = gzip.open if file.name.endswith(".gz") else open
    try:
        with opener(file, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, zlib.error, ValueError) as exc:  # ValueError: JSON and UTF-8 errors
        raise EpisodeError(f"{file}: not a readable episode file ({type(exc).__name__}: {exc})") from None


def parse_episode(raw: Any, categories: Collection[str] | None, aliases: Mapping[str, str],
                  source: str = "<memory>", index: int | None = None) -> ObjectNavEpisode:
    """One episode dict -> a normalised ``ObjectNavEpisode`` (see the module doc).

    ``source`` (the file) and ``index`` (its place in the file) only name the episode in errors,
    until its ``episode_id`` is known.
    """
    where = f"{source}: episode #{index}" if index is not None else f"{source}: episode"
    if not isinstance(raw, dict):
        raise EpisodeError(f"{where}: expected an object, got {type(raw).__name__}")
    if "episode_id" not in raw or not isinstance(raw["episode_id"], (str, int)) \
            or isinstance(raw["episode_id"], bool):
        raise EpisodeError(f"{where}: missing or invalid episode_id {raw.get('episode_id')!r}")
    episode_id = str(raw["episode_id"])
    where = f"{source}: episode {episode_id}"

    missing = [k for k in ("scene_id", "start_position", "start_rotation", "object_category") if k not in raw]
    if missing:
        raise EpisodeError(f"{where}: missing field(s) {missing}")
    scene_id = raw["scene_id"]
    if not isinstance(scene_id, str) or not scene_id:
        raise EpisodeError(f"{where}: scene_id must be a non-empty string, got {scene_id!r}")
    position = _numbers(raw["start_position"], 3, "start_position", where)
    rotation = _rotation(raw["start_rotation"], where)
    category = _category(raw["object_category"], categories, aliases, where)
    floor_id = raw.get("floor_id", 0)
    if not isinstance(floor_id, int) or isinstance(floor_id, bool) or floor_id < 0:
        raise EpisodeError(f"{where}: floor_id must be an integer >= 0, got {floor_id!r}")
    info = _info(raw, where)
    scene_key = raw.get("scene_key") or derive_scene_key(scene_id, floor_id)
    if not isinstance(scene_key, str):
        raise EpisodeError(f"{where}: scene_key must be a string, got {scene_key!r}")
    return ObjectNavEpisode(episode_id=episode_id, scene_id=scene_id, start_position=position,
                            start_rotation=rotation, object_category=category, info=info,
                            floor_id=floor_id, scene_key=scene_key)


def _numbers(value: Any, n: int, field: str, where: str) -> list[float]:
    ok = isinstance(value, (list, tuple)) and len(value) == n and all(
        isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise EpisodeError(f"{where}: {field} must be {n} finite numbers, got {value!r}")
    return [float(v) for v in value]


def _rotation(value: Any, where: str) -> list[float]:
    """A yaw-only quaternion in either order -> unit ``[x, y, z, w]``."""
    q = _numbers(value, 4, "start_rotation", where)
    if abs(math.sqrt(sum(v * v for v in q)) - 1.0) > _UNIT_TOLERANCE:
        raise EpisodeError(f"{where}: start_rotation {value!r} is not a unit quaternion")
    try:
        return yaw_to_quaternion_xyzw(quaternion_to_yaw(q))
    except ValueError as exc:
        raise EpisodeError(f"{where}: start_rotation: {exc}") from None


def _category(value: Any, categories: Collection[str] | None, aliases: Mapping[str, str], where: str) -> str:
    if not isinstance(value, str):
        raise EpisodeError(f"{where}: object_category must be a string, got {value!r}")
    name = aliases.get(value, value)
    if categories is not None and name not in categories:
        raise EpisodeError(f"{where}: unknown object_category {value!r}; known: {sorted(categories)}")
    return name


def _info(raw: dict, where: str) -> dict:
    info = raw.get("info") or {}
    if not isinstance(info, dict):
        raise EpisodeError(f"{where}: info must be an object, got {info!r}")
    info = dict(info)
    distance = info.get("geodesic_distance")
    if distance is not None and (not isinstance(distance, Real) or isinstance(distance, bool)
                                 or not math.isfinite(distance) or distance < 0):
        raise EpisodeError(f"{where}: info.geodesic_distance must be a number >= 0, got {distance!r}")
    if "object_id" in raw:
        info["object_id"] = raw["object_id"]
    return info


# -- writing --------------------------------------------------------------------------------
def episode_to_json(episode: ObjectNavEpisode) -> dict:
    """An episode as a habitat-layout JSON dict (``object_id`` back at the top level)."""
    data = asdict(episode)
    info = dict(data["info"])
    if "object_id" in info:
        data["object_id"] = info.pop("object_id")
    data["info"] = info
    return data


def write_episodes(episodes: Iterable[ObjectNavEpisode], directory: Path | str) -> list[Path]:
    """Write ``episodes`` as ``directory/content/<Scene>_episodes.json.gz``, one file per scene_id.

    Each episode is checked as the reader would check it first (``EpisodeError`` naming it), then
    every file is written to a temporary name and renamed into place only once all are written,
    so a failure leaves no half-written file. Files of other scenes already there are kept.
    Returns the written paths.
    """
    content = Path(directory).expanduser() / CONTENT_DIR
    by_scene: dict[str, list[dict]] = defaultdict(list)
    for episode in episodes:
        data = episode_to_json(episode)
        source = episode_source(episode) or "write_episodes"
        try:
            text = json.dumps(data, default=_jsonable)
        except (TypeError, ValueError) as exc:
            raise EpisodeError(f"{source}: episode {episode.episode_id}: cannot write as JSON: {exc}") from None
        parse_episode(json.loads(text), None, {}, source=source)
        by_scene[episode.scene_id].append(data)
    names = _file_stems(by_scene)
    content.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for scene_id, items in by_scene.items():
            target = content / f"{names[scene_id]}{EPISODES_SUFFIX}"
            staged.append((_write_temp(target, {"episodes": items}), target))
        for temp, target in staged:
            os.replace(temp, target)
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
    return [target for _, target in staged]


def _file_stems(by_scene: Mapping[str, list]) -> dict[str, str]:
    """scene_id -> file stem: the mesh name (``Collierville``), or the whole id where names clash."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "scene"

    short = {sid: safe(PurePosixPath(sid).name.removesuffix(".glb").removesuffix(".basis")) for sid in by_scene}
    counts = defaultdict(int)
    for stem in short.values():
        counts[stem] += 1
    return {sid: stem if counts[stem] == 1 else safe(sid) for sid, stem in short.items()}


def _write_temp(target: Path, data: dict) -> Path:
    """Write ``data`` as gzipped JSON next to ``target`` under a temporary name; return that name."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
                gz.write(json.dumps(data, default=_jsonable).encode("utf-8"))
            raw.flush()
            os.fsync(raw.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays (e.g. from a generator's info dict) as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
