"""The deterministic DSBench rubric: a score 0..10 per action from the hand-offs and the final metric,
with upstream blame: the first agent whose program failed or left its files missing gets 0; the agents
after it, whose inputs were never written, get no score at all (None: no gradient). A neutral score
would not be neutral: REINFORCE++ whitens an agent's scores over its batch, so when most of a batch's
inputs were missing, a "neutral" 5 next to a few delivered 10s becomes a negative advantage and trains
the agent away from what it did, for a failure that was not its own."""

from __future__ import annotations

from pipelines.base import Episode

# the files each agent must leave in the workspace for the next one
HANDOFFS = {
    "data_engineer": ["features_train.csv", "features_test.csv"],
    "modeler": ["predictions.csv"],
    "analyst": ["submission.csv"],
}


def rubric_scores(ep: Episode) -> list[tuple[float | None, str]]:
    """Hand-off made: 6 + 4 x outcome (the submission's normalised gain over the trivial predictor);
    the first failure: 0; everything after it: None (its input was missing; not scored)."""
    out: list[tuple[float | None, str]] = []
    broken = None
    for a in ep.actions:
        agent = a["agent"]
        done = ep.metrics.get("submission_ok" if agent == "analyst" else f"{agent}_ok", 0.0) == 1.0
        if broken:
            out.append((None, f"not scored: its input was missing: {broken} did not deliver"))
        elif done:
            out.append((6.0 + 4.0 * ep.outcome, f"delivered {', '.join(HANDOFFS[agent])}; outcome {ep.outcome:.2f}"))
        else:
            broken = agent
            out.append((0.0, f"did not deliver {', '.join(HANDOFFS[agent])}: {(a['tool_output'] or '')[:200]}"))
    return out
