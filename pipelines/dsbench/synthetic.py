"""Synthetic DSBench datasets for held-out tasks: `synthetic_<kind>_<k>` is a table from scikit-learn's
make_classification / make_regression whose shape (rows, features, informative features, classes) and
generator seed are drawn from an RNG keyed by (run seed, k). No training task is generated, so a team
trained on the bundled datasets has never seen one; the same run seed gives the same tables."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

NAME_RE = re.compile(r"synthetic_(classification|regression)_(\d+)")


def names(n: int) -> list[str]:
    """The names of `n` synthetic datasets, classification and regression by turns."""
    return [f"synthetic_{('classification', 'regression')[k % 2]}_{k}" for k in range(n)]


def kind(name: str) -> str | None:
    """A synthetic dataset's task kind ("regression" | "classification"); None for any other name."""
    m = NAME_RE.fullmatch(name)
    return m.group(1) if m else None


def table(name: str, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """(features with columns feature_0.., target) of synthetic dataset `name` for run seed `seed`."""
    from sklearn import datasets as skd

    m = NAME_RE.fullmatch(name)
    if not m:
        raise ValueError(f"not a synthetic dataset: {name!r} (synthetic_<classification|regression>_<k>)")
    rng = np.random.default_rng([seed, int(m.group(2))])
    # 200..400 rows: no bundled dataset has that many (150, 178, 442, 569, 1797), so none shares a shape
    n, d = int(rng.integers(200, 401)), int(rng.integers(4, 21))
    informative, state = int(rng.integers(2, d + 1)), int(rng.integers(2**31))
    if m.group(1) == "regression":  # noise: the target is no exact formula of the features, as in real data
        X, y = skd.make_regression(n_samples=n, n_features=d, n_informative=informative, noise=10.0, random_state=state)
    else:  # no redundant features (all d may be informative); one cluster per class: 2..4 classes fit 2 informative
        X, y = skd.make_classification(
            n_samples=n,
            n_features=d,
            n_informative=informative,
            n_redundant=0,
            n_classes=int(rng.integers(2, 5)),
            n_clusters_per_class=1,
            random_state=state,
        )
    return pd.DataFrame(X, columns=[f"feature_{j}" for j in range(d)]), y
