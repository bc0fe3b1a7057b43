"""The LLM planner (paper Sec. 3.3): the language model picks a candidate path, reading each
candidate's description L(T_tp) and the past experience retrieved for it.

One decision:

1. the *fallback* planner chooses first (``fallback.choose``). A retrieval-scoring fallback
   (``planners.scoring.ScoringPlanner``) retrieves the experiences of every candidate as it does
   and leaves them in ``last_retrieval``, so retrieval runs once per decision and the fallback
   answer is ready if the LLM fails. Without ``last_retrieval`` (nearest frontier) the planner's
   own ``retrieve`` callable is used if given, else the prompt has no experience section;
2. the prompt: the goal, each candidate as ``[i] <length> m`` + its path description (the tail
   kept within ``path_chars``: the planned end is what differs between candidates), and below
   it the best retrieved experiences (goal, reached or not, similarity, description), filled
   rank by rank across candidates within ``experience_budget_chars``;
3. the chat model answers ``{"choice": <int>, "reason": "..."}`` (the assistant turn is
   pre-filled with ``prefill``). Parsing is tolerant (``parse_answer``); an unusable answer is
   shown back to the model with the reason, ``retries`` times, then the fallback's choice is
   used. ``parse_failures`` counts unusable answers, ``fallbacks`` decisions the fallback made
   (totals over the planner's life; ``episode`` holds the same counters for the episode).

A chat backend failure (server down, timeout) falls back for that decision; more than
``max_consecutive_chat_errors`` in a row raise ``LLMPlannerError`` rather than silently turning
an LLM evaluation into a fallback one. Unusable answers keep falling back (the protocol above),
but once more than ``unusable_warn_share`` of the decisions asked (after ``unusable_warn_after``
of them) fell back for that reason, the planner warns once on stderr: the results are then
mostly the fallback's.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from trajrag.config import Settings
from trajrag.planners.base import Planner, PlannerContext
from trajrag.planners.chat import ChatConfig, ChatError, ChatModel, make_chat
from trajrag.planners.frontier import NearestFrontierPlanner
from trajrag.retrieval.types import DecisionRetrieval, Experience
from trajrag.topo.describe import describe
from trajrag.topo.trajectory import TopoPolarTrajectory

log = logging.getLogger(__name__)


# -- config (configs/llm.yaml) ----------------------------------------------------------------------
@dataclass
class LLMPlannerConfig:
    """``llm.planner``: the prompt and the answer protocol (characters, tokens; see the YAML).

    fallback: the planner that decides when the LLM cannot (a key of ``FALLBACKS``).
    """

    fallback: str
    system_prompt: str
    prefill: str
    max_tokens: int
    retries: int
    max_consecutive_chat_errors: int
    unusable_warn_after: int
    unusable_warn_share: float
    path_chars: int
    experiences_per_candidate: int
    experience_chars: int
    experience_budget_chars: int
    log_transcripts: bool

    def __post_init__(self) -> None:
        if self.unusable_warn_after < 1 or not 0.0 <= self.unusable_warn_share <= 1.0:
            raise ValueError(f"llm.planner: unusable_warn_after must be >= 1 and unusable_warn_share in [0, 1], "
                             f"got {self.unusable_warn_after} and {self.unusable_warn_share}")


@dataclass
class ServeLLMConfig:
    """``llm.serve``: the local OpenAI-compatible Serve app (``distributed/serve_llm.py``).

    host/port: HTTP proxy address (127.0.0.1: loopback only). route_prefix: where the app is
    mounted ("/" -> ``/v1/chat/completions``). model_id: the name clients send as ``model``.
    max_ongoing_requests: per replica. num_cpus: per replica.
    """

    host: str
    port: int
    app_name: str
    route_prefix: str
    model_id: str
    max_ongoing_requests: int
    num_cpus: float


@dataclass
class LLMConfig:
    """``configs/llm.yaml``: the planner, its chat backend, and the local Serve app."""

    planner: LLMPlannerConfig
    chat: ChatConfig
    serve: ServeLLMConfig


class LLMPlannerError(RuntimeError):
    """The LLM planner cannot go on (its chat backend keeps failing)."""


# -- records -------------------------------------------------------------------------------------------
@dataclass
class LLMCounts:
    """Counters of the LLM planner. decisions: ``choose`` calls. asked: decisions put to the LLM
    (two candidates or more). answers: answers received (retries included). parse_failures:
    answers that were not a usable choice. chat_errors: backend failures. fallbacks: decisions
    taken by the fallback planner because the LLM gave no usable answer. agreed: LLM choices
    equal to the fallback's. chat_s: seconds spent waiting for the chat backend."""

    decisions: int = 0
    asked: int = 0
    answers: int = 0
    parse_failures: int = 0
    chat_errors: int = 0
    fallbacks: int = 0
    agreed: int = 0
    chat_s: float = 0.0

    def add(self, other: "LLMCounts") -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class ParsedAnswer:
    """The outcome of parsing one answer: ``choice`` (None when unusable, then ``error`` says why)."""

    choice: Optional[int]
    reason: str = ""
    error: str = ""


@dataclass
class LLMTranscript:
    """The last decision put to the LLM: the messages sent (the last request, retries included),
    every raw answer, the final choice and whether the fallback made it."""

    messages: list[dict]
    answers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    choice: int = -1
    fallback_choice: int = -1
    used_fallback: bool = False
    reason: str = ""


# -- parsing -------------------------------------------------------------------------------------------
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)  # reasoning models (Qwen3) think first
_TRUNCATED_CHOICE = re.compile(r'\{\s*"choice"\s*:\s*"?(-?\d+)"?\s*,')
_INT_TEXT = re.compile(r"\s*-?\d+\s*")


def first_json_object(text: str) -> Optional[dict]:
    """The first ``{...}`` in ``text`` that decodes as a JSON object with a ``choice`` key (code
    fences and chatter around it are ignored); None if there is none."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "choice" in value:
            return value
    return None


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        return int(value)
    return None


def parse_answer(text: str, n_candidates: int) -> ParsedAnswer:
    """Read ``{"choice": <int>, "reason": "..."}`` from a model's answer.

    Tolerant: the first JSON object with a ``choice`` anywhere in the text (fenced or not,
    ``<think>`` blocks dropped); a choice given as ``2``, ``2.0`` or ``"2"``; and an object cut
    off by the token limit after its choice (``{"choice": 2, "reason": "the be``). The choice
    must be an index in ``[0, n_candidates)``.
    """
    text = _THINK.sub("", text)
    obj = first_json_object(text)
    if obj is not None:
        choice, reason = _as_int(obj["choice"]), str(obj.get("reason", ""))
        if choice is None:
            return ParsedAnswer(None, error=f"choice {obj['choice']!r} is not an integer")
    else:
        cut = _TRUNCATED_CHOICE.search(text)
        if cut is None:
            return ParsedAnswer(None, error='no JSON object with a "choice" in the answer')
        choice, reason = int(cut.group(1)), ""
    if not 0 <= choice < n_candidates:
        return ParsedAnswer(None, error=f"choice {choice} is not a candidate number from 0 to {n_candidates - 1}")
    return ParsedAnswer(choice, reason)


# -- the prompt ----------------------------------------------------------------------------------------
def path_text(traj: TopoPolarTrajectory) -> str:
    """L(T_tp) without its goal sentence and outcome sentence (a candidate has no outcome yet)."""
    return strip_goal_and_outcome(describe(traj))


def strip_goal_and_outcome(text: str) -> str:
    """Drop ``Goal: x.`` at the start and ``X reached.`` / ``X not reached.`` at the end."""
    text = re.sub(r"^Goal: [^.]*\.\s*", "", text.strip())
    return re.sub(r"\s*[^.]*\b(not )?reached\.$", "", text)


def tail(text: str, budget: int) -> str:
    """The end of ``text`` within ``budget`` characters, cut at a ``Node`` sentence when possible."""
    if len(text) <= budget:
        return text
    cut = text[len(text) - budget + 4:]
    start = cut.find("Node ")
    return "... " + (cut[start:] if start > 0 else cut)


def _planned_nodes(traj: TopoPolarTrajectory) -> int:
    """Nodes at the end of a candidate that were not walked (``node_visit_steps`` = -1)."""
    steps = np.asarray(traj.node_visit_steps)
    if len(steps) != len(traj):
        return 0
    walked = np.flatnonzero(steps >= 0)
    return len(steps) - (int(walked[-1]) + 1 if len(walked) else 0)


def candidate_line(index: int, candidate: Any, cfg: LLMPlannerConfig) -> str:
    """``[i] 3.2 m; nodes 5-7 planned. Node 1: ...`` for one candidate path."""
    traj = candidate.trajectory
    planned = _planned_nodes(traj)
    span = ""
    if planned:
        first = len(traj) - planned + 1
        span = f"; node {first} planned" if planned == 1 else f"; nodes {first}-{len(traj)} planned"
    return f"[{index}] {candidate.length_m:.1f} m{span}. {tail(path_text(traj), cfg.path_chars)}"


def experience_line(exp: Experience, cfg: LLMPlannerConfig) -> str:
    """``  - past search for bed, reached, similarity 0.91: Node 1: ...`` (the description's tail)."""
    goal = exp.goal.replace("_", " ")
    outcome = "reached" if exp.success else "not reached"
    text = "(no description)"
    if exp.description:
        text = tail(strip_goal_and_outcome(exp.description), cfg.experience_chars)
    return f"  - past search for {goal}, {outcome}, similarity {exp.similarity:.2f}: {text}"


def experience_lines(retrieval: DecisionRetrieval, n_candidates: int, cfg: LLMPlannerConfig) -> list[list[str]]:
    """Per candidate, the lines of its best experiences: rank 1 of every candidate first, then
    rank 2, ..., while the budget of ``experience_budget_chars`` lasts, so that no candidate is
    left without experience because another one took the whole budget."""
    lines: list[list[str]] = [[] for _ in range(n_candidates)]
    used = 0
    for rank in range(cfg.experiences_per_candidate):
        for i in range(n_candidates):
            exps = retrieval.experiences[i] if i < len(retrieval.experiences) else []
            if rank >= len(exps):
                continue
            line = experience_line(exps[rank], cfg)
            if used + len(line) > cfg.experience_budget_chars:
                continue  # a shorter line of another candidate may still fit
            lines[i].append(line)
            used += len(line)
    return lines


def build_messages(ctx: PlannerContext, retrieval: Optional[DecisionRetrieval], cfg: LLMPlannerConfig) -> list[dict]:
    """The chat messages of one decision (system + user)."""
    n = len(ctx.candidates)
    goal = ctx.goal.replace("_", " ")
    experience = experience_lines(retrieval, n, cfg) if retrieval is not None else None
    parts = [f"Goal: find a {goal}.",
             f"Candidate paths ({n}), each from the start of the episode to a frontier (the border of "
             "unexplored space); node sentences say what lies around the robot at each node:"]
    for i, candidate in enumerate(ctx.candidates):
        parts.append(candidate_line(i, candidate, cfg))
        if experience is not None:
            parts.append("  Similar past experience:" if experience[i] else "  Similar past experience: none.")
            parts.extend(experience[i])
    parts.append(f"Which candidate should the robot follow to find the {goal}? " + answer_format(n))
    return [{"role": "system", "content": cfg.system_prompt.strip()},
            {"role": "user", "content": "\n".join(parts)}]


def answer_format(n_candidates: int) -> str:
    return (f'Answer only with JSON: {{"choice": <candidate number from 0 to {n_candidates - 1}>, '
            '"reason": "<one short sentence>"}.')


# -- asking (shared with planners.llm_choice) --------------------------------------------------------------
class ChatCounts(Protocol):
    """What ``GuardedChat`` adds to (``LLMCounts``, ``llm_choice.ChoiceCounts``): answers
    received, unusable answers, backend failures, seconds waiting for the backend."""

    answers: int
    parse_failures: int
    chat_errors: int
    chat_s: float


class GuardedChat:
    """``chat`` asked under the answer protocol of ``cfg`` (module docstring, 3.), with the guard
    on backend failures: a failure falls back, more than ``max_consecutive_chat_errors`` in a row
    raise ``LLMPlannerError``. One per planner: its failures in a row count across its questions.

    who: the start of its messages (e.g. ``"LLM planner: "``). decider: who decides instead of
    the model, named in the warning (e.g. ``"the fallback"``).
    """

    def __init__(self, chat: ChatModel, cfg: LLMPlannerConfig, who: str, decider: str) -> None:
        self.chat, self.cfg, self.who, self.decider = chat, cfg, who, decider
        self._errors_in_a_row = 0

    def choose(self, transcript: LLMTranscript, n: int, counts: ChatCounts) -> Optional[int]:
        """The choice (0..n-1) the model answers to ``transcript.messages``, or None when no answer
        was usable; ``transcript`` keeps every answer, error and the last request sent."""
        for attempt in range(1 + self.cfg.retries):
            answer = self.complete(transcript, self.cfg.prefill, self.cfg.max_tokens, counts)
            if answer is None:
                return None
            parsed = parse_answer(answer, n)
            if parsed.choice is not None:
                transcript.reason = parsed.reason
                return parsed.choice
            counts.parse_failures += 1
            transcript.errors.append(parsed.error)
            if attempt < self.cfg.retries:  # show the model its answer and what was wrong with it
                transcript.messages = transcript.messages + [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"That answer is not usable: {parsed.error}. {answer_format(n)}"}]
        return None

    def complete(self, transcript: LLMTranscript, prefill: str, max_tokens: int, counts: ChatCounts) -> Optional[str]:
        """The model's answer to ``transcript.messages`` (``max_tokens`` new tokens at most), or None
        when the backend failed (the error kept in ``transcript.errors``)."""
        start = time.perf_counter()
        try:
            answer = self.chat.complete(transcript.messages, prefill=prefill, max_tokens=max_tokens)
        except ChatError as exc:
            counts.chat_errors += 1
            transcript.errors.append(str(exc))
            self._errors_in_a_row += 1
            if self._errors_in_a_row > self.cfg.max_consecutive_chat_errors:
                raise LLMPlannerError(f"{self.who}{self._errors_in_a_row} chat failures in a row "
                                      f"(llm.planner.max_consecutive_chat_errors); last: {exc}") from exc
            log.warning("%schat backend failed, %s decides: %s", self.who, self.decider, exc)
            return None
        finally:
            counts.chat_s += time.perf_counter() - start
        self._errors_in_a_row = 0
        counts.answers += 1
        transcript.answers.append(answer)
        return answer


# -- the planner ---------------------------------------------------------------------------------------
class LLMPlanner:
    """Planner whose choice comes from a chat model (see the module docstring).

    chat: a ``ChatModel``. fallback: the planner used first (its choice is the fallback, its
    ``last_retrieval`` the experiences). retrieve: optional ``(trajectories, goal) ->
    DecisionRetrieval`` used when the fallback leaves no ``last_retrieval``.
    """

    name = "llm"

    def __init__(self, chat: ChatModel, fallback: Planner, cfg: LLMPlannerConfig,
                 retrieve: Optional[Callable[[Sequence[TopoPolarTrajectory], str], DecisionRetrieval]] = None) -> None:
        self.guarded_chat = GuardedChat(chat, cfg, who="LLM planner: ", decider="the fallback")
        self.fallback = fallback
        self.cfg = cfg
        self.retrieve = retrieve
        self.totals = LLMCounts()
        self.episode = LLMCounts()
        self.last_transcript: Optional[LLMTranscript] = None
        self.last_retrieval: Optional[DecisionRetrieval] = None
        self.chat_ms: list[float] = []  # per decision put to the LLM, this episode
        self._unusable = 0  # decisions asked that fell back because no answer was usable
        self._warned_unusable = False

    @property
    def parse_failures(self) -> int:
        """Unusable answers over the planner's life."""
        return self.totals.parse_failures

    @property
    def fallbacks(self) -> int:
        """Decisions the fallback planner took over the planner's life."""
        return self.totals.fallbacks

    def reset(self, goal: str, seed: int) -> None:
        self.fallback.reset(goal, seed)
        self.episode = LLMCounts()
        self.chat_ms = []

    def episode_stats(self) -> dict:
        """Per-episode counters for the evaluation records (``agent/evaluate.py``)."""
        stats = {}
        inner = getattr(self.fallback, "episode_stats", None)
        if inner is not None:
            stats.update(inner())  # retrieval timings of the scoring fallback
        stats.update(asdict(self.episode))
        stats["chat_s"] = round(self.episode.chat_s, 3)
        stats["chat_ms"] = [round(t, 1) for t in self.chat_ms]
        return stats

    def choose(self, ctx: PlannerContext) -> int:
        counts = LLMCounts(decisions=1)
        fallback_choice = int(self.fallback.choose(ctx))
        self.last_retrieval = self._retrieval(ctx)
        if len(ctx.candidates) < 2:  # nothing to ask
            self._count(counts)
            return fallback_choice
        counts.asked = 1
        transcript = LLMTranscript(build_messages(ctx, self.last_retrieval, self.cfg), fallback_choice=fallback_choice)
        choice = self.guarded_chat.choose(transcript, len(ctx.candidates), counts)
        if choice is None:
            counts.fallbacks = 1
            transcript.used_fallback = True
            choice = fallback_choice
            self._unusable += int(counts.chat_errors == 0)  # chat errors warn (and raise) on their own
        counts.agreed = int(choice == fallback_choice and not transcript.used_fallback)
        transcript.choice = choice
        self.last_transcript = transcript
        self.chat_ms.append(counts.chat_s * 1e3)
        self._count(counts)
        self._warn_if_mostly_unusable(transcript)
        if self.cfg.log_transcripts:
            log.info("LLM decision %s: %s", ctx.step, json.dumps(asdict(transcript))[:4000])
        return choice

    def _retrieval(self, ctx: PlannerContext) -> Optional[DecisionRetrieval]:
        retrieval = getattr(self.fallback, "last_retrieval", None)
        if retrieval is None and self.retrieve is not None:
            retrieval = self.retrieve([c.trajectory for c in ctx.candidates], ctx.goal)
        return retrieval

    def _warn_if_mostly_unusable(self, transcript: LLMTranscript) -> None:
        """Once per planner: say on stderr that the fallback is making most decisions because the
        LLM's answers are unusable (a wrong prefill, template or backend would otherwise pass as an
        LLM evaluation, exit status 0)."""
        asked = self.totals.asked
        if (self._warned_unusable or asked < self.cfg.unusable_warn_after
                or self._unusable <= self.cfg.unusable_warn_share * asked):
            return
        self._warned_unusable = True
        last = transcript.answers[-1] if transcript.answers else ""
        print(f"warning: LLM planner: {self._unusable} of {asked} decisions fell back to the "
              f"{getattr(self.fallback, 'name', 'fallback')} planner because no answer was usable "
              f"(llm.planner.unusable_warn_share {self.cfg.unusable_warn_share:g}); last answer {last[:80]!r}: "
              f"{transcript.errors[-1] if transcript.errors else ''}", file=sys.stderr)

    def _count(self, counts: LLMCounts) -> None:
        self.totals.add(counts)
        self.episode.add(counts)


# -- factories (agent/registry.py) ------------------------------------------------------------------
FALLBACKS: dict[str, str] = {
    "scoring": "trajrag.planners.scoring:make_scoring_planner",
    "frontier": "trajrag.planners.llm:make_frontier_fallback",
}


def make_frontier_fallback(settings: Settings) -> Planner:
    """The nearest-frontier planner with the navigator's hysteresis (no retrieval)."""
    return NearestFrontierPlanner(settings.navigator.frontier_hysteresis_m)


def make_fallback(name: str, settings: Settings) -> Planner:
    """The fallback planner ``llm.planner.fallback`` names."""
    try:
        module_name, factory = FALLBACKS[name].split(":")
    except KeyError:
        raise ValueError(f"llm.planner.fallback: unknown planner {name!r}; known: {sorted(FALLBACKS)}") from None
    return getattr(importlib.import_module(module_name), factory)(settings)


def make_llm_planner(settings: Settings) -> LLMPlanner:
    """The LLM planner of the ``llm`` section; the local backend loads SmolLM2 once per process."""
    cfg = settings.llm
    return LLMPlanner(make_chat(cfg.chat), make_fallback(cfg.planner.fallback, settings), cfg.planner)
