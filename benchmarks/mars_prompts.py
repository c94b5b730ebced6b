"""Where the untrained MARS team loses its name questions, replayed without training (issue 22): the
System-1 and System-2 prompts of a run's first held-out evaluation (iteration 0, the untrained team), each
generated again greedily by the untrained SmolLM2-135M-Instruct as logged and with one edit.

    .venv/bin/python benchmarks/mars_prompts.py --run /work/mars-runs/mars-shared-s1 --write

System 1 (its first extraction of each episode) scores whether the gold answer is in what it copied; System
2 (its last turn, given the findings System 1 gave it in the run) scores exact match. Edits:
- System 2: `kind-hint`, the final note names the kind of answer the question asks for (from its wording:
  who, which city, what year, ...); `question-again`, the final note repeats the question;
  `examples-swapped`, the two worked episodes in the other order (the name example last); `name-example`, a
  third worked episode last, a company question whose findings hold a birth year before the company, answered
  with the company (untrained, System 2 answers most name questions with a year from its findings).
- System 1: `purpose-pair`, two worked extractions from one document for two purposes (its founder, then
  its founding year), so the sentence copied depends on the purpose; `purpose-pair-swapped`, the year first.
Writes `benchmarks/mars/prompts-<run>.csv` (one row per edit and answer kind) and, with --write, the section
of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_section  # noqa: E402
from benchmarks.mars import OUT, README  # noqa: E402
from pipelines.deepresearch import corpus  # noqa: E402
from pipelines.deepresearch import prompts as p  # noqa: E402
from pipelines.deepresearch.scoring import contains  # noqa: E402

SECTION = "## MARS prompts replayed (`benchmarks/mars_prompts.py`)"
FINAL_NOTE = p.FINAL_NOTE.strip()
# the preset's worked extraction (a company's founder) and, from the same document, its founding year
(S1_PURPOSE, S1_DOC, S1_SENTENCE) = p.S1_EXAMPLES[0]
S1_FOUNDER = (S1_PURPOSE, S1_SENTENCE)
S1_YEAR = ("the year Quimby Works was founded", "Quimby Works was founded in 1712.")
KINDS = [  # (question wording, the kind of answer it asks for)
    (r"^in what year", "year"),
    (r"^who", "person's name"),
    (r"\bcity\b", "city"),
    (r"\bcompany\b", "company"),
    (r"\bmountain\b", "mountain"),
]


def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def answer_kind(question: str) -> str:
    return next((k for pattern, k in KINDS if re.search(pattern, question, re.I)), "answer")


def _final_note(prompt: str, note: str) -> str:
    # the episode's own final note is the prompt's last; the worked episodes keep theirs
    head, tail = prompt.rsplit(FINAL_NOTE, 1)
    return head + note + tail


def kind_hint(prompt: str, question: str) -> str:
    return _final_note(prompt, f"Final turn: reply with ANSWER: <the {answer_kind(question)}>.")


def question_again(prompt: str, question: str) -> str:
    return _final_note(prompt, f"Final turn: answer {question!r} with ANSWER: <answer>.")


def examples_swapped(prompt: str, question: str) -> str:
    # the worked episodes each open with a user turn "Question: ...", as does the episode itself
    sep = "<|im_start|>user\nQuestion:"
    head, *episodes = prompt.split(sep)
    if len(episodes) != 3:
        raise ValueError(f"expected two worked episodes before the question, got {len(episodes) - 1}")
    return sep.join([head, episodes[1], episodes[0], episodes[2]])


# a company question answered with the company, though its findings give a year first (the example's names
# and year cannot occur in the corpus, as in prompts.S2_EXAMPLES)
NAME_EPISODE = (
    "Which company does Ada Quill work for?",
    "Ada Quill",
    "the company Ada Quill works for",
    ["Ada Quill was born in 1544.", "Ada Quill works for Hexley Press."],
    "Hexley Press",
)


def name_example(prompt: str, question: str) -> str:
    q, query, purpose, findings, answer = NAME_EPISODE
    episode = turn("user", f"Question: {q}") + turn("assistant", f"SEARCH: {query} PURPOSE: {purpose}")
    episode += turn("user", p.findings_text(purpose, "\n".join(f"- {f}" for f in findings)) + p.FINAL_NOTE)
    episode += turn("assistant", f"ANSWER: {answer}")
    head, own = prompt.rsplit("<|im_start|>user\nQuestion:", 1)
    return head + episode + "<|im_start|>user\nQuestion:" + own


def _s1_examples(pairs: list[tuple[str, str]]) -> Callable[[str, str], str]:
    def edit(prompt: str, question: str) -> str:
        system = prompt.split("<|im_end|>\n", 1)[0] + "<|im_end|>\n"
        request = prompt[prompt.rindex("<|im_start|>user\nPurpose:") :]
        shots = "".join(turn("user", p.s1_request(q, S1_DOC)) + turn("assistant", s) for q, s in pairs)
        return system + shots + request

    return edit


def logged(prompt: str, question: str) -> str:
    return prompt


EDITS: dict[int, dict[str, Callable[[str, str], str]]] = {
    2: {
        "logged": logged,
        "kind-hint": kind_hint,
        "question-again": question_again,
        "examples-swapped": examples_swapped,
        "name-example": name_example,
    },
    1: {
        "logged": logged,
        "purpose-pair": _s1_examples([S1_FOUNDER, S1_YEAR]),
        "purpose-pair-swapped": _s1_examples([S1_YEAR, S1_FOUNDER]),
    },
}


def prompts(run_dir: Path) -> pd.DataFrame:
    """Per held-out episode of iteration 0: question, gold answer, its kind, System 1's first prompt (None
    without System 1) and System 2's last."""
    from infra import store

    eps = store.read_table(run_dir, "episodes", iteration=0, phase="eval").set_index("episode_id")
    acts = store.read_table(run_dir, "actions", iteration=0, phase="eval").sort_values("turn")
    s2 = acts[acts["system"] == 2].groupby("episode_id")["prompt_text"].last()
    s1 = acts[acts["system"] == 1].groupby("episode_id")["prompt_text"].first()
    out = pd.DataFrame({"question": eps["question"], "answer": eps["answer"].astype(str)})
    out["kind"] = [corpus.answer_kind(a) for a in out["answer"]]
    return out.join(s2.rename("s2_prompt")).join(s1.rename("s1_prompt"))


def replay(table: pd.DataFrame, generate: Callable[[str], str]) -> pd.DataFrame:
    """One row per (system, edit, kind): the share of episodes whose reply holds (System 1) or is (System 2)
    the gold answer, greedy; for System 2 also the share of replies that are a year, and the exact match
    over the episodes whose findings (the prompt after the episode's question) hold the answer."""
    from pipelines.deepresearch.scoring import exact_match

    rows = []
    for system, edits in EDITS.items():
        col = f"s{system}_prompt"
        for name, edit in edits.items():
            for e in table.dropna(subset=[col]).itertuples():
                prompt = getattr(e, col)
                reply = generate(edit(prompt, e.question))
                ok = exact_match(reply, e.answer) if system == 2 else contains(reply, e.answer)
                row = {"system": system, "edit": name, "kind": e.kind, "right": float(ok)}
                if system == 2:
                    read = prompt.rsplit(f"Question: {e.question}", 1)[-1]
                    row |= {"year_reply": float(corpus.answer_kind(reply) == "year"), "found": contains(read, e.answer)}
                rows.append(row)
    df = pd.DataFrame(rows)
    by = df.groupby(["system", "edit", "kind"], sort=False)
    out = by["right"].agg(["mean", "size"])
    if "found" in df:
        out["year_reply"] = by["year_reply"].mean()
        out["em_when_found"] = df[df["found"] == True].groupby(["system", "edit", "kind"], sort=False)["right"].mean()  # noqa: E712
        out["found"] = by["found"].sum()
    return out.reset_index()


def greedy(max_new_tokens: int = 48) -> Callable[[str], str]:
    """The untrained SmolLM2-135M-Instruct, greedy, the reply's first line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infra.models import smollm2_dir

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir()).eval()

    def generate(prompt: str) -> str:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0].strip()

    return generate


def report(results: dict[str, pd.DataFrame]) -> str:
    lines = [
        SECTION,
        "",
        "Command: `.venv/bin/python benchmarks/mars_prompts.py --run RUN_DIR --write` (the run's iteration-0 "
        "held-out prompts, the untrained model, greedy; edits in the script's docstring). System 1: the share "
        "of its first extractions that hold the gold answer; System 2: exact match of its last reply, given the "
        "findings it had in the run; on name questions also the share of its replies that are a year, and its "
        "exact match where those findings hold the answer.",
        "",
        "| run | system | edit | name questions | year questions | name: year replies | name: EM when found |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, r in results.items():
        for (system, edit), g in r.groupby(["system", "edit"], sort=False):
            by = g.set_index("kind")
            cells = [
                f"{by.loc[k, 'mean']:.2f} (of {by.loc[k, 'size']})" if k in by.index else "-" for k in ("name", "year")
            ]
            name = by.loc["name"] if "name" in by.index else None
            has = name is not None and "year_reply" in by and not pd.isna(name["year_reply"])
            cells.append(f"{name['year_reply']:.2f}" if has else "-")
            found = has and name["found"] > 0
            cells.append(f"{name['em_when_found']:.2f} (of {int(name['found'])})" if found else "-")
            lines.append(f"| {run} | {system} | {edit} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="a deepresearch run folder with an iteration-0 evaluation")
    ap.add_argument("--write", action="store_true", help="replace the section in benchmarks/README.md")
    args = ap.parse_args()
    if args.run:
        replay(prompts(args.run), greedy()).to_csv(
            OUT / f"prompts-{args.run.name}.csv", index=False, float_format="%.6g"
        )
    results = {f.stem.removeprefix("prompts-"): pd.read_csv(f) for f in sorted(OUT.glob("prompts-*.csv"))}
    text = report(results)
    print(text)
    if args.write:
        write_section(README, SECTION, text)


if __name__ == "__main__":
    main()
