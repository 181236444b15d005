"""Random problems shared by the backend tests (CPU in CI, CUDA on the device)."""

import numpy as np
import scipy.sparse as sp

from sklearn_cuwide._layout import build_layout
from sklearn_cuwide._state import ModelState, StepParams

# (name, StepParams kwargs, n_outputs, n_factors)
CONFIGS = [
    ("lr-adagrad", dict(model="linear", loss="logistic", solver="adagrad"), 1, 0),
    ("lr-sgd-l1", dict(model="linear", loss="logistic", solver="sgd", l1=0.002), 1, 0),
    ("mlr-adagrad", dict(model="linear", loss="multinomial", solver="adagrad"), 3, 0),
    ("fm1-sgd", dict(model="fm", loss="logistic", solver="sgd"), 1, 1),
    ("fm8-adagrad", dict(model="fm", loss="logistic", solver="adagrad"), 1, 8),
    ("fm16-sq-adagrad", dict(model="fm", loss="squared", solver="adagrad"), 1, 16),
    ("fm64-sgd", dict(model="fm", loss="logistic", solver="sgd"), 1, 64),
    ("fm128-sq-sgd", dict(model="fm", loss="squared", solver="sgd"), 1, 128),
    # penalties scaled to the full objective's per epoch (_layout.penalty_scale)
    ("lr-adagrad-scaled",
     dict(model="linear", loss="logistic", solver="adagrad", penalty_scaled=True), 1, 0),
    ("lr-sgd-l1-scaled",
     dict(model="linear", loss="logistic", solver="sgd", l1=0.002, penalty_scaled=True), 1, 0),
    ("mlr-adagrad-scaled",
     dict(model="linear", loss="multinomial", solver="adagrad", penalty_scaled=True), 3, 0),
    ("mlr-sgd-scaled",
     dict(model="linear", loss="multinomial", solver="sgd", penalty_scaled=True), 3, 0),
    ("fm8-adagrad-scaled",
     dict(model="fm", loss="logistic", solver="adagrad", penalty_scaled=True), 1, 8),
]


def random_problem(rng, n=997, d=301, density=0.03, n_outputs=1, loss="logistic"):
    """A sparse matrix with empty rows and columns and one feature in every row."""
    X = sp.random(n, d, density=density, format="lil", random_state=rng, dtype=np.float64)
    X[:, 5] = rng.uniform(0.5, 1.5, size=(n, 1))  # present in every row
    X[rng.choice(n, 20, replace=False), :] = 0  # empty rows
    X[:, rng.choice(np.arange(6, d), 15, replace=False)] = 0  # empty columns
    X[rng.choice(n, 20, replace=False), 5] = 0
    X = X.tocsr()
    X.eliminate_zeros()
    X.data = X.data.astype(np.float32)
    X = X.astype(np.float32)
    if loss == "multinomial":
        y = rng.integers(0, n_outputs, n).astype(np.float64)
    elif loss == "squared":
        y = rng.normal(size=n)
    else:
        y = (rng.random(n) < 0.4).astype(np.float64)
    sw = rng.uniform(0.2, 2.0, n)
    sw[rng.choice(n, 10, replace=False)] = 0.0
    return X, y, sw


def make_case(rng, cfg, batch_size=96, sample_block=40, n_hot_max=12, **kw):
    """Layout, targets, initial state and params of one random problem."""
    _, pkw, D, k = cfg
    X, y, sw = random_problem(rng, n_outputs=D, loss=pkw["loss"], **kw)
    params = StepParams(
        learning_rate=0.05 if pkw["solver"] == "sgd" else 0.1,
        l2_w=1e-3,
        l2_v=2e-3,
        **pkw,
    )
    layout = build_layout(
        X,
        batch_size=batch_size,
        sample_block=sample_block,
        n_hot_max=n_hot_max,
        shuffle=True,
        random_state=int(rng.integers(1 << 30)),
    )
    state = ModelState.zeros(
        X.shape[1],
        D,
        k,
        adagrad=pkw["solver"] == "adagrad",
        init_scale=0.1,
        random_state=int(rng.integers(1 << 30)),
    )
    state.w[:] = rng.normal(scale=0.1, size=state.w.shape)
    state.b[:] = rng.normal(scale=0.1, size=state.b.shape)
    if state.gw is not None:
        for a in (state.gw, state.gb, state.gV):
            if a is not None:
                a[:] = rng.uniform(0.0, 0.5, size=a.shape)
    return X, y, sw, layout, state, params
