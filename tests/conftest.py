"""Shared fixtures: small sparse problems and the real data sets (skipped when
``../shared/data`` or ``$SKLEARN_CUWIDE_DATA`` does not have them), and the
hypothesis profiles of the property tests (``tests/test_properties.py``)."""

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp


def _in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the property tests skip (and fail in CI) without it
    _hypothesis_settings = None
else:
    # "ci": the same examples every run (derandomized) and no example
    # database, so that CI is reproducible; "dev": random examples, failures
    # remembered in ./.hypothesis and replayed first.  No deadline: a first
    # example may compile or warm caches.  HYPOTHESIS_PROFILE overrides.
    _hypothesis_settings.register_profile(
        "ci", derandomize=True, database=None, deadline=None, print_blob=True)
    _hypothesis_settings.register_profile("dev", deadline=None, print_blob=True)
    _hypothesis_settings.load_profile(
        os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _in_ci() else "dev"))


def data_dir():
    """Where the real data sets live (may not exist)."""
    env = os.environ.get("SKLEARN_CUWIDE_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def make_sparse_problem(n_classes, n_samples=400, n_features=60, density=0.15,
                        positive_rate=0.3, seed=0):
    """A sparse float32-valued problem with a planted linear model.

    Binary labels are imbalanced (``positive_rate``) so that
    ``class_weight="balanced"`` changes the model.  ``X`` holds values that
    float32 represents exactly, so float32 and float64 fits see the same data.
    """
    rng = np.random.default_rng(seed)
    X = sp.random(n_samples, n_features, density=density, format="csr",
                  random_state=rng, dtype=np.float64)
    X.data = rng.uniform(0.5, 2.0, X.nnz).astype(np.float32).astype(np.float64)
    K = 1 if n_classes == 2 else n_classes
    W = rng.normal(scale=1.5, size=(n_features, K))
    Z = np.asarray(X @ W) + rng.normal(scale=0.5, size=(n_samples, K))
    if K == 1:
        y = (Z[:, 0] > np.quantile(Z[:, 0], 1 - positive_rate)).astype(np.int64)
    else:
        y = Z.argmax(axis=1)
    return X, y


@pytest.fixture(scope="session")
def sparse_binary():
    return make_sparse_problem(2)


@pytest.fixture(scope="session")
def sparse_multiclass():
    return make_sparse_problem(3, seed=1)


@pytest.fixture(scope="session")
def movielens_100k():
    """MovieLens 100k fold 1 as user and item one-hot CSR matrices.

    Returns ``(X_train, y_train, X_test, y_test)``.
    """
    root = data_dir() / "movielens_100k"
    if not (root / "u1.base").is_file() or not (root / "u1.test").is_file():
        pytest.skip(f"MovieLens 100k not found under {root}")

    def load(name):
        a = np.loadtxt(root / name, dtype=np.int64)
        return a[:, 0] - 1, a[:, 1] - 1, a[:, 2].astype(np.float64)

    (u1, i1, r1), (u2, i2, r2) = load("u1.base"), load("u1.test")
    n_users = int(max(u1.max(), u2.max())) + 1
    n_items = int(max(i1.max(), i2.max())) + 1

    def one_hot(u, i):
        n = u.size
        cols = np.column_stack([u, n_users + i]).ravel()
        return sp.csr_matrix(
            (np.ones(2 * n), cols, np.arange(0, 2 * n + 1, 2)),
            shape=(n, n_users + n_items),
        )

    return one_hot(u1, i1), r1, one_hot(u2, i2), r2
