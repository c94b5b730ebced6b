"""What every table of a run and each of its columns means: the text of the generated schema page
(docs/reference/schemas.md, flows/reference.py). A table or column without a description here stops the
generator, so a new column is documented where it is added."""

TABLES = {
    "episodes": "One row per episode: the problem, how the team did, and the policy versions that played it. "
    "Written by `collect_rollouts` after the partition's `actions`, so an `episodes` file marks the "
    "pair complete.",
    "actions": "One row per action (a generation of one agent in one turn), with its tokens and log-probs and the "
    "tool call it made. Written by `collect_rollouts`.",
    "coach": "The coach's score of every action. Written by `coach_evaluate`.",
    "advantages": "Per-token advantages, loss mask and duplication count of every action. Written by "
    "`compute_advantages`.",
    "updates": "One row per gradient update of one weights unit (an agent's own weights, or a shared model), "
    "and per Stage-0 alignment (phase `align`, strategy `stage0`). Written by `update` and "
    "`stage0_align`.",
    "align": "One row per Stage-0 alignment (`teamrl align`), phase `align` at the iteration whose rollouts "
    "gave the probe set. Written by the `align` flow.",
}

KEY_TEXT = {
    "run_id": "the run's id (its folder name)",
    "iteration": "partition key, stored in the path (`iteration=K`): the training iteration (1, 2, ...); for an "
    "evaluation phase, the policy evaluated (the one after K updates; 0: untrained)",
    "phase": "partition key, stored in the path (`phase=P`): `rollout`, `resample-<i>` (TeamTR), `eval`, "
    "`eval-swap-<agent>`, `eval-aligned-<agent>` (Stage-0), `align`",
    "episode_id": "`<phase>-<question, 4 digits>-<sample, 2 digits>` (`s` before the sample for pass@k samples); "
    "ids repeat across iterations",
    "turn": "the action's position in its episode (0, 1, ...)",
    "agent": "the role that acted (MARS: `system2`, `system1`)",
}

COLUMNS: dict[str, dict[str, str]] = {
    "episodes": {
        "task_id": "the problem's id in its pipeline (DSBench: `<dataset>-<split seed>`)",
        "group_id": "`<phase>-<question>`: the episodes of one question (the group of GRPO and RLOO; the certificate "
        "clusters its standard error by it)",
        "pipeline": "the pipeline's name",
        "success": "the episode solved its problem",
        "outcome": "the pipeline's score of the episode in [0, 1]: MathChat 1 or 0, deep research F1 or exact match "
        "(`pipeline.reward`), DSBench the gain over the trivial predictor",
        "metrics": "per-episode metrics: `greedy`, `infra_error` and the pipeline's own (e.g. MathChat "
        "`code_error`, `code_correct`; deep research `em`, `f1`, `tool_calls`, `s1_*`)",
        "final_answer": "the team's final answer",
        "num_turns": "the episode's number of actions",
        "policy_versions": "role -> the policy version it played at",
        "question": "the problem as the team was given it",
        "answer": "the expected answer",
        "infra_error": "null unless an infrastructure fault hit the episode: `<kind>: <message>` (the episode is "
        "not scored)",
    },
    "actions": {
        "role": "the role (the agent's name)",
        "system": "0: a single-system agent; MARS: 2 (System 2) or 1 (System 1)",
        "policy_version": "the version of the weights that played the role",
        "prompt_text": "the prompt as decoded text (special tokens kept)",
        "response_text": "the response text",
        "prompt_ids": "the prompt's token ids",
        "response_ids": "the response's token ids",
        "logprobs": "each response token's log-prob under the sampling distribution, log softmax(logits / T)",
        "ref_logprobs": "the same under the frozen reference model; null where no reference pass ran (evaluation, "
        "`algorithm.kl_coef: 0`)",
        "tool_name": "the tool the action called: `python`, `search`, `answer` (deep research's System 2), `extract` "
        "(System 1), or null",
        "tool_input": "the tool's input (a program, search keywords); System 1: the purpose",
        "tool_output": "the tool's raw output; System 1: the packed bin it read",
        "parent_turn": "System 1: the turn of the System-2 tool call it extracts from; else null",
        "infra_error": "null unless the tool never ran because of an infrastructure fault: `<kind>: <message>`",
    },
    "coach": {
        "score": "0..10; null when missing or not scored",
        "rationale": "the coach's reason, or why the score is missing",
        "coach_model": "`coach.model` for the `llm` backend, else the backend's name (`rubric`, `outcome`)",
        "latency_s": "seconds the score took",
        "status": "`ok`, `malformed`, `timeout`, `error` or `skipped` (not asked: the action is not at fault and "
        "has nothing to be judged on)",
        "error_kind": "why a score is missing, finer: `timeout`, `rate_limited`, `server_error`, "
        "`connection_error`, `not_a_completion`, `no_valid_score`, `other`, `infra_sandbox`, "
        "`infra_tool`, `infra_scorer`",
    },
    "advantages": {
        "reward": "the action's scalar score s(a) (REINFORCE++, GRPO, RLOO) or its trajectory's reward "
        "(`grpo_trajectory`); null without a score",
        "advantages": "per-token advantages the loss uses (zeros where the action has no score)",
        "raw_advantages": "the same before any division by a standard deviation, in the reward's units; null "
        "without a score",
        "loss_mask": "1 on tokens the loss covers, 0 elsewhere",
        "weight": "how many times the action enters its update batch: 1, 0 (no score, or dropped by balanced "
        "sampling) or the duplication count of MARS's balanced sampling",
        "held_out": "the action's question group was held out of the update to estimate its certificate "
        "(`algorithm.certify_holdout`, `stale` and `teamtr` only): reward kept, weight 0; null in files "
        "written before the column",
    },
    "updates": {
        "agent": "the weights unit updated: an agent, or the model several roles share (MARS `shared`)",
        "strategy": "`joint`, `stale`, `teamtr`, or `stage0` for an alignment",
        "kl": "the token KL of the update after the step (k3 estimate): with a trust region, on the trained batch "
        "(what `kl_delta` bounds); without, on every action of the unit; Stage-0: the reverse KL after",
        "surrogate_gain": "mean over episodes of the sum over the unit's tokens of (rho - 1) A, A the advantage of the "
        "team's task return (every agent's rewards, without KL shaping), in reward units: for `stale` and "
        "`teamtr` over the held-out groups, for `joint` over the whole batch",
        "penalty": "the certificate's penalty: occupancy shift plus sampling error (`stale`, `teamtr` only)",
        "certificate": "surrogate_gain - penalty: a 95% lower bound on the update's true improvement of the task "
        "return (rewards without KL shaping), estimated on question groups held out of the update (`stale`, "
        "`teamtr` only; null where fewer than two groups were held out)",
        "loss": "the update's loss (Stage-0: the reverse KL after)",
        "tokens": "response tokens trained on",
        "seconds": "wall time of the update",
        "version_before": "the version the update started from",
        "version_after": "the version it wrote (= version_before when skipped)",
        "skipped": "no new version: no scored actions, a non-finite loss or gradient, or a trust region that "
        "could not be met",
        "reason": "why it was skipped, the step fraction kept by backtracking (`step x0.5`), or the Stage-0 summary",
        "over_length": "samples left out of the update for being longer than `algorithm.max_sample_tokens` "
        "(null for a Stage-0 alignment and in files written before the column)",
        "grad_norm": "the gradient norm before clipping, mean over the update's optimizer steps (null where the "
        "trainer reports none, for a Stage-0 alignment and in files written before the column)",
        "clip_frac": "the share of trained tokens whose ratio left [1 - clip_eps, 1 + clip_eps], mean over the steps",
        "kl_ref": "with `algorithm.kl_loss_coef` > 0: the loss's KL term to the reference (k3 token mean), mean "
        "over the steps; else null",
    },
    "align": {
        "init": "the new agent: `fresh` (a fresh LoRA adapter or a fresh copy of the base)",
        "version_before": "the replaced agent's version (the alignment's target)",
        "version_after": "the aligned agent's version",
        "probe_actions": "contexts in the probe set",
        "probe_tokens": "response tokens in the probe set",
        "delta0": "the reverse-KL target",
        "lr": "the AdamW learning rate used",
        "kl_before": "probe-set reverse KL D_KL(new || old) of the fresh agent",
        "kl_after": "the same after the alignment",
        "steps": "AdamW steps taken",
        "converged": "kl_after <= delta0",
        "seconds": "wall time of the alignment",
        "success_before": "held-out success of the team before the swap",
        "success_swap": "held-out success right after the swap (no alignment)",
        "success_aligned": "held-out success after the alignment",
    },
}
