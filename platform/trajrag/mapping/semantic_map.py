"""The semantic map M_t: obstacle and explored channels plus one channel per object category.

The paper's ``M_t in R^{(2 + N_o) x H x W}`` (Sec. 3.3): two geometric channels and ``N_o``
object channels on a 5 cm grid, built incrementally from depth, object masks and poses.

How a frame is mapped (``SemanticMapper.update``):

* **Back-projection.** Every ``pixel_stride``-th pixel (row and column) of the depth image is
  lifted to a 3D point with the pinhole model of ``CameraIntrinsics`` (z-depth; image columns to
  the agent's right, rows up; the camera ``camera_height`` above the floor, looking along the
  heading) and dropped into the grid.
* **Obstacles** are points whose height above the floor lies in
  ``[obstacle_min_height_m, obstacle_max_height_m]`` (SemExp's band: above small bumps, below the
  top of the agent). Lower points are floor; higher points cannot block the agent.
* **Explored area** (the rule, stated once): a cell is explored if the camera saw it. Each image
  column is a vertical plane through the camera; along the ground ray of that plane, the camera
  has seen free space up to the nearest obstacle point in the column, or, where the column holds
  none, up to the farthest floor point / the range reached by a no-return pixel below the
  horizon (a ray that left the camera downward and travelled ``max_depth`` without a hit swept
  the obstacle band). Everything is capped at ``max_range_m``. The cells whose centres lie
  inside that per-column range are marked explored; so are the cells of every back-projected
  point (the obstacle cell that ended a column is seen through its own points) and a disk of
  ``self_explored_radius_m`` under the agent (it stands there). Nothing behind the first
  obstacle of a column is marked, except floor points actually seen over a low obstacle; no
  margin is added past the range, since one would leak into thick walls and past thin ones,
  creating free cells on walls and spurious frontiers behind them.
  No-return pixels (depth >= ``no_return_fraction * max_depth``) never create obstacles.
* **Objects**: each non-empty mask is eroded by ``object_erosion_px`` (mask edges bleed onto the
  background, whose depth would smear the object onto the wall behind; VLFM erodes its masks the
  same way) and its strided pixels' points set the category's channel.

The map is a fixed ``map_size_m`` square centred on the episode's start pose; cells follow the
house grid convention (docs/architecture.md): ``col`` from ``x``, ``row`` from ``y``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

from trajrag.world.frames import GridGeometry, Pose2D, wrap_angle
from trajrag.world.interface import CameraIntrinsics


@dataclass
class FrontierConfig:
    """Frontier extraction (``trajrag.mapping.frontiers``).

    min_size_m: frontiers with fewer than ``min_size_m / cell`` cells are dropped as noise.
    obstacle_clearance_m: frontier cells this close to an obstacle are dropped (0 keeps them).
    reachable_clearance_m: obstacles are inflated by this much before testing which frontiers
        the agent can reach through free space (0 = plain free space).
    """

    min_size_m: float
    obstacle_clearance_m: float
    reachable_clearance_m: float


# Detection evidence per cell and category is kept in uint8 steps of 1/16 of a full-score view, so
# a cell holds up to ~16 views' worth (more adds nothing to a commit decision of a few views).
_EVIDENCE_STEP = 1.0 / 16.0
_EVIDENCE_MAX = 255 * _EVIDENCE_STEP


@dataclass
class MappingConfig:
    """Semantic-map construction; units in the names (metres, pixels)."""

    cell_size_m: float
    map_size_m: float
    pixel_stride: int
    obstacle_min_height_m: float
    obstacle_max_height_m: float
    max_range_m: float
    no_return_fraction: float
    self_explored_radius_m: float
    object_erosion_px: int
    object_min_pixels: int
    mask_depth_edge_m: float
    mask_depth_window_px: int
    evidence_commit: float
    evidence_min_ratio: float
    frontier: FrontierConfig

    @property
    def weighs_evidence(self) -> bool:
        """Whether object cells wait for evidence (else one detection marks a cell for good)."""
        return self.evidence_commit > 1.0 or self.evidence_min_ratio > 0.0


def validate_config(cfg: MappingConfig) -> None:
    """``ValueError`` naming the key if a mapping parameter is out of range."""
    positive = ("cell_size_m", "map_size_m", "max_range_m")
    for key in positive:
        if getattr(cfg, key) <= 0:
            raise ValueError(f"mapping.{key} must be > 0, got {getattr(cfg, key)}")
    if cfg.pixel_stride < 1:
        raise ValueError(f"mapping.pixel_stride must be >= 1, got {cfg.pixel_stride}")
    if not cfg.obstacle_min_height_m < cfg.obstacle_max_height_m:
        raise ValueError(
            f"mapping.obstacle_min_height_m ({cfg.obstacle_min_height_m}) must be below "
            f"obstacle_max_height_m ({cfg.obstacle_max_height_m})"
        )
    if not 0.0 < cfg.no_return_fraction <= 1.0:
        raise ValueError(f"mapping.no_return_fraction must be in (0, 1], got {cfg.no_return_fraction}")
    for key in ("self_explored_radius_m", "object_erosion_px", "object_min_pixels", "mask_depth_edge_m",
                "mask_depth_window_px", "evidence_commit"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"mapping.{key} must be >= 0, got {getattr(cfg, key)}")
    if not 0.0 <= cfg.evidence_min_ratio <= 1.0 or cfg.evidence_commit > _EVIDENCE_MAX:
        raise ValueError(f"mapping.evidence_min_ratio must be in [0, 1] and evidence_commit <= {_EVIDENCE_MAX}, "
                         f"got {cfg.evidence_min_ratio}, {cfg.evidence_commit}")



# -- grid helpers (cell <-> metres: world.frames.GridGeometry) ---------------------------------------
# Radii in cells come from metres / cell size (0.1 / 0.05 = 2.0000000000000004): compare with slack.
_RADIUS_SLACK = 1e-9


def disk_footprint(radius_cells: float) -> np.ndarray:
    """Bool ``(2r + 1, 2r + 1)``: the cell offsets within ``radius_cells`` of the centre (Euclidean)."""
    r = int(math.floor(radius_cells + _RADIUS_SLACK))
    d = np.arange(-r, r + 1)
    return d[:, None] ** 2 + d[None, :] ** 2 <= radius_cells**2 + _RADIUS_SLACK


def stamp_disk(mask: np.ndarray, cell: np.ndarray, radius_cells: float) -> None:
    """Set the cells of ``disk_footprint(radius_cells)`` around ``cell`` (row, col) in ``mask``, in
    place; the part of the disk beyond the grid's edge is left out."""
    footprint = disk_footprint(radius_cells)
    r = footprint.shape[0] // 2
    row, col = int(cell[0]), int(cell[1])
    h, w = mask.shape
    r0, r1, c0, c1 = max(row - r, 0), min(row + r + 1, h), max(col - r, 0), min(col + r + 1, w)
    if r0 < r1 and c0 < c1:
        mask[r0:r1, c0:c1] |= footprint[r0 - row + r : r1 - row + r, c0 - col + r : c1 - col + r]


def dilate_disk(mask: np.ndarray, radius_cells: float) -> np.ndarray:
    """Binary dilation by ``disk_footprint(radius_cells)``: cells within that distance of a True cell.

    Done as an OR of row-shifted, horizontally widened copies: ~5x faster than
    ``scipy.ndimage.binary_dilation`` for the radii used here (4 cells on 400x400: 0.6 vs 2.8 ms).
    """
    footprint = disk_footprint(radius_cells)
    mask = mask.astype(bool, copy=False)
    r = footprint.shape[0] // 2
    if r == 0:
        return mask.copy()
    h = mask.shape[0]
    widened = _widen(mask, sorted({int(np.count_nonzero(row)) // 2 for row in footprint}))
    out = np.zeros_like(mask)
    for i, row in enumerate(footprint):
        dr = i - r
        src = widened[int(np.count_nonzero(row)) // 2]
        if dr >= 0:
            out[dr:] |= src[: h - dr]
        else:
            out[: h + dr] |= src[-dr:]
    return out


def _widen(mask: np.ndarray, halves: list[int]) -> dict[int, np.ndarray]:
    """Half-width -> ``mask`` dilated horizontally by that many cells (built incrementally)."""
    out: dict[int, np.ndarray] = {}
    acc = mask.copy()
    done = 0
    for half in halves:
        for dc in range(done + 1, half + 1):
            acc[:, dc:] |= mask[:, :-dc]
            acc[:, :-dc] |= mask[:, dc:]
        done = half
        out[half] = acc.copy()
    return out


@dataclass
class SemanticMap(GridGeometry):
    """``M_t``: obstacle / explored (bool H x W) and object channels (bool N_o x H x W).

    ``origin`` is the map-frame ``(x, y)`` in metres of the corner of cell ``(0, 0)``;
    ``categories[k]`` names object channel ``k``.
    """

    obstacle: np.ndarray
    explored: np.ndarray
    objects: np.ndarray
    categories: tuple[str, ...]
    cell_size: float
    origin: tuple[float, float]

    def __post_init__(self) -> None:
        shape = self.obstacle.shape
        if self.explored.shape != shape or self.objects.shape != (len(self.categories), *shape):
            raise ValueError(
                f"SemanticMap: obstacle {shape}, explored {self.explored.shape} and objects "
                f"{self.objects.shape} disagree (expected objects {(len(self.categories), *shape)})"
            )

    @classmethod
    def empty(
        cls, shape: tuple[int, int], categories: tuple[str, ...], cell_size: float, origin: tuple[float, float]
    ) -> "SemanticMap":
        """An all-unknown map."""
        return cls(
            obstacle=np.zeros(shape, dtype=bool),
            explored=np.zeros(shape, dtype=bool),
            objects=np.zeros((len(categories), *shape), dtype=bool),
            categories=tuple(categories),
            cell_size=float(cell_size),
            origin=(float(origin[0]), float(origin[1])),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.obstacle.shape

    def free(self) -> np.ndarray:
        """Bool (H, W): explored cells without an obstacle (``m_t^free`` in the paper)."""
        return self.explored & ~self.obstacle

    def object_channel(self, name: str) -> np.ndarray:
        """Bool (H, W) channel of category ``name``; ``KeyError`` listing the map's categories."""
        try:
            return self.objects[self.categories.index(name)]
        except ValueError:
            raise KeyError(f"semantic map has no category {name!r}; it has {list(self.categories)}") from None

    def channels(self) -> np.ndarray:
        """Bool ``(2 + N_o, H, W)``: obstacle, explored, then the object channels (the paper's M_t)."""
        return np.concatenate([self.obstacle[None], self.explored[None], self.objects], axis=0)

    def explored_bbox(self, margin: int = 0) -> tuple[int, int, int, int] | None:
        """``(r0, r1, c0, c1)`` (end-exclusive) around the explored cells, grown by ``margin`` cells."""
        rows = np.flatnonzero(self.explored.any(axis=1))
        if rows.size == 0:
            return None
        cols = np.flatnonzero(self.explored.any(axis=0))
        h, w = self.shape
        return (
            max(int(rows[0]) - margin, 0),
            min(int(rows[-1]) + 1 + margin, h),
            max(int(cols[0]) - margin, 0),
            min(int(cols[-1]) + 1 + margin, w),
        )

    def copy(self) -> "SemanticMap":
        return SemanticMap(
            self.obstacle.copy(),
            self.explored.copy(),
            self.objects.copy(),
            self.categories,
            self.cell_size,
            self.origin,
        )


def pose_values(pose: Pose2D) -> tuple[float, float, float]:
    """``(x, y, yaw)``; ``ValueError`` if any is not a finite number (the caller skips the frame)."""
    try:
        values = (float(pose.x), float(pose.y), float(pose.yaw))
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"pose must have numeric x, y, yaw; got {pose!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"pose has a non-finite value (x, y, yaw) = {values}: frame not mapped")
    return values


class SemanticMapper:
    """Builds a ``SemanticMap`` from depth + object masks + pose, one frame at a time."""

    def __init__(self, cfg: MappingConfig, intrinsics: CameraIntrinsics, categories: tuple[str, ...]) -> None:
        validate_config(cfg)
        self.cfg = cfg
        self.intrinsics = intrinsics
        self.categories = tuple(categories)
        stride = cfg.pixel_stride
        focal = intrinsics.focal
        self._rows = np.arange(stride // 2, intrinsics.height, stride)
        self._cols = np.arange(stride // 2, intrinsics.width, stride)
        # Camera-frame ray slopes of the sampled pixels: x to the right, y up, per metre of z-depth.
        self._x_c = ((self._cols + 0.5 - intrinsics.width / 2.0) / focal).astype(np.float32)
        self._y_r = ((intrinsics.height / 2.0 - self._rows - 0.5) / focal).astype(np.float32)
        # Horizontal distance per metre of z-depth, per sampled column.
        self._hfac = np.sqrt(1.0 + self._x_c.astype(np.float64) ** 2).astype(np.float32)
        self._below_horizon = self._y_r < 0
        self._range = min(cfg.max_range_m, intrinsics.max_depth)
        self._n_cells = int(round(cfg.map_size_m / cfg.cell_size_m))
        self._map: SemanticMap | None = None
        # With mapping.evidence_*: summed detection scores (``_EVIDENCE_STEP`` units) per category
        # and cell, and the number of frames that saw each cell (``reset`` allocates them).
        self.evidence: np.ndarray | None = None
        self.views: np.ndarray | None = None
        # Flat map cells each category's masks marked in the last frame (verification reads them).
        self.last_object_cells: dict[int, np.ndarray] = {}

    @property
    def map(self) -> SemanticMap:
        if self._map is None:
            raise RuntimeError("SemanticMapper: call reset(start_pose) before using the map")
        return self._map

    def reset(self, start_pose: Pose2D) -> SemanticMap:
        """A fresh all-unknown map of ``map_size_m`` centred on ``start_pose`` (m)."""
        x, y, _ = pose_values(start_pose)
        half = self._n_cells * self.cfg.cell_size_m / 2.0
        shape = (self._n_cells, self._n_cells)
        self._map = SemanticMap.empty(shape, self.categories, self.cfg.cell_size_m, (x - half, y - half))
        if self.cfg.weighs_evidence:
            self.evidence = np.zeros((len(self.categories), *shape), dtype=np.uint8)
            self.views = np.zeros(shape, dtype=np.uint8)
            self._best_score = np.zeros(self.views.size, dtype=np.float32)  # scratch, all 0 between frames
        self.last_object_cells = {}
        return self._map

    # -- one frame ------------------------------------------------------------------------------
    def update(self, depth: np.ndarray, masks: np.ndarray | None, pose: Pose2D,
               scores: np.ndarray | None = None) -> bool:
        """Fuse one frame into the map; returns False (map untouched) if the frame has no depth return.

        depth: float (H, W) z-depth in metres, as ``Observations.depth``.
        masks: bool (N_o, H, W) in ``categories`` order, or None for no detections.
        pose: the agent pose in the map frame. ``ValueError`` if it is non-finite or off the map.
        scores: float (H, W) detection score in [0, 1] per pixel (None: 1 wherever a mask is); the
            evidence a pixel adds to its cell with ``mapping.evidence_*``.
        """
        sem = self.map
        x, y, yaw = pose_values(pose)
        agent_cell = sem.to_cell(np.array([x, y]))
        if not sem.in_bounds(agent_cell):
            lo = np.array(sem.origin)
            hi = lo + np.array(sem.shape[::-1]) * sem.cell_size
            raise ValueError(
                f"pose ({x:.2f}, {y:.2f}) is off the semantic map, which covers x in [{lo[0]:.2f}, {hi[0]:.2f}], "
                f"y in [{lo[1]:.2f}, {hi[1]:.2f}] m (mapping.map_size_m={self.cfg.map_size_m})"
            )
        depth = np.asarray(depth)
        if depth.size == 0:
            return False
        expected = (self.intrinsics.height, self.intrinsics.width)
        if depth.shape != expected:
            raise ValueError(f"depth image has shape {depth.shape}, the camera gives {expected}")
        if masks is not None:
            masks = self._check_masks(masks)
        stride = self.cfg.pixel_stride
        z = depth[stride // 2 :: stride, stride // 2 :: stride].astype(np.float32)
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(z) & (z > 0)
            no_return = finite & (z >= self.cfg.no_return_fraction * self.intrinsics.max_depth)
        hit = finite & ~no_return
        if not hit.any():
            return False
        z = np.where(finite, z, 0.0).astype(np.float32)
        points = self._project(z, hit, x, y, yaw)
        self._mark_points(points)
        ranges = self._column_ranges(points, no_return)
        self._mark_visible(x, y, yaw, ranges)
        self.last_object_cells = {}
        if self.evidence is not None:
            self._count_views(points)
        if masks is not None:
            self._mark_objects(masks, points, z, scores)
        return True

    def _project(self, z: np.ndarray, hit: np.ndarray, x: float, y: float, yaw: float) -> dict[str, np.ndarray]:
        """Strided pixels -> map cells and heights; returns the per-pixel arrays the steps need."""
        sem = self.map
        hd = z * self._hfac[None, :]
        up = self.intrinsics.camera_height + z * self._y_r[:, None]
        right = z * self._x_c[None, :]
        c, s = math.cos(yaw), math.sin(yaw)
        # Right of the heading is heading - 90 deg in the counter-clockwise map frame.
        px = x + z * c + right * s
        py = y + z * s - right * c
        col = np.floor((px - sem.origin[0]) / sem.cell_size).astype(np.int64)
        row = np.floor((py - sem.origin[1]) / sem.cell_size).astype(np.int64)
        h, w = sem.shape
        valid = hit & (hd <= self._range) & (row >= 0) & (row < h) & (col >= 0) & (col < w)
        flat = np.where(valid, row * w + col, 0)
        obstacle = valid & (up >= self.cfg.obstacle_min_height_m) & (up <= self.cfg.obstacle_max_height_m)
        floor = valid & (up < self.cfg.obstacle_min_height_m)
        return {"hd": hd, "flat": flat, "valid": valid, "obstacle": obstacle, "floor": floor}

    def _mark_points(self, points: dict[str, np.ndarray]) -> None:
        sem = self.map
        flat = points["flat"]
        sem.obstacle.reshape(-1)[flat[points["obstacle"]]] = True
        sem.explored.reshape(-1)[flat[points["valid"]]] = True

    def _column_ranges(self, points: dict[str, np.ndarray], no_return: np.ndarray) -> np.ndarray:
        """Per sampled column: the ground distance (m) up to which the camera saw free space."""
        hd = points["hd"]
        nearest_obstacle = np.where(points["obstacle"], hd, np.inf).min(axis=0)
        open_ray = no_return & self._below_horizon[:, None]
        seen = np.where(points["floor"], hd, 0.0).max(axis=0)
        seen = np.where(open_ray.any(axis=0), self._range, seen)
        return np.minimum(np.minimum(nearest_obstacle, seen), self._range)

    def _mark_visible(self, x: float, y: float, yaw: float, ranges: np.ndarray) -> None:
        """Mark explored every cell whose ground ray from the camera is within its column's range."""
        sem = self.map
        cfg = self.cfg
        reach = max(float(ranges.max()), cfg.self_explored_radius_m)
        radius = int(math.ceil(reach / sem.cell_size)) + 1
        ar, ac = (int(v) for v in sem.to_cell(np.array([x, y])))
        h, w = sem.shape
        # Only the view cone (and the self-explored disk) can be marked: its bounding box is a
        # third of the square around the agent, and the cells outside it are never seen.
        (dx0, dx1), (dy0, dy1) = self._view_box(yaw, reach, cfg.self_explored_radius_m)
        r0 = max(ar - radius, ar + int(math.floor(dy0 / sem.cell_size)) - 1, 0)
        r1 = min(ar + radius + 1, ar + int(math.ceil(dy1 / sem.cell_size)) + 2, h)
        c0 = max(ac - radius, ac + int(math.floor(dx0 / sem.cell_size)) - 1, 0)
        c1 = min(ac + radius + 1, ac + int(math.ceil(dx1 / sem.cell_size)) + 2, w)
        dy = (sem.origin[1] + (np.arange(r0, r1) + 0.5) * sem.cell_size - y)[:, None]
        dx = (sem.origin[0] + (np.arange(c0, c1) + 0.5) * sem.cell_size - x)[None, :]
        c, s = math.cos(yaw), math.sin(yaw)
        forward = dx * c + dy * s
        right = dx * s - dy * c
        dist = np.hypot(dx, dy)
        with np.errstate(divide="ignore", invalid="ignore"):
            pixel = right / forward * self.intrinsics.focal + self.intrinsics.width / 2.0
        in_view = (forward > 0) & (pixel >= 0) & (pixel < self.intrinsics.width)
        strip = np.clip(np.where(in_view, pixel, 0) // cfg.pixel_stride, 0, ranges.size - 1).astype(np.int64)
        seen = in_view & (dist <= ranges[strip])
        seen |= dist <= cfg.self_explored_radius_m
        sem.explored[r0:r1, c0:c1] |= seen

    def _view_box(self, yaw: float, reach: float, disk: float) -> tuple[tuple[float, float], tuple[float, float]]:
        """((x min, x max), (y min, y max)) in metres from the agent of the cone of half-angle
        ``atan(width / 2 / focal)`` and length ``reach`` around ``yaw``, and of the disk of
        radius ``disk`` around the agent."""
        half = math.atan2(self.intrinsics.width / 2.0, self.intrinsics.focal)
        angles = [yaw - half, yaw + half]
        # The cone also reaches farthest along any axis direction between its two edges.
        angles += [k * math.pi / 2 for k in range(-4, 5) if abs(wrap_angle(k * math.pi / 2 - yaw)) <= half]
        xs = [reach * math.cos(a) for a in angles] + [-disk, disk]
        ys = [reach * math.sin(a) for a in angles] + [-disk, disk]
        return (min(xs), max(xs)), (min(ys), max(ys))

    def _check_masks(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks).astype(bool, copy=False)  # uint8 masks must not become indices
        expected = (len(self.categories), self.intrinsics.height, self.intrinsics.width)
        if masks.shape != expected:
            raise ValueError(f"object masks have shape {masks.shape}, expected {expected} (categories, H, W)")
        return masks

    def _mark_objects(self, masks: np.ndarray, points: dict[str, np.ndarray], z: np.ndarray,
                      scores: np.ndarray | None) -> None:
        stride = self.cfg.pixel_stride
        sampled_scores = None if scores is None else np.asarray(scores)[stride // 2 :: stride, stride // 2 :: stride]
        for k in range(masks.shape[0]):
            mask = masks[k]
            if not mask.any():
                continue
            mask = self._clean_mask(mask)
            if mask is None:
                continue
            sampled = mask[stride // 2 :: stride, stride // 2 :: stride] & points["valid"]
            if self.cfg.mask_depth_edge_m > 0:
                sampled &= self._in_front_of_edges(sampled, z)
            cells = points["flat"][sampled]
            self.last_object_cells[k] = cells
            if self.evidence is None:
                self.map.objects[k].reshape(-1)[cells] = True
            else:
                self._add_evidence(k, cells, None if sampled_scores is None else sampled_scores[sampled])

    def _in_front_of_edges(self, sampled: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Bool over the sampled pixels: those no deeper than ``mask_depth_edge_m`` beyond the
        nearest masked pixel around them (``mask_depth_window_px``). A mask spilling past an
        object's outline lands on pixels far behind it; within one object depth changes smoothly."""
        window = max(2 * int(math.ceil(self.cfg.mask_depth_window_px / self.cfg.pixel_stride / 2.0)) + 1, 3)
        nearest = ndi.minimum_filter(np.where(sampled, z, np.inf), size=window, mode="constant", cval=np.inf)
        return z <= nearest + self.cfg.mask_depth_edge_m

    def _count_views(self, points: dict[str, np.ndarray]) -> None:
        """One more view of every cell a valid pixel landed on; committed objects whose share of
        detections falls under ``evidence_min_ratio`` are dropped (a false positive seen again)."""
        seen = np.unique(points["flat"][points["valid"]])
        views = self.views.reshape(-1)
        views[seen] = np.minimum(views[seen].astype(np.int32) + 1, 255).astype(np.uint8)
        if self.cfg.evidence_min_ratio > 0:
            objects = self.map.objects.reshape(len(self.categories), -1)
            marked = seen[objects[:, seen].any(axis=0)]
            if marked.size:
                objects[:, marked] &= self._ratio_ok(marked)

    def _add_evidence(self, k: int, cells: np.ndarray, scores: np.ndarray | None) -> None:
        """Add each cell's best score of this frame to category ``k``'s evidence; commit the cells
        whose evidence reaches ``evidence_commit`` with a share of detections over the minimum."""
        scores = np.ones(cells.size, dtype=np.float32) if scores is None else scores.astype(np.float32)
        best = self._best_score
        np.maximum.at(best, cells, scores)
        unique = np.unique(cells)
        steps = np.rint(best[unique] / _EVIDENCE_STEP).astype(np.int32)
        best[unique] = 0.0
        evidence = self.evidence[k].reshape(-1)
        evidence[unique] = np.minimum(evidence[unique].astype(np.int32) + steps, 255).astype(np.uint8)
        commit = evidence[unique] * _EVIDENCE_STEP >= self.cfg.evidence_commit - 1e-6
        if self.cfg.evidence_min_ratio > 0:
            commit &= self._ratio_ok(unique, channel=k)
        self.map.objects[k].reshape(-1)[unique] = commit

    def _ratio_ok(self, cells: np.ndarray, channel: int | None = None) -> np.ndarray:
        """Bool (N_o, len(cells)), or (len(cells),) for one ``channel``: evidence per view at
        least ``evidence_min_ratio``."""
        evidence = self.evidence.reshape(len(self.categories), -1)
        evidence = (evidence[:, cells] if channel is None else evidence[channel, cells]) * _EVIDENCE_STEP
        views = np.maximum(self.views.reshape(-1)[cells], 1)
        return evidence >= self.cfg.evidence_min_ratio * views - 1e-6

    def _clean_mask(self, mask: np.ndarray) -> np.ndarray | None:
        """Drop masks under ``object_min_pixels``; erode the rest inside their bounding box."""
        if np.count_nonzero(mask) < max(self.cfg.object_min_pixels, 1):
            return None
        e = self.cfg.object_erosion_px
        if e == 0:
            return mask
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        r0, r1 = max(rows[0] - e, 0), rows[-1] + e + 1
        c0, c1 = max(cols[0] - e, 0), cols[-1] + e + 1
        out = np.zeros_like(mask)
        # border_value=1: the image border is not an object boundary, so do not eat into it.
        out[r0:r1, c0:c1] = ndi.binary_erosion(mask[r0:r1, c0:c1], iterations=e, border_value=1)
        return out
