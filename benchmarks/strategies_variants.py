"""What the ablations compare and where their figures go: each variant of benchmarks/strategies.py is the
preset plus its overrides, and `TEAMTR_TABLE` the variants of the TeamTR section (the coaches have their own).
The runner (strategies.py) and the report (strategies_report.py) both read these; held here, the report
need not import the runner, which is run as a script.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "strategies"

# issue 21's coaches, each otherwise as joint (the rubric coach with the answer): the answer-blind rubric, the
# episode's outcome as every action's score, and an LLM judge with the answer (SmolLM2-135M-Instruct, which the
# runner serves with `transformers serve` on LLM_COACH_PORT while the run trains)
LLM_COACH_PORT = 8000
COACHES = {
    "blind": ["coach.ground_truth=false"],
    "outcome": ["coach.backend=outcome"],
    "llm": ["coach.backend=llm", f"coach.base_url=http://127.0.0.1:{LLM_COACH_PORT}/v1", "coach.model={smollm2}"],
}
# variant -> overrides; stale and teamtr share the trust region, so they differ only in resampling
VARIANTS = {
    "joint": [],
    "teamtr": ["algorithm.strategy=teamtr", "algorithm.kl_delta={delta}"],
    "stale": ["algorithm.strategy=stale", "algorithm.kl_delta={delta}"],
    "teamtr-d0.01": ["algorithm.strategy=teamtr", "algorithm.kl_delta=0.01"],  # a tighter trust region
    "teamtr-no-tr": ["algorithm.strategy=teamtr", "algorithm.kl_delta=null"],
    # one question per resample: the smallest TeamTR overhead this batch allows
    "teamtr-rq1": ["algorithm.strategy=teamtr", "algorithm.kl_delta={delta}", "algorithm.resample_questions=1"],
    # joint given teamtr-rq1's extra episodes (2 resamples x 1 question) as a larger batch
    "joint-q10": ["rollout.questions=10"],
    **COACHES,
}
TEAMTR_TABLE = [v for v in VARIANTS if v not in COACHES]  # the coaches have their own section
# the paper's ablations as paired differences, beside each variant against joint: what resampling adds
# (teamtr − stale), what the trust region adds (teamtr − teamtr-no-tr), what a tighter one changes
# (teamtr-d0.01 − teamtr), and TeamTR against joint at equal training episodes (teamtr-rq1 − joint-q10)
ABLATION_PAIRS = [
    ("teamtr", "stale"),
    ("teamtr", "teamtr-no-tr"),
    ("teamtr-d0.01", "teamtr"),
    ("teamtr-rq1", "joint-q10"),
]
# (variant, seed) runs whose certificates came from each agent's own advantage with a span of 1, before the
# team's advantage (tasks/certificate.py team_advantages): their success figures count, but their
# certificates are left out of the certificate figures rather than pooled with the team-advantage ones
OWN_ADVANTAGE_CERTIFICATES = {("teamtr", 0)}
