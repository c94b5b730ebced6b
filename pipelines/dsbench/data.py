"""DSBench data layer: tabular tasks from scikit-learn's bundled datasets (no downloads) or a user's
CSV files (`load_tasks`), split deterministically per problem into a workspace (train.csv with `target`,
test.csv with `id` and no target), and the scorer of the team's submission.csv against the hidden test
labels.

Split seeds: problem index i (counted from `start`) gets split_seed = (seed * 1_000_003 + i) mod 2**31,
which is injective in i, so a train set (start=0, n) and a held-out set (start=n, m) never share one.
Synthetic datasets (`synthetic_<kind>_<k>`, pipelines/dsbench/synthetic.py) are generated from the run seed."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache, partial
from pathlib import Path

import numpy as np
import pandas as pd

from infra.errors import UsageError
from pipelines.base import Problem
from pipelines.dsbench import synthetic
from pipelines.records import check_fields, records


def _bundled(loader: str, **kw):
    """One of scikit-learn's bundled datasets (imported on first use: scikit-learn and the SciPy it loads
    take over a second to import, which every `teamrl` command would pay)."""
    from sklearn import datasets

    return getattr(datasets, loader)(**kw)


# dataset -> (loader, kind)
DATASETS = {
    "diabetes": (partial(_bundled, "load_diabetes", scaled=False), "regression"),
    "breast_cancer": (partial(_bundled, "load_breast_cancer"), "classification"),
    "wine": (partial(_bundled, "load_wine"), "classification"),
    "iris": (partial(_bundled, "load_iris"), "classification"),
    "digits": (partial(_bundled, "load_digits"), "classification"),
}
TARGET = "target"
TEST_FRACTION = 0.25  # share of rows held out as test.csv
METRIC = {
    "regression": "RMSE (success: lower than predicting the train mean)",
    "classification": "macro F1 and accuracy (success: accuracy above the majority-class baseline)",
}
# a task file's metric -> (task kind, its name for people, what a success beats without a threshold)
METRICS = {
    "rmse": ("regression", "RMSE", "predicting the train mean"),
    "accuracy": ("classification", "accuracy", "the majority-class baseline"),
    "f1": ("classification", "macro F1", "the majority-class baseline"),
}


@dataclass(frozen=True)
class DSProblem(Problem):
    dataset: str = ""
    kind: str = ""  # "regression" | "classification"
    target: str = TARGET
    split_seed: int = 0
    data_seed: int = 0  # a synthetic dataset's run seed (its table is generated from it); 0 for others
    csv: str = ""  # a user's task (`load_tasks`): its CSV file; "": the bundled `dataset`
    label: str = ""  # the CSV's column to predict (`target` in the workspace)
    metric: str = ""  # a METRICS key; "": the kind's default (rmse, or accuracy)
    threshold: float | None = None  # success: the metric at most (rmse) / at least this; None: beat the baseline


@dataclass
class Score:
    ok: bool  # False: submission missing or malformed
    feedback: str
    metrics: dict[str, float] = field(default_factory=dict)


def column_name(name: str) -> str:
    """A CSV/Python friendly column name: lowercase, runs of non-alphanumerics -> `_`."""
    return re.sub(r"[^0-9a-z]+", "_", str(name).lower()).strip("_")


@cache
def load(dataset: str, data_seed: int = 0) -> tuple[pd.DataFrame, pd.Series]:
    """The cached (features, target) of a bundled dataset, or of a synthetic one generated for run seed
    `data_seed`; callers must not mutate them."""
    if synthetic.kind(dataset):
        X, y = synthetic.table(dataset, data_seed)
        return X, pd.Series(y, name=TARGET)
    if dataset not in DATASETS:
        raise UsageError(f"unknown dataset {dataset!r}; known: {sorted(DATASETS)} and synthetic_<kind>_<k>")
    bunch = DATASETS[dataset][0]()
    X = pd.DataFrame(bunch.data, columns=[column_name(c) for c in bunch.feature_names])
    return X, pd.Series(bunch.target, name=TARGET)


@lru_cache(maxsize=16)
def load_csv(path: str, label: str) -> tuple[pd.DataFrame, pd.Series]:
    """The cached (features, target) of a user's CSV file, feature names as `column_name` makes them;
    callers must not mutate them."""
    try:
        df = pd.read_csv(path)
    except Exception as e:  # whatever pandas cannot parse
        raise UsageError(f"{path}: not a readable CSV file ({type(e).__name__}: {str(e)[:200]})") from None
    if label not in df.columns:
        raise UsageError(f"{path} has no column {label!r}; its columns: {', '.join(map(str, df.columns[:20]))}")
    X = df.drop(columns=[label])
    X.columns = names = [column_name(c) for c in X.columns]
    if clash := sorted({n for n in names if names.count(n) > 1 or n in ("", "id", TARGET)}):
        raise UsageError(
            f"{path}: feature column name(s) {clash} clash in the workspace (where `id` and `target` "
            "are taken and names are lowercased, non-alphanumerics as _): rename or drop them"
        )
    return X, df[label].rename(TARGET)


def frame(problem: DSProblem) -> tuple[pd.DataFrame, pd.Series]:
    """The problem's (features, target): its bundled or synthetic dataset, or its CSV file."""
    return load_csv(problem.csv, problem.label) if problem.csv else load(problem.dataset, problem.data_seed)


def _seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i) % 2**31


def _question(name: str, kind: str, X: pd.DataFrame, metric: str) -> str:
    n_test = math.ceil(len(X) * TEST_FRACTION)  # as train_test_split rounds
    return (
        f"Dataset `{name}` ({kind}). train.csv has {len(X) - n_test} rows, {X.shape[1]} feature "
        f"columns and the target column `{TARGET}`; test.csv has {n_test} rows with an `id` column "
        f"and the same features, no target. Predict `{TARGET}` for every test row and write "
        f"submission.csv with columns id,{TARGET}. Metric: {metric}."
    )


def make_problems(datasets: Sequence[str], n: int, seed: int, start: int = 0) -> list[DSProblem]:
    """`n` problems round-robin over `datasets` (bundled or synthetic), problem i (from `start`) with its own
    split seed."""
    if not datasets:
        raise UsageError("make_problems: no datasets given")
    out = []
    for i in range(start, start + n):
        name = datasets[(i - start) % len(datasets)]
        data_seed = seed if synthetic.kind(name) else 0  # a bundled table does not depend on the seed
        X, _ = load(name, data_seed)
        kind, split_seed = synthetic.kind(name) or DATASETS[name][1], _seed(seed, i)
        out.append(
            DSProblem(
                task_id=f"{name}-{split_seed}",
                question=_question(name, kind, X, METRIC[kind]),
                answer="",
                dataset=name,
                kind=kind,
                target=TARGET,
                split_seed=split_seed,
                data_seed=data_seed,
            )
        )
    return out


def criterion(metric: str, threshold: float | None) -> str:
    """What a success is under a task file's metric, for people: `RMSE at most 3.5`."""
    _, name, baseline = METRICS[metric]
    if threshold is None:
        return f"{name} {'below' if metric == 'rmse' else 'above'} {baseline}"
    return f"{name} at {'most' if metric == 'rmse' else 'least'} {threshold:g}"


def _check_target(y: pd.Series, metric: str) -> None:
    kind = METRICS[metric][0]
    if y.isna().any():
        raise UsageError(f"the target column has {int(y.isna().sum())} empty cell(s)")
    whole = pd.api.types.is_numeric_dtype(y) and bool((y % 1 == 0).all())
    if kind == "regression" and not pd.api.types.is_numeric_dtype(y):
        raise UsageError(f"metric {metric} needs a numeric target column, got values like {_examples(y.unique())}")
    if kind == "classification" and not whole:
        raise UsageError(
            f"metric {metric} needs integer class labels in the target column, got values like {_examples(y.unique())}"
        )
    if kind == "classification" and y.nunique() < 2:
        raise UsageError(f"metric {metric} needs at least two classes in the target column")


def load_tasks(path: str | Path, seed: int) -> list[DSProblem]:
    """A user's tasks, one JSON object a line: {"csv": a file, relative to the task file or absolute,
    "target": its column to predict, "metric": rmse | accuracy | f1, "threshold"?: a number (success:
    the metric at most (rmse) or at least this; default: better than the trivial predictor), "name"?: for
    people (default: the CSV's name)}. Each CSV is split like a bundled dataset (its split seed from `seed`
    and the line). Errors name the file and line."""
    out = []
    for i, (where, d) in enumerate(records(path)):
        check_fields(
            where, d, {"csv": (str,), "target": (str,), "metric": (str,)}, {"threshold": (int, float), "name": (str,)}
        )
        if d["metric"] not in METRICS:
            raise UsageError(f"{where}: unknown metric {d['metric']!r}; supported: {', '.join(METRICS)}")
        csv = (Path(path).parent / d["csv"]).resolve()  # an absolute path stays itself
        if not csv.is_file():
            raise UsageError(f"{where}: no such CSV file {csv}")
        metric, threshold, name = d["metric"], d.get("threshold"), d.get("name", csv.stem)
        kind, split_seed = METRICS[metric][0], _seed(seed, i)
        try:
            X, y = load_csv(str(csv), d["target"])
            _check_target(y, metric)
            p = DSProblem(
                task_id=f"{name}-{split_seed}",
                answer=criterion(metric, threshold),
                dataset=name,
                question=_question(name, kind, X, f"{METRICS[metric][1]} (success: {criterion(metric, threshold)})"),
                kind=kind,
                split_seed=split_seed,
                csv=str(csv),
                label=d["target"],
                metric=metric,
                threshold=None if threshold is None else float(threshold),
            )
            split(p)  # it must split (a stratified split needs two rows of every class)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        out.append(p)
    return out


def split(problem: DSProblem, test_fraction: float = TEST_FRACTION) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """(train with target, test features with `id`, hidden test target indexed by id), stratified
    for classification, deterministic from the problem's split seed."""
    from sklearn.model_selection import train_test_split

    X, y = frame(problem)
    strat = y if problem.kind == "classification" else None
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=test_fraction, random_state=problem.split_seed, stratify=strat
    )
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
    problems = [
        f"{what} ids: {_examples(v)}"
        for what, v in (("duplicate", dup), ("unknown", unknown), ("missing", absent))
        if len(v)
    ]
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
            return _fail(
                f"non-numeric, NaN or infinite predictions for ids {_examples(bad.index)} (values: {_examples(bad)})"
            )
        err, base = rmse(truth, num), rmse(truth, np.full(len(truth), train[problem.target].mean()))
        # fair_rmse = rmse(prediction) / rmse(predicting the train mean for every test row)
        fair = err / base if base > 0 else (0.0 if err == 0 else math.inf)
        m = {"rmse": err, "fair_rmse": fair}
        return Score(
            True,
            f"rmse {err:.4g}, fair_rmse {fair:.3f} (< 1 beats predicting the train mean)",
            m | {"success": succeeds(problem, m)},
        )
    classes = set(train[problem.target].unique().tolist())
    bad = pred[~num.isin(classes)]
    if len(bad):
        return _fail(
            f"labels not among the training classes {sorted(classes)} for ids "
            f"{_examples(bad.index)} (values: {_examples(bad)})"
        )
    labels = num.astype(np.int64)
    acc, f1 = accuracy(truth, labels), macro_f1(truth, labels)
    # baseline: predict the train majority class for every test row
    majority = np.full(len(truth), train[problem.target].mode().iloc[0])
    base = accuracy(truth, majority)
    m = {"f1": f1, "accuracy": acc, "baseline_accuracy": base, "baseline_f1": macro_f1(truth, majority)}
    return Score(
        True,
        f"accuracy {acc:.3f} (majority baseline {base:.3f}), macro F1 {f1:.3f}",
        m | {"success": succeeds(problem, m)},
    )


def succeeds(problem: DSProblem, m: dict[str, float]) -> float:
    """1.0 when the task's metric meets its threshold, or without one (every bundled task) beats the trivial
    predictor: fair_rmse < 1, accuracy or macro F1 above the majority class's; else 0.0."""
    metric = problem.metric or ("rmse" if problem.kind == "regression" else "accuracy")
    if problem.threshold is not None:
        return float(m[metric] <= problem.threshold if metric == "rmse" else m[metric] >= problem.threshold)
    return float(m["fair_rmse"] < 1 if metric == "rmse" else m[metric] > m[f"baseline_{metric}"])


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
