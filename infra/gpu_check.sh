#!/usr/bin/env bash
# GPU smoke test of the GPU engines: trains two iterations of the `mathchat-gpu` preset with vLLM
# rollouts (one LoRA adapter per agent, reloaded after every update) and DeepSpeed ZeRO-3 updates,
# then prints rollout tokens/s, trainer tokens/s, seconds per stage and per update, the vLLM/trainer
# log-prob gap and the GPU's peak memory. Installs nothing; meant to finish in under 8 minutes on one
# H200 (a model already in the Hugging Face cache; the first download of Qwen3-4B adds ~8 GB).
#
#   bash infra/gpu_check.sh                                   # Qwen/Qwen3-4B-Instruct-2507
#   MODEL=/models/my-model bash infra/gpu_check.sh            # any Hugging Face id or local folder
#   PRESET=mathchat-smol bash infra/gpu_check.sh \
#       engines.generation=vllm engines.trainer=deepspeed engines.device=cuda model.dtype=bfloat16
#                                                             # SmolLM2-135M, no download; extra key=value overrides
# Environment: GPU_PYTHON (the interpreter; default: the first of .venv-gpu/bin/python,
# .venv/bin/python and python3 that imports vllm and deepspeed), PRESET, MODEL, LIMIT_S (default 450).
set -euo pipefail
cd "$(dirname "$0")/.."

PRESET=${PRESET:-mathchat-gpu}
LIMIT_S=${LIMIT_S:-450}
export TEAMRL_PROGRESS=0

# The gpu extra lives in an environment of its own (vLLM brings its own CUDA build of torch), so the
# CPU .venv of `make install` cannot run this: take the interpreter GPU_PYTHON names, else the
# first candidate that has the extra (.venv is one: the GPU guide installs the extra there on a GPU machine).
has_gpu_extra() { "$1" -c "import vllm, deepspeed" >/dev/null 2>&1; }
CANDIDATES=(.venv-gpu/bin/python .venv/bin/python python3)
PY=${GPU_PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in "${CANDIDATES[@]}"; do
        if command -v "$candidate" >/dev/null && has_gpu_extra "$candidate"; then
            PY=$candidate
            break
        fi
    done
fi
if [ -z "$PY" ] || ! has_gpu_extra "$PY"; then
    echo "gpu_check: no Python with vllm and deepspeed (tried ${PY:-${CANDIDATES[*]}})." >&2
    echo "  On a machine with an NVIDIA GPU, in a fresh virtual environment: pip install -e '.[gpu,ray]'," >&2
    echo "  then set GPU_PYTHON=<that environment>/bin/python (see docs/guides/gpus-and-ray.md);" >&2
    echo "  this script installs nothing." >&2
    exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA GPU (torch.cuda.is_available() is False)." >&2
    exit 2
fi
"$PY" -c "import sys, torch, vllm, deepspeed; print(f'gpu_check: {sys.executable}: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, vllm {vllm.__version__}, deepspeed {deepspeed.__version__}')"

WORK=$(mktemp -d -t teamrl-gpu-check-XXXX)
RUN_ID=gpu-check-$(date +%Y%m%d-%H%M%S)
SETS=(run.dir="$WORK/runs" run.id="$RUN_ID" iterations=2 evaluate=false
      rollout.questions=16 rollout.group_size=4)
[ -n "${MODEL:-}" ] && SETS+=(model.name="$MODEL")

MEMLOG="$WORK/gpu-memory.csv"
SAMPLER=
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$MEMLOG" 2>/dev/null &
    SAMPLER=$!
fi
stop_sampler() { [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true; }
trap stop_sampler EXIT

echo "gpu_check: teamrl train $PRESET ${SETS[*]} $* (at most ${LIMIT_S}s)"
T0=$(date +%s)
set +e
timeout "$LIMIT_S" "$PY" -m flows.cli train "$PRESET" "${SETS[@]}" "$@"
RC=$?
set -e
stop_sampler
echo "gpu_check: training took $(( $(date +%s) - T0 ))s, exit code $RC"
[ "$RC" = 124 ] && echo "gpu_check: stopped after ${LIMIT_S}s (LIMIT_S)" >&2
[ "$RC" = 0 ] || exit "$RC"

"$PY" - "$WORK/runs" "$RUN_ID" "$MEMLOG" <<'EOF'
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from infra import store
from infra.tracking import default_tracking_uri

root, run_id, memlog = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
run_dir = root / run_id
client = MlflowClient(tracking_uri=default_tracking_uri(root))
mlflow_run = (run_dir / "mlflow_run_id").read_text().strip()
keys = sorted(client.get_run(mlflow_run).data.metrics)
wanted = ["rollout_tokens_per_s", "episode/logprob_gap", "success_rate"] + [k for k in keys if k.startswith("seconds/")]
hist = {k: {m.step: m.value for m in client.get_metric_history(mlflow_run, k)} for k in wanted if k in keys}
engines = yaml.safe_load((run_dir / "config.yaml").read_text())["engines"]
print(f"\nengines: generation={engines['generation']} trainer={engines['trainer']} device={engines['device']}")
print(f"{'iteration':>9}  " + "  ".join(f"{k:>{max(10, len(k))}}" for k in hist))
for it in sorted({s for h in hist.values() for s in h}):
    print(f"{it:>9}  " + "  ".join(f"{hist[k].get(it, float('nan')):>{max(10, len(k))}.3f}" for k in hist))

up = store.read_table(run_dir, "updates")
up = up[~up["skipped"].astype(bool)]
print(f"\nupdates ({engines['trainer']} trainer): seconds per update and trained tokens/s")
for r in up.sort_values(["iteration", "agent"]).to_dict("records"):
    print(f"  iteration {r['iteration']} {r['agent']:>10}: {r['seconds']:7.2f} s, {r['tokens']:6d} tokens, "
          f"{r['tokens'] / max(r['seconds'], 1e-9):9.1f} tokens/s, kl {r['kl'] if r['kl'] is not None else float('nan'):.2e}")
if len(up):
    print(f"  all updates: {up['tokens'].sum() / up['seconds'].sum():.1f} trained tokens/s")
if memlog.exists() and memlog.stat().st_size:
    used = [int(x) for x in memlog.read_text().split() if x.strip().isdigit()]
    if used:
        print(f"\nGPU memory used (nvidia-smi, every 0.5 s): peak {max(used) / 1024:.1f} GiB")
print(f"\nrun folder: {run_dir}")
EOF
