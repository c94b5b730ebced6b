"""The `llm` coach against a real OpenAI-compatible server: `transformers serve` on 127.0.0.1 serving
the converted SmolLM2-135M-Instruct folder. No mock stands in for it."""

import socket

import pytest

from infra.local_llm import free_port, transformers_serve
from infra.models import smollm2_dir
from tasks.coach import CoachConfig, CoachRequest, LLMCoach

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    model_dir = smollm2_dir()
    port = free_port()  # a port given, as a sweep file gives its coach's base_url one
    try:
        with transformers_serve(model_dir, port=port) as url:
            assert url == f"http://127.0.0.1:{port}/v1"
            yield url, str(model_dir)
    except RuntimeError as e:
        pytest.fail(str(e))


class CountingCoach(LLMCoach):
    """The real client, counting the HTTP requests it makes."""

    calls = 0

    def _ask(self, messages):
        type(self).calls += 1
        return super()._ask(messages)


def _episode_requests(trained_run, n: int) -> list[CoachRequest]:
    from tasks.coach_evaluate import load_partition_episodes
    from tasks.context import RunContext

    _, run_dir = trained_run
    pipe = RunContext(run_dir).pipeline
    roles = {a.name: a.role for a in pipe.agents}
    reqs = []
    for ep in load_partition_episodes(str(run_dir), 1, "rollout")[:n]:
        reqs += [
            CoachRequest(ep.problem.question, roles[a["agent"]], a["prompt_text"], a["response_text"], fb)
            for a, fb in zip(ep.actions, pipe.feedback(ep, True))
        ]
    return reqs


def test_llm_coach_scores_real_episodes_and_caches(server, trained_run, tmp_path):
    base_url, model = server
    cfg = CoachConfig(backend="llm", base_url=base_url, model=model, max_tokens=40, concurrency=2)
    CountingCoach.calls = 0
    coach = CountingCoach(cfg, cache_path=tmp_path / "cache.sqlite")
    # three MathChat episodes (solver, executor, verifier each): a 135M judge seldom keeps to the
    # PROCESS_SCORE format (1 of these 9 answers), and one parsed score is what the cache check needs
    reqs = _episode_requests(trained_run, 3)
    results = coach.score_many(reqs)
    assert len(results) == 9
    for r in results:
        assert r.status in ("ok", "malformed") and r.latency_s > 0 and not r.cached
        assert r.score is None if r.status == "malformed" else 0 <= r.score <= 10
    assert sum(r.status == "ok" for r in results) >= 1, [r.rationale for r in results]
    first_calls = CountingCoach.calls
    # the same prompts again: every parsed score comes from the cache, without an HTTP request
    again = coach.score_many(reqs)
    ok = [i for i, r in enumerate(results) if r.status == "ok"]
    for i in ok:
        assert again[i].cached and again[i].score == results[i].score and again[i].latency_s == 0.0
    assert CountingCoach.calls - first_calls == 2 * (len(reqs) - len(ok))  # only malformed ones are re-sent


def test_malformed_reply_is_reasked_then_recorded_missing(server, trained_run):
    base_url, model = server
    # 3 tokens cannot hold a rationale and the score line: the reply is malformed, re-asked once, then missing
    cfg = CoachConfig(backend="llm", base_url=base_url, model=model, max_tokens=3, reask=1, cache=False)
    CountingCoach.calls = 0
    r = CountingCoach(cfg).score(_episode_requests(trained_run, 1)[1])
    assert r.status == "malformed" and r.score is None
    assert CountingCoach.calls == 2


def test_unreachable_coach_is_a_missing_score_not_a_crash():
    port = free_port()  # nothing listens here
    cfg = CoachConfig(backend="llm", base_url=f"http://127.0.0.1:{port}/v1", model="x", max_retries=0, timeout_s=5)
    r = LLMCoach(cfg).score(CoachRequest("q", "role", "ctx", "act", "fb"))
    assert (r.status, r.error_kind) == ("error", "connection_error") and r.score is None and "Connection" in r.rationale


def test_a_taken_port_is_refused_before_a_server_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} is already in use"):
            with transformers_serve(smollm2_dir(), port=port):
                pass
