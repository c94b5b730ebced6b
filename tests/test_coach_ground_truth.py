"""`coach.ground_truth: false`: no coach input holds the answer. Every pipeline's episodes go through
the real coach stage (tasks/coach_evaluate.score_episodes) to a real HTTP server on 127.0.0.1 that
records each request body; the answer is a number no episode text contains (987654), and neither it
nor anything derived from it (DSBench's score on the hidden labels, deep research's gold documents)
may reach the coach. MathChat's answer-blind rubric scores alike whatever the answer."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import tiny_config

from flows.config import ConfigError, load_config
from infra import runs
from pipelines.base import Episode, Problem
from tasks.coach_evaluate import score_episodes
from tasks.context import RunContext

ANSWER = "987654"


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
        data = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "coach",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "Sound.\nPROCESS_SCORE: 7"},
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    srv.bodies = []
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def act(turn, agent, response, tool_output=None, tool_name=None, tool_input=None):
    return {
        "turn": turn,
        "agent": agent,
        "prompt_text": f"the {agent}'s input",
        "response_text": response,
        "tool_output": tool_output,
        "tool_name": tool_name,
        "tool_input": tool_input,
    }


def mathchat_episode(answer=ANSWER, output="42", verdict="ANSWER: 42"):
    acts = [
        act(0, "solver", "Multiply 6 by 7."),
        act(1, "executor", "```python\nprint(6 * 7)\n```", output, "python", "print(6 * 7)"),
        act(2, "verifier", verdict),
    ]
    return Episode(Problem("m", "What is 6 times 7?", answer), "e0", "g0", acts, final_answer="42")


def dsbench_episode():
    acts = [
        act(i, a, "```python\nimport pandas\n```", "(no output)\nFiles now: train.csv", "python", "import pandas")
        for i, a in enumerate(("data_engineer", "modeler", "analyst"))
    ]
    return Episode(
        Problem("diabetes-0", "Predict the target.", ANSWER),
        "e0",
        "g0",
        acts,
        final_answer=f"fair RMSE 0.{ANSWER} on the hidden test labels",
    )


def deepresearch_episode(run_dir):
    p = next(p for p in RunContext(run_dir).pipeline.problems("train") if p.hops == 2)  # a bridge document to hide
    acts = [
        act(0, "system2", "search: who built it", "# Unrelated Page\nnothing here", "search", "who built it"),
        act(1, "system1", "- nothing relevant", "# Unrelated Page\nnothing here", "extract", "who built it"),
        act(2, "system2", "answer: nobody", None, "answer", "nobody"),
    ]
    return Episode(Problem(p.task_id, p.question, ANSWER), "e0", "g0", acts, final_answer="nobody")


def hidden_titles(run_dir, ep):
    """The gold support documents that the question does not name."""
    return [t for t in RunContext(run_dir).pipeline._support_titles[ep.problem.task_id] if t not in ep.problem.question]


def run_dir_for(tmp_path, preset, *overrides):
    """A run folder holding only the resolved config, as the coach stage reads it."""
    cfg = load_config(preset, [f"run.dir={tmp_path}", *overrides])
    return str(runs.create_run(tmp_path, "coach", cfg.model_dump(mode="json")))


@pytest.mark.parametrize("preset", ["tiny", "dsbench-tiny", "deepresearch-tiny"])
@pytest.mark.parametrize("ground_truth", [False, True])
def test_llm_coach_requests_hold_no_answer(server, tmp_path, preset, ground_truth):
    run_dir = run_dir_for(
        tmp_path,
        preset,
        "coach.backend=llm",
        f"coach.ground_truth={str(ground_truth).lower()}",
        f"coach.base_url=http://127.0.0.1:{server.server_port}/v1",
        "coach.cache=false",
    )
    ep = {
        "tiny": mathchat_episode,
        "dsbench-tiny": dsbench_episode,
        "deepresearch-tiny": lambda: deepresearch_episode(run_dir),
    }[preset]()
    [results] = score_episodes(RunContext(run_dir), [ep])
    assert [r.status for r in results] == ["ok"] * 3 and len(server.bodies) == 3
    leaked = [ANSWER, *(hidden_titles(run_dir, ep) if preset == "deepresearch-tiny" else [])]
    payload = "\n".join(server.bodies)
    assert len(leaked) == 1 + (preset == "deepresearch-tiny")
    if ground_truth:  # the control: by default the same episodes do carry all of it to the coach
        assert all(s in payload for s in leaked)
    else:
        assert not [s for s in leaked if s in payload]
        assert "not given" in payload and "Correct answer" not in payload  # nor in the few-shot example
        for fb in RunContext(run_dir).pipeline.feedback(ep, False):
            assert not [s for s in leaked if s in fb]


def test_blind_rubric_reads_no_answer(tmp_path):
    class Untouchable(str):
        """An answer that fails the test when anything compares, prints or searches it."""

        def _touch(self, *a):
            raise AssertionError("the answer-blind rubric read problem.answer")

        __eq__ = __ne__ = __str__ = __contains__ = __hash__ = __format__ = __iter__ = __len__ = _touch

    run_dir = run_dir_for(tmp_path, "tiny", "coach.ground_truth=false")
    for output, verdict in [("42", "ANSWER: 42"), ("42", "It is 42"), ("ERROR: boom", "ANSWER: 3"), ("42", "")]:
        blind = [
            [
                (r.score, r.rationale, r.status)
                for r in score_episodes(RunContext(run_dir), [mathchat_episode(a, output, verdict)])[0]
            ]
            for a in (Untouchable(ANSWER), "42", ANSWER)
        ]
        assert blind[0] == blind[1] == blind[2]  # the same scores and rationales, whatever the answer
        assert "error" not in {status for _, _, status in blind[0]} and ANSWER not in str(blind[2])


@pytest.mark.parametrize("preset, backend", [("dsbench-tiny", "rubric"), ("deepresearch-tiny", "rubric")])
def test_no_answer_blind_rubric_is_a_config_error(preset, backend, tmp_path):
    name = preset.split("-")[0]
    with pytest.raises(ConfigError, match=f"the {name} pipeline has no answer-blind rubric.*coach.backend=llm"):
        load_config(preset, [f"run.dir={tmp_path}", f"coach.backend={backend}", "coach.ground_truth=false"])
    for ok in ("llm", "outcome"):  # the llm coach is answer-blind for every pipeline; outcome ignores the switch
        assert not load_config(preset, [f"coach.backend={ok}", "coach.ground_truth=false"]).coach.ground_truth
    assert not tiny_config(tmp_path, "coach.ground_truth=false").coach.ground_truth  # mathchat has one
