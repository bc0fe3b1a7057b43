"""Topo-polar representation (issue 3, items 4-5): nodes, sectors, loop pruning, descriptions.

Hand-built maps only (no simulator): a tiny object with the semantic map's attributes.
Frame reminder (docs/architecture.md): col grows with map x, row with map y, yaw CCW positive.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from scipy import ndimage

from trajrag import config as config_mod
from trajrag.topo import labels as L
from trajrag.topo.describe import _TURNS, describe, node_headings, node_surroundings, quarter_index
from trajrag.topo.sectors import sector_vectors
from trajrag.topo.skeleton import junction_nodes
from trajrag.topo.trajectory import (
    TopoPolarTrajectory,
    assign_nodes,
    build_topo_polar,
    merge_consecutive,
    prune_loops,
    topo_graph,
)

CS = 0.05  # metres per cell, as the house default


@dataclass
class GridMap:
    """The attributes the topo stage reads from mapping.semantic_map.SemanticMap."""

    obstacle: np.ndarray
    explored: np.ndarray
    objects: np.ndarray
    categories: tuple = ("chair", "bed")
    cell_size: float = CS
    origin: tuple = (0.0, 0.0)


def cells(metres: float) -> int:
    return int(round(metres / CS))


def corridor(free: np.ndarray, p, q, width: float) -> None:
    """Mark an axis-aligned corridor of ``width`` metres along p -> q (map-frame metres)."""
    (x0, y0), (x1, y1) = p, q
    half = width / 2
    free[cells(min(y0, y1) - half) : cells(max(y0, y1) + half), cells(min(x0, x1) - half) : cells(max(x0, x1) + half)] = True


def walled(free: np.ndarray, n_objects: int = 2) -> GridMap:
    """A map whose free space is ``free``, with 3-cell walls around it and nothing else explored."""
    explored = ndimage.binary_dilation(free, iterations=3)
    return GridMap(explored & ~free, explored, np.zeros((n_objects,) + free.shape, dtype=bool))


def polyline(points, step: float = 0.1) -> np.ndarray:
    """Poses (T, 3) every ``step`` metres along the points, yaw along the motion."""
    out = []
    for a, b in zip(points[:-1], points[1:]):
        a, b = np.asarray(a, float), np.asarray(b, float)
        n = max(int(np.ceil(np.linalg.norm(b - a) / step)), 1)
        out += [a + (b - a) * t for t in np.arange(n) / n]
    out.append(np.asarray(points[-1], float))
    xy = np.array(out)
    d = np.diff(xy, axis=0)
    yaw = np.arctan2(d[:, 1], d[:, 0])
    return np.c_[xy, np.r_[yaw, yaw[-1:]]]


@pytest.fixture(scope="module")
def cfg():
    return config_mod.load("topo")


def cell_xy(cell) -> np.ndarray:
    """Map-frame centre (x, y) of a [row, col] cell."""
    return (np.asarray(cell)[::-1] + 0.5) * CS


# -- nodes -------------------------------------------------------------------------------------
def test_plus_and_t_corridors_have_exactly_one_junction_at_the_crossing(cfg):
    plus = np.zeros((140, 140), bool)
    corridor(plus, (0.5, 3.5), (6.5, 3.5), 1.0)
    corridor(plus, (3.5, 0.5), (3.5, 6.5), 1.0)
    tee = np.zeros((140, 140), bool)
    corridor(tee, (0.5, 3.5), (6.5, 3.5), 1.0)
    corridor(tee, (3.5, 0.5), (3.5, 3.5), 1.0)
    for free in (plus, tee):
        for prune, factor in ((0.0, 0.0), (cfg.min_branch_m, cfg.spur_clearance_factor)):
            nodes = junction_nodes(free, CS, cfg.d_min_m, min_branch_m=prune, clearance_factor=factor)
            assert len(nodes) == 1
            assert np.linalg.norm(cell_xy(nodes[0]) - (3.5, 3.5)) < 0.15
        # Through the map-level path too (crop, cleaning, config), junctions only:
        graph = topo_graph(walled(free), replace(cfg, include_end_nodes=False))
        assert len(graph) == 1 and np.linalg.norm(graph.xy[0] - (3.5, 3.5)) < 0.15
    # With end nodes on (the default), the plus also gets its four dead ends, 3 m from the centre.
    graph = topo_graph(walled(plus), replace(cfg, include_end_nodes=True))
    dist = np.sort(np.linalg.norm(graph.xy - (3.5, 3.5), axis=1))
    assert len(graph) == 5 and dist[0] < 0.15 and (dist[1:] > 2.5).all()


@pytest.mark.parametrize("offset, expected", [(0.3, 1), (0.8, 2)])
def test_junctions_closer_than_d_min_merge(cfg, offset, expected):
    # A main corridor with one side branch going down at x = 3.1 and one going up `offset` further.
    free = np.zeros((140, 160), bool)
    corridor(free, (0.5, 3.2), (7.0, 3.2), 0.4)
    corridor(free, (3.1, 0.5), (3.1, 3.2), 0.2)
    corridor(free, (3.1 + offset, 3.2), (3.1 + offset, 6.5), 0.2)
    nodes = junction_nodes(free, CS, 0.5)
    assert len(nodes) == expected
    assert cfg.d_min_m == 0.5  # the paper's value is the shipped default


def test_a_notch_in_a_corridor_wall_makes_no_junction(cfg):
    # A 0.3 m deep recess in the wall grows a skeleton spur, i.e. a junction mid-corridor; the
    # spur pruning of the shipped config removes it (only the fallback node, near the agent, is left).
    free = np.zeros((100, 160), bool)
    corridor(free, (0.5, 2.5), (7.5, 2.5), 1.0)
    free[cells(3.0) : cells(3.3), cells(3.8) : cells(4.2)] = True
    anchor = np.array([cells(2.5), cells(1.0)])
    plain = junction_nodes(free, CS, cfg.d_min_m, anchor_cell=anchor)
    assert len(plain) == 1 and abs(cell_xy(plain[0])[0] - 4.0) < 0.15  # the spur's junction
    pruned = junction_nodes(free, CS, cfg.d_min_m, min_branch_m=cfg.min_branch_m,
                            clearance_factor=cfg.spur_clearance_factor, anchor_cell=anchor)
    assert len(pruned) == 1 and abs(cell_xy(pruned[0])[0] - 1.0) < 0.15  # no junction: the fallback


def test_corridor_without_junction_still_has_one_node_near_the_agent(cfg):
    free = np.zeros((60, 200), bool)
    corridor(free, (0.5, 1.5), (9.5, 1.5), 1.0)
    graph = topo_graph(walled(free), replace(cfg, include_end_nodes=False), anchor_xy=np.array([7.0, 1.5]))
    assert len(graph) == 1 and abs(graph.xy[0, 0] - 7.0) < 0.1


# -- Eq. 4 / f_PL ----------------------------------------------------------------------------------
def test_prune_loops_keeps_last_occurrence_and_drops_the_loop():
    assert prune_loops(list("ABCBDAE")).tolist() == ["A", "E"]
    assert prune_loops([1, 2, 3, 2, 4]).tolist() == [1, 2, 4]
    assert prune_loops([5, 6, 7], return_index=True).tolist() == [0, 1, 2]
    assert prune_loops([1, 2, 1, 3], return_index=True).tolist() == [2, 3]
    assert merge_consecutive([4, 4, 2, 2, 2, 4]).tolist() == [4, 2, 4]
    values, starts = merge_consecutive([4, 4, 2, 2, 2, 4], return_starts=True)
    assert starts.tolist() == [0, 2, 5]


def test_assign_nodes_picks_the_nearest_node():
    nodes = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    poses = np.array([[0.2, 0.1], [1.8, -0.3], [0.1, 2.0], [1.1, 0.0]])
    assert assign_nodes(poses, nodes).tolist() == [0, 1, 2, 1]


def ring_map() -> GridMap:
    """A square ring corridor (centre line (2,2)-(6,6)) with a 1.4 m dead-end stub on each side."""
    free = np.zeros((160, 160), bool)
    square = [(2, 2), (6, 2), (6, 6), (2, 6), (2, 2)]
    for a, b in zip(square[:-1], square[1:]):
        corridor(free, a, b, 0.6)
    for a, b in [((4, 2), (4, 0.6)), ((6, 4), (7.4, 4)), ((4, 6), (4, 7.4)), ((2, 4), (0.6, 4))]:
        corridor(free, a, b, 0.6)
    return walled(free)


def test_walking_around_a_ring_loses_the_loop(cfg):
    sem_map = ring_map()
    # Start at the bottom junction, go once around the ring back to it, then down its stub.
    poses = polyline([(4, 2), (6, 2), (6, 4), (6, 6), (4, 6), (2, 6), (2, 4), (2, 2), (4, 2), (4, 0.8)])
    graph = topo_graph(sem_map, cfg)
    # The graph: 4 junctions on the ring (degree 3: two ring neighbours and a stub), 4 stub ends.
    degree = np.bincount(graph.edges.ravel(), minlength=len(graph))
    assert len(graph) == 8 and sorted(degree.tolist()) == [1, 1, 1, 1, 3, 3, 3, 3]
    raw = merge_consecutive(assign_nodes(poses[:, :2], graph.xy))
    assert len(raw) > len(set(raw.tolist()))  # the walk did visit a node twice: there is a loop
    traj = build_topo_polar(sem_map, poses, "bed", cfg, episode_id="7", scene_id="ring")
    assert len(set(traj.node_ids.tolist())) == len(traj)  # loop-free
    assert len(traj) == 2
    np.testing.assert_allclose(traj.node_xy[0], (4, 2), atol=0.15)  # the junction, kept once
    assert traj.node_xy[1][1] < 1.0  # then the stub's dead end
    assert traj.node_visit_steps[0] > len(poses) // 2  # the step of the junction's *last* visit, not 0
    assert traj.sectors.shape == (2, cfg.n_sectors) and traj.edges.tolist() == [[0, 1]]


# -- sectors -----------------------------------------------------------------------------------
def random_map(seed: int) -> GridMap:
    rng = np.random.default_rng(seed)
    n = 81

    def blobs(p):
        return ndimage.binary_dilation(rng.random((n, n)) < p, iterations=2)

    return GridMap(blobs(0.004), ~blobs(0.003), np.stack([blobs(0.001), blobs(0.001)]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotating_the_map_by_90_degrees_shifts_sectors_by_3(cfg, seed):
    """np.rot90 maps cell (r, c) -> (W-1-c, r): map (x, y) -> (y, -x), a -90 deg (clockwise) turn
    of the world seen from above. With the same reference yaw, what was in sector i + 3 is now in
    sector i: new = np.roll(old, -3)."""
    m = random_map(seed)
    nodes = np.array([[40, 40], [30, 50], [55, 20]])
    width = m.explored.shape[1]
    rotated_nodes = np.stack([width - 1 - nodes[:, 1], nodes[:, 0]], axis=1)
    rotated = GridMap(np.rot90(m.obstacle), np.rot90(m.explored), np.rot90(m.objects, axes=(1, 2)))
    for ref in (0.0, 0.4):
        old = sector_vectors(m, nodes, ref, cfg)
        new = sector_vectors(rotated, rotated_nodes, ref, cfg)
        assert len(np.unique(old)) >= 3  # the map is varied enough for the test to mean something
        np.testing.assert_array_equal(new, np.roll(old, -3, axis=1))
        assert not np.array_equal(new, old)


def open_map(n: int = 101) -> GridMap:
    return GridMap(np.zeros((n, n), bool), np.ones((n, n), bool), np.zeros((2, n, n), bool))


def sector_at(angle: float, reference_yaw: float, n: int = 12) -> int:
    """Index of the sector pointing at map-frame ``angle``."""
    return int(round((angle - reference_yaw - math.pi / 2) / (2 * math.pi / n))) % n


def test_object_behind_a_thin_wall_is_still_seen_thanks_to_dilation(cfg):
    m = open_map()
    node = np.array([[50, 50]])
    m.obstacle[:, 60] = True  # a one-cell wall 0.5 m east of the node (+x)
    m.objects[1, 45:56, 61:64] = True  # a bed right behind it
    east = sector_at(0.0, 0.0)
    assert sector_vectors(m, node, 0.0, cfg)[0, east] == 1
    assert sector_vectors(m, node, 0.0, replace(cfg, object_dilation_m=0.0))[0, east] == L.OBSTACLE
    # Rays pointing elsewhere still see the wall, not the bed.
    north_east = sector_at(math.radians(60), 0.0)
    assert sector_vectors(m, node, 0.0, cfg)[0, north_east] == L.OBSTACLE


def test_free_when_nothing_within_radius_and_unknown_for_unexplored(cfg):
    m = open_map()
    node = np.array([[50, 50]])
    m.obstacle[:, 50 + cells(2.0)] = True  # a wall 2 m east: beyond R = 1.5 m
    assert (sector_vectors(m, node, 0.0, cfg) == L.FREE).all()
    m.explored[:, :40] = False  # unexplored from 0.5 m west (-x)
    vec = sector_vectors(m, node, 0.3, cfg)[0]
    west, north = sector_at(math.pi + 0.3, 0.3), sector_at(math.pi / 2 + 0.3, 0.3)
    assert vec[west] == L.UNKNOWN and vec[north] == L.FREE
    # Rays leaving the map read UNKNOWN too.
    assert (sector_vectors(m, np.array([[50, 100]]), 0.0, cfg)[0] == L.UNKNOWN).any()


def test_sector_zero_is_the_left_of_the_reference_and_indices_turn_ccw(cfg):
    m = open_map()
    node = np.array([[50, 50]])
    m.objects[0, 50 + 10 : 50 + 13, 49:52] = True  # a chair 0.5 m north (+y): left of heading +x
    vec = sector_vectors(m, node, 0.0, cfg)[0]
    assert vec[0] == 0 and (vec[1:] == L.FREE).all()
    # Facing north instead, the chair is ahead: three sectors counter-clockwise (90 deg) later.
    assert sector_vectors(m, node, math.pi / 2, cfg)[0, 9] == 0


def test_label_names():
    assert L.label_names([0, -1, -2, -3, 1], ("chair", "bed")) == ["chair", "free", "obstacle", "unknown", "bed"]
    with pytest.raises(ValueError, match="category id"):
        L.label_names([5], ("chair",))


# -- descriptions -------------------------------------------------------------------------------
def two_node_traj(start, end, sectors, reference_yaw=math.pi / 2, success=False) -> TopoPolarTrajectory:
    return TopoPolarTrajectory(np.array([start, end], float), sectors, ("chair", "bed"), "bed", reference_yaw,
                               success=success)


def test_description_puts_an_object_on_the_correct_side():
    sectors = np.full((2, 12), L.OBSTACLE, dtype=np.int16)
    sectors[:, sector_at(math.pi / 2, math.pi / 2)] = 1  # a bed at +y of both nodes
    going_east = describe(two_node_traj((1, 1), (3, 1), sectors))  # heading +x: +y is the left
    going_west = describe(two_node_traj((3, 1), (1, 1), sectors))  # heading -x: +y is the right
    assert "Node 1: wall ahead, bed on the left, wall on the right" in going_east
    assert "bed on the right" in going_west and "bed on the left" not in going_west
    assert going_east.endswith("Bed not reached.")
    assert "2.0 m" in going_east


def test_description_names_turns_open_space_and_the_goal(cfg):
    sectors = np.full((3, 12), L.OBSTACLE, dtype=np.int16)
    sectors[1, sector_at(math.pi / 2, 0.0)] = L.FREE  # at the corner, the way on (+y) is open
    traj = TopoPolarTrajectory(np.array([[0, 0], [2, 0], [2, 2.5]], float), sectors, ("chair", "bed"), "bed", 0.0,
                               success=True)
    text = describe(traj)
    assert "Node 1: wall ahead, wall on the left, wall on the right; go straight, 2.0 m." in text
    assert "Node 2: open ahead" in text and "turn left, 2.5 m" in text
    assert text.endswith("Bed reached.") and text.count("Node ") == 3


def test_description_of_a_built_trajectory_mentions_the_nearby_object(cfg):
    free = np.zeros((140, 140), bool)
    corridor(free, (0.5, 3.5), (6.5, 3.5), 1.0)
    corridor(free, (3.5, 0.5), (3.5, 3.5), 1.0)
    m = walled(free)
    m.objects[0, cells(4.05) : cells(4.3), cells(3.3) : cells(3.7)] = True  # a chair at the T's top wall
    poses = polyline([(0.8, 3.5), (3.5, 3.5), (3.5, 0.8)])  # east along the top, then south down the stem
    traj = build_topo_polar(m, poses, "chair", cfg, success=True)
    junction = int(np.argmin(np.linalg.norm(traj.node_xy - (3.5, 3.5), axis=1)))
    sentence = describe(traj).split(". ")[junction + 1]  # after "Goal: chair"
    assert sentence.startswith(f"Node {junction + 1}: ")
    assert "chair behind" in sentence  # facing south down the stem, the chair on the north wall is behind
    assert "turn right" in sentence  # east, then south: clockwise


def test_description_says_of_every_node_what_it_says_of_that_node_alone():
    """``describe`` finds every node's quarters and turns in one array each: each sentence is
    still the one made node by node (``node_surroundings`` facing its heading, the turn from the
    heading before), 1-node walks and zero-length legs included."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 9):
        for _ in range(20):
            xy = np.cumsum(rng.normal(0, 1.5, (n, 2)), axis=0)
            if n > 2:
                xy[2] = xy[1]
            traj = TopoPolarTrajectory(xy, rng.integers(-3, 3, (n, 12)).astype(np.int16), ("chair", "bed", "sofa"),
                                       "bed", float(rng.uniform(-4, 4)))
            headings, previous, want = node_headings(traj), traj.reference_yaw, []
            for k in range(n):
                text = f"Node {k + 1}: {node_surroundings(traj, k, headings[k])}"
                if k + 1 < n:
                    turn = _TURNS[int(quarter_index(headings[k] - previous))]
                    text += f"; {turn}, {float(np.linalg.norm(xy[k + 1] - xy[k])):.1f} m"
                want.append(text)
                previous = headings[k]
            assert describe(traj).split(". ")[1:-1] == want


# -- serialisation and input errors ------------------------------------------------------------------
def test_json_and_column_round_trip(cfg):
    poses = polyline([(4, 2), (6, 2), (6, 4), (7.3, 4)])
    traj = build_topo_polar(ring_map(), poses, "bed", cfg, success=True, episode_id="3", scene_id="ring")
    back = TopoPolarTrajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    for t in (back, TopoPolarTrajectory.from_columns(traj.to_columns())):
        np.testing.assert_array_equal(t.node_xy, traj.node_xy)
        np.testing.assert_array_equal(t.sectors, traj.sectors)
        assert t.sectors.dtype == np.int16
        np.testing.assert_array_equal(t.node_visit_steps, traj.node_visit_steps)
        assert (t.goal, t.success, t.episode_id, t.scene_id, t.categories) == ("bed", True, "3", "ring", ("chair", "bed"))
        assert t.reference_yaw == traj.reference_yaw and describe(t) == describe(traj)
    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_pylist([traj.to_columns()])
    np.testing.assert_array_equal(TopoPolarTrajectory.from_columns(table.to_pylist()[0]).sectors, traj.sectors)


def test_bad_inputs_give_clear_errors(cfg):
    m = ring_map()
    with pytest.raises(ValueError, match=r"episode ring/9: poses must be"):
        build_topo_polar(m, np.zeros((5, 2)), "bed", cfg, episode_id="9", scene_id="ring")
    with pytest.raises(ValueError, match="pose 1 is not finite"):
        build_topo_polar(m, np.array([[4, 2, 0], [np.nan, 2, 0]]), "bed", cfg)
    broken = GridMap(m.obstacle, m.explored, m.objects[:1])
    with pytest.raises(ValueError, match="1 object channels but 2 categories"):
        build_topo_polar(broken, polyline([(4, 2), (6, 2)]), "bed", cfg)
    with pytest.raises(ValueError, match=r"lacks \['reference_yaw'"):
        TopoPolarTrajectory.from_dict({"goal": "bed"})


def test_config_section_is_registered_with_the_paper_values():
    cfg = config_mod.load("topo", ["topo.d_min_m=0.7"])
    assert cfg.d_min_m == 0.7 and cfg.sector_radius_m == 1.5 and cfg.n_sectors == 12
