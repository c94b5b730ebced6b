"""Deep research (MARS): System 2 reasons and calls tools, each call with a purpose; System 1 reads the
bin-packed tool output and extracts what serves the purpose; System 2 answers a question about a
fictional corpus exactly (pipelines/deepresearch/corpus.py, BM25 search in search.py).

Turn protocol, per episode, all active episodes batched per turn:
  System 2 -> `SEARCH: <keywords> PURPOSE: <why>` | `PYTHON: <code> PURPOSE: <why>` | `ANSWER: <answer>`
  tool -> raw documents -> (System 1 on) the `extract` stage packs and extracts -> System 2's next turn
System 2's contexts are token sequences extended turn by turn (infra.generation.continue_chat), so its
turns form one trajectory with the observations in between (masked out of its loss).

The settings are in config.py, the prompts, worked examples and reply parser in prompts.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property, lru_cache

from pydantic import BaseModel

from infra.generation import continue_chat, encode_chat
from infra.retry import InfraFault, infra_record, with_retries
from infra.sandbox import preflight, run_python, sandbox_fault
from infra.sandbox_types import INFRA_PREFIX
from pipelines.base import (
    Act,
    AgentSpec,
    Episode,
    Problem,
    ToolCall,
    action_row,
    no_blind_rubric,
    own_problem,
    own_weights,
)
from pipelines.deepresearch import corpus
from pipelines.deepresearch.config import DeepResearchConfig
from pipelines.deepresearch.prompts import (
    FINAL_NOTE,
    S1_EXAMPLES,
    S2_EXAMPLES,
    S2_TWO_SEARCH_EXAMPLE,
    SYSTEM1,
    SYSTEM2,
    assistant_message,
    findings_text,
    parse_turn,
    s1_request,
    user_message,
)
from pipelines.deepresearch.scoring import exact_match, f1, rubric_scores
from pipelines.deepresearch.search import SearchIndex
from pipelines.dual_system import DualSystem

SHARED = "shared"  # the weights both systems share (shared_model): its checkpoints, updates rows, registered model


@lru_cache(maxsize=4)
def _docs_index(path: str) -> SearchIndex:
    """The search index over a user's documents file, built once per process."""
    return SearchIndex(corpus.load_docs(path))


class DeepResearch(DualSystem):
    name = "deepresearch"
    Config: type[BaseModel] = DeepResearchConfig

    def stop(self, agent: str) -> tuple[str, ...]:
        return tuple(self.cfg.stop)

    @staticmethod
    def group_of(problem: Problem) -> str:
        """The kind of the question's answer (corpus.answer_kind: `year` or `name`): the untrained team and
        training treat the two very differently, so held-out success is also reported per kind."""
        return corpus.answer_kind(str(problem.answer))

    def __init__(self, cfg: DeepResearchConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.agents = [
            AgentSpec("system2", "System 2: reasons, calls search / python stating a purpose, answers", system=2)
        ]
        if cfg.system1:
            self.agents.append(
                AgentSpec(
                    "system1",
                    "System 1: extracts from the packed tool output the facts that serve System 2's purpose",
                    system=1,
                )
            )
        self.weights = {a.name: SHARED for a in self.agents} if cfg.shared_model else own_weights(self.agents)
        preflight(cfg.sandbox)

    @cached_property
    def _data(self) -> tuple[list[corpus.Document], list[corpus.ResearchProblem], list[corpus.ResearchProblem]]:
        c = self.cfg
        if c.docs_file:
            if c.questions_file is None:  # DeepResearchConfig refuses this; a config built unvalidated does not
                raise ValueError("docs_file and questions_file go together: give both or neither")
            docs, probs = corpus.load_jsonl(c.docs_file, c.questions_file)
        else:
            docs, probs = corpus.generate(
                self.seed, c.questions, c.distractors, c.min_tokens, c.max_tokens, hops=tuple(c.hops)
            )
        if len(probs) <= c.eval_size:
            raise ValueError(f"{len(probs)} questions, need more than eval_size={c.eval_size}")
        train, held_out = corpus.split(probs, c.eval_size)
        train = [p for p in train if corpus.answer_kind(p.answer) in c.train_answers]
        if not train:
            raise ValueError(f"no training question asks for a {' or '.join(c.train_answers)} (pipeline.train_answers)")
        return docs, train, held_out

    @cached_property
    def index(self) -> SearchIndex:
        return SearchIndex(self._data[0])

    @cached_property
    def _support_titles(self) -> dict[str, list[str]]:
        titles = {d.doc_id: d.title for d in self._data[0]}
        return {p.task_id: [titles[s] for s in p.support] for p in self._data[1] + self._data[2]}

    def max_actions(self) -> int:
        """Per System-2 turn: its own action and one System-1 extraction per bin, at most one bin per
        document found (a document longer than a bin is cut to it)."""
        return self.cfg.max_turns * (1 + self.cfg.top_k)

    def problems(self, split: str) -> list[corpus.ResearchProblem]:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}: train | eval")
        return self._data[1] if split == "train" else self._data[2]

    def load_problems(self, path: str, docs: str | None = None) -> list[corpus.ResearchProblem]:
        """A user's questions {"question", "answer"} (pipelines/deepresearch/corpus.py `load_questions`), over
        the documents file `docs` ({"id", "title"?, "text"} a line) or else the run's corpus."""
        return corpus.load_questions(path, docs)

    def _search_index(self, problem: Problem) -> SearchIndex:
        """The corpus a question is asked over: the run's, or the user's documents file it names."""
        docs = own_problem(problem, corpus.ResearchProblem).docs
        return _docs_index(docs) if docs else self.index

    def system1_chat(self, purpose: str, text: str) -> list[dict]:
        shots = S1_EXAMPLES if self.cfg.examples else []
        turns = [
            m for p, doc, sentence in shots for m in (user_message(s1_request(p, doc)), assistant_message(sentence))
        ]
        return [{"role": "system", "content": SYSTEM1}, *turns, user_message(s1_request(purpose, text))]

    def system2_chat(self, question: str) -> list[dict]:
        """System 2's opening prompt: the instructions, the worked episodes (`examples`), the question."""
        shots = [*S2_EXAMPLES, *([S2_TWO_SEARCH_EXAMPLE] if self.cfg.two_search_example else [])]
        turns = []
        for q, searches, answer in shots if self.cfg.examples else []:
            turns.append(user_message(f"Question: {q}"))
            for k, (query, purpose, findings) in enumerate(searches, 1):
                note = FINAL_NOTE if k == len(searches) else ""
                turns += [
                    assistant_message(f"SEARCH: {query} PURPOSE: {purpose}"),
                    user_message(findings_text(purpose, "\n".join(f"- {f}" for f in findings)) + note),
                ]
            turns.append(assistant_message(f"ANSWER: {answer}"))
        return [{"role": "system", "content": SYSTEM2}, *turns, user_message(f"Question: {question}")]

    def _tool(self, kind: str, arg: str, purpose: str, index: SearchIndex | None = None) -> ToolCall:
        """Run one tool call; a search goes to `index` (default: the run's corpus)."""
        index = index or self.index
        if kind == "python":
            r = run_python(arg, self.cfg.sandbox)
            return ToolCall(purpose, [r.feedback()], sandbox_fault(r))
        try:
            hits = with_retries(lambda: index.search(arg, self.cfg.top_k), "tool", "search")
        except InfraFault as fault:
            return ToolCall(
                purpose, [f"{INFRA_PREFIX} the search backend failed"], infra_record(fault.kind, fault.message)
            )
        return ToolCall(purpose, [f"# {d.title}\n{d.text}" for d in hits] or ["(no results)"])

    def run_episodes(
        self, problems: Sequence[Problem], episode_ids: list[str], group_ids: list[str], act: Act
    ) -> list[Episode]:
        tok, c = act.tokenizer, self.cfg
        eps = [Episode(problem=p, episode_id=e, group_id=g) for p, e, g in zip(problems, episode_ids, group_ids)]
        ctx = [encode_chat(tok, self.system2_chat(e.problem.question)) + self._lead(tok, 0) for e in eps]
        for e in eps:
            e.metrics |= dict.fromkeys(
                ["tool_calls", "purpose_given", "s1_tokens_in", "s1_tokens_out", "s1_bins", "s1_bins_lower_bound"], 0.0
            )
        active = list(range(len(eps)))
        for t in range(c.max_turns):
            last = t == c.max_turns - 1
            gens = act("system2", [ctx[i] for i in active])
            lead = tok.decode(self._lead(tok, t))
            turns = {i: (g, *parse_turn(lead + g.text)) for i, g in zip(active, gens)}
            calls = {
                i: self._tool(kind, arg, purpose or arg, self._search_index(eps[i].problem))
                for i, (g, kind, arg, purpose) in turns.items()
                if kind in ("search", "python") and arg and not last
            }
            extractions = dict(zip(calls, self.extract(act, list(calls.values())))) if c.system1 and calls else {}
            still = []
            for i, (g, kind, arg, purpose) in turns.items():
                e = eps[i]
                s2_turn = len(e.actions)
                call = calls.get(i)
                e.actions.append(
                    action_row(
                        s2_turn,
                        "system2",
                        g,
                        system=2,
                        prompt_ids=ctx[i],
                        tool_name=kind if kind != "none" else None,
                        tool_input=arg,
                        tool_output="\n\n".join(call.documents) if call else None,
                        infra_error=call.infra_error if call else None,
                    )
                )
                if kind == "answer":
                    e.final_answer = arg
                    continue
                if call is None:
                    note = "Reply with one line: SEARCH: <keywords> PURPOSE: <why>, or ANSWER: <answer>."
                else:
                    e.metrics["tool_calls"] += 1
                    e.metrics["purpose_given"] += float(bool(purpose))
                    note = findings_text(call.purpose, self._observe(tok, e, s2_turn, call, extractions.get(i)))
                if last:
                    continue
                if t + 1 == c.max_turns - 1:
                    note += FINAL_NOTE
                ctx[i] = ctx[i] + g.response_ids + continue_chat(tok, g.response_ids, note) + self._lead(tok, t + 1)
                still.append(i)
            active = still
            if not active:
                break
        for e, x in zip(eps, ctx):
            gold = e.problem.answer
            e.metrics |= {
                "em": exact_match(e.final_answer, gold),
                "f1": f1(e.final_answer, gold),
                "answered": float(bool(e.final_answer)),
                "s2_context_tokens": float(len(x)),
            }
            e.success = bool(e.metrics["em"])
            e.outcome = e.metrics[c.reward]
        return eps

    def _lead(self, tok, turn: int) -> list[int]:
        """The tokens written for System 2 at the start of turn `turn` (prompt, not trained): with the
        scaffold, `ANSWER:` on the last turn, else `SEARCH:` on the first."""
        if not self.cfg.scaffold:
            return []
        text = "ANSWER:" if turn == self.cfg.max_turns - 1 else "SEARCH:" if turn == 0 else ""
        return tok(text, add_special_tokens=False)["input_ids"] if text else []

    def _observe(self, tok, e: Episode, s2_turn: int, call: ToolCall, ex) -> str:
        """System 2's view of a tool call: System 1's extractions (rows added to the episode), or the raw
        output truncated to `context_tokens` in the ablation."""
        if ex is None:
            text = "\n\n".join(call.documents)
        else:
            for text, g in zip(ex.bins, ex.generations):
                e.actions.append(
                    action_row(
                        len(e.actions),
                        "system1",
                        g,
                        system=1,
                        tool_name="extract",
                        tool_input=call.purpose,
                        tool_output=text,
                        parent_turn=s2_turn,
                    )
                )
            e.metrics["s1_tokens_in"] += ex.tokens_in
            e.metrics["s1_tokens_out"] += sum(len(g.response_ids) for g in ex.generations)
            e.metrics["s1_bins"] += len(ex.bins)
            e.metrics["s1_bins_lower_bound"] += ex.lower_bound
            text = "\n".join(f"- {g.text.strip()}" for g in ex.generations)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return tok.decode(ids[: self.cfg.context_tokens])

    def rubric(self, episode: Episode, ground_truth: bool) -> list[tuple[float, str]]:
        if not ground_truth:  # it scores against the gold answer and support documents
            raise ValueError(no_blind_rubric(self.name))
        return rubric_scores(episode, self._support_titles.get(episode.problem.task_id, []))

    def feedback(self, episode: Episode, ground_truth: bool) -> list[str]:
        """Environment feedback per action, as the LLM coach sees it; with `ground_truth` the gold answer
        and the documents needed (the gold support titles), without them only what the episode shows."""
        gold, titles = episode.problem.answer, ", ".join(self._support_titles.get(episode.problem.task_id, []))
        truth = f" Correct answer: {gold}." if ground_truth else ""
        needed = f" Documents needed: {titles}.{truth}" if ground_truth else ""
        out = []
        for a in episode.actions:
            if a["agent"] == "system1":
                out.append(needed.strip() if ground_truth else f"Extraction purpose: {a['tool_input']}.")
            elif a["tool_name"] == "answer":
                out.append(f"Stated answer: {episode.final_answer or '(none)'}.{truth}")
            else:
                got = re.findall(r"^# (.+)$", a["tool_output"] or "", re.M)
                out.append(f"Retrieved: {', '.join(got) or '(nothing)'}.{needed}")
        return out
