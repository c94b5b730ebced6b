"""The coach: scores every action of every agent on 0..10 (MAPPA's process reward).

Backends: `rubric` (the pipeline's deterministic rules, offline) and `llm` (any OpenAI-compatible
chat endpoint; asks for a rationale and `PROCESS_SCORE: N`; calls are concurrent and cached by
(coach model, prompt hash)). With `ground_truth: false` neither sees the problem's answer: the pipeline's
answer-blind rubric, or feedback without it (pipelines/base.py `Pipeline.rubric`, `Pipeline.feedback`).

The `llm` coach never fails the iteration: the client retries timeouts, 429 and 5xx and refused
connections with exponential backoff (honouring Retry-After); answers without a score in 0..10 are
re-asked `reask` times. What still fails is recorded as missing (score None) with `status`
(`malformed`, `timeout` or `error`, the store's contract), the finer `error_kind` (see ERROR_KINDS)
and the error or the last answer in `rationale`. Only scores are cached, so a later call asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.engines.pool import ClientPool
from infra.retry import INFRA_KINDS

SYSTEM = (
    "You are a grader. Reply with one sentence of rationale, then a last line "
    "PROCESS_SCORE: N (N an integer from 0 to 10)."
)
SCORE_RE = re.compile(r"PROCESS_SCORE\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.I)
# A score's status (the data contract): `ok`, or why it is missing; `skipped` = not asked.
STATUSES = ("ok", "malformed", "timeout", "error", "skipped")
# Why a score is missing, finer: the request's last error after the retries, or what was wrong with the reply.
ERROR_KINDS = {
    "timeout": "timeout",
    "rate_limited": "error",
    "server_error": "error",
    "connection_error": "error",
    "other": "error",
    "not_a_completion": "malformed",
    "no_valid_score": "malformed",
    # an infrastructure fault in the episode (infra/retry.py): not the agents' doing, so no score
    **{f"infra_{k}": "error" for k in INFRA_KINDS},
}  # kind -> status


class CoachConfig(BaseModel):
    """Who scores the actions and how."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["rubric", "llm", "outcome"] = Field(
        "rubric",
        description="`rubric` (deterministic, offline), `llm` (OpenAI-compatible endpoint) or `outcome` "
        "(no process reward: every action gets the sparse end-of-episode outcome, x10)",
    )
    ground_truth: bool = Field(
        True,
        description="rubric / llm: the coach sees the problem's answer (false: "
        "answer-blind, each action judged from the episode's evidence alone: the answer-blind "
        "rubric (mathchat only), or llm feedback without the answer). `outcome` is the answer's "
        "verdict by definition, so it ignores this",
    )
    base_url: str = Field("http://127.0.0.1:8000/v1", description="llm: the endpoint's /v1 URL")
    model: str = Field("coach", description="llm: model name sent to the endpoint")
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="llm: environment variable holding the API key "
        "(a placeholder is sent when unset, as local servers expect)",
    )
    temperature: float = Field(0.0, ge=0, le=2, description="llm: sampling temperature")
    max_tokens: int = Field(256, ge=1, description="llm: reply token limit")
    timeout_s: float = Field(120.0, gt=0, description="llm: per-request timeout (each retry gets its own)")
    max_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="llm: client retries (exponential backoff, honouring "
        "Retry-After) on timeouts, 429, 5xx and connection errors; then the score is missing",
    )
    concurrency: int = Field(
        4,
        ge=1,
        le=256,
        description="llm: concurrent requests (the client pool's max_concurrency, infra/engines/pool.py)",
    )
    reask: int = Field(
        1,
        ge=0,
        le=5,
        description="llm: re-asks after an answer without a score in 0..10 before recording it missing (`malformed`)",
    )
    max_context_chars: int = Field(2000, ge=100, description="llm: the agent's input context is cut to this")
    few_shot: bool = Field(
        True, description="llm: send one worked example turn first (helps small coaches keep the answer format)"
    )
    cache: bool = Field(
        True,
        description="llm: cache scored answers by (model, prompt hash) in "
        "<run.dir>/coach-cache.sqlite (failures are not cached)",
    )


def parse_score(text: str) -> float | None:
    """The last `PROCESS_SCORE: N` in `text` if 0 <= N <= 10, else None (malformed / out of range)."""
    found = SCORE_RE.findall(text or "")
    if not found:
        return None
    v = float(found[-1])
    return v if 0.0 <= v <= 10.0 else None


@dataclass
class CoachRequest:
    question: str
    role: str
    context: str
    action: str
    feedback: str


@dataclass
class CoachResult:
    score: float | None
    rationale: str
    status: str  # one of STATUSES
    latency_s: float
    cached: bool = False
    error_kind: str | None = None  # one of ERROR_KINDS when the score is missing


def build_prompt(r: CoachRequest, max_context_chars: int, ground_truth: bool = True) -> str:
    """The grading request; without `ground_truth` it says that no answer is given (the feedback has none)."""
    ctx = r.context if len(r.context) <= max_context_chars else "..." + r.context[-max_context_chars:]
    blind = (
        ""
        if ground_truth
        else (
            "The correct answer is not given: judge the action by the evidence above "
            "alone (is it sound, and does it use what the agent saw faithfully?). "
        )
    )
    return (
        "You coach a team of AI agents. Grade ONE action of ONE agent.\n"
        f"Team task: {r.question}\n"
        f"Agent role: {r.role}\n"
        f"What the agent saw:\n{ctx}\n"
        f"The agent's action:\n{r.action}\n"
        f"Environment feedback:\n{r.feedback}\n\n"
        f"{blind}Judge only this agent's own contribution: if it failed because an earlier agent failed, "
        "blame that agent, not this one. Give a one-sentence rationale, then end with the line\n"
        "PROCESS_SCORE: N\nwhere N is an integer from 0 (harmful) to 10 (perfect)."
    )


# One worked example turn before the real request, by coach.ground_truth: small coaches copy the
# answer format from it (the answer-blind one judges the program against the task, not an answer).
_EXAMPLE_TASK = (
    "Compute 2*5.",
    "Code Executor: writes Python that prints the answer",
    "Problem: Compute 2*5.",
    "```python\nprint(2+5)\n```",
)
EXAMPLES = {
    True: (
        CoachRequest(*_EXAMPLE_TASK, "Program output: 7. Correct answer: 10."),
        "The program adds instead of multiplying, so it prints the wrong number.\nPROCESS_SCORE: 2",
    ),
    False: (
        CoachRequest(*_EXAMPLE_TASK, "Program output: 7."),
        "The task multiplies but the program adds, so it cannot print 2*5.\nPROCESS_SCORE: 2",
    ),
}


class _Cache:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS coach (key TEXT PRIMARY KEY, value TEXT)")
            self._db.commit()

    def get(self, key: str):
        with self._lock:
            row = self._db.execute("SELECT value FROM coach WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO coach VALUES (?, ?)", (key, json.dumps(value)))
            self._db.commit()


class MalformedReply(Exception):
    """The endpoint answered 200 with something that is not a chat completion."""


def error_kind(e: Exception) -> str:
    """What kind of failure ended a request for good (after the client's retries)."""
    import openai

    if isinstance(e, MalformedReply):
        return "not_a_completion"
    if isinstance(e, openai.APITimeoutError):
        return "timeout"
    if isinstance(e, openai.APIConnectionError):
        return "connection_error"
    if isinstance(e, openai.RateLimitError):
        return "rate_limited"
    if isinstance(e, openai.APIStatusError) and e.status_code >= 500:
        return "server_error"
    return "other"


def coach_messages(cfg: CoachConfig, req: CoachRequest) -> list[dict]:
    """The chat the `llm` coach sends for one action: the system line, the worked example (few_shot), the
    grading request."""
    messages = [{"role": "system", "content": SYSTEM}]
    if cfg.few_shot:
        example, reply = EXAMPLES[cfg.ground_truth]
        messages += [
            {"role": "user", "content": build_prompt(example, cfg.max_context_chars, cfg.ground_truth)},
            {"role": "assistant", "content": reply},
        ]
    return messages + [{"role": "user", "content": build_prompt(req, cfg.max_context_chars, cfg.ground_truth)}]


class LLMCoach:
    """Scores actions through an OpenAI-compatible chat completions endpoint."""

    def __init__(self, cfg: CoachConfig, cache_path: Path | None = None):
        from openai import OpenAI

        self.cfg = cfg
        self.client = OpenAI(
            base_url=cfg.base_url,
            api_key=os.environ.get(cfg.api_key_env) or "not-needed",
            timeout=cfg.timeout_s,
            max_retries=cfg.max_retries,
        )
        self.cache = _Cache(cache_path) if (cfg.cache and cache_path) else None
        self.pool = ClientPool(max_concurrency=cfg.concurrency)

    def _ask(self, messages: list[Any]) -> str:  # chat messages, as openai types them
        resp = None
        try:
            resp = self.client.chat.completions.create(
                model=self.cfg.model,
                messages=messages,
                temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
            )
            return resp.choices[0].message.content or ""
        except ValueError as e:  # a JSON content type whose body does not parse
            raise MalformedReply(f"the reply is not JSON: {e}") from e
        except (AttributeError, IndexError, TypeError):  # plain text (a proxy's error page) or JSON of another shape
            raise MalformedReply(f"the reply is not a chat completion: {str(resp)[:300]!r}") from None

    def score(self, req: CoachRequest) -> CoachResult:
        import openai

        messages = coach_messages(self.cfg, req)
        key = hashlib.sha256(f"{self.cfg.model}\0{messages[-1]['content']}".encode()).hexdigest()
        if self.cache and (hit := self.cache.get(key)):
            return CoachResult(hit["score"], hit["rationale"], "ok", 0.0, cached=True)
        t0 = time.perf_counter()
        try:
            for _ in range(self.cfg.reask + 1):
                text = self._ask(messages)
                score = parse_score(text)
                if score is not None:
                    if self.cache:
                        self.cache.put(key, {"score": score, "rationale": text})
                    return CoachResult(score, text, "ok", time.perf_counter() - t0)
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "Now give only the score line, exactly in this form: PROCESS_SCORE: N"},
                ]
            kind, why = "no_valid_score", f"no PROCESS_SCORE in 0..10 in {self.cfg.reask + 1} answer(s); last: {text}"
        except (openai.OpenAIError, MalformedReply) as e:
            kind, why = error_kind(e), f"{type(e).__name__}: {e}"
        return CoachResult(None, why, ERROR_KINDS[kind], time.perf_counter() - t0, error_kind=kind)

    def score_many(self, reqs: list[CoachRequest]) -> list[CoachResult]:
        """Every request scored through the client pool, at most `concurrency` at a time, in order."""
        return self.pool.map(self.score, reqs)
