"""DSBench data layer: tabular tasks from scikit-learn's bundled datasets (no downloads), split
deterministically per problem into a workspace (train.csv with `target`, test.csv with `id` and no
target), and the scorer of the team's submission.csv against the hidden test labels.

Split seeds: problem index i (counted from `start`) gets split_seed = (seed * 1_000_003 + i) mod 2**31,
which is injective in i, so a train set (start=0, n) and a held-out set (start=n, m) never share one.
Synthetic datasets (`synthetic_<kind>_<k>`, pipelines/dsbench/synthetic.py) are generated from the run seed."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn import datasets as skd
from sklearn.model_selection import train_test_split

from pipelines.base import Problem
from pipelines.dsbench import synthetic

# dataset -> (loader, kind)
DATASETS = {"diabetes": (lambda: skd.load_diabetes(scaled=False), "regression"),
            "breast_cancer": (skd.load_breast_cancer, "classification"),
            "wine": (skd.load_wine, "classification"),
            "iris": (skd.load_iris, "classification"),
            "digits": (skd.load_digits, "classification")}
TARGET = "target"
TEST_FRACTION = 0.25        # share of rows held out as test.csv
METRIC = {"regression": "RMSE (success: lower than predicting the train mean)",
          "classification": "macro F1 and accuracy (success: accuracy above the majority-class baseline)"}


@dataclass(frozen=True)
class DSProblem(Problem):
    dataset: str = ""
    kind: str = ""              # "regression" | "classification"
    target: str = TARGET
    split_seed: int = 0
    data_seed: int = 0          # a synthetic dataset's run seed (its table is generated from it); 0 for others


@dataclass
class Score:
    ok: bool                    # False: submission missing or malformed
    feedback: str
    metrics: dict[str, float] = field(default_factory=dict)


def column_name(name: str) -> str:
    """A CSV/Python friendly column name: lowercase, runs of non-alphanumerics -> `_`."""
    return re.sub(r"[^0-9a-z]+", "_", str(name).lower()).strip("_")


@lru_cache(maxsize=None)
def load(dataset: str, data_seed: int = 0) -> tuple[pd.DataFrame, pd.Series]:
    """The cached (features, target) of a bundled dataset, or of a synthetic one generated for run seed
    `data_seed`; callers must not mutate them."""
    if synthetic.kind(dataset):
        X, y = synthetic.table(dataset, data_seed)
        return X, pd.Series(y, name=TARGET)
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; known: {sorted(DATASETS)} and synthetic_<kind>_<k>")
    bunch = DATASETS[dataset][0]()
    X = pd.DataFrame(bunch.data, columns=[column_name(c) for c in bunch.feature_names])
    return X, pd.Series(bunch.target, name=TARGET)


def make_problems(datasets: list[str], n: int, seed: int, start: int = 0) -> list[DSProblem]:
    """`n` problems round-robin over `datasets` (bundled or synthetic), problem i (from `start`) with its own
    split seed."""
    if not datasets:
        raise ValueError("make_problems: no datasets given")
    out = []
    for i in range(start, start + n):
        name = datasets[(i - start) % len(datasets)]
        data_seed = seed if synthetic.kind(name) else 0  # a bundled table does not depend on the seed
        X, _ = load(name, data_seed)
        kind, split_seed = synthetic.kind(name) or DATASETS[name][1], (seed * 1_000_003 + i) % 2**31
        n_test = math.ceil(len(X) * TEST_FRACTION)  # as train_test_split rounds
        q = (f"Dataset `{name}` ({kind}). train.csv has {len(X) - n_test} rows, {X.shape[1]} feature "
             f"columns and the target column `{TARGET}`; test.csv has {n_test} rows with an `id` column "
             f"and the same features, no target. Predict `{TARGET}` for every test row and write "
             f"submission.csv with columns id,{TARGET}. Metric: {METRIC[kind]}.")
        out.append(DSProblem(task_id=f"{name}-{split_seed}", question=q, answer="", dataset=name,
                             kind=kind, target=TARGET, split_seed=split_seed, data_seed=data_seed))
    return out


def split(problem: DSProblem,
          test_fraction: float = TEST_FRACTION) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """(train with target, test features with `id`, hidden test target indexed by id), stratified
    for classification, deterministic from the problem's split seed."""
    X, y = load(problem.dataset, problem.data_seed)
    strat = y if problem.kind == "classification" else None
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=test_fraction, random_state=problem.split_seed,
                                              stratify=strat)
    train = X_tr.assign(**{problem.target: y_tr}).reset_index(drop=True)
    ids = pd.RangeIndex(len(X_te), name="id")
    test = pd.concat([pd.Series(ids, name="id"), X_te.reset_index(drop=True)], axis=1)
    return train, test, pd.Series(y_te.to_numpy(), index=ids, name=problem.target)


def write_workspace(problem: DSProblem, workdir: Path) -> None:
    """Write the problem's train.csv and test.csv into `workdir` (created if missing)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    train, test, _ = split(problem)
    train.to_csv(workdir / "train.csv", index=False)
    test.to_csv(workdir / "test.csv", index=False)


def rmse(y_true, y_pred) -> float:
    """Root mean squared error."""
    # rmse = sqrt(mean((y - ŷ)^2))
    return float(np.sqrt(np.mean((np.asarray(y_true, float) - np.asarray(y_pred, float)) ** 2)))


def accuracy(y_true, y_pred) -> float:
    """Fraction of exact matches."""
    # accuracy = mean(y == ŷ)
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def macro_f1(y_true, y_pred) -> float:
    """Unweighted mean F1 over the classes seen in y_true or y_pred (as sklearn's average="macro")."""
    # F1_c = 2·TP_c / (2·TP_c + FP_c + FN_c); macro F1 = mean over classes c
    t, p = np.asarray(y_true), np.asarray(y_pred)
    f1s = [2 * np.sum((t == c) & (p == c)) / (np.sum(t == c) + np.sum(p == c)) for c in np.union1d(t, p)]
    return float(np.mean(f1s))


def _fail(msg: str) -> Score:
    return Score(ok=False, feedback=f"invalid submission.csv: {msg}", metrics={"success": 0.0})


def _examples(values) -> str:
    values = list(values)
    return ", ".join(map(str, values[:5])) + (f", ... ({len(values)} in all)" if len(values) > 5 else "")


def _read(problem: DSProblem, path: Path, ids: pd.Index) -> pd.Series | Score:
    """The submission's predictions indexed by id, or a failing Score naming what is wrong."""
    if not path.is_file():
        return _fail(f"file not found ({path.name} was not written to the workspace)")
    try:
        sub = pd.read_csv(path)
    except Exception as e:  # any parse failure is the agents' fault, never ours
        return _fail(f"not parseable as CSV: {type(e).__name__}: {str(e)[:200]}")
    sub.columns = [str(c).strip() for c in sub.columns]
    missing = [c for c in ("id", problem.target) if c not in sub.columns]
    if missing:
        return _fail(f"missing column(s) {missing}; found {list(sub.columns)[:10]}")
    if len(sub) != len(ids):
        return _fail(f"wrong number of rows: {len(sub)}, expected {len(ids)} (one per test.csv row)")
    sid = pd.to_numeric(sub["id"], errors="coerce")
    if sid.isna().any() or (sid % 1 != 0).any():
        return _fail(f"non-integer ids: {_examples(sub['id'][sid.isna() | (sid % 1 != 0)])}")
    sid = sid.astype(np.int64)
    dup, unknown = sid[sid.duplicated()].unique(), sorted(set(sid) - set(ids))
    absent = sorted(set(ids) - set(sid))
    problems = [f"{what} ids: {_examples(v)}" for what, v in
                (("duplicate", dup), ("unknown", unknown), ("missing", absent)) if len(v)]
    if problems:
        return _fail("ids do not match test.csv's ids: " + "; ".join(problems))
    return pd.Series(sub[problem.target].to_numpy(), index=pd.Index(sid, name="id")).reindex(ids)


def score_submission(problem: DSProblem, workdir: Path) -> Score:
    """Score `workdir`/submission.csv against the hidden test labels; never raises on bad output."""
    train, _, truth = split(problem)
    pred = _read(problem, Path(workdir) / "submission.csv", truth.index)
    if isinstance(pred, Score):
        return pred
    num = pd.to_numeric(pred, errors="coerce").astype(float)
    if problem.kind == "regression":
        bad = pred[~np.isfinite(num)]
        if len(bad):
            return _fail(f"non-numeric, NaN or infinite predictions for ids {_examples(bad.index)} "
                         f"(values: {_examples(bad)})")
        err, base = rmse(truth, num), rmse(truth, np.full(len(truth), train[problem.target].mean()))
        # fair_rmse = rmse(prediction) / rmse(predicting the train mean for every test row)
        fair = err / base if base > 0 else (0.0 if err == 0 else math.inf)
        return Score(True, f"rmse {err:.4g}, fair_rmse {fair:.3f} (< 1 beats predicting the train mean)",
                     {"rmse": err, "fair_rmse": fair, "success": float(fair < 1)})
    classes = set(train[problem.target].unique().tolist())
    bad = pred[~num.isin(classes)]
    if len(bad):
        return _fail(f"labels not among the training classes {sorted(classes)} for ids "
                     f"{_examples(bad.index)} (values: {_examples(bad)})")
    labels = num.astype(np.int64)
    acc, f1 = accuracy(truth, labels), macro_f1(truth, labels)
    # baseline: predict the train majority class for every test row
    base = accuracy(truth, np.full(len(truth), train[problem.target].mode().iloc[0]))
    return Score(True, f"accuracy {acc:.3f} (majority baseline {base:.3f}), macro F1 {f1:.3f}",
                 {"f1": f1, "accuracy": acc, "baseline_accuracy": base, "success": float(acc > base)})


def outcome(problem: DSProblem, s: Score) -> float:
    """The episode's reward in [0, 1]: the gain over the trivial predictor, 0 for an invalid submission.
    Regression: 1 - fair_rmse; classification: (accuracy - baseline) / (1 - baseline); clipped to [0, 1]."""
    if not s.ok:
        return 0.0
    if problem.kind == "regression":
        gain = 1.0 - s.metrics["fair_rmse"]
    else:
        base = s.metrics["baseline_accuracy"]
        gain = (s.metrics["accuracy"] - base) / (1.0 - base) if base < 1 else 0.0
    return float(min(max(gain, 0.0), 1.0))
