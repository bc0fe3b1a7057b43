"""Dataset specs: which scenes and which episodes a command runs on, and whether they fit together.

Scene specs (``load_scenes``):

* ``path/to/<split>_info.pbz2``: Gibson semantic maps (``world/gibson.py``), or a folder of them;
  ``...@held_out`` keeps only the scenes of ``gibson.held_out_scenes`` and ``...@rest`` every
  other one (an evaluation on unseen homes with a corpus from the remaining ones);
* a folder of Matterport3D scans, ``<scan>/BEV_semantic_map.npy`` (or the folder holding
  ``scenes/``, or one scan's own folder): one scene per scan (``world/mp3d.py``); ``@held_out`` /
  ``@rest`` select by ``mp3d.held_out_scans``;
* ``procedural:SPLIT:N``: ``N`` procedural homes of split ``train``, ``val`` or ``test``;
  ``procedural:SPLIT:A-B``: its homes ``A`` to ``B - 1``.

Episode specs (``load_episodes``):

* a habitat-layout episode folder or file (``world/episode_io.py``);
* ``generated:K`` or ``generated:K:SEED``: ``K`` episodes per scene from
  ``world/episode_gen.py`` (``SEED`` defaults to the ``episodes`` config's seed).

``validate_episodes`` checks that every episode can run: its scene is loaded, its start is on the
traversable area at the height of the scene's floor (a start on another floor of the building
would run on this floor's map) and its goal category has an object in that scene.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from trajrag.config import Settings
from trajrag.safe_pickle import CorruptFileError, UnsafePickleError
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.episode_gen import generate_episodes, why_no_episodes
from trajrag.world.episode_io import EpisodeError, episode_source, read_episodes
from trajrag.world.geodesic import Motion
from trajrag.world.gibson import GibsonConfig, GibsonFormatError, category_name, load_gibson_scenes
from trajrag.world.mp3d import Mp3dFormatError, is_mp3d_folder, load_mp3d_scenes
from trajrag.world.procedural import procedural_scenes
from trajrag.world.scene import Scene

SPLITS = ("train", "val", "test")
PROCEDURAL_PREFIX = "procedural:"
GENERATED_PREFIX = "generated:"


class DatasetError(ValueError):
    """A scene or episode spec that cannot be understood."""


# Every error bad data or a bad spec raises here, each with a message naming the file/episode:
# commands catch these (with FileNotFoundError and ConfigError) and print one line.
DATA_ERRORS = (DatasetError, EpisodeError, GibsonFormatError, Mp3dFormatError, CorruptFileError, UnsafePickleError)


# -- scenes ---------------------------------------------------------------------------------
def load_scenes(spec: str, settings: Settings) -> list[Scene]:
    """Scenes named by ``spec`` (see the module doc), built with the ``procedural``, ``mp3d`` or
    ``gibson`` section of ``settings``."""
    if spec.startswith(PROCEDURAL_PREFIX):
        split, start, n = parse_procedural_range(spec)
        return list(procedural_scenes(split, n, settings.procedural, start=start))
    path, _, selection = spec.partition("@")
    folder = Path(path).expanduser()
    if is_mp3d_folder(folder):
        mp3d = settings.mp3d
        scenes = load_mp3d_scenes(folder, mp3d)
        held_out, setting = mp3d.held_out_scans, "mp3d.held_out_scans"
    else:
        scenes = _gibson_scenes(folder, spec, settings.gibson)
        held_out, setting = settings.gibson.held_out_scenes, "gibson.held_out_scenes"
    return _select(scenes, selection, spec, set(held_out), setting) if selection else scenes


def _select(scenes: list[Scene], selection: str, spec: str, held_out: set[str], setting: str) -> list[Scene]:
    """The ``@held_out`` / ``@rest`` part of a real-home spec (scene names as in the data, any floor)."""
    if selection not in ("held_out", "rest"):
        raise DatasetError(f"scene spec {spec!r}: expected @held_out or @rest after the path, got @{selection}")
    keep = [s for s in scenes if (s.name.split("/")[1] in held_out) == (selection == "held_out")]
    if not keep:
        raise DatasetError(f"scene spec {spec!r}: no scene left ({setting} = {sorted(held_out)})")
    return keep


def parse_procedural_range(spec: str) -> tuple[str, int, int]:
    """``procedural:SPLIT:N`` -> ``(SPLIT, 0, N)`` and ``procedural:SPLIT:A-B`` -> ``(SPLIT, A, B)``
    (homes A .. B - 1: scenes of a split that a corpus of its first A homes never saw)."""
    head, _, count = spec.rpartition(":")
    first, dash, last = count.partition("-")
    if dash and first.isascii() and first.isdigit():
        split, stop = parse_procedural_spec(f"{head}:{last}")
        if int(first) >= stop:
            raise DatasetError(f"scene spec {spec!r}: empty range {count} (expected A-B with A < B)")
        return split, int(first), stop
    split, n = parse_procedural_spec(spec)
    return split, 0, n


def parse_procedural_spec(spec: str) -> tuple[str, int]:
    """``procedural:SPLIT:N`` -> ``(SPLIT, N)``; ``DatasetError`` naming what is wrong."""
    parts = spec.split(":")
    usage = f"scene spec {spec!r}: expected procedural:SPLIT:N with SPLIT in {list(SPLITS)} and N > 0"
    if len(parts) != 3:
        raise DatasetError(usage)
    split, count = parts[1], parts[2]
    if split not in SPLITS:
        raise DatasetError(f"{usage}; unknown split {split!r}")
    if not (count.isascii() and count.isdigit()) or int(count) <= 0:
        raise DatasetError(f"{usage}; N={count!r} is not a positive integer")
    return split, int(count)


def _gibson_scenes(path: Path, spec: str, cfg: GibsonConfig) -> list[Scene]:
    if path.is_dir():
        files = sorted(path.glob("*_info.pbz2"))
        if not files:
            raise DatasetError(f"scene spec {spec!r}: folder has no *_info.pbz2 Gibson semantic maps "
                               f"and no <scan>/BEV_semantic_map.npy MP3D scans")
    elif path.is_file():
        if not path.name.endswith(".pbz2"):
            raise DatasetError(f"scene spec {spec!r}: expected a Gibson *_info.pbz2 file")
        files = [path]
    else:
        raise DatasetError(f"scene spec {spec!r}: no such file or folder; expected a Gibson "
                           f"*_info.pbz2 file (or a folder of them), a folder of MP3D scans "
                           f"(<scan>/BEV_semantic_map.npy) or procedural:SPLIT:N")
    scenes: list[Scene] = []
    for file in files:
        scenes.extend(load_gibson_scenes(file, cfg))
    repeated = [name for name, n in Counter(s.name for s in scenes).items() if n > 1]
    if repeated:
        raise DatasetError(f"scene spec {spec!r}: scenes {repeated} appear in more than one file")
    return scenes


# -- episodes -------------------------------------------------------------------------------
def load_episodes(spec: str, scenes: Sequence[Scene], settings: Settings,
                  strict: bool = True) -> list[ObjectNavEpisode]:
    """Episodes named by ``spec`` for ``scenes`` (see the module doc): generated with the
    ``episodes`` section and the motion of the ``sim`` section, or read with the ``gibson``
    section's category names.

    With ``strict`` (the default), the first episode that cannot run in ``scenes`` raises
    ``EpisodeError``; pass ``strict=False`` and call ``validate_episodes`` to list them all.
    """
    cfg = settings.episodes
    if spec.startswith(GENERATED_PREFIX):
        k, seed = parse_generated_spec(spec)
        episodes = list(generate_episodes(list(scenes), k, cfg, cfg.seed if seed is None else seed,
                                          Motion.from_sim_config(settings.sim)))
        if not episodes:
            reasons = "; ".join(f"{scene.name}: {why_no_episodes(scene, cfg)}" for scene in scenes[:5])
            more = f"; and {len(scenes) - 5} more scenes" if len(scenes) > 5 else ""
            raise DatasetError(f"episode spec {spec!r}: no episode could be generated ({reasons}{more})")
    else:
        gibson = settings.gibson
        known = known_categories(gibson) | {c for scene in scenes for c in scene.categories}
        episodes = read_episodes(spec, categories=known, aliases=gibson.category_names)
    if strict:
        validate_episodes(episodes, scenes, cfg.start_floor_tolerance_m, strict=True)
    return episodes


def known_categories(gibson: GibsonConfig) -> set[str]:
    """This package's names of the Gibson categories (``gibson.channels`` through
    ``gibson.category_names``): the goals an episode file may name."""
    return {category_name(c, gibson) for c in gibson.channels}


def parse_generated_spec(spec: str) -> tuple[int, int | None]:
    """``generated:K`` or ``generated:K:SEED`` -> ``(K, SEED or None)``."""
    parts = spec.split(":")
    usage = f"episode spec {spec!r}: expected generated:K or generated:K:SEED with K > 0 episodes per scene"
    if len(parts) not in (2, 3) or not (parts[1].isascii() and parts[1].isdigit()) or int(parts[1]) <= 0:
        raise DatasetError(usage)
    if len(parts) == 3 and not (parts[2].isascii() and parts[2].lstrip("-").isdigit()):
        raise DatasetError(f"{usage}; SEED={parts[2]!r} is not an integer")
    return int(parts[1]), (int(parts[2]) if len(parts) == 3 else None)


# -- validation -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeProblem:
    """Why one episode cannot run. kind: unknown_scene, bad_start, other_floor, off_map,
    not_traversable, unknown_category or category_absent."""

    source: str
    episode_id: str
    scene_key: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.source or '<generated>'}: episode {self.episode_id} ({self.scene_key}): {self.message}"


@dataclass
class ValidationReport:
    """The outcome of ``validate_episodes``: every problem, in episode order."""

    n_episodes: int
    problems: list[EpisodeProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def n_unusable(self) -> int:
        return len({(p.source, p.scene_key, p.episode_id) for p in self.problems})

    def counts(self) -> dict[str, int]:
        """Number of problems of each kind."""
        return dict(Counter(p.kind for p in self.problems))

    def to_dict(self) -> dict:
        """The report as JSON-able data (for ``--json`` output)."""
        return {"n_episodes": self.n_episodes, "n_usable": self.n_episodes - self.n_unusable,
                "counts": self.counts(), "problems": [asdict(p) for p in self.problems]}

    def summary(self, max_lines: int | None = None) -> str:
        """A human-readable report: a headline, then one line per problem (the first ``max_lines``)."""
        head = f"{self.n_episodes - self.n_unusable}/{self.n_episodes} episodes usable"
        if self.ok:
            return head
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.counts().items()))
        lines = [f"{head} ({kinds})"] + [str(p) for p in self.problems[:max_lines]]
        if max_lines is not None and len(self.problems) > max_lines:
            lines.append(f"... and {len(self.problems) - max_lines} more")
        return "\n".join(lines)


def validate_episodes(episodes: Iterable[ObjectNavEpisode], scenes: Sequence[Scene], floor_tolerance_m: float,
                      strict: bool = False) -> ValidationReport:
    """Check each episode against ``scenes``; with ``strict``, raise ``EpisodeError`` at the first
    problem. ``floor_tolerance_m``: ``episodes.start_floor_tolerance_m``."""
    by_name = {scene.name: scene for scene in scenes}
    present: dict[str, set[str]] = {}  # scene name -> categories with an object, computed once
    report = ValidationReport(n_episodes=0)
    for episode in episodes:
        report.n_episodes += 1
        for kind, message in _episode_problems(episode, by_name, present, floor_tolerance_m):
            problem = EpisodeProblem(episode_source(episode), episode.episode_id, episode.scene_key, kind, message)
            if strict:
                raise EpisodeError(str(problem))
            report.problems.append(problem)
    return report


def _episode_problems(episode: ObjectNavEpisode, scenes: dict[str, Scene], present: dict[str, set[str]],
                      floor_tolerance_m: float) -> list[tuple[str, str]]:
    """``(kind, message)`` for each reason ``episode`` cannot run (empty if it can)."""
    scene = scenes.get(episode.scene_key)
    if scene is None:
        shown = sorted(scenes)[:5]
        more = f" and {len(scenes) - 5} more" if len(scenes) > 5 else ""
        return [("unknown_scene", f"scene {episode.scene_key!r} is not loaded (loaded: {shown}{more})")]
    problems = []
    try:
        pose = episode.start_pose()
    except ValueError as exc:
        problems.append(("bad_start", f"start pose: {exc}"))
    else:
        height = float(episode.start_position[1])
        if abs(height - scene.floor_height) > floor_tolerance_m:
            problems.append(("other_floor", f"start height {height:.2f} m is {height - scene.floor_height:+.2f} m "
                                            f"from this map's floor ({scene.floor_height:.2f} m; "
                                            f"episodes.start_floor_tolerance_m {floor_tolerance_m:g}): a start on "
                                            f"another floor (floor_id {episode.floor_id}) would run on this one's map"))
        cell = scene.to_cell(pose.xy)
        where = f"start (x={pose.x:.2f}, y={pose.y:.2f}) m, cell (row={cell[0]}, col={cell[1]})"
        if not scene.in_bounds(cell):
            problems.append(("off_map", f"{where} is outside the {scene.shape[0]}x{scene.shape[1]} map"))
        elif not scene.is_traversable(pose.xy):
            problems.append(("not_traversable", f"{where} is not on the traversable area"))
    if episode.object_category not in scene.categories:
        problems.append(("unknown_category", f"category {episode.object_category!r} is not one of "
                                             f"the scene's categories {list(scene.categories)}"))
    elif episode.object_category not in present.setdefault(scene.name, set(scene.present_categories())):
        problems.append(("category_absent", f"category {episode.object_category!r} has no object in this scene"))
    return problems
