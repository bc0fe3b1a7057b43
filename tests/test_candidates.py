"""Candidate paths to frontiers over the current topo graph (issue 3, item 5), on hand-built maps."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import ndimage

from trajrag import config
from trajrag.topo.candidates import MapPlace, candidate_paths, frontier_node, map_place, step_candidates
from trajrag.topo.sectors import sector_vectors
from trajrag.topo.trajectory import TopoPolarTrajectory
from trajrag.world.frames import xy_to_cell

CS = 0.05


@dataclass
class GridMap:
    obstacle: np.ndarray
    explored: np.ndarray
    objects: np.ndarray
    categories: tuple = ("chair", "bed")
    cell_size: float = CS
    origin: tuple = (0.0, 0.0)


@dataclass
class Frontier:
    """What the mapping stage's frontiers offer: centroid (metres) and cells ([row, col])."""

    centroid_xy: np.ndarray
    cells: np.ndarray


def c(metres: float) -> int:
    return int(round(metres / CS))


def frontier_strip(x0, x1, y0, y1) -> Frontier:
    """A frontier made of the cells of a thin axis-aligned strip (metres)."""
    rows, cols = np.mgrid[c(y0) : c(y1), c(x0) : c(x1)]
    cells = np.stack([rows.ravel(), cols.ravel()], axis=1)
    return Frontier(((cells[:, ::-1] + 0.5) * CS).mean(axis=0), cells)


@pytest.fixture(scope="module")
def cfg():
    return config.load("topo")


@pytest.fixture(scope="module")
def t_and_room():
    """A T corridor (top y = 3.5 from x 0.5 to 6.5, stem x = 3.5 down to y 0.5, 1 m wide) and,
    behind a wall, a separate room x 8..10, y 1..6. Frontiers: the T's three open ends (0, 1, 2)
    and one in the walled-off room (3)."""
    free = np.zeros((150, 230), bool)
    free[c(3.0) : c(4.0), c(0.5) : c(6.5)] = True
    free[c(0.5) : c(3.5), c(3.0) : c(4.0)] = True
    free[c(1.0) : c(6.0), c(8.0) : c(10.0)] = True
    explored = ndimage.binary_dilation(free, iterations=3)
    sem_map = GridMap(explored & ~free, explored, np.zeros((2,) + free.shape, bool))
    sem_map.objects[1, c(4.1) : c(4.3), c(5.5) : c(6.0)] = True  # a bed by the east end
    frontiers = [
        frontier_strip(6.4, 6.5, 3.0, 4.0),  # east end of the top
        frontier_strip(0.5, 0.6, 3.0, 4.0),  # west end of the top
        frontier_strip(3.0, 4.0, 0.5, 0.6),  # bottom of the stem
        frontier_strip(8.0, 10.0, 5.9, 6.0),  # north wall of the separate room
    ]
    return sem_map, frontiers


def walk(points, step=0.1) -> np.ndarray:
    out = []
    for a, b in zip(points[:-1], points[1:]):
        a, b = np.asarray(a, float), np.asarray(b, float)
        n = max(int(np.ceil(np.linalg.norm(b - a) / step)), 1)
        out += [a + (b - a) * t for t in np.arange(n) / n]
    out.append(np.asarray(points[-1], float))
    xy = np.array(out)
    return np.c_[xy, np.zeros(len(xy))]


def test_the_map_place_holds_every_node_of_the_map_with_its_sectors_and_the_walked_steps(cfg, t_and_room):
    sem_map, frontiers = t_and_room
    traj, _, graph = step_candidates(sem_map, walk([(0.8, 3.5), (3.5, 3.5)]), frontiers, "bed", cfg)
    place = map_place(sem_map, graph, traj, cfg)
    assert len(place) == len(graph) > len(traj)  # the walled-off room's nodes too, never walked
    np.testing.assert_allclose(place.node_xy, graph.xy)
    np.testing.assert_array_equal(place.sectors, sector_vectors(sem_map, graph.cells, traj.reference_yaw, cfg))
    edges = {tuple(e) for e in place.edges.tolist()}
    assert {tuple(sorted(e)) for e in graph.edges.tolist()} <= edges
    walked = {tuple(sorted(p)) for p in zip(traj.node_ids[:-1].tolist(), traj.node_ids[1:].tolist()) if p[0] != p[1]}
    assert walked <= edges
    back = MapPlace.from_dict(json.loads(json.dumps(place.to_dict())))
    np.testing.assert_array_equal(back.sectors, place.sectors)
    assert back.categories == traj.categories and back.reference_yaw == traj.reference_yaw
    with pytest.raises(ValueError, match="edges"):
        MapPlace(place.node_xy, place.sectors, [[0, len(place)]], place.categories, 0.0)


def test_every_reachable_frontier_gets_a_path_and_the_walled_off_one_none(cfg, t_and_room):
    sem_map, frontiers = t_and_room
    poses = walk([(0.8, 3.5), (3.5, 3.5)])  # from the west end to the junction
    traj, candidates, graph = step_candidates(sem_map, poses, frontiers, "bed", cfg, episode_id="1")
    assert np.linalg.norm(graph.xy[traj.node_ids[-1]] - (3.5, 3.5)) < 0.15  # the agent is at the junction
    room_nodes = np.flatnonzero(graph.xy[:, 0] > 7.5)
    assert len(room_nodes) >= 1  # the room has nodes of its own, just no way to them
    assert sorted(cp.frontier_index for cp in candidates) == [0, 1, 2]
    edges = {tuple(e) for e in graph.edges.tolist()}
    for cp in candidates:
        f = frontiers[cp.frontier_index]
        path = cp.node_path.tolist()
        assert path[0] == traj.node_ids[-1]
        assert not set(path) & set(room_nodes.tolist())
        assert all(tuple(sorted(p)) in edges for p in zip(path[:-1], path[1:]))  # along the graph
        t = cp.trajectory
        np.testing.assert_allclose(t.node_xy[-1], f.centroid_xy)  # ends at the frontier centroid
        assert t.node_ids[-1] == -1 - cp.frontier_index
        expected = sector_vectors(sem_map, xy_to_cell(f.centroid_xy, sem_map.origin, CS)[None], traj.reference_yaw, cfg)
        np.testing.assert_array_equal(t.sectors[-1], expected[0])  # the frontier's own sector vector
        assert len(set(t.node_ids.tolist())) == len(t)  # loop-free like a stored trajectory
        assert cp.length_m == pytest.approx(np.linalg.norm(f.centroid_xy - (3.5, 3.5)), abs=0.3)
        assert t.goal == "bed" and t.episode_id == "1" and not t.success
    east = next(cp for cp in candidates if cp.frontier_index == 0).trajectory
    assert (east.sectors[-1] == 1).any()  # the bed next to the east frontier shows in its sectors
    # Going back west retraces the walked part: f_PL leaves the west end, then its frontier.
    west = next(cp for cp in candidates if cp.frontier_index == 1).trajectory
    assert len(west) == 2 and west.node_ids[0] == traj.node_ids[0]


def open_map(n=120) -> GridMap:
    return GridMap(np.zeros((n, n), bool), np.ones((n, n), bool), np.zeros((2, n, n), bool))


def test_frontiers_of_graph_disconnected_nodes_are_not_valid(cfg):
    sem_map = open_map()
    node_xy = np.array([[1.025, 1.025], [3.025, 1.025], [5.025, 1.025], [3.025, 5.025]])
    edges = np.array([[0, 1], [1, 2]])  # node 3 is in the same free space but not in the graph's reach
    current = TopoPolarTrajectory(node_xy[:1], np.full((1, 12), -1), sem_map.categories, "chair", 0.0,
                                  node_ids=[0], node_visit_steps=[0])
    frontiers = [frontier_strip(5.5, 5.6, 0.8, 1.2), frontier_strip(3.0, 3.4, 5.5, 5.6)]
    cands = candidate_paths(node_xy, edges, 0, frontiers, sem_map, config.load("topo"), current)
    assert [cp.frontier_index for cp in cands] == [0]
    assert cands[0].node_path.tolist() == [0, 1, 2]
    assert cands[0].trajectory.node_ids.tolist() == [0, 1, 2, -1]
    assert cands[0].trajectory.node_visit_steps.tolist() == [0, -1, -1, -1]
    assert cands[0].length_m == pytest.approx(4.0 + np.linalg.norm(frontiers[0].centroid_xy - node_xy[2]))
    # Joining node 3 to the graph makes its frontier valid.
    cands = candidate_paths(node_xy, np.vstack([edges, [[2, 3]]]), 0, frontiers, sem_map, config.load("topo"), current)
    assert [cp.frontier_index for cp in cands] == [0, 1] and cands[1].node_path.tolist() == [0, 1, 2, 3]


def test_frontier_goes_to_the_nearest_node_on_its_side_of_a_wall():
    sem_map = open_map()
    sem_map.obstacle[:, 60] = True  # a wall at x = 3.0 m splits the free space
    node_cells = np.array([[40, 50], [40, 100]])  # x = 2.5 (west side), x = 5.0 (east side)
    frontier = frontier_strip(3.1, 3.2, 1.9, 2.1)  # just east of the wall: nearer the west node
    free = sem_map.explored & ~sem_map.obstacle
    assert frontier_node(node_cells, [frontier], free, sem_map.origin, CS).tolist() == [1]
    nowhere = Frontier(np.array([3.0, 2.0]), np.array([[40, 60]]))  # lies on the wall itself
    assert frontier_node(node_cells, [nowhere], sem_map.obstacle & False, sem_map.origin, CS).tolist() == [-1]


def test_bad_current_node_is_reported(cfg):
    sem_map = open_map()
    current = TopoPolarTrajectory(np.zeros((1, 2)), np.full((1, 12), -1), sem_map.categories, "chair", 0.0)
    with pytest.raises(ValueError, match="current node 5 is not one of the 2 graph nodes"):
        candidate_paths(np.zeros((2, 2)), np.zeros((0, 2)), 5, [], sem_map, cfg, current)
