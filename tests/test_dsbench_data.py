"""DSBench data layer: problems, splits, workspace files, metrics and the submission scorer."""

import math

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from pipelines.dsbench.data import (
    DATASETS,
    DSProblem,
    accuracy,
    column_name,
    macro_f1,
    make_problems,
    rmse,
    score_submission,
    split,
    write_workspace,
)

ALL = ["diabetes", "breast_cancer", "wine", "iris", "digits"]
REG, CLS = make_problems(["diabetes", "iris"], 2, seed=7)


def submit(workdir, ids, preds, columns=("id", "target")):
    pd.DataFrame({columns[0]: ids, columns[1]: preds}).to_csv(workdir / "submission.csv", index=False)


# --- problems and splits ---------------------------------------------------------------------------------------


def test_problems_deterministic_round_robin_unique():
    a, b = make_problems(ALL, 12, seed=3), make_problems(ALL, 12, seed=3)
    assert a == b
    assert [p.dataset for p in a] == [ALL[i % 5] for i in range(12)]
    assert len({p.task_id for p in a}) == len({p.split_seed for p in a}) == 12
    assert all(p.task_id == f"{p.dataset}-{p.split_seed}" and p.answer == "" for p in a)
    assert {p.kind for p in a} == {"regression", "classification"}
    assert make_problems(ALL, 5, seed=4) != make_problems(ALL, 5, seed=3)


def test_question_names_task():
    q = CLS.question
    for s in ("iris", "classification", "`target`", "112 rows", "4 feature", "38 rows", "id,target", "accuracy"):
        assert s in q, s
    assert "RMSE" in REG.question and "diabetes" in REG.question


def test_train_and_held_out_split_seeds_disjoint():
    train = make_problems(ALL, 50, seed=1)
    held = make_problems(ALL, 20, seed=1, start=50)
    assert not {p.split_seed for p in train} & {p.split_seed for p in held}
    assert not {p.task_id for p in train} & {p.task_id for p in held}


def test_keyword_construction_and_unknown_dataset():
    p = DSProblem(task_id="x", question="q", answer="", dataset="wine", kind="classification", split_seed=5)
    assert p.target == "target"
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        make_problems(["nope"], 1, seed=0)
    with pytest.raises(ValueError, match="no datasets"):
        make_problems([], 1, seed=0)


def test_split_deterministic_and_shaped():
    for p in make_problems(ALL, 5, seed=2):
        train, test, truth = split(p)
        train2, test2, truth2 = split(p)
        pd.testing.assert_frame_equal(train, train2)
        pd.testing.assert_frame_equal(test, test2)
        pd.testing.assert_series_equal(truth, truth2)
        assert "target" in train.columns and "target" not in test.columns and "id" not in train.columns
        assert list(test.columns) == ["id"] + [c for c in train.columns if c != "target"]
        assert list(truth.index) == list(test["id"]) and truth.index.is_unique
        assert all(c == column_name(c) and c.isidentifier() for c in train.columns)
    a, b = make_problems(["wine"], 2, seed=0)
    assert not split(a)[0].equals(split(b)[0])


def test_column_names_friendly():
    assert column_name("sepal length (cm)") == "sepal_length_cm"
    assert column_name("od280/od315_of_diluted_wines") == "od280_od315_of_diluted_wines"
    assert column_name("Mean Radius") == "mean_radius"


def test_stratified_split_keeps_every_class():
    for p in make_problems(["iris", "wine", "digits", "breast_cancer"], 8, seed=9):
        train, _, truth = split(p)
        assert set(train["target"]) == set(truth) == set(DATASETS[p.dataset][0]().target)
        full = train["target"].value_counts(normalize=True)
        assert (truth.value_counts(normalize=True) - full).abs().max() < 0.1


def test_write_workspace(tmp_path):
    for p in (REG, CLS):
        d = tmp_path / p.task_id
        write_workspace(p, d)
        train, test, _ = split(p)
        tr, te = pd.read_csv(d / "train.csv"), pd.read_csv(d / "test.csv")
        assert "target" not in te.columns and list(te.columns) == list(test.columns)
        pd.testing.assert_frame_equal(tr, train, check_dtype=False)
        assert np.allclose(te.to_numpy(float), test.to_numpy(float))


# --- metrics ---------------------------------------------------------------------------------------------------


def test_rmse_hand_computed():
    assert rmse([1, 2, 3], [1, 2, 3]) == 0.0
    assert rmse([0, 0], [3, 4]) == pytest.approx(math.sqrt(12.5))  # sqrt((9 + 16) / 2)
    assert rmse([1, 2, 3, 4], [2, 2, 2, 2]) == pytest.approx(math.sqrt(1.5))  # (1+0+1+4)/4


def test_accuracy_hand_computed():
    assert accuracy([0, 1, 1, 2], [0, 1, 2, 2]) == 0.75
    assert accuracy([1, 1], [0, 0]) == 0.0


def test_macro_f1_hand_computed():
    t, p = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]
    # class 0: TP1 FP1 FN1 -> 2/4; class 1: TP2 FP1 FN0 -> 4/5; class 2: TP1 FP0 FN1 -> 2/3
    assert macro_f1(t, p) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert macro_f1([0, 0, 1], [0, 0, 2]) == pytest.approx((1 + 0 + 0) / 3)  # 2 only predicted, 1 never hit
    rng = np.random.default_rng(0)
    t, p = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    assert macro_f1(t, p) == pytest.approx(skm.f1_score(t, p, average="macro"))
    assert accuracy(t, p) == pytest.approx(skm.accuracy_score(t, p))
    assert rmse(t, p) == pytest.approx(math.sqrt(skm.mean_squared_error(t, p)))


# --- scoring ---------------------------------------------------------------------------------------------------


def test_perfect_submissions_succeed(tmp_path):
    _, _, truth = split(REG)
    submit(tmp_path, truth.index[::-1], truth.to_numpy()[::-1])  # order does not matter
    s = score_submission(REG, tmp_path)
    assert s.ok and s.metrics["rmse"] == 0 and s.metrics["fair_rmse"] == 0 and s.metrics["success"] == 1
    for p in make_problems(["breast_cancer", "wine", "iris", "digits"], 4, seed=0):
        _, _, truth = split(p)
        submit(tmp_path, truth.index, truth.to_numpy())
        s = score_submission(p, tmp_path)
        assert s.ok and s.metrics["accuracy"] == 1 and s.metrics["f1"] == 1 and s.metrics["success"] == 1
        assert 0 < s.metrics["baseline_accuracy"] < 1


def test_baselines_do_not_succeed(tmp_path):
    train, _, truth = split(REG)
    submit(tmp_path, truth.index, np.full(len(truth), train["target"].mean()))
    s = score_submission(REG, tmp_path)
    assert s.ok and s.metrics["fair_rmse"] == pytest.approx(1.0) and s.metrics["success"] == 0
    assert s.metrics["rmse"] == pytest.approx(rmse(truth, np.full(len(truth), train["target"].mean())))
    train, _, truth = split(CLS)
    majority = train["target"].mode().iloc[0]
    submit(tmp_path, truth.index, np.full(len(truth), majority))
    s = score_submission(CLS, tmp_path)
    assert s.ok and s.metrics["accuracy"] == s.metrics["baseline_accuracy"] and s.metrics["success"] == 0


def test_float_labels_accepted(tmp_path):
    _, _, truth = split(CLS)
    submit(tmp_path, truth.index.astype(float), truth.to_numpy().astype(float))
    assert score_submission(CLS, tmp_path).metrics["accuracy"] == 1


def bad(tmp_path, problem, message):
    s = score_submission(problem, tmp_path)
    assert not s.ok and s.metrics == {"success": 0.0}, s
    assert message in s.feedback, s.feedback


def test_missing_and_unparseable(tmp_path):
    bad(tmp_path, REG, "file not found")
    (tmp_path / "submission.csv").write_text("")
    bad(tmp_path, REG, "not parseable as CSV")
    (tmp_path / "submission.csv").write_text('id,target\n1,"2\n3,4,5,6\n')
    bad(tmp_path, REG, "not parseable as CSV")
    (tmp_path / "submission.csv").write_bytes(b"\xff\xfe\x00\x81garbage")
    bad(tmp_path, CLS, "invalid submission.csv")


def test_missing_columns_and_rows(tmp_path):
    _, _, truth = split(REG)
    submit(tmp_path, truth.index, truth.to_numpy(), columns=("id", "prediction"))
    bad(tmp_path, REG, "missing column(s) ['target']")
    submit(tmp_path, truth.index, truth.to_numpy(), columns=("row", "target"))
    bad(tmp_path, REG, "missing column(s) ['id']")
    submit(tmp_path, truth.index[:-1], truth.to_numpy()[:-1])
    bad(tmp_path, REG, f"wrong number of rows: {len(truth) - 1}, expected {len(truth)}")
    (tmp_path / "submission.csv").write_text("id,target\n")
    bad(tmp_path, REG, "wrong number of rows: 0")


def test_id_mismatches(tmp_path):
    _, _, truth = split(CLS)
    ids, y = truth.index.to_numpy().copy(), truth.to_numpy()
    dup = ids.copy()
    dup[0] = dup[1]
    submit(tmp_path, dup, y)
    bad(tmp_path, CLS, f"duplicate ids: {ids[1]}")
    bad(tmp_path, CLS, f"missing ids: {ids[0]}")
    unknown = ids.copy()
    unknown[-1] = 9999
    submit(tmp_path, unknown, y)
    bad(tmp_path, CLS, "unknown ids: 9999")
    submit(tmp_path, ["a"] + list(ids[1:]), y)
    bad(tmp_path, CLS, "non-integer ids: a")


def test_bad_regression_predictions(tmp_path):
    _, _, truth = split(REG)
    for value, shown in (("oops", "oops"), (np.nan, "nan"), (np.inf, "inf")):
        preds = truth.to_numpy().astype(object)
        preds[3] = value
        submit(tmp_path, truth.index, preds)
        bad(tmp_path, REG, "non-numeric, NaN or infinite predictions for ids 3")
        bad(tmp_path, REG, shown)


def test_bad_class_labels(tmp_path):
    _, _, truth = split(CLS)
    for value in (7, 1.5, "setosa", np.nan):
        preds = truth.to_numpy().astype(object)
        preds[2] = value
        submit(tmp_path, truth.index, preds)
        bad(tmp_path, CLS, "labels not among the training classes [0, 1, 2] for ids 2")
