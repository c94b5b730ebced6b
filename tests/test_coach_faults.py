"""The `llm` coach survives a misbehaving endpoint: a real HTTP server on 127.0.0.1 that answers each
request according to the first segment of its path (base_url http://127.0.0.1:PORT/<mode>/v1), with
the real openai client and no mocks. A failure is retried by the client, then recorded as a missing
score with its reason in `status` and `error_kind`; the training iteration completes and logs the
counts to MLflow."""

import json
import socket
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_config

from tasks.coach import ERROR_KINDS, STATUSES, CoachConfig, CoachRequest, LLMCoach

FLAKY_FAILURES = 2  # `flaky` answers 500 to this many requests, then ok
RETRY_AFTER_S = 1.5  # what `429` asks the client to wait (longer than its own backoff for a first retry)
SLOW_S = 2.0  # how long `slow` sleeps before answering (longer than the timeouts below)
MIXED = ("ok", "500", "noscore", "outofrange")  # `mixed` picks one per prompt (a hash of it)


def completion(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "coach",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
    }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.path.split("/")[1]
        hit = self.server.count(mode)
        if mode == "mixed":  # the real prompt is the last user turn holding "Agent role:" (re-asks come after)
            prompt = [m["content"] for m in body["messages"] if "Agent role:" in m["content"]][-1]
            mode = MIXED[zlib.crc32(prompt.encode()) % len(MIXED)]
            self.server.count(f"mixed/{mode}")
        if mode == "flaky":
            mode = "500" if hit <= FLAKY_FAILURES else "ok"
        if mode == "slow":
            time.sleep(SLOW_S)
            mode = "ok"
        if mode == "ok":
            self.reply(200, completion("The step is sound.\nPROCESS_SCORE: 7"))
        elif mode == "noscore":
            self.reply(200, completion("Looks reasonable to me."))
        elif mode == "outofrange":
            self.reply(200, completion("Excellent.\nPROCESS_SCORE: 42"))
        elif mode == "garbage":
            self.reply(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        elif mode == "badjson":
            self.reply(200, b'{"choices": [', "application/json")
        elif mode == "429":
            self.reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": str(RETRY_AFTER_S)})
        else:  # "500"
            self.reply(500, {"error": {"message": "the coach fell over"}})

    def reply(self, code: int, body, content_type="application/json", headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        for k, v in {"Content-Type": content_type, "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class MisbehavingServer(ThreadingHTTPServer):
    """Counts the requests per mode (`hits`); `slow` handlers still asleep at shutdown are dropped."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.hits: Counter = Counter()
        self._lock = threading.Lock()

    def count(self, mode: str) -> int:
        with self._lock:
            self.hits[mode] += 1
            return self.hits[mode]

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.server_port}/{mode}/v1"

    def handle_error(self, request, client_address):
        pass  # a client that timed out closed the socket `slow` writes to


@pytest.fixture
def server():
    srv = MisbehavingServer()
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


REQ = CoachRequest(
    "What is 2 + 3?", "Verifier: states the final answer", "the solver said 5", "ANSWER: 5", "Correct answer: 5."
)


def coach(url: str, cache_path=None, **kw) -> LLMCoach:
    """A coach with short timeouts and few retries, so that every case takes seconds."""
    kw = {"timeout_s": 1.0, "max_retries": 1, "cache": False} | kw
    return LLMCoach(CoachConfig(backend="llm", base_url=url, **kw), cache_path=cache_path)


def test_ok(server):
    r = coach(server.url("ok")).score(REQ)
    assert (r.status, r.score) == ("ok", 7.0) and "sound" in r.rationale
    assert server.hits["ok"] == 1


def test_flaky_server_recovers_through_the_retries(server):
    r = coach(server.url("flaky"), max_retries=FLAKY_FAILURES).score(REQ)
    assert (r.status, r.score) == ("ok", 7.0)
    assert server.hits["flaky"] == FLAKY_FAILURES + 1


@pytest.mark.parametrize(
    "mode, kind, words",
    [
        ("500", "server_error", ["InternalServerError", "500", "fell over"]),
        ("429", "rate_limited", ["RateLimitError", "429", "slow down"]),
    ],
)
def test_error_status_is_retried_then_missing(server, mode, kind, words):
    r = coach(server.url(mode), max_retries=2).score(REQ)
    assert (r.status, r.error_kind, r.score) == ("error", kind, None)
    assert all(w in r.rationale for w in words), r.rationale
    assert server.hits[mode] == 3  # the request and 2 retries
    if mode == "429":  # Retry-After is honoured: 2 waits of RETRY_AFTER_S, longer than the backoff (<= 1.5 s)
        assert r.latency_s >= 2 * RETRY_AFTER_S


def test_timeout_is_retried_then_missing(server):
    r = coach(server.url("slow"), timeout_s=0.5, max_retries=1).score(REQ)
    assert (r.status, r.error_kind, r.score) == ("timeout", "timeout", None)
    assert "APITimeoutError" in r.rationale and "timed out" in r.rationale
    assert server.hits["slow"] == 2


def test_refused_connection_is_retried_then_missing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    r = coach(f"http://127.0.0.1:{port}/v1", max_retries=1).score(REQ)
    assert (r.status, r.error_kind, r.score) == ("error", "connection_error", None)
    assert "APIConnectionError" in r.rationale and "Connection" in r.rationale
    assert r.latency_s >= 0.3  # one backoff (0.5 s less up to 25% jitter) before the retry


@pytest.mark.parametrize(
    "mode, words",
    [
        ("garbage", ["not a chat completion", "502 Bad Gateway"]),  # 200 with an HTML page
        ("badjson", ["not JSON"]),  # 200, application/json, a body that does not parse
    ],
)
def test_non_json_reply_is_malformed(server, mode, words):
    r = coach(server.url(mode)).score(REQ)
    assert (r.status, r.error_kind, r.score) == ("malformed", "not_a_completion", None)
    assert all(w in r.rationale for w in words), r.rationale
    assert server.hits[mode] == 1  # a 200 is not retried, and there is no answer to re-ask about


@pytest.mark.parametrize("mode, words", [("noscore", ["Looks reasonable"]), ("outofrange", ["PROCESS_SCORE: 42"])])
def test_answer_without_a_valid_score_is_reasked_then_malformed(server, mode, words):
    r = coach(server.url(mode), reask=2).score(REQ)
    assert (r.status, r.error_kind, r.score) == ("malformed", "no_valid_score", None)
    assert "no PROCESS_SCORE in 0..10" in r.rationale and all(w in r.rationale for w in words), r.rationale
    assert server.hits[mode] == 3  # the question and 2 re-asks


def test_only_scores_are_cached(server, tmp_path):
    """`flaky` fails the first call (500 twice: the request and its retry); the second call asks again and
    gets a score; the third is answered from the cache."""
    c = coach(server.url("flaky"), tmp_path / "cache.sqlite", max_retries=1, cache=True)
    first, second, third = (c.score(REQ) for _ in range(3))
    assert (first.status, first.error_kind) == ("error", "server_error") and not first.cached
    assert second.status == "ok" and not second.cached
    assert third.status == "ok" and third.cached and third.score == 7.0
    assert server.hits["flaky"] == FLAKY_FAILURES + 1  # 2 failed, 1 ok, none for the cached one


@pytest.mark.slow
def test_train_iteration_completes_with_a_faulty_coach(prefect_harness, server, tmp_path):
    """The tiny preset, one iteration, the coach at `mixed` (per prompt: ok, 500 without recovery, no score,
    score 42): the iteration completes, missing scores are stored with their status and counted in MLflow."""
    from mlflow.tracking import MlflowClient

    from flows.train import train
    from infra import store

    cfg = tiny_config(
        tmp_path,
        "run.id=faulty-coach",
        "iterations=1",
        "evaluate=false",
        "coach.backend=llm",
        f"coach.base_url={server.url('mixed')}",
        "coach.max_retries=1",
        "coach.reask=1",
        "coach.timeout_s=5",
        "coach.cache=false",
    )
    run_dir = train(config=cfg)

    coach_df = store.read_table(run_dir, "coach")
    status = coach_df["status"].value_counts().to_dict()
    kinds = coach_df["error_kind"].value_counts().to_dict()
    # each action's mode follows from the server's request counts: ok 1, 500 2 (a retry), no score 2 (a re-ask)
    expected = {
        "ok": server.hits["mixed/ok"],
        "error": server.hits["mixed/500"] // 2,
        "malformed": (server.hits["mixed/noscore"] + server.hits["mixed/outofrange"]) // 2,
    }
    assert status == {k: v for k, v in expected.items() if v}
    assert kinds == {
        k: v for k, v in {"server_error": expected["error"], "no_valid_score": expected["malformed"]}.items() if v
    }
    assert status.get("ok", 0) > 0 and len(coach_df) - status.get("ok", 0) > 0, status
    assert coach_df[coach_df.status == "ok"]["score"].eq(7.0).all()
    missing = coach_df[coach_df.status != "ok"]
    assert missing["score"].isna().all() and missing["rationale"].str.len().gt(0).all()

    adv = store.read_table(run_dir, "advantages", 1, "rollout")
    assert len(adv) == len(coach_df)
    assert set(adv[adv["weight"] == 0]["turn"].astype(str) + adv[adv["weight"] == 0]["episode_id"]) == set(
        missing["turn"].astype(str) + missing["episode_id"]
    )  # missing scores are masked out of the loss
    assert len(store.read_table(run_dir, "updates", 1)) == 3

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(tmp_path).resolve() / 'mlflow.db'}")
    run = client.get_run((Path(run_dir) / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for s in STATUSES:
        assert metrics[f"coach_status/{s}"] == status.get(s, 0), s
    for k in ERROR_KINDS:
        assert metrics[f"coach_error/{k}"] == kinds.get(k, 0), k
    assert sum(metrics[f"coach_missing/{a}"] for a in ("solver", "executor", "verifier")) == len(missing)
