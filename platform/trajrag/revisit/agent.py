"""An agent that reads, in each home, that home's own memory."""

from __future__ import annotations

from typing import Any, Callable

from trajrag.world.episode import ObjectNavEpisode
from trajrag.world.scene import Scene


class PerHomeAgent:
    """At each episode's reset, the agent made for its home (``make_for_home(scene name)``, e.g. a
    retrieving planner over ``HomeMemories.uri(home)``); one home's agent is held at a time, so
    episodes are best run home by home (generated episodes are). Everything else (the navigator's
    topo trajectory, stats and planner, read into the episode records) is the current agent's;
    a decision observer set before the first reset is handed to every home's agent."""

    def __init__(self, make_for_home: Callable[[str], Any]) -> None:
        self.__dict__.update(make_for_home=make_for_home, home=None, current=None, decision_observer=None)

    def reset(self, episode: ObjectNavEpisode, scene: Scene) -> None:
        if scene.name != self.home:
            self.__dict__.update(current=None)  # the last home's agent goes before the next one loads
            self.__dict__.update(current=self.make_for_home(scene.name), home=scene.name)
        if self.decision_observer is not None:
            self.current.decision_observer = self.decision_observer
        self.current.reset(episode, scene)

    def act(self, observations: Any) -> Any:
        return self.current.act(observations)

    def __getattr__(self, name: str) -> Any:
        current = self.__dict__.get("current")
        if current is None:
            raise AttributeError(f"{type(self).__name__} has no {name!r} before its first episode")
        return getattr(current, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "decision_observer":
            raise AttributeError(f"{type(self).__name__}: set {name!r} on the home's agent")
        self.__dict__[name] = value
        if self.current is not None:
            self.current.decision_observer = value
