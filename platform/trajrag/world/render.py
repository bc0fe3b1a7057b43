"""2.5D renderer for top-down grid scenes: depth, semantic (instance + category) and synthetic RGB.

The world is a height field on the scene grid: walls (cells with ``Scene.floor == False`` and
everything out of bounds) rise to the ceiling, object cells are columns from the floor up to their
category's height, the floor is at 0 and a flat ceiling at the wall height. A pinhole camera with
zero pitch looks along the agent's heading from ``camera_height``.

How it stays fast with numpy alone (one core, 640x480 in a few milliseconds):

* Each image column ``c`` is one vertical plane through the camera. Its ray direction in camera
  coordinates is ``(x_c, y_r, 1)``; all columns are sampled at the *same* z-depths ``z_i`` (so a
  wall faced square-on has one z-depth across the image), spaced so that the ground step at the
  image edge, ``dz * sqrt(1 + x_c^2)``, is at most ``ray_step_cells`` cells.
* Sample ``i`` of column ``c`` has a top height ``top_i`` (0 floor, category height for an
  object, "infinite" for a wall). Pixel row ``r`` (ray height ``cam_h + z * y_r``) hits it iff
  ``y_r <= s_i = (top_i - cam_h) / z_i``; the first hit of row ``r`` is the first ``i`` where the
  running max of ``s`` reaches ``y_r``. Because ``y_r`` is linear in ``r``, sample ``i`` paints a
  contiguous run of rows, so one column is a run-length fill: a running max gives the number of
  rows covered so far (counted from the bottom), its differences are the run lengths and
  ``np.repeat`` expands sample codes to pixels. A sentinel last sample paints whatever is left
  ("nothing in range", or the ceiling).
* Depth of a pixel painted by sample ``i``: a ray meeting a horizontal top from above (the floor,
  a bed) crosses that height at ``z* = (top - cam_h) / y_r`` exactly; otherwise it entered the
  column through its side, somewhere after the previous sample, so depth = ``max(z_{i-1}, z*)``.
  Rays looking up see the ceiling at ``(wall_h - cam_h) / y_r`` if that is nearer than the hit.

Everything that depends only on the camera is computed once (``Renderer``), everything that
depends only on the scene once per scene (``SceneRaster``, a wall-padded code grid so that no ray
leaves the array), and the per-frame work is a few dozen vectorised passes over (W, S) and
(H, W) arrays, mostly into preallocated buffers.

Limits of the 2.5D model: objects are solid columns (a table hides what is under it), thin
diagonal walls drawn as 8-connected staircases may let a ray slip through a corner, and nothing
beyond ``max_depth`` is rendered (it reads as max_depth, no semantics), as the depth sensor clips
there anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from trajrag.world.interface import CameraIntrinsics
from trajrag.world.scene import NO_CATEGORY, NO_INSTANCE, Scene

WALL = -1  # cell code of walls and out-of-bounds cells
NOTHING = -2  # pixel code where nothing is hit in range, or the ceiling is nearer
LOW = -3  # cell code of low unlabelled obstacles (``Scene.low_obstacle``)
_N_NEGATIVE_CODES = 3  # the per-code tables end with LOW, NOTHING, WALL (indexed with wrap-around)

# Brightness steps of the synthetic RGB: 256, one per uint8 grey level.
_SHADE_LEVELS = 256

# A wall's top, relative to the camera, in metres. It must beat every object and stay finite:
# an infinite top would turn into inf * 0 = nan in the depth arithmetic.
_WALL_TOP = 1.0e6


@dataclass
class RgbConfig:
    """Synthetic RGB shading (all values are fractions of full brightness, in [0, 1]).

    palette: matplotlib colormap name; category id ``k`` takes colour ``k`` of it (mod its size).
    wall_grey, floor_grey, ceiling_grey: grey levels of the structure.
    top_shade: brightness of horizontal surfaces (floor, object tops, ceiling).
    x_face_shade, y_face_shade: brightness of vertical faces whose normal is along map x / map y
        (a fixed light direction, so that corners and object sides stand out).
    distance_falloff: fraction of brightness lost at ``max_depth`` (linear in z-depth).
    """

    palette: str
    wall_grey: float
    floor_grey: float
    ceiling_grey: float
    top_shade: float
    x_face_shade: float
    y_face_shade: float
    distance_falloff: float


@dataclass(frozen=True)
class SceneRaster:
    """A scene prepared for rendering: a wall-padded grid of per-cell codes plus lookup tables.

    Codes: ``0`` floor, ``1..n`` object instance ids, ``WALL`` (-1) wall, ``NOTHING`` (-2) no hit
    in range or the ceiling, ``LOW`` (-3) a low unlabelled obstacle. Negative codes make the
    instance image a plain ``max(code, 0)``; the per-code tables have ``n + 4`` entries and are
    indexed with wrap-around (-1 is the last).
    ``code_flat`` is the padded grid raveled, plus one ``NOTHING`` entry at the end that the
    sentinel ray sample points to.

    top_rel: float32 per code, top height minus camera height (metres; walls ``_WALL_TOP``).
    category: int16 per code, the category id to report. colour: uint8 RGB per code and
    brightness level (see ``Renderer._colours``), or None if prepared without RGB.
    padded_width: columns of the padded grid; pad: wall cells added on each side.
    """

    scene_name: str
    code_flat: np.ndarray
    padded_width: int
    pad: int
    cell_size: float
    origin: tuple[float, float]
    top_rel: np.ndarray
    category: np.ndarray
    colour: Optional[np.ndarray]


def object_heights_per_instance(scene: Scene, heights: Mapping[str, float], default: float) -> np.ndarray:
    """Height in metres of each instance id (index 0 unused): its category's height by name."""
    per_category = np.array([heights.get(name, default) for name in scene.categories] or [default],
                            dtype=np.float32)
    cats = scene.instance_category.astype(np.int64)
    return np.where(cats >= 0, per_category[np.clip(cats, 0, None)], np.float32(default))


@dataclass(frozen=True)
class _Rays:
    """Ray samples for one cell size: z-depths (S,), their inverses and the previous depths."""

    cell_size: float
    z: np.ndarray  # float32 (S + 1,): sample z-depths in metres; the sentinel's is 0
    inv_z: np.ndarray  # float32 (S + 1,)
    z_prev: np.ndarray  # float32 (W, S + 1): z_{i-1} tiled over columns; sentinel: inf
    pad: int  # cells of wall padding so that every sample stays inside the grid


class Renderer:
    """Renders ``SceneRaster`` views for one camera (``CameraIntrinsics``) and wall height."""

    def __init__(self, intrinsics: CameraIntrinsics, wall_height: float, ray_step_cells: float,
                 rgb: RgbConfig) -> None:
        cam = intrinsics
        if not (0 < cam.min_depth < cam.max_depth):
            raise ValueError(f"sim: need 0 < min_depth < max_depth, got {cam.min_depth}, {cam.max_depth}")
        if wall_height <= cam.camera_height:
            raise ValueError(f"sim: wall_height {wall_height} m must exceed camera_height {cam.camera_height} m")
        if cam.height > np.iinfo(np.int16).max:
            raise ValueError(f"sim: image height {cam.height} px is above the renderer's int16 row counts")
        if not 0 < ray_step_cells <= 1:
            raise ValueError(f"sim: ray_step_cells must be in (0, 1], got {ray_step_cells}")
        self.intrinsics = cam
        self.wall_height = float(wall_height)
        self.ray_step_cells = float(ray_step_cells)
        self.rgb_config = rgb
        w, h, f = cam.width, cam.height, cam.focal
        self.focal = f
        # Pinhole ray slopes: x to the right per column, y up per row counted from the bottom (b).
        self.x_c = ((np.arange(w) + 0.5 - w / 2.0) / f).astype(np.float32)
        y_b = ((np.arange(h) + 0.5 - h / 2.0) / f).astype(np.float32)
        self.n_below = int(np.count_nonzero(y_b < 0))  # rows looking down (bottom half)
        self.inv_y_down = (1.0 / y_b[: self.n_below]).astype(np.float32)
        y_up = y_b[self.n_below:]
        with np.errstate(divide="ignore"):
            ceil = np.where(y_up > 0, (self.wall_height - cam.camera_height) / y_up, np.inf)
        self.z_ceiling = ceil.astype(np.float32)
        self._rays: Optional[_Rays] = None
        self._buffers: dict[str, np.ndarray] = {}

    # -- camera-only precomputation ---------------------------------------------------------
    def rays(self, cell_size: float) -> _Rays:
        """Ray samples for grids of ``cell_size`` metres (cached for the last cell size)."""
        if self._rays is not None and self._rays.cell_size == cell_size:
            return self._rays
        cam = self.intrinsics
        stretch = math.sqrt(1.0 + float(np.max(self.x_c ** 2)))  # ground length per unit z at the edge
        dz = self.ray_step_cells * cell_size / stretch
        n = int(math.ceil(cam.max_depth / dz))
        z = np.zeros(n + 1, dtype=np.float32)
        z[:n] = dz * np.arange(1, n + 1)
        inv_z = np.zeros_like(z)
        inv_z[:n] = 1.0 / z[:n]
        z_prev = np.empty(n + 1, dtype=np.float32)
        z_prev[0] = 0.0
        z_prev[1:n] = z[: n - 1]
        z_prev[n] = np.inf  # "nothing in range": depth max_depth after clipping, or the ceiling
        reach = cam.max_depth * stretch / cell_size
        self._rays = _Rays(
            cell_size=cell_size, z=z, inv_z=inv_z,
            z_prev=np.ascontiguousarray(np.broadcast_to(z_prev, (cam.width, n + 1))),
            pad=int(math.ceil(reach)) + 2,
        )
        self._buffers = {}
        return self._rays

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._buffers[name] = np.empty(shape, dtype=dtype)
        return buf

    # -- scene precomputation ---------------------------------------------------------------
    def prepare(self, scene: Scene, heights: Mapping[str, float], default_height: float,
                with_rgb: bool) -> SceneRaster:
        """Pad the scene with walls and build its code grid and per-code tables.

        heights: category name -> column height in metres; default_height for other names.
        with_rgb: also build the colour table (needed to render RGB; it imports matplotlib).
        """
        rays = self.rays(scene.cell_size)
        n_inst = len(scene.instance_category) - 1
        if scene.instance_map.size and int(scene.instance_map.max()) > n_inst:
            raise ValueError(f"scene {scene.name}: instance_map has id {int(scene.instance_map.max())} "
                             f"but instance_category covers only 0..{n_inst}")
        if scene.instance_map.size and int(scene.instance_map.min()) < 0:
            raise ValueError(f"scene {scene.name}: instance_map has negative ids")
        # Objects win over walls: an object cell always renders as its object, even where a
        # source marked it as non-floor (furniture is not navigable floor in the Gibson maps).
        code = np.where(scene.floor, 0, np.where(scene.low_obstacle, LOW, WALL)).astype(np.int32)
        code = np.where(scene.instance_map > 0, scene.instance_map, code).astype(np.int32)
        code = np.pad(code, rays.pad, constant_values=WALL)
        cam_h = self.intrinsics.camera_height
        top = np.empty(n_inst + 1 + _N_NEGATIVE_CODES, dtype=np.float32)
        top[0] = -cam_h
        top[1: n_inst + 1] = object_heights_per_instance(scene, heights, default_height)[1:] - cam_h
        top[WALL] = top[NOTHING] = _WALL_TOP
        top[LOW] = scene.low_obstacle_height - cam_h
        category = np.full(n_inst + 1 + _N_NEGATIVE_CODES, NO_CATEGORY, dtype=np.int16)
        category[1: n_inst + 1] = scene.instance_category[1:]
        return SceneRaster(
            scene_name=scene.name,
            code_flat=np.append(code.ravel(), np.int32(NOTHING)),
            padded_width=code.shape[1], pad=rays.pad, cell_size=scene.cell_size,
            origin=(float(scene.origin[0]), float(scene.origin[1])),
            top_rel=top, category=category, colour=self._colours(category) if with_rgb else None,
        )

    def _colours(self, category: np.ndarray) -> np.ndarray:
        """Colour table (n_codes * _SHADE_LEVELS, 3) uint8: row ``(code + 2) * L + level`` is the
        code's base colour (its category's palette colour; greys for the structure) at brightness
        ``level / (L - 1)``."""
        from matplotlib import colormaps  # only for the palette; imported lazily (slow import)

        cfg = self.rgb_config
        cmap = colormaps[cfg.palette]
        base = np.empty((len(category), 3), dtype=np.float64)
        for code, cat in enumerate(category):
            base[code] = cmap(int(cat) % cmap.N)[:3] if cat >= 0 else cfg.wall_grey
        base[0] = cfg.floor_grey
        base[WALL] = base[LOW] = cfg.wall_grey
        base[NOTHING] = cfg.ceiling_grey
        base = np.roll(base, _N_NEGATIVE_CODES, axis=0)  # code LOW first, as _shade indexes it
        levels = np.linspace(0.0, 1.0, _SHADE_LEVELS)
        table = np.rint(base[:, None, :] * levels[None, :, None] * 255.0)
        return table.reshape(-1, 3).astype(np.uint8)

    # -- per frame --------------------------------------------------------------------------
    def render(self, raster: SceneRaster, x: float, y: float, yaw: float, with_rgb: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """Render the view from map-frame ``(x, y)`` (metres) with heading ``yaw`` (radians).

        Returns ``(depth, instance, category, rgb)``: float32 z-depth in metres clipped to
        [min_depth, max_depth], int32 instance ids, int16 category ids, uint8 (H, W, 3) or None.
        """
        if with_rgb and raster.colour is None:
            raise ValueError(f"scene {raster.scene_name} was prepared without RGB; prepare(..., with_rgb=True)")
        cam = self.intrinsics
        w, h = cam.width, cam.height
        rays = self.rays(raster.cell_size)
        codes, cells_x = self._march(raster, rays, x, y, yaw, with_rgb)
        runs = self._run_lengths(raster, rays, codes)
        # Pixels in column-major, bottom-up order: pixel (c, b) is image (h - 1 - b, c).
        counts = runs.ravel()
        code_px = np.repeat(codes.ravel(), counts).reshape(w, h)
        z_prev_px = np.repeat(rays.z_prev.ravel(), counts).reshape(w, h)
        depth_cb, top_hit = self._depth(raster, code_px, z_prev_px, with_rgb)
        # Back to image order (rows top-down): a plain transposed copy is far cheaper than
        # writing a ufunc's output through a transposed view.
        np.clip(depth_cb, cam.min_depth, cam.max_depth, out=depth_cb)
        depth = np.ascontiguousarray(depth_cb[:, ::-1].T)
        code_img = np.ascontiguousarray(code_px[:, ::-1].T)
        instance = np.maximum(code_img, NO_INSTANCE)
        category = raster.category.take(code_img, mode="wrap")
        rgb = None
        if with_rgb:
            x_face = np.repeat(cells_x, counts).reshape(w, h)
            rgb = self._shade(raster, code_px, depth_cb, top_hit, x_face)
        return depth, instance, category, rgb

    def _march(self, raster: SceneRaster, rays: _Rays, x: float, y: float, yaw: float,
               with_rgb: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Codes (W, S + 1) int32 of the cells under every ray sample (last: the sentinel).

        Also returns, when ``with_rgb``, whether each sample entered its cell across a boundary of
        constant map x (its face normal is along x), for shading; else None.
        """
        w, n = self.intrinsics.width, rays.z.shape[0]
        cs = raster.cell_size
        cos, sin = math.cos(yaw), math.sin(yaw)
        # Map-frame direction per column in cells per metre of z: forward + x_c * right, where
        # the agent's right is the heading turned clockwise: (sin, -cos).
        step_col = ((cos + self.x_c * sin) / cs).astype(np.float32)
        step_row = ((sin - self.x_c * cos) / cs).astype(np.float32)
        col0 = (x - raster.origin[0]) / cs + raster.pad
        row0 = (y - raster.origin[1]) / cs + raster.pad
        colf = self._buffer("colf", (w, n), np.float32)
        rowf = self._buffer("rowf", (w, n), np.float32)
        np.multiply.outer(step_col, rays.z, out=colf)
        colf += np.float32(col0)
        np.multiply.outer(step_row, rays.z, out=rowf)
        rowf += np.float32(row0)
        # The padding keeps every sample at a non-negative index, so truncation is floor.
        col = self._buffer("col", (w, n), np.int32)
        flat = self._buffer("flat", (w, n), np.int32)
        col[...] = colf
        flat[...] = rowf
        row = flat.copy() if with_rgb else None
        flat *= raster.padded_width
        flat += col
        flat[:, -1] = raster.code_flat.shape[0] - 1  # the sentinel: "nothing" code
        codes = self._buffer("codes", (w, n), np.int32)
        np.take(raster.code_flat, flat, out=codes, mode="wrap")
        x_face = None
        if with_rgb:
            x_face = self._entry_faces(raster, codes, colf, rowf, col, row, step_col, step_row)
        return codes, x_face

    @staticmethod
    def _entry_faces(raster: SceneRaster, codes: np.ndarray, colf: np.ndarray, rowf: np.ndarray,
                     col: np.ndarray, row: np.ndarray, step_col: np.ndarray,
                     step_row: np.ndarray) -> np.ndarray:
        """Whether each sample's cell was entered across a boundary of constant x (W * (S + 1),).

        Between two samples the ray crosses a column boundary, a row boundary or both. With both,
        look at the cell between: if undoing one crossing still leaves the ray in the same
        surface, the other crossing is the one that entered it; if neither (a convex corner),
        the later crossing entered, and if both (a concave corner), the earlier one did.
        """
        crossed_x = np.zeros(codes.shape, dtype=bool)
        crossed_y = np.zeros(codes.shape, dtype=bool)
        np.not_equal(col[:, 1:], col[:, :-1], out=crossed_x[:, 1:])
        np.not_equal(row[:, 1:], row[:, :-1], out=crossed_y[:, 1:])
        # codes of the cells (row_i, col_{i-1}) and (row_{i-1}, col_i)
        undo_x = row[:, 1:] * raster.padded_width + col[:, :-1]
        undo_y = row[:, :-1] * raster.padded_width + col[:, 1:]
        still_in_x = np.zeros_like(crossed_x)
        still_in_y = np.zeros_like(crossed_y)
        still_in_x[:, 1:] = raster.code_flat[undo_x] == codes[:, 1:]
        still_in_y[:, 1:] = raster.code_flat[undo_y] == codes[:, 1:]
        frac_x = colf - np.floor(colf)  # float32 (colf - col would promote to float64)
        frac_y = rowf - np.floor(rowf)
        np.subtract(1.0, frac_x, out=frac_x, where=(step_col < 0)[:, None])
        np.subtract(1.0, frac_y, out=frac_y, where=(step_row < 0)[:, None])
        # distance back to each crossing in units of z is frac / |step|; compare without dividing
        x_earlier = frac_x * np.abs(step_row)[:, None] > frac_y * np.abs(step_col)[:, None]
        x_entered = np.where(still_in_x == still_in_y, x_earlier == still_in_x, still_in_y)
        return np.where(crossed_x & crossed_y, x_entered, crossed_x).ravel()

    def _run_lengths(self, raster: SceneRaster, rays: _Rays, codes: np.ndarray) -> np.ndarray:
        """Rows painted by each ray sample, per column: (W, S + 1) int16, each row summing to H.

        Row ``b`` from the bottom (slope ``y_b = (b + 0.5 - H/2) / f``) is covered by sample
        ``i`` iff ``y_b <= s_i``, i.e. ``b < f * s_i + H/2 + 0.5``; the rows covered by samples
        ``0..i`` are the running max of that count (floored, clipped to [0, H]), and sample
        ``i`` paints the increase. The running max runs sample-major, (S + 1, W) in int16, by
        doubling: contiguous vector passes, several times faster than ``maximum.accumulate``.
        """
        w, h = self.intrinsics.width, self.intrinsics.height
        n = rays.z.shape[0]
        u = self._buffer("u", (w, n), np.float32)
        f_top = (raster.top_rel * np.float32(self.focal)).astype(np.float32)
        np.take(f_top, codes, out=u, mode="wrap")
        u *= rays.inv_z
        u += np.float32(h / 2.0 + 0.5)
        np.clip(u, 0, h, out=u)
        covered = self._buffer("covered", (n, w), np.int16)
        covered[...] = u.T
        covered[-1] = h  # the sentinel paints every row left
        covered = self._running_max(covered)
        runs_t = self._buffer("runs_t", (n, w), np.int16)
        runs_t[0] = covered[0]
        np.subtract(covered[1:], covered[:-1], out=runs_t[1:])
        runs = self._buffer("runs", (w, n), np.int16)
        runs[...] = runs_t.T
        return runs

    def _running_max(self, a: np.ndarray) -> np.ndarray:
        """Running maximum along axis 0 by doubling (log2(S) passes); may return a buffer."""
        b = self._buffer("running_max", a.shape, a.dtype)
        k = 1
        while k < a.shape[0]:
            b[:k] = a[:k]
            np.maximum(a[k:], a[:-k], out=b[k:])
            a, b = b, a
            k *= 2
        return a

    def _depth(self, raster: SceneRaster, code_px: np.ndarray, z_prev_px: np.ndarray,
               with_rgb: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Unclipped z-depth (W, H) bottom-up, and (when ``with_rgb``) where a horizontal top was hit.

        Looking down: ``max(z_{i-1}, (top - cam_h) / y)`` (exact on the floor and object tops).
        Looking up: the side of what was hit, unless the ceiling is nearer; ceiling pixels get the
        "nothing" code (no instance, no category).
        """
        w, h = self.intrinsics.width, self.intrinsics.height
        nb = self.n_below
        depth = self._buffer("depth", (w, h), np.float32)
        down = raster.top_rel.take(code_px[:, :nb], mode="wrap")
        down *= self.inv_y_down
        np.maximum(down, z_prev_px[:, :nb], out=depth[:, :nb])
        z_up = z_prev_px[:, nb:]
        ceiling = z_up > self.z_ceiling
        np.copyto(code_px[:, nb:], np.int32(NOTHING), where=ceiling)
        np.minimum(z_up, self.z_ceiling, out=depth[:, nb:])
        top_hit = None
        if with_rgb:
            top_hit = np.zeros((w, h), dtype=bool)
            np.greater(down, z_prev_px[:, :nb], out=top_hit[:, :nb])
            top_hit[:, nb:] = ceiling
        return depth, top_hit

    def _shade(self, raster: SceneRaster, code_px: np.ndarray, depth_cb: np.ndarray,
               top_hit: np.ndarray, x_face: np.ndarray) -> np.ndarray:
        """Synthetic RGB (H, W, 3) uint8: base colour x face/top shade x distance falloff.

        The brightness is quantised to ``_SHADE_LEVELS`` and looked up in the raster's colour
        table, so the image is one gather of 3-byte rows instead of float arithmetic per channel.
        """
        cfg = self.rgb_config
        shade = np.where(x_face, np.float32(cfg.x_face_shade), np.float32(cfg.y_face_shade))
        np.copyto(shade, np.float32(cfg.top_shade), where=top_hit)
        falloff = depth_cb * np.float32(-cfg.distance_falloff / self.intrinsics.max_depth)
        falloff += np.float32(1.0)
        shade *= falloff
        shade *= np.float32(_SHADE_LEVELS - 1)
        shade += np.float32(0.5)
        index = code_px - np.int32(LOW)  # codes -3.. -> rows 0.. of the colour table
        index *= _SHADE_LEVELS
        index += shade.astype(np.int32)
        return raster.colour.take(np.ascontiguousarray(index[:, ::-1].T), axis=0)
