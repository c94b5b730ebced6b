"""Every table of a run, defined once: each column's name, Arrow type and meaning, and what the table holds.

The meanings ride on the schemas as pyarrow metadata (`description` on each field and on each schema):
infra/store.py writes and reads by these schemas, and flows/reference.py renders them as
docs/reference/schemas.md, which a column without a description stops, so a new column is documented
where it is added. They are the contract: columns may be added, none renamed.
"""

from __future__ import annotations

import pyarrow as pa

_DESCRIPTION = b"description"


def column(name: str, type: pa.DataType, description: str) -> pa.Field:
    return pa.field(name, type, metadata={_DESCRIPTION: description})


def table(description: str, columns: list[pa.Field]) -> pa.Schema:
    return pa.schema(columns, metadata={_DESCRIPTION: description})


def description(item: pa.Field | pa.Schema) -> str:
    """The description of a column or a table ("" when it has none)."""
    return (item.metadata or {}).get(_DESCRIPTION, b"").decode()


def bare(schema: pa.Schema) -> pa.Schema:
    """`schema` without its descriptions: what a Parquet file stores (the text belongs to the code, not
    repeated in every file)."""
    return pa.schema([f.remove_metadata() for f in schema])


RUN_ID = column("run_id", pa.string(), "the run's id (its folder name)")
ITERATION = column(
    "iteration",
    pa.int32(),
    "partition key, stored in the path (`iteration=K`): the training iteration (1, 2, ...); for an "
    "evaluation phase, the policy evaluated (the one after K updates; 0: untrained)",
)
PHASE = column(
    "phase",
    pa.string(),
    "partition key, stored in the path (`phase=P`): `rollout`, `resample-<i>` (TeamTR), `eval`, "
    "`eval-swap-<agent>`, `eval-aligned-<agent>` (Stage-0), `align`",
)
EPISODE_ID = column(
    "episode_id",
    pa.string(),
    "`<phase>-<question, 4 digits>-<sample, 2 digits>` (`s` before the sample for pass@k samples); "
    "ids repeat across iterations",
)
TURN = column("turn", pa.int32(), "the action's position in its episode (0, 1, ...)")
AGENT = column("agent", pa.string(), "the role that acted (MARS: `system2`, `system1`)")

# the keys every per-action table joins on
KEY_FIELDS = [RUN_ID, ITERATION, PHASE, EPISODE_ID, TURN, AGENT]
KEYS = [f.name for f in KEY_FIELDS]

SCHEMAS: dict[str, pa.Schema] = {
    "episodes": table(
        "One row per episode: the problem, how the team did, and the policy versions that played it. "
        "Written by `collect_rollouts` after the partition's `actions`, so an `episodes` file marks the "
        "pair complete.",
        [
            RUN_ID,
            ITERATION,
            PHASE,
            EPISODE_ID,
            column("task_id", pa.string(), "the problem's id in its pipeline (DSBench: `<dataset>-<split seed>`)"),
            column(
                "group_id",
                pa.string(),
                "`<phase>-<question>`: the episodes of one question (the group of GRPO and RLOO; the certificate "
                "clusters its standard error by it)",
            ),
            column("pipeline", pa.string(), "the pipeline's name"),
            column("success", pa.bool_(), "the episode solved its problem"),
            column(
                "outcome",
                pa.float64(),
                "the pipeline's score of the episode in [0, 1]: MathChat 1 or 0, deep research F1 or exact match "
                "(`pipeline.reward`), DSBench the gain over the trivial predictor",
            ),
            column(
                "metrics",
                pa.map_(pa.string(), pa.float64()),
                "per-episode metrics: `greedy`, `infra_error` and the pipeline's own (e.g. MathChat "
                "`code_error`, `code_correct`; deep research `em`, `f1`, `tool_calls`, `s1_*`)",
            ),
            column("final_answer", pa.string(), "the team's final answer"),
            column("num_turns", pa.int32(), "the episode's number of actions"),
            column("policy_versions", pa.map_(pa.string(), pa.int32()), "role -> the policy version it played at"),
            column("question", pa.string(), "the problem as the team was given it"),
            column("answer", pa.string(), "the expected answer"),
            column(
                "infra_error",
                pa.string(),
                "null unless an infrastructure fault hit the episode: `<kind>: <message>` (the episode is not scored)",
            ),
        ],
    ),
    "actions": table(
        "One row per action (a generation of one agent in one turn), with its tokens and log-probs and the "
        "tool call it made. Written by `collect_rollouts`.",
        KEY_FIELDS
        + [
            column("role", pa.string(), "the role (the agent's name)"),
            column("system", pa.int8(), "0: a single-system agent; MARS: 2 (System 2) or 1 (System 1)"),
            column("policy_version", pa.int32(), "the version of the weights that played the role"),
            column("prompt_text", pa.string(), "the prompt as decoded text (special tokens kept)"),
            column("response_text", pa.string(), "the response text"),
            column("prompt_ids", pa.list_(pa.int32()), "the prompt's token ids"),
            column("response_ids", pa.list_(pa.int32()), "the response's token ids"),
            column(
                "logprobs",
                pa.list_(pa.float32()),
                "each response token's log-prob under the sampling distribution, log softmax(logits / T)",
            ),
            column(
                "ref_logprobs",
                pa.list_(pa.float32()),
                "the same under the frozen reference model; null where no reference pass ran (evaluation, "
                "`algorithm.kl_coef: 0`)",
            ),
            column(
                "tool_name",
                pa.string(),
                "the tool the action called: `python`, `search`, `answer` (deep research's System 2), `extract` "
                "(System 1), or null",
            ),
            column("tool_input", pa.string(), "the tool's input (a program, search keywords); System 1: the purpose"),
            column("tool_output", pa.string(), "the tool's raw output; System 1: the packed bin it read"),
            column(
                "parent_turn", pa.int32(), "System 1: the turn of the System-2 tool call it extracts from; else null"
            ),
            column(
                "infra_error",
                pa.string(),
                "null unless the tool never ran because of an infrastructure fault: `<kind>: <message>`",
            ),
        ],
    ),
    "coach": table(
        "The coach's score of every action. Written by `coach_evaluate`.",
        KEY_FIELDS
        + [
            column("score", pa.float64(), "0..10; null when missing or not scored"),
            column("rationale", pa.string(), "the coach's reason, or why the score is missing"),
            column(
                "coach_model",
                pa.string(),
                "`coach.model` for the `llm` backend, else the backend's name (`rubric`, `outcome`)",
            ),
            column("latency_s", pa.float64(), "seconds the score took"),
            column(
                "status",
                pa.string(),
                "`ok`, `malformed`, `timeout`, `error` or `skipped` (not asked: the action is not at fault and "
                "has nothing to be judged on)",
            ),
            column(
                "error_kind",
                pa.string(),
                "why a score is missing, finer: `timeout`, `rate_limited`, `server_error`, "
                "`connection_error`, `not_a_completion`, `no_valid_score`, `other`, `infra_sandbox`, "
                "`infra_tool`, `infra_scorer`",
            ),
        ],
    ),
    "advantages": table(
        "Per-token advantages, loss mask and duplication count of every action. Written by `compute_advantages`.",
        KEY_FIELDS
        + [
            column(
                "reward",
                pa.float64(),
                "the action's scalar score s(a) (REINFORCE++, GRPO, RLOO) or its trajectory's reward "
                "(`grpo_trajectory`); null without a score",
            ),
            column(
                "advantages",
                pa.list_(pa.float32()),
                "per-token advantages the loss uses (zeros where the action has no score)",
            ),
            column(
                "raw_advantages",
                pa.list_(pa.float32()),
                "the same before any division by a standard deviation, in the reward's units; null without a score",
            ),
            column("loss_mask", pa.list_(pa.int8()), "1 on tokens the loss covers, 0 elsewhere"),
            column(
                "weight",
                pa.int32(),
                "how many times the action enters its update batch: 1, 0 (no score, or dropped by balanced "
                "sampling) or the duplication count of MARS's balanced sampling",
            ),
            column(
                "held_out",
                pa.bool_(),
                "the action's question group was held out of the update to estimate its certificate "
                "(`algorithm.certify_holdout`, `stale` and `teamtr` only): reward kept, weight 0; null in files "
                "written before the column",
            ),
        ],
    ),
    "updates": table(
        "One row per gradient update of one weights unit (an agent's own weights, or a shared model), "
        "and per Stage-0 alignment (phase `align`, strategy `stage0`). Written by `update` and "
        "`stage0_align`.",
        [
            RUN_ID,
            ITERATION,
            PHASE,
            column(
                "agent",
                pa.string(),
                "the weights unit updated: an agent, or the model several roles share (MARS `shared`)",
            ),
            column("strategy", pa.string(), "`joint`, `stale`, `teamtr`, or `stage0` for an alignment"),
            column(
                "kl",
                pa.float64(),
                "the token KL of the update after the step (k3 estimate): with a trust region, on the trained batch "
                "(what `kl_delta` bounds); without, on every action of the unit; Stage-0: the reverse KL after",
            ),
            column(
                "surrogate_gain",
                pa.float64(),
                "mean over episodes of the sum over the unit's tokens of (rho - 1) A, A the advantage of the "
                "team's task return (every agent's rewards, without KL shaping), in reward units: for `stale` and "
                "`teamtr` over the held-out groups, for `joint` over the whole batch",
            ),
            column(
                "penalty",
                pa.float64(),
                "the certificate's penalty: occupancy shift plus sampling error (`stale`, `teamtr` only)",
            ),
            column(
                "certificate",
                pa.float64(),
                "surrogate_gain - penalty: a 95% lower bound on the update's true improvement of the task "
                "return (rewards without KL shaping), estimated on question groups held out of the update (`stale`, "
                "`teamtr` only; null where fewer than two groups were held out)",
            ),
            column("loss", pa.float64(), "the update's loss (Stage-0: the reverse KL after)"),
            column("tokens", pa.int64(), "response tokens trained on"),
            column("seconds", pa.float64(), "wall time of the update"),
            column("version_before", pa.int32(), "the version the update started from"),
            column("version_after", pa.int32(), "the version it wrote (= version_before when skipped)"),
            column(
                "skipped",
                pa.bool_(),
                "no new version: no scored actions, a non-finite loss or gradient, or a trust region that "
                "could not be met",
            ),
            column(
                "reason",
                pa.string(),
                "why it was skipped, the step fraction kept by backtracking (`step x0.5`), or the Stage-0 summary",
            ),
            column(
                "over_length",
                pa.int32(),
                "samples left out of the update for being longer than `algorithm.max_sample_tokens` "
                "(null for a Stage-0 alignment and in files written before the column)",
            ),
            column(
                "grad_norm",
                pa.float64(),
                "the gradient norm before clipping, mean over the update's optimizer steps (null where the "
                "trainer reports none, for a Stage-0 alignment and in files written before the column)",
            ),
            column(
                "clip_frac",
                pa.float64(),
                "the share of trained tokens whose ratio left [1 - clip_eps, 1 + clip_eps], mean over the steps",
            ),
            column(
                "kl_ref",
                pa.float64(),
                "with `algorithm.kl_loss_coef` > 0: the loss's KL term to the reference (k3 token mean), mean "
                "over the steps; else null",
            ),
        ],
    ),
    "align": table(
        "One row per Stage-0 alignment (`teamrl align`), phase `align` at the iteration whose rollouts "
        "gave the probe set. Written by the `align` flow.",
        [
            RUN_ID,
            ITERATION,
            PHASE,
            AGENT,
            column("init", pa.string(), "the new agent: `fresh` (a fresh LoRA adapter or a fresh copy of the base)"),
            column("version_before", pa.int32(), "the replaced agent's version (the alignment's target)"),
            column("version_after", pa.int32(), "the aligned agent's version"),
            column("probe_actions", pa.int32(), "contexts in the probe set"),
            column("probe_tokens", pa.int64(), "response tokens in the probe set"),
            column("delta0", pa.float64(), "the reverse-KL target"),
            column("lr", pa.float64(), "the AdamW learning rate used"),
            column("kl_before", pa.float64(), "probe-set reverse KL D_KL(new || old) of the fresh agent"),
            column("kl_after", pa.float64(), "the same after the alignment"),
            column("steps", pa.int32(), "AdamW steps taken"),
            column("converged", pa.bool_(), "kl_after <= delta0"),
            column("seconds", pa.float64(), "wall time of the alignment"),
            column("success_before", pa.float64(), "held-out success of the team before the swap"),
            column("success_swap", pa.float64(), "held-out success right after the swap (no alignment)"),
            column("success_aligned", pa.float64(), "held-out success after the alignment"),
        ],
    ),
}
