"""Real Matterport3D homes from top-down semantic maps (``scenes/<scan>/BEV_semantic_map.npy``).

File format (``../shared/data/README.md``): a ``.npy`` holding a 0-d object array whose item is a
dict: ``semantic_map`` int (H, W) of mpcat40 labels at 10 cm, a crop of a 1000 x 1000 grid over
habitat X, Z in [-50, 50] m; ``min_x``, ``min_z`` the crop's first column and row in that grid.
Habitat ``X = (col + min_x) * 0.1 - 50`` and ``Z = (row + min_z) * 0.1 - 50``.

How a scan becomes a ``Scene`` (one per scan, ``mp3d/<scan>/0``: the files hold the ground floor):

* frame: the package's map frame has ``x = Z`` along the columns and ``y = X`` along the rows
  (``world/frames.py``), so the BEV crop is transposed (its rows run along Z) and the corner of
  cell ``(0, 0)`` is at ``x = min_z * 0.1 - 50``, ``y = min_x * 0.1 - 50``.
* traversable = the floor label eroded by ``floor_erosion_cells`` source cells (4-connected
  structuring element): the floor is all that is seen from above, not agent-centre space (the
  data README's navmesh measurement, quoted in ``configs/mp3d.yaml``). Objects hide the floor
  under them, so they are never traversable.
* walls: void (never observed), wall and every label in ``wall_labels`` (structure: doors,
  windows, stairs, columns...), plus any label outside ``labels`` (reported in ``meta``).
* objects: every other label is an object category (its mpcat40 name); instances are the
  ``instance_connectivity``-connected components of each label. With ``fragment_max_cells`` a
  component of at most that many cells (a stray projected cell, not an object) first takes the
  label most common around it.
* resolution: each 10 cm source cell becomes ``upsample`` x ``upsample`` cells, so the rest of the
  stack (maps, renderer, geodesics) runs at its usual 5 cm.

Loaded scenes are cached per (file, mtime, config) and their arrays are read-only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from numpy.lib import format as npy_format
from scipy import ndimage

from trajrag import config as config_mod
from trajrag.safe_pickle import CorruptFileError, restricted_load
from trajrag.world.scene import NO_CATEGORY, Scene

BEV_FILE = "BEV_semantic_map.npy"
_REQUIRED_KEYS = ("semantic_map", "min_x", "min_z")
_CACHE_SIZE = 64  # scans kept parsed (the 50 shipped ones fit)
_CACHE: dict[tuple, Scene] = {}


@dataclass
class Mp3dConfig:
    """How MP3D top-down semantic maps become scenes (values: ``configs/mp3d.yaml``).

    source_cell_size: metres per cell in the files. upsample: scene cells per source cell along
    each axis (cell_size = source_cell_size / upsample). grid_offset_m: habitat X / Z of the
    files' grid cell 0 corner. floor_erosion_cells: source cells eroded off the floor label.
    floor_height: habitat Y of the ground floor, metres. instance_connectivity: 4 or 8.
    fragment_max_cells: source cells; object components this small take the label around them
    (0: none).
    labels: mpcat40 id -> name. floor_label, void_label: ids. wall_labels: names drawn as walls.
    held_out_scans: scans kept out of a corpus for evaluation on unseen homes (``FOLDER@held_out``
    / ``FOLDER@rest``). The goal vocabularies are ``episodes.goal_categories`` (six, as Gibson)
    and the ``mp3d21`` preset (MP3D ObjectNav's 21).
    """

    source_cell_size: float
    upsample: int
    grid_offset_m: float
    floor_erosion_cells: int
    floor_height: float
    instance_connectivity: int
    fragment_max_cells: int
    labels: dict[int, str]
    floor_label: int
    void_label: int
    wall_labels: list[str]
    held_out_scans: list[str]

    @property
    def cell_size(self) -> float:
        return self.source_cell_size / self.upsample

    def object_labels(self) -> dict[int, str]:
        """id -> name of the labels that become object categories, in id order."""
        structure = {self.floor_label, self.void_label}
        walls = set(self.wall_labels)
        return {i: n for i, n in sorted(self.labels.items()) if i not in structure and n not in walls}


class Mp3dFormatError(ValueError):
    """An MP3D ``BEV_semantic_map.npy`` does not have the expected structure."""


def check_config(cfg: Mp3dConfig) -> None:
    """``ConfigError`` naming the bad value."""
    if cfg.source_cell_size <= 0 or cfg.upsample < 1 or cfg.floor_erosion_cells < 0:
        raise config_mod.ConfigError(
            f"mp3d: need source_cell_size > 0, upsample >= 1 and floor_erosion_cells >= 0, got "
            f"{cfg.source_cell_size}, {cfg.upsample}, {cfg.floor_erosion_cells}")
    if cfg.fragment_max_cells < 0:
        raise config_mod.ConfigError(f"mp3d.fragment_max_cells must be >= 0, got {cfg.fragment_max_cells}")
    if cfg.instance_connectivity not in (4, 8):
        raise config_mod.ConfigError(f"mp3d.instance_connectivity must be 4 or 8, got {cfg.instance_connectivity}")
    unknown = sorted(set(cfg.wall_labels) - set(cfg.labels.values()))
    if unknown:
        raise config_mod.ConfigError(f"mp3d: wall_labels {unknown} are not in mp3d.labels")


def is_mp3d_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of scans (``<scan>/BEV_semantic_map.npy``), holds ``scenes/``,
    or is one scan's folder."""
    return path.is_dir() and bool(scan_files(path))


def scan_files(folder: Path) -> list[Path]:
    """The ``<scan>/BEV_semantic_map.npy`` files of ``folder`` (or of ``folder/scenes``), by scan;
    a scan's own folder gives its one file (the scan is the folder's name)."""
    folder = Path(folder).expanduser()
    if (folder / BEV_FILE).is_file():
        return [folder / BEV_FILE]
    root = folder / "scenes" if not any(folder.glob(f"*/{BEV_FILE}")) else folder
    return sorted(root.glob(f"*/{BEV_FILE}"), key=lambda p: p.parent.name)


def scene_name(scan: str) -> str:
    """The ``Scene.name`` of an MP3D scan's ground floor: ``mp3d/<scan>/0``."""
    return f"mp3d/{scan}/0"


def load_mp3d_scenes(folder: Path | str, cfg: Mp3dConfig) -> list[Scene]:
    """Every scan under ``folder`` as a scene, sorted by name. Raises ``FileNotFoundError``,
    ``CorruptFileError`` / ``UnsafePickleError`` or ``Mp3dFormatError``, each naming the file."""
    check_config(cfg)
    files = scan_files(Path(folder))
    if not files:
        raise FileNotFoundError(f"{folder}: no <scan>/{BEV_FILE} (nor scenes/<scan>/{BEV_FILE}) in this folder")
    key = json.dumps(config_mod.to_dict(cfg), sort_keys=True)
    scenes = []
    for path in files:
        path = path.resolve()
        stat = path.stat()
        scenes.append(_load_cached(str(path), stat.st_mtime_ns, stat.st_size, key, cfg))
    return scenes


def _load_cached(path: str, mtime_ns: int, size: int, cfg_json: str, cfg: Mp3dConfig) -> Scene:
    """Parse one file once per (path, version, config): the key's extra fields invalidate edits."""
    key = (path, mtime_ns, size, cfg_json)
    scene = _CACHE.get(key)
    if scene is None:
        scene = build_scene(Path(path).parent.name, read_bev(path), cfg, source=path).freeze()
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = scene
    return scene


def read_bev(path: Path | str) -> dict[str, Any]:
    """A ``BEV_semantic_map.npy`` as its dict, through the restricted unpickler (never
    ``np.load(allow_pickle=True)``: the pickle could name any callable)."""
    path = str(path)
    with open(path, "rb") as fileobj:
        try:
            version = npy_format.read_magic(fileobj)
            read_header = {(1, 0): npy_format.read_array_header_1_0,
                           (2, 0): npy_format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy version {version}")
            shape, _, dtype = read_header(fileobj)
        except (ValueError, EOFError, SyntaxError) as exc:
            raise CorruptFileError(f"{path}: not a .npy file ({exc})") from None
        if dtype != np.dtype(object) or shape != ():
            raise Mp3dFormatError(f"{path}: expected a 0-d object array holding a dict, got {dtype} {shape}")
        array = restricted_load(fileobj, path)
    item = array.item() if isinstance(array, np.ndarray) and array.shape == () else array
    if not isinstance(item, dict):
        raise Mp3dFormatError(f"{path}: expected a dict inside the array, got {type(item).__name__}")
    return item


def build_scene(scan: str, bev: Mapping[str, Any], cfg: Mp3dConfig, source: str = "<memory>") -> Scene:
    """One scan's BEV dict -> ``Scene`` (see the module doc)."""
    labels, min_x, min_z = _validate(bev, f"{source}: scan {scan!r}")
    objects = cfg.object_labels()
    # rows along habitat X (map y), columns along Z (map x)
    grid = _absorb_fragments(labels.T, list(objects), cfg.fragment_max_cells, cfg.instance_connectivity)
    traversable = _erode(grid == cfg.floor_label, cfg.floor_erosion_cells)
    is_object = np.isin(grid, list(objects))
    no_wall = (grid == cfg.floor_label) | is_object

    category_of_label = {label: index for index, label in enumerate(objects)}
    instance_map, instance_category = _instances(grid, is_object, category_of_label, cfg.instance_connectivity)
    up = cfg.upsample
    instance_map = _upsample(instance_map, up)
    unknown = sorted(int(v) for v in np.unique(grid) if int(v) not in cfg.labels)
    offset = cfg.grid_offset_m
    return Scene(
        name=scene_name(scan),
        categories=tuple(objects.values()),
        traversable=_upsample(traversable, up),
        floor=_upsample(no_wall, up),
        instance_map=instance_map,
        category_map=instance_category[instance_map],
        instance_category=instance_category,
        cell_size=cfg.cell_size,
        origin=(min_z * cfg.source_cell_size + offset, min_x * cfg.source_cell_size + offset),
        floor_height=cfg.floor_height,
        meta={
            "source": str(source),
            "dataset": "mp3d",
            "scene": scan,
            "floor": 0,
            "scene_id": f"mp3d/{scan}/{scan}.glb",
            "floor_id": 0,
            "unknown_labels_as_walls": unknown,
        },
    )


def _validate(bev: Mapping[str, Any], where: str) -> tuple[np.ndarray, int, int]:
    missing = [k for k in _REQUIRED_KEYS if k not in bev]
    if missing:
        raise Mp3dFormatError(f"{where}: missing key(s) {missing}; has {sorted(map(str, bev))}")
    labels = bev["semantic_map"]
    if not isinstance(labels, np.ndarray) or labels.ndim != 2 or min(labels.shape) < 1 or labels.dtype.kind not in "iu":
        shape = getattr(labels, "shape", type(labels).__name__)
        raise Mp3dFormatError(f"{where}: semantic_map must be a 2-D integer array of labels, got "
                              f"{shape} {getattr(labels, 'dtype', '')}")
    bounds = []
    for key in ("min_x", "min_z"):
        value = bev[key]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) and not (
                isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu"):
            raise Mp3dFormatError(f"{where}: {key} must be an integer cell index, got {value!r}")
        bounds.append(int(value))
    return labels.astype(np.int64, copy=False), bounds[0], bounds[1]


def _erode(mask: np.ndarray, cells: int) -> np.ndarray:
    return ndimage.binary_erosion(mask, iterations=cells) if cells > 0 else mask.copy()


def _upsample(grid: np.ndarray, factor: int) -> np.ndarray:
    """Each cell -> ``factor`` x ``factor`` cells of the same value."""
    return grid.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else grid.copy()


def _absorb_fragments(grid: np.ndarray, object_labels: list[int], max_cells: int, connectivity: int) -> np.ndarray:
    """``grid`` with each connected component of an object label of at most ``max_cells`` cells
    relabelled to the label most common among its neighbours (the lowest id on a tie), read from
    ``grid`` as given so that the order of the components does not matter."""
    if max_cells <= 0:
        return grid
    out = grid.copy()
    structure = ndimage.generate_binary_structure(2, 2 if connectivity == 8 else 1)
    around = ndimage.generate_binary_structure(2, 2)
    for label in np.unique(grid[np.isin(grid, object_labels)]):
        components, _ = ndimage.label(grid == label, structure=structure)
        sizes = np.bincount(components.ravel())
        for component, box in enumerate(ndimage.find_objects(components), start=1):
            if box is None or sizes[component] > max_cells:
                continue
            window = tuple(slice(max(s.start - 1, 0), s.stop + 1) for s in box)
            mine = components[window] == component
            ring = ndimage.binary_dilation(mine, structure=around) & ~mine
            values, counts = np.unique(grid[window][ring], return_counts=True)
            if len(values):
                out[window][mine] = values[np.argmax(counts)]
    return out


def _instances(grid: np.ndarray, is_object: np.ndarray, category_of_label: dict[int, int],
               connectivity: int) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of each object label -> ``(instance_map int32, instance_category int16)``
    with instance ids 1..n in (label, component) order."""
    structure = ndimage.generate_binary_structure(2, 2 if connectivity == 8 else 1)
    instance_map = np.zeros(grid.shape, dtype=np.int32)
    categories = [NO_CATEGORY]
    for label in np.unique(grid[is_object]):
        components, n = ndimage.label(grid == label, structure=structure)
        inside = components > 0
        instance_map[inside] = components[inside] + len(categories) - 1
        categories.extend([category_of_label[int(label)]] * n)
    return instance_map, np.asarray(categories, dtype=np.int16)
