"""DSBench held-out modes: `datasets` (tasks on datasets training never sees: bundled ones outside
`pipeline.datasets` and synthetic ones) and `splits` (new splits of the training datasets, the held-out set
before); synthetic workspaces through the real scorer; success per held-out dataset in the report."""

import hashlib

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from flows.config import ConfigError, load_config
from flows.metrics import partition_metrics
from infra import store
from infra.sandbox import SandboxConfig
from pipelines.dsbench import DSBench, DSBenchConfig, data, synthetic
from tests.test_dsbench import GOOD, ScriptedTeam
from tests.test_dsbench_data import submit
from tests.test_store import ROWS

SANDBOX = SandboxConfig(isolation="rlimits")  # no bubblewrap probe: these tests run no program
TRAIN = ["diabetes", "breast_cancer", "wine", "iris"]  # the default training datasets

# the held-out problems of the implementation before `heldout` (commit a283cb8), seed 3, datasets TRAIN,
# train_size 64, eval_size 8: their task ids and a digest of every field they had
BEFORE_IDS = [
    "diabetes-3000073",
    "breast_cancer-3000074",
    "wine-3000075",
    "iris-3000076",
    "diabetes-3000077",
    "breast_cancer-3000078",
    "wine-3000079",
    "iris-3000080",
]
BEFORE_DIGEST = "2e52ea91c987e5e8a9602442ae8093d0290b37330822bd410b07638afe1ec78e"
BEFORE_FIELDS = ("task_id", "question", "answer", "dataset", "kind", "target", "split_seed")


def pipeline(seed: int = 0, **cfg) -> DSBench:
    return DSBench(DSBenchConfig(sandbox=SANDBOX, **({"heldout": "datasets"} | cfg)), seed)


def test_datasets_mode_shares_no_dataset_with_training():
    p = pipeline(train_size=16, eval_size=10)
    train, held = p.problems("train"), p.problems("eval")
    assert [x.dataset for x in held] == 2 * ["digits", *synthetic.names(4)]  # round-robin
    assert {x.dataset for x in train} == set(TRAIN) and not {x.dataset for x in train} & {x.dataset for x in held}
    assert {x.kind for x in held} == {"regression", "classification"}
    for seed in range(10):  # no synthetic table has a bundled dataset's shape, so none equals a training matrix
        for name in synthetic.names(4):
            X = data.load(name, seed)[0].to_numpy()
            assert all(X.shape != data.load(d)[0].shape for d in data.DATASETS), (seed, name)


def test_synthetic_tables_deterministic_per_seed_and_new_across_seeds():
    a, b = pipeline(seed=0, eval_size=10).problems("eval"), pipeline(seed=0, eval_size=10).problems("eval")
    assert a == b and all(x.data_seed == 0 for x in a if x.dataset == "digits")
    assert pipeline(seed=1, eval_size=10).problems("eval") != a
    for name in synthetic.names(4):
        (X, y), (X2, y2), (X1, _) = synthetic.table(name, 0), synthetic.table(name, 0), synthetic.table(name, 1)
        pd.testing.assert_frame_equal(X, X2)
        assert np.array_equal(y, y2) and not (X.shape == X1.shape and np.allclose(X, X1))
    tables = [synthetic.table(n, 0)[0] for n in synthetic.names(4)]
    assert len({t.shape for t in tables}) == 4  # the held-out datasets of a run differ from each other


def test_splits_mode_reproduces_the_earlier_held_out_set():
    held = pipeline(seed=3, heldout="splits", train_size=64, eval_size=8).problems("eval")
    assert [p.task_id for p in held] == BEFORE_IDS
    fields = repr([tuple(getattr(p, f) for f in BEFORE_FIELDS) for p in held])
    assert hashlib.sha256(fields.encode()).hexdigest() == BEFORE_DIGEST
    assert all(p.data_seed == 0 for p in held)


def test_heldout_datasets_must_be_unseen():
    with pytest.raises(ValidationError, match=r"heldout_datasets \['iris'\] are also in pipeline.datasets"):
        DSBenchConfig(datasets=["iris", "wine"], heldout_datasets=["digits", "iris"])
    with pytest.raises(ConfigError, match=r"heldout_datasets \['iris'\] are also in pipeline.datasets"):
        load_config("dsbench-tiny", ["pipeline.heldout_datasets=[iris, digits]"])
    with pytest.raises(ValidationError, match="heldout=datasets needs a held-out dataset"):
        DSBenchConfig(datasets=list(data.DATASETS), heldout="datasets", heldout_synthetic=0)
    assert DSBenchConfig(datasets=["iris"]).heldout_datasets == ["diabetes", "breast_cancer", "wine", "digits"]
    assert DSBenchConfig(datasets=list(data.DATASETS), heldout="datasets").heldout_names() == synthetic.names(4)
    # a run folder whose config predates `heldout` keeps the held-out set it was evaluated on
    assert DSBenchConfig().heldout == "splits" and load_config("dsbench-tiny", []).pipeline.heldout == "datasets"
    assert DSBenchConfig(datasets=["iris"], heldout="splits").heldout_names() == ["iris"]


def test_synthetic_problem_named_and_described():
    cls, reg = data.make_problems(synthetic.names(2), 2, seed=5, start=64)
    X, y = data.load(cls.dataset, 5)
    assert cls.task_id == f"synthetic_classification_0-{cls.split_seed}" and cls.data_seed == 5
    assert (cls.kind, reg.kind) == ("classification", "regression")
    assert "Dataset `synthetic_classification_0` (classification)" in cls.question
    assert f"{X.shape[1]} feature columns" in cls.question and "RMSE" in reg.question
    assert list(X.columns) == [f"feature_{j}" for j in range(X.shape[1])] and set(y) <= {0, 1, 2, 3}
    assert pipeline().group_of(cls) == "synthetic_classification_0"
    with pytest.raises(ValueError, match="unknown dataset 'synthetic_clustering_0'"):
        data.make_problems(["synthetic_clustering_0"], 1, seed=0)


def test_synthetic_workspace_written_and_scored(tmp_path):
    for p in data.make_problems(synthetic.names(2), 2, seed=5, start=64):
        ws = tmp_path / p.task_id
        data.write_workspace(p, ws)
        train, test, truth = data.split(p)
        pd.testing.assert_frame_equal(pd.read_csv(ws / "train.csv"), train, check_dtype=False)
        assert list(pd.read_csv(ws / "test.csv").columns) == ["id", *data.load(p.dataset, 5)[0].columns]
        submit(ws, truth.index, truth.to_numpy())
        assert data.score_submission(p, ws).metrics["success"] == 1
        constant = train["target"].mean() if p.kind == "regression" else train["target"].mode().iloc[0]
        submit(ws, truth.index, np.full(len(truth), constant))
        s = data.score_submission(p, ws)
        assert s.ok and s.metrics["success"] == 0


def test_team_solves_synthetic_held_out_tasks_in_the_sandbox():
    """The scripted team's programs (tests/test_dsbench.py) on synthetic tables: the same hand-offs and scoring."""
    p = DSBench(
        DSBenchConfig(
            datasets=list(data.DATASETS), heldout="datasets", eval_size=2, examples=False, scaffold="none", stop=[]
        ),
        seed=0,
    )
    held = p.problems("eval")
    eps = p.run_episodes(held, ["e0", "e1"], ["g0", "g1"], ScriptedTeam(GOOD))
    assert [e.problem.dataset for e in eps] == synthetic.names(2)
    assert all(e.success and e.infra_error is None and e.metrics["code_error"] == 0 for e in eps), eps
    assert eps[1].metrics["regression"] == 1.0 and "fair_rmse" in eps[1].metrics


def test_success_per_held_out_dataset(tmp_path):
    held = pipeline(eval_size=5).problems("eval")  # digits and four synthetic datasets
    outcomes = [True, False, True, False, True]
    eps = [
        dict(
            ROWS["episodes"],
            episode_id=f"e{i}",
            task_id=p.task_id,
            question=p.question,
            answer=p.answer,
            pipeline="dsbench",
            success=s,
            iteration=1,
            phase="eval",
            metrics={"greedy": 1.0},
        )
        for i, (p, s) in enumerate(zip(held, outcomes))
    ]
    eps.append(dict(eps[0], episode_id="e5", success=False, infra_error="scorer: failed"))  # not counted
    eps.append(dict(eps[1], episode_id="e6", success=True))  # a second synthetic_classification_0 task
    store.write_partition(tmp_path, "episodes", 1, "eval", eps)
    store.write_partition(
        tmp_path,
        "actions",
        1,
        "eval",
        [dict(ROWS["actions"], episode_id=e["episode_id"], iteration=1, phase="eval") for e in eps],
    )
    m = partition_metrics(tmp_path, 1, "eval")
    assert {k: v for k, v in m.items() if k.startswith("success/")} == {
        "success/digits": 1.0,
        "success/synthetic_classification_0": 0.5,
        "success/synthetic_regression_1": 1.0,
        "success/synthetic_classification_2": 0.0,
        "success/synthetic_regression_3": 1.0,
    }
    mathchat = [dict(e, pipeline="mathchat") for e in eps]  # a pipeline without groups: no breakdown
    store.write_partition(tmp_path / "m", "episodes", 1, "eval", mathchat)
    assert not [k for k in partition_metrics(tmp_path / "m", 1, "eval") if k.startswith("success/")]
