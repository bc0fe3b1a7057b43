"""A chat model asked to pick one of a few numbered options, or to write one short text, for the
comparison planners that consult it (``planners.embodied_rag``, ``planners.navprobe``).

The protocol of the LLM planner, asked by the same ``llm.GuardedChat``: the assistant turn is
pre-filled with ``llm.planner.prefill``, the answer is read by ``llm.parse_answer``, an unusable
answer is shown back ``retries`` times, then the caller's own rule decides (``None``). A backend
failure falls back too; more than ``max_consecutive_chat_errors`` in a row raise
``LLMPlannerError`` rather than let an LLM evaluation pass as a rule-based one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from trajrag.planners.chat import ChatModel
from trajrag.planners.llm import GuardedChat, LLMPlannerConfig, LLMTranscript, answer_format


@dataclass
class ChoiceCounts:
    """asked: questions put to the model. answers: answers received (retries included).
    parse_failures: answers that were no usable choice. chat_errors: backend failures.
    fallbacks: questions the caller's rule answered. chat_s: seconds waiting for the model."""

    asked: int = 0
    answers: int = 0
    parse_failures: int = 0
    chat_errors: int = 0
    fallbacks: int = 0
    chat_s: float = 0.0

    def since(self, before: "ChoiceCounts") -> dict:
        """These counts minus ``before`` (an earlier copy), for one episode's records."""
        now, then = asdict(self), asdict(before)
        return {name: round(now[name] - then[name], 3) for name in now}


class ChoiceAsker:
    """Asks ``chat`` under the LLM planner's answer protocol (``cfg``: ``llm.planner``)."""

    def __init__(self, chat: ChatModel, cfg: LLMPlannerConfig) -> None:
        self.guarded_chat = GuardedChat(chat, cfg, who="", decider="the planner's own rule")
        self.counts = ChoiceCounts()

    def choose(self, system: str, question: str, n: int) -> Optional[int]:
        """The index (0..n-1) the model picks for ``question``, or None when no answer was usable."""
        self.counts.asked += 1
        transcript = LLMTranscript([{"role": "system", "content": system.strip()},
                                    {"role": "user", "content": f"{question}\n{answer_format(n)}"}])
        choice = self.guarded_chat.choose(transcript, n, self.counts)
        if choice is None:
            self.counts.fallbacks += 1
        return choice

    def write(self, system: str, request: str, max_tokens: int) -> Optional[str]:
        """The model's first line of text for ``request``, or None (no answer, or an empty one)."""
        self.counts.asked += 1
        transcript = LLMTranscript([{"role": "system", "content": system.strip()},
                                    {"role": "user", "content": request}])
        text = (self.guarded_chat.complete(transcript, "", max_tokens, self.counts) or "").strip()
        line = text.splitlines()[0].strip() if text else ""
        if not line:
            self.counts.fallbacks += 1
            return None
        return line
