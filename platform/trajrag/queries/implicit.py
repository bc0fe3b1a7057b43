"""Implicit queries: a need ("somewhere to sleep") instead of a goal category.

``ImplicitQueries`` holds the fixed table of needs (``queries.implicit``: category -> needs) and a
``NeedResolver``: the offline text encoder (the frozen MiniLM of ``encoder.node``) embeds the need
and every goal category's words and picks the nearest category by cosine. An implicit episode
asks one need of its own category (a stable draw); ``ImplicitQueryAgent`` hands the navigator the
episode with the *resolved* category as its goal, while the simulator still scores the episode's
own category: a wrong resolution is a failed episode, as it would be for a robot. An evaluation
resolves the whole table before its episodes (``ImplicitQueries.answered_in_advance``), so its
evaluators, in this process or on Ray, are handed answers, not the text encoder.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from trajrag.encoder.node_encoder import goal_text
from trajrag.queries import IMPLICIT, QueryError
from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.scene import Scene


class NeedResolver:
    """Resolves a need to the goal category whose words the text encoder places nearest.

    ``text_encoder``: an object with ``encode_texts(texts) -> (N, D)`` unit rows (a
    ``NodeEncoder``); ``categories``: the goal categories to choose among."""

    def __init__(self, text_encoder: Any, categories: Sequence[str]) -> None:
        if not categories:
            raise QueryError("no goal category to resolve needs to")
        self.text_encoder = text_encoder
        self.categories = list(categories)
        self._category_vectors = text_encoder.encode_texts([goal_text(c) for c in self.categories])
        self._resolved: dict[str, tuple[str, float]] = {}

    def resolve(self, need: str) -> tuple[str, float]:
        """``(category, cosine similarity)`` of the category nearest to ``need``."""
        return self.resolve_many([need])[0]

    def resolve_many(self, needs: Sequence[str]) -> list[tuple[str, float]]:
        """``resolve`` of each need, the ones not seen yet encoded in one batch."""
        new = [n for n in dict.fromkeys(needs) if n not in self._resolved]
        if new:
            similarity = self.text_encoder.encode_texts(new) @ self._category_vectors.T
            for need, row in zip(new, similarity):
                best = int(np.argmax(row))
                self._resolved[need] = (self.categories[best], float(row[best]))
        return [self._resolved[n] for n in needs]


class ResolvedNeeds:
    """A resolver whose answers were given in advance: each of ``needs`` resolved alone by
    ``resolver`` (as an episode asks it, so the answers are those it would give one at a time).
    Plain data: it pickles small to evaluator actors."""

    def __init__(self, resolver: NeedResolver, needs: Sequence[str]) -> None:
        self._resolved = {need: resolver.resolve(need) for need in dict.fromkeys(needs)}

    def resolve(self, need: str) -> tuple[str, float]:
        return self._resolved[need]


class ImplicitQueries:
    """The table of needs (category -> needs, ``queries.implicit``) and the resolver that answers them."""

    def __init__(self, table: dict[str, list[str]], resolver: NeedResolver | ResolvedNeeds) -> None:
        self.table = {str(category): [str(n) for n in needs] for category, needs in table.items()}
        self.intended = {need: category for category, needs in self.table.items() for need in needs}
        self.resolver = resolver

    def answered_in_advance(self) -> ImplicitQueries:
        """The same queries with every need of the table already resolved (``ResolvedNeeds``)."""
        return ImplicitQueries(self.table, ResolvedNeeds(self.resolver, list(self.intended)))

    def check_categories(self, categories: Sequence[str]) -> None:
        """``QueryError`` naming each goal category the table has no need for (implicit episodes
        of it cannot be asked)."""
        missing = sorted({str(c) for c in categories} - {c for c, needs in self.table.items() if needs})
        if missing:
            raise QueryError(f"implicit queries: no need for goal categories {missing} in queries.implicit "
                             f"(configs/queries.yaml); it has needs for {sorted(self.table)}")

    def need_for(self, episode: ObjectNavEpisode) -> str:
        """The need an implicit episode asks: one of its category's, drawn stably by episode."""
        self.check_categories([episode.object_category])
        needs = self.table[episode.object_category]
        return needs[zlib.crc32(f"{episode.scene_key}/{episode.episode_id}".encode()) % len(needs)]

    def resolve(self, need: str) -> tuple[str, float]:
        """``(category, similarity)`` the encoder resolves ``need`` to; ``QueryError`` for a need
        that is not in the table (the benchmark asks only needs whose intended category it knows)."""
        if need not in self.intended:
            raise QueryError(f"unknown need {need!r}: not in queries.implicit (configs/queries.yaml); "
                             f"known needs: {sorted(self.intended)}")
        return self.resolver.resolve(need)


class ImplicitQueryAgent:
    """``agent`` asked each episode's need instead of its category: at reset it gets the episode
    with the resolved category as goal. ``episode_extras()`` (read into the episode record) says
    what was asked and what it resolved to; everything else is the wrapped agent's."""

    def __init__(self, agent: Any, queries: ImplicitQueries) -> None:
        self.agent = agent
        self.queries = queries
        self.query: dict = {}

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        need = self.queries.need_for(episode)
        category, similarity = self.queries.resolve(need)
        self.query = {"kind": IMPLICIT, "need": need, "resolved": category, "similarity": round(similarity, 4)}
        self.agent.reset(replace(episode, object_category=category), scene)

    def act(self, observations: Any) -> Any:
        return self.agent.act(observations)

    def episode_extras(self) -> dict:
        return {"query": dict(self.query)}

    def __getattr__(self, name: str) -> Any:
        # the navigator's topo trajectory, stats, planner and decision observer, for the records
        agent = self.__dict__.get("agent")
        if agent is None:
            raise AttributeError(name)
        return getattr(agent, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("agent", "queries", "query"):
            object.__setattr__(self, name, value)
        else:  # e.g. the decision audit's observer: the navigator's
            setattr(self.agent, name, value)
