"""A chat model asked to pick one of a few numbered options, or to write one short text, for the
comparison planners that consult it (``planners.embodied_rag``, ``planners.navprobe``).

The protocol of the LLM planner (``planners.llm``): the assistant turn is pre-filled with
``llm.planner.prefill``, the answer is read by ``llm.parse_answer``, an unusable answer is shown
back ``retries`` times, then the caller's own rule decides (``None``). A backend failure falls
back too; more than ``max_consecutive_chat_errors`` in a row raise ``LLMPlannerError`` rather
than let an LLM evaluation pass as a rule-based one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Optional

from trajrag.planners.chat import ChatError, ChatModel
from trajrag.planners.llm import LLMPlannerConfig, LLMPlannerError, answer_format, parse_answer

log = logging.getLogger(__name__)


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
        self.chat, self.cfg = chat, cfg
        self.counts = ChoiceCounts()
        self._errors_in_a_row = 0

    def choose(self, system: str, question: str, n: int) -> Optional[int]:
        """The index (0..n-1) the model picks for ``question``, or None when no answer was usable."""
        self.counts.asked += 1
        messages = [{"role": "system", "content": system.strip()},
                    {"role": "user", "content": f"{question}\n{answer_format(n)}"}]
        for attempt in range(1 + self.cfg.retries):
            answer = self._complete(messages, self.cfg.prefill, self.cfg.max_tokens)
            if answer is None:
                break
            parsed = parse_answer(answer, n)
            if parsed.choice is not None:
                return parsed.choice
            self.counts.parse_failures += 1
            messages = messages + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": f"That answer is not usable: {parsed.error}. {answer_format(n)}"}]
        self.counts.fallbacks += 1
        return None

    def write(self, system: str, request: str, max_tokens: int) -> Optional[str]:
        """The model's first line of text for ``request``, or None (no answer, or an empty one)."""
        self.counts.asked += 1
        messages = [{"role": "system", "content": system.strip()}, {"role": "user", "content": request}]
        text = (self._complete(messages, "", max_tokens) or "").strip()
        line = text.splitlines()[0].strip() if text else ""
        if not line:
            self.counts.fallbacks += 1
            return None
        return line

    def _complete(self, messages: list[dict], prefill: str, max_tokens: int) -> Optional[str]:
        start = time.perf_counter()
        try:
            answer = self.chat.complete(messages, prefill=prefill, max_tokens=max_tokens)
        except ChatError as exc:
            self.counts.chat_errors += 1
            self._errors_in_a_row += 1
            if self._errors_in_a_row > self.cfg.max_consecutive_chat_errors:
                raise LLMPlannerError(f"{self._errors_in_a_row} chat failures in a row "
                                      f"(llm.planner.max_consecutive_chat_errors); last: {exc}") from exc
            log.warning("chat backend failed, the planner's own rule decides: %s", exc)
            return None
        finally:
            self.counts.chat_s += time.perf_counter() - start
        self._errors_in_a_row = 0
        self.counts.answers += 1
        return answer
