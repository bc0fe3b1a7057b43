"""Real Gibson homes from the SemExp / L3MVN ObjectNav v1.1 semantic maps (``*_info.pbz2``).

File format (``../shared/data/README.md``): a bz2 pickle of ``{scene: {floor: {"floor_height":
float (m), "sem_map": (16, H, W) float, "origin": (2,) int (cm)}}}`` at 5 cm per cell. Channel 0
holds navigable-floor samples; channels 1..15 are the object categories in ``GibsonConfig.channels``.

How a floor becomes a ``Scene``:

* traversable = channel 0 dilated by a disk of ``floor_dilation_radius`` cells. It comes from
  habitat's navmesh, which already keeps the agent's centre off walls, so it is not eroded by
  the agent radius (eroding leaves 20% of the benchmark's starts off the map, see the README).
* floor (no wall) = traversable dilated by the agent radius, plus every object cell.
* low obstacles: the rest would be walls, which walls in an object that stands behind an
  unlabelled strip (a tv on its stand, a toilet behind its cistern box): no side of it would face
  the room. For each object with no side on open floor, the unlabelled cells between it and the
  nearest open floor (within ``strip_max_gap`` metres, the lens of cells whose distances to the
  object and to the floor add up to at most that gap plus ``strip_slack``) become a low obstacle
  of ``strip_height`` metres: seen over, never walked on.
* instances = connected components of each object channel; where channels overlap (a cup on a
  table), the smaller instance is kept so that small objects are not hidden by furniture.
* categories = the channel names mapped through ``GibsonConfig.category_names`` (couch -> sofa,
  potted plant -> plant, tv -> tv_monitor: habitat-lab's ObjectNav names).
* origin = map-frame ``(x, y)`` of cell ``(0, 0)``: ``(origin[0], origin[1]) / 100`` metres, since
  a habitat position ``(X, Y, Z)`` falls in row ``(X - origin[1]/100) * 20`` and column
  ``(Z - origin[0]/100) * 20`` with map ``x = Z``, ``y = X`` (``world/frames.py``).

Loaded scenes are cached per (file, mtime, config) and their arrays are read-only: copy an array
before changing it.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from scipy import ndimage

from trajrag import config as config_mod
from trajrag.safe_pickle import load_pbz2
from trajrag.world.scene import NO_CATEGORY, Scene

N_FLOOR_CHANNELS = 1  # channel 0 is the navigable floor; objects follow


@dataclass
class GibsonConfig:
    """How Gibson semantic maps become scenes (values: ``configs/gibson.yaml``).

    cell_size: metres per map cell. floor_dilation_radius: cells. agent_radius: metres.
    instance_connectivity: 4 or 8 (neighbours joining one instance). channels: Gibson names of
    sem_map channels 1..N. goal_categories: Gibson names of the ObjectNav goals.
    category_names: Gibson name -> package name, where they differ.
    """

    cell_size: float
    floor_dilation_radius: int
    agent_radius: float
    instance_connectivity: int
    channels: list[str]
    goal_categories: list[str]
    category_names: dict[str, str]
    held_out_scenes: list[str]
    strip_max_gap: float
    strip_slack: float
    strip_height: float


class GibsonFormatError(ValueError):
    """A Gibson ``*_info.pbz2`` file does not have the expected structure."""


def category_name(name: str, cfg: GibsonConfig) -> str:
    """A Gibson (or habitat-lab) category name -> this package's name (unchanged if not in the table)."""
    return cfg.category_names.get(name, name)


def scene_name(scene: str, floor: Any) -> str:
    """The ``Scene.name`` of a Gibson floor: ``gibson/<Scene>/<floor>``."""
    return f"gibson/{scene}/{floor}"


def load_gibson_scenes(path: Path | str, cfg: GibsonConfig) -> list[Scene]:
    """All floors of a Gibson ``*_info.pbz2`` file as scenes (``cfg``: the ``gibson`` section),
    sorted by name. Raises ``FileNotFoundError``,
    ``CorruptFileError``/``UnsafePickleError`` (``trajrag.safe_pickle``) or ``GibsonFormatError``,
    each naming the file (and the scene for a malformed entry).
    """
    _check_config(cfg)
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: Gibson semantic-map file not found")
    stat = path.stat()
    key = json.dumps(config_mod.to_dict(cfg), sort_keys=True)
    return list(_load_cached(str(path), stat.st_mtime_ns, stat.st_size, key))


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, size: int, cfg_json: str) -> tuple[Scene, ...]:
    """Parse a file once per (path, version, config); the key's extra fields invalidate edits."""
    cfg = config_mod.from_dict(GibsonConfig, json.loads(cfg_json))
    data = load_pbz2(path)
    if not isinstance(data, dict) or not data:
        raise GibsonFormatError(f"{path}: expected a non-empty dict {{scene: {{floor: ...}}}}, "
                                f"got {type(data).__name__}")
    scenes = []
    for scene, floors in data.items():
        if not isinstance(scene, str) or not isinstance(floors, dict) or not floors:
            raise GibsonFormatError(f"{path}: scene {scene!r}: expected a non-empty dict of floors, "
                                    f"got {type(floors).__name__}")
        for floor, entry in floors.items():
            scenes.append(build_scene(scene, floor, entry, cfg, source=path))
    scenes.sort(key=lambda s: s.name)
    for s in scenes:
        s.freeze()
    return tuple(scenes)


def build_scene(scene: str, floor: Any, entry: Mapping[str, Any], cfg: GibsonConfig,
                source: str = "<memory>") -> Scene:
    """One floor's ``{'floor_height', 'sem_map', 'origin'}`` entry -> ``Scene`` (see module doc)."""
    where = f"{source}: scene {scene!r} floor {floor!r}"
    sem_map, origin_cm, floor_height = _validate_entry(entry, cfg, where)

    navigable = sem_map[0] > 0
    if not navigable.any():
        raise GibsonFormatError(f"{where}: channel 0 (navigable floor) is empty")
    traversable = _dilate(navigable, cfg.floor_dilation_radius)
    # Object footprints are projected point clouds that bleed a cell or two onto the navmesh
    # floor (1.2% of traversable cells on the train maps). The navmesh is the authority on where
    # the agent stands, so those cells stay floor: an agent starting there would otherwise stand
    # inside a 2.5D object column and see nothing but min_depth.
    objects = (sem_map[N_FLOOR_CHANNELS:] > 0) & ~traversable[None]
    instance_map, instance_category = _instances(objects, cfg.instance_connectivity)
    wall_free = _dilate(traversable, cfg.agent_radius / cfg.cell_size) | objects.any(axis=0)
    low_obstacle = open_walled_in_objects(wall_free, instance_map, cfg.strip_max_gap / cfg.cell_size,
                                          cfg.strip_slack / cfg.cell_size)

    categories = tuple(category_name(c, cfg) for c in cfg.channels)
    return Scene(
        name=scene_name(scene, floor),
        categories=categories,
        traversable=traversable,
        floor=wall_free,
        instance_map=instance_map,
        category_map=instance_category[instance_map],
        instance_category=instance_category,
        cell_size=cfg.cell_size,
        origin=(float(origin_cm[0]) / 100.0, float(origin_cm[1]) / 100.0),
        floor_height=floor_height,
        low_obstacle=low_obstacle,
        low_obstacle_height=cfg.strip_height,
        meta={
            "source": str(source),
            "dataset": "gibson",
            "scene": scene,
            "floor": floor,
            "goal_categories": [category_name(c, cfg) for c in cfg.goal_categories],
        },
    )


def open_walled_in_objects(wall_free: np.ndarray, instance_map: np.ndarray, max_gap: float,
                           slack: float) -> np.ndarray:
    """bool (H, W): the low-obstacle strips that give each walled-in object a side on the floor.

    wall_free: cells that are no wall (objects included); instance_map: object ids, 0 for none;
    max_gap, slack: cells. An object is walled in when none of its 4-neighbours is open floor
    (wall-free and no object). Its strip is the unlabelled cells ``c`` with ``d_obj(c) + d_floor(c)
    <= gap + slack``, ``gap`` the smallest such sum (Euclidean, cells): the cells between the
    object and the floor nearest to it, so the strip lies on the side that faces the room.
    Objects with ``gap > max_gap`` stay walled in (what separates them is more than a stand).
    """
    objects = instance_map > 0
    open_floor = wall_free & ~objects
    unlabelled = ~wall_free
    touches_floor = np.zeros(int(instance_map.max()) + 1, dtype=bool)
    touches_floor[instance_map[ndimage.binary_dilation(open_floor) & objects]] = True
    strip = np.zeros(wall_free.shape, dtype=bool)
    pad = int(math.ceil(max_gap + slack)) + 1
    boxes = ndimage.find_objects(instance_map)
    for instance, box in enumerate(boxes, start=1):
        if box is None or touches_floor[instance]:
            continue
        window = tuple(slice(max(s.start - pad, 0), s.stop + pad) for s in box)
        floor_here = open_floor[window]
        if not floor_here.any():
            continue
        to_object, at_object = ndimage.distance_transform_edt(instance_map[window] != instance, return_indices=True)
        to_floor, at_floor = ndimage.distance_transform_edt(~floor_here, return_indices=True)
        through = np.where(unlabelled[window] & _between(at_object, at_floor), to_object + to_floor, np.inf)
        gap = through.min()
        if gap <= max_gap:
            strip[window] |= through <= gap + slack
    return strip


def _between(at_object: np.ndarray, at_floor: np.ndarray) -> np.ndarray:
    """bool (H, W): cells whose nearest object cell and nearest floor cell lie on opposite sides
    (more than 120 degrees apart as seen from the cell). Wall cells beside the object along the
    floor's edge are not between them, so a wall next to a walled-in object stays a wall."""
    rows, cols = np.indices(at_object.shape[1:])
    to_obj = np.stack([at_object[0] - rows, at_object[1] - cols]).astype(np.float64)
    to_flr = np.stack([at_floor[0] - rows, at_floor[1] - cols]).astype(np.float64)
    dot = (to_obj * to_flr).sum(axis=0)
    norms = np.hypot(*to_obj) * np.hypot(*to_flr)
    return dot < -0.5 * norms


def _check_config(cfg: GibsonConfig) -> None:
    if cfg.cell_size <= 0 or cfg.agent_radius < 0 or cfg.floor_dilation_radius < 0:
        raise config_mod.ConfigError(
            f"gibson: cell_size must be > 0 and radii >= 0, got cell_size={cfg.cell_size}, "
            f"agent_radius={cfg.agent_radius}, floor_dilation_radius={cfg.floor_dilation_radius}")
    if cfg.strip_max_gap < 0 or cfg.strip_slack < 0 or cfg.strip_height <= 0:
        raise config_mod.ConfigError(
            f"gibson: strip_max_gap and strip_slack must be >= 0 and strip_height > 0, got "
            f"{cfg.strip_max_gap}, {cfg.strip_slack}, {cfg.strip_height}")
    if cfg.instance_connectivity not in (4, 8):
        raise config_mod.ConfigError(f"gibson.instance_connectivity must be 4 or 8, got {cfg.instance_connectivity}")
    unknown = sorted(set(cfg.goal_categories) - set(cfg.channels))
    if unknown:
        raise config_mod.ConfigError(f"gibson.goal_categories {unknown} are not in gibson.channels")


def _validate_entry(entry: Any, cfg: GibsonConfig, where: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Check one floor entry; return ``(sem_map, origin_cm, floor_height_m)`` or raise naming ``where``."""
    if not isinstance(entry, Mapping):
        raise GibsonFormatError(f"{where}: expected a dict, got {type(entry).__name__}")
    missing = sorted({"floor_height", "sem_map", "origin"} - set(entry))
    if missing:
        raise GibsonFormatError(f"{where}: missing key(s) {missing}; has {sorted(map(str, entry))}")

    sem_map = entry["sem_map"]
    n_channels = N_FLOOR_CHANNELS + len(cfg.channels)
    if not isinstance(sem_map, np.ndarray) or sem_map.ndim != 3 or sem_map.shape[0] != n_channels \
            or min(sem_map.shape[1:]) < 1:
        shape = getattr(sem_map, "shape", type(sem_map).__name__)
        raise GibsonFormatError(f"{where}: sem_map must be an array ({n_channels}, H, W), got {shape}")
    if sem_map.dtype.kind not in "biuf":
        raise GibsonFormatError(f"{where}: sem_map must be numeric, got dtype {sem_map.dtype}")
    if sem_map.dtype.kind == "f" and not np.isfinite(sem_map).all():
        raise GibsonFormatError(f"{where}: sem_map has NaN or infinite values")

    origin = np.asarray(entry["origin"])
    if origin.shape != (2,) or origin.dtype.kind not in "iuf" or not np.isfinite(origin).all():
        raise GibsonFormatError(f"{where}: origin must be 2 finite numbers (cm), got {entry['origin']!r}")

    height = entry["floor_height"]
    if isinstance(height, (bool, np.bool_)) or not isinstance(height, Real) or not math.isfinite(height):
        raise GibsonFormatError(f"{where}: floor_height must be a finite number (m), got {height!r}")
    return sem_map, origin.astype(np.float64), float(height)


def _dilate(mask: np.ndarray, radius: float) -> np.ndarray:
    """Cells within ``radius`` cells (Euclidean, centre to centre) of a ``True`` cell."""
    if radius <= 0 or not mask.any():
        return mask.copy()
    return ndimage.distance_transform_edt(~mask) <= radius


def _instances(objects: np.ndarray, connectivity: int) -> tuple[np.ndarray, np.ndarray]:
    """Object channels (C, H, W) bool -> ``(instance_map int32, instance_category int16)``.

    Components are painted largest first, so where channels overlap the smaller object (a cup
    on a table) keeps its cells. Instances left with no cell are dropped and ids renumbered
    1..n in painting order.
    """
    structure = ndimage.generate_binary_structure(2, 2 if connectivity == 8 else 1)
    components = []  # (size, category, mask)
    for category, channel in enumerate(objects):
        labels, n = ndimage.label(channel, structure=structure)
        if n == 0:
            continue
        sizes = np.bincount(labels.ravel())
        for label in range(1, n + 1):
            components.append((int(sizes[label]), category, labels == label))
    components.sort(key=lambda c: -c[0])  # stable: ties keep channel order

    painted = np.zeros(objects.shape[1:], dtype=np.int32)
    for index, (_, _, mask) in enumerate(components, start=1):
        painted[mask] = index
    visible = np.unique(painted[painted > 0])
    renumber = np.zeros(len(components) + 1, dtype=np.int32)
    renumber[visible] = np.arange(1, len(visible) + 1, dtype=np.int32)
    instance_category = np.full(len(visible) + 1, NO_CATEGORY, dtype=np.int16)
    instance_category[1:] = [components[i - 1][1] for i in visible]
    return renumber[painted], instance_category
