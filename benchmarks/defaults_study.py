"""The defaults study: which step size, initial scale, penalties, batch size
and epochs the mini-batch estimators default to (docs/design/defaults.rst).

``python -m benchmarks.defaults_study --stage grid`` trains one long fit per
setting of a grid on the *choosing* half of the data sets and records, after
every epoch, the training loss, the loss on a held-out validation split and
the test metric (through :func:`sklearn_cuwide._profiling.time_epochs`: the
estimator's own fit code).  The epochs are read off these curves: early
stopping on the validation loss with the best epoch restored, the training
loss ``tol`` rule, or a fixed number of epochs, without refitting.

``--stage baselines`` fits scikit-learn's ``LogisticRegression`` at its
default and over a grid of ``C`` on every binary set (the lbfgs optimum's
test logloss is the target of the adagrad logistic regression), and Ridge
over a grid of ``alpha`` on the regression sets.

``--stage confirm`` fits the estimators as a user would, at their defaults
(``device="cpu"``, only ``random_state`` set), on every set, the held-out
*confirming* half included, and ``--stage report`` writes the markdown
tables from what the stages recorded.

The halves are fixed here (:data:`CHOOSE`, :data:`CONFIRM`); real sets come
from ``benchmarks/data.py`` (``../shared/data`` or ``$SKLEARN_CUWIDE_DATA``)
and are skipped when absent.  ``--size tiny`` shrinks every synthetic set to
a few thousand rows and keeps the real ones out (what the tests run).

The CPU backend trains the mini-batches strictly in order: the in-order
reference of the GPU's concurrent run.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import train_test_split

__all__ = ["SETS", "CHOOSE", "CONFIRM", "Setting", "fm_grid", "lr_grid", "load_set",
           "epoch_curves", "stopping_epoch", "tol_rule_epoch", "regrets", "main"]

# --------------------------------------------------------------------------
# the data sets and the halves
# --------------------------------------------------------------------------
#: the synthetic sets: make_ctr_classification / make_ctr_regression
#: arguments, and the number of training rows (the test rows are a fifth more)
SYNTHETIC = {
    "syn_fm_26f": dict(task="binary", n=100_000, n_features=2**18, n_fields=26,
                       n_numeric=13, zipf_a=1.2, model="fm", n_factors=8, seed=1),
    "syn_fm_10f": dict(task="binary", n=30_000, n_features=2**16, n_fields=10,
                       n_numeric=0, zipf_a=1.1, model="fm", n_factors=4, seed=2),
    "syn_lr_26f": dict(task="binary", n=100_000, n_features=2**18, n_fields=26,
                       n_numeric=13, zipf_a=1.2, model="lr", n_factors=8, seed=3),
    "syn_reg_26f": dict(task="regression", n=100_000, n_features=2**18, n_fields=26,
                        n_numeric=13, zipf_a=1.2, model="fm", n_factors=8, seed=4),
    "syn_reg_10f": dict(task="regression", n=30_000, n_features=2**16, n_fields=10,
                        n_numeric=0, zipf_a=1.1, model="fm", n_factors=4, seed=5),
    "syn_fm_39f": dict(task="binary", n=300_000, n_features=2**19, n_fields=39,
                       n_numeric=0, zipf_a=1.3, model="fm", n_factors=16, seed=6),
    "syn_fm_10k": dict(task="binary", n=10_000, n_features=2**16, n_fields=20,
                       n_numeric=5, zipf_a=1.05, model="fm", n_factors=8, seed=7),
    "syn_reg_20f": dict(task="regression", n=100_000, n_features=2**18, n_fields=20,
                        n_numeric=0, zipf_a=1.3, model="fm", n_factors=16, seed=8),
}
#: the real sets (benchmarks/data.py), binary unless named in REAL_REGRESSION
REAL = ("a9a", "agaricus", "avazu_9k", "criteo_kaggle_8k", "criteo_xlearn_ffm",
        "frappe", "ipinyou_deepctr", "rcv1_vw_small", "w8a", "movielens_100k")
REAL_REGRESSION = ("movielens_100k",)
SETS = tuple(SYNTHETIC) + REAL

#: the defaults are chosen on these ...
CHOOSE = ("syn_fm_26f", "syn_fm_10f", "syn_lr_26f", "syn_reg_26f", "syn_reg_10f",
          "a9a", "avazu_9k", "frappe", "rcv1_vw_small", "criteo_xlearn_ffm")
#: ... and confirmed on these, which the choice never sees
CONFIRM = ("syn_fm_39f", "syn_fm_10k", "syn_reg_20f", "w8a", "agaricus",
           "criteo_kaggle_8k", "ipinyou_deepctr", "movielens_100k")

#: early stopping's held-out share and seed in the study (the estimators'
#: validation_fraction default)
VALIDATION_FRACTION = 0.1
#: below this many training rows early_stopping="auto" is off
#: (scikit-learn's HistGradientBoosting threshold, as the estimators use)
AUTO_THRESHOLD = 10_000


@dataclass
class Split:
    """One data set: training, validation (for the curves) and test rows."""

    name: str
    task: str
    X_train: object
    y_train: np.ndarray
    X_test: object
    y_test: np.ndarray

    @property
    def n_train(self):
        return self.X_train.shape[0]


def task_of(name):
    if name in SYNTHETIC:
        return SYNTHETIC[name]["task"]
    return "regression" if name in REAL_REGRESSION else "binary"


def load_set(name, size="full", root=None):
    """A :class:`Split` of set ``name``, or None when its files are absent
    (or, for ``size="tiny"``, when it is a real set)."""
    if name in SYNTHETIC:
        from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

        spec = dict(SYNTHETIC[name])
        task, n, seed = spec.pop("task"), spec.pop("n"), spec.pop("seed")
        if size == "tiny":
            n = max(2_000, n // 50)
            spec["n_features"] = 2**12
        n_test = n // 5
        make = make_ctr_classification if task == "binary" else make_ctr_regression
        X, y = make(n + n_test, random_state=seed, **spec)
        X = sp.csr_matrix(X)
        return Split(name, task, X[:n], np.asarray(y[:n]), X[n:], np.asarray(y[n:]))
    if size == "tiny":
        return None
    from benchmarks import data

    if name not in data.available_datasets(root):
        return None
    d = data.load(name, root)
    return Split(name, d.task, d.X_train, np.asarray(d.y_train), d.X_test,
                 np.asarray(d.y_test))


# --------------------------------------------------------------------------
# the grids
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One point of a grid: the estimator ("fm" or "lr") and its parameters."""

    model: str
    params: tuple = field(default_factory=tuple)

    @property
    def kw(self):
        return dict(self.params)

    @property
    def key(self):
        return self.model + ":" + ",".join(f"{k}={v}" for k, v in self.params)


def _setting(model, **kw):
    return Setting(model, tuple(sorted(kw.items())))


#: the old defaults of the factorization machines, for the tables
OLD_FM = dict(learning_rate=0.1, alpha=1e-4, beta=1e-3, scale_penalty=False,
              init_scale=0.01, batch_size=1024)
#: today's defaults of the factorization machines, as stage 3 runs them
DEFAULT_FM = dict(learning_rate="auto", alpha="auto", beta="auto", init_scale=0.01,
                  batch_size=1024)

#: the penalties tried: (scale_penalty, alpha, beta)
PENALTIES = ((False, 0.0, 0.0), (False, 1e-6, 1e-5), (False, 1e-5, 1e-4),
             (False, 1e-4, 1e-3), (True, 1e-7, 1e-6), (True, 1e-6, 1e-5),
             (True, 1e-5, 1e-4))
FM_RATES = (0.01, 0.03, 0.1, 0.3)
#: stage 3, the penalties on the full objective with strengths per row:
#: ``(a, b)`` is ``alpha = a / n``, ``beta = b / n`` with ``scale_penalty=True``
#: (``n`` the rows trained on; ``alpha="auto"`` is ``a = 1``, scikit-learn's
#: ``C = 1``), at ``learning_rate="auto"``
PER_ROW_PENALTIES = ((1, 3), (1, 10), (1, 30), (1, 100), (3, 30))
LR_RATES = (0.01, 0.03, 0.1, 0.3, 1.0)


def fm_grid(stage=1, best=None):
    """Stage 1: step size x penalty at the old initial scale and batch;
    stage 2 around ``best`` (a Setting): a third of its step, the initial
    scale, and the batch size (at the step and twice it)."""
    if stage == 1:
        return [_setting("fm", learning_rate=lr, alpha=a, beta=b, scale_penalty=s,
                         init_scale=0.01, batch_size=1024)
                for lr in FM_RATES for s, a, b in PENALTIES]
    kw = best.kw
    # a third of the step (the least of stage 1 may be at its edge)
    out = [_setting("fm", **{**kw, "learning_rate": round(kw["learning_rate"] / 3, 6)})]
    for init in (0.001, 0.1):
        out.append(_setting("fm", **{**kw, "init_scale": init}))
    out.append(_setting("fm", **{**kw, "batch_size": 4096}))
    out.append(_setting("fm", **{**kw, "batch_size": 4096,
                                 "learning_rate": 2 * kw["learning_rate"]}))
    return out


def per_row_grid(task):
    """Stage 3: the estimators' ``"auto"`` penalties and fixed per-row ones
    at ``learning_rate="auto"``, and at
    (1, 10) the step fixed at 0.03 and at 0.1 (and, for the regressor, the
    initial scale 0.1)."""
    base = dict(init_scale=0.01, batch_size=1024)
    # the estimators' "auto" penalties: alpha = 1 / n, beta = m / n (m the
    # mean nonzeros of a row), resolved by the estimator itself
    out = [_setting("fm", learning_rate="auto", alpha="auto", beta="auto", **base)]
    out += [_setting("fm", learning_rate="auto", alpha_per_row=a, beta_per_row=b, **base)
            for a, b in PER_ROW_PENALTIES]
    out += [_setting("fm", learning_rate=lr, alpha_per_row=1, beta_per_row=10, **base)
            for lr in (0.03, 0.1)]
    if task == "regression":
        out.append(_setting("fm", learning_rate="auto", alpha_per_row=1, beta_per_row=10,
                            init_scale=0.1, batch_size=1024))
    return out


def lr_grid():
    """Adagrad logistic regression at scikit-learn's C=1: step size x batch."""
    return ([_setting("lr", learning_rate=lr, batch_size=1024) for lr in LR_RATES]
            + [_setting("lr", learning_rate=lr, batch_size=4096) for lr in (0.1, 0.3)])


def epochs_for(n_train, stage=1):
    """Epochs of one long fit: enough to see the best epoch and past it; in
    stage 3, on the sets where ``"auto"`` runs the training-loss rule, the
    rule's whole ``max_iter = 100``."""
    if n_train <= 12_000:
        return 100 if stage == 3 else 30
    if n_train <= 60_000:
        return 15
    return 10


# --------------------------------------------------------------------------
# one long fit: the per-epoch curves
# --------------------------------------------------------------------------
def _estimator(setting, task, random_state=0, n_rows=None):
    """The setting's estimator; per-row penalties (stage 3) over ``n_rows``,
    the rows it trains on."""
    from sklearn_cuwide import (GPUFactorizationMachine, GPUFactorizationMachineRegressor,
                                GPULogisticRegression)

    if setting.model == "lr":
        return GPULogisticRegression(solver="adagrad", device="cpu",
                                     random_state=random_state, **setting.kw)
    kw = setting.kw
    if "alpha_per_row" in kw:
        kw["alpha"] = kw.pop("alpha_per_row") / n_rows
        kw["beta"] = kw.pop("beta_per_row") / n_rows
        kw["scale_penalty"] = True
    cls = GPUFactorizationMachine if task == "binary" else GPUFactorizationMachineRegressor
    return cls(device="cpu", random_state=random_state, **kw)


def _pointwise(task, y, z):
    """Per-row loss of decision values ``z``: log loss or squared error."""
    if task == "binary":
        return np.logaddexp(0.0, z) - y * z
    return (y - z) ** 2


def epoch_curves(split, setting, epochs, seed=0):
    """Per epoch: the training loss, the validation loss (log loss or mean
    squared error on a held-out ``VALIDATION_FRACTION`` of the training
    rows, stratified for classifiers) and the test metrics, from one fit of
    ``epochs`` epochs on the rest."""
    from sklearn_cuwide._profiling import time_epochs

    strat = split.y_train if split.task == "binary" else None
    Xtr, Xva, ytr, yva = train_test_split(split.X_train, split.y_train,
                                          test_size=VALIDATION_FRACTION,
                                          stratify=strat, random_state=seed)
    est = _estimator(setting, split.task, seed, n_rows=Xtr.shape[0])
    t0 = time.perf_counter()
    tim = time_epochs(est, Xtr, ytr, epochs=epochs, eval_X=sp.vstack([Xva, split.X_test]))
    seconds = time.perf_counter() - t0
    n_va = Xva.shape[0]
    out = dict(train_loss=[float(v) for v in tim.loss], val_loss=[], test=[],
               test_loss=[], seconds=seconds, n_train=int(Xtr.shape[0]))
    for z in tim.eval_decision:
        z = np.asarray(z, dtype=np.float64).reshape(-1)
        zv, zt = z[:n_va], z[n_va:]
        out["val_loss"].append(float(np.mean(_pointwise(split.task, yva, zv))))
        if split.task == "binary":
            ok = np.isfinite(zt).all()
            out["test"].append(float(roc_auc_score(split.y_test, zt)) if ok else 0.5)
            out["test_loss"].append(float(np.mean(_pointwise("binary", split.y_test, zt))))
        else:
            out["test"].append(float(np.sqrt(np.mean(_pointwise("regression",
                                                                 split.y_test, zt)))))
            out["test_loss"].append(out["test"][-1])
    return out


# --------------------------------------------------------------------------
# reading the epochs off the curves
# --------------------------------------------------------------------------
def stopping_epoch(val_loss, n_iter_no_change=5, tol=1e-4):
    """Early stopping with the best epoch restored, on a validation curve:
    the epoch (1-based) whose model it returns.  The estimators' rule
    (tests/test_defaults_study.py checks it against a fit): stop when the
    least loss of the last ``n_iter_no_change`` epochs is not ``tol`` below
    the least before them."""
    curve, k = list(val_loss), int(n_iter_no_change)
    for e in range(k + 1, len(curve) + 1):
        if min(curve[e - k : e]) > min(curve[: e - k]) - tol:
            curve = curve[:e]
            break
    return int(np.argmin(curve)) + 1 if curve else 1


def tol_rule_epoch(train_loss, max_iter, n_iter_no_change=5, tol=1e-4):
    """The training-loss ``tol`` rule without a validation split: the last
    epoch it runs (1-based; capped by the curve's length)."""
    best, bad = math.inf, 0
    for e, v in enumerate(train_loss[:max_iter], 1):
        bad = bad + 1 if v > best - tol else 0
        best = min(best, v)
        if bad >= n_iter_no_change:
            return e
    return min(max_iter, len(train_loss))


def policy_epoch(curves, policy):
    """The epoch a stopping policy returns: ``("es", P)`` early stopping with
    patience P; ``("fixed", E)``; ``("tol", M)`` the training-loss rule with
    ``max_iter=M``; ``("auto", M)`` what the estimators do by default: early
    stopping from AUTO_THRESHOLD rows, else the training-loss rule (both
    capped by the curve's length)."""
    kind, arg = policy
    if kind == "es" or (kind == "auto" and curves["n_train"] / (1 - VALIDATION_FRACTION)
                        >= AUTO_THRESHOLD):
        return stopping_epoch(curves["val_loss"], arg if kind == "es" else 5)
    if kind in ("tol", "auto"):
        return tol_rule_epoch(curves["train_loss"], arg)
    return min(arg, len(curves["test"]))


def higher_is_better(task):
    return task == "binary"


def regrets(records, policy):
    """Per setting key: {set: regret} where regret is how far its test
    metric (AUC, or RMSE relative to the best) at ``policy``'s epoch is
    from the best any setting reached at any epoch on that set."""
    best = {}
    for r in records:
        t = r["curves"]["test"]
        b = max(t) if higher_is_better(r["task"]) else min(t)
        cur = best.get(r["set"])
        if cur is None or (b > cur if higher_is_better(r["task"]) else b < cur):
            best[r["set"]] = b
    out = {}
    for r in records:
        e = policy_epoch(r["curves"], policy)
        v = r["curves"]["test"][e - 1]
        if higher_is_better(r["task"]):
            reg = best[r["set"]] - v
        else:
            reg = v / best[r["set"]] - 1.0
        out.setdefault(r["key"], {})[r["set"]] = reg
    return out


def choose(records, policy, sets):
    """The setting key of least mean regret over ``sets`` (all present)."""
    table = regrets([r for r in records if r["set"] in sets], policy)
    scored = [(float(np.mean([v[s] for s in sets])), k) for k, v in table.items()
              if all(s in v for s in sets)]
    return min(scored)[1] if scored else None


# --------------------------------------------------------------------------
# the stages
# --------------------------------------------------------------------------
def _append(path, rec):
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _read(path):
    if not Path(path).exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _done(path):
    return {(r["set"], r["key"]) for r in _read(path)}


def run_grid(args, log):
    """Stage 1 of both models on the choosing half; stage 2 of the FM around
    stage 1's best (classifier and regressor separately)."""
    path = Path(args.out) / "grid.jsonl"
    done = _done(path)
    sets = [s for s in _names(args, CHOOSE)]
    for name in sets:
        split = load_set(name, args.size, args.data_root)
        if split is None:
            log(f"{name}: absent, skipped")
            continue
        settings = fm_grid(1) + (lr_grid() if split.task == "binary" else [])
        for st in settings:
            if (name, st.key) in done:
                continue
            c = epoch_curves(split, st, epochs_for(split.n_train))
            _append(path, dict(set=name, task=split.task, key=st.key, model=st.model,
                               params=st.kw, curves=c))
            log(f"{name} {st.key}: best test {max(c['test']) if split.task == 'binary' else min(c['test']):.4f} "
                f"({c['seconds']:.1f} s)")
    # stage 2 around stage 1's best, per task
    recs = _read(path)
    done = _done(path)
    for task in ("binary", "regression"):
        tsets = [s for s in sets if task_of(s) == task and any(r["set"] == s for r in recs)]
        fm = [r for r in recs if r["model"] == "fm" and r["task"] == task
              and "alpha_per_row" not in r["params"]]
        key = choose(fm, ("auto", 100), tsets)
        if key is None:
            continue
        best = next(Setting("fm", tuple(sorted(r["params"].items())))
                    for r in fm if r["key"] == key)
        log(f"stage 2 ({task}) around {key}")
        for name in tsets:
            split = load_set(name, args.size, args.data_root)
            for st in fm_grid(2, best):
                if (name, st.key) in done:
                    continue
                c = epoch_curves(split, st, epochs_for(split.n_train))
                _append(path, dict(set=name, task=split.task, key=st.key, model="fm",
                                   params=st.kw, curves=c))
                log(f"{name} {st.key} ({c['seconds']:.1f} s)")
    # stage 3: the per-row penalties on the full objective
    for name in sets:
        split = load_set(name, args.size, args.data_root)
        if split is None:
            continue
        for st in per_row_grid(split.task):
            if (name, st.key) in done:
                continue
            c = epoch_curves(split, st, epochs_for(split.n_train, stage=3))
            _append(path, dict(set=name, task=split.task, key=st.key, model="fm",
                               params=st.kw, curves=c))
            log(f"{name} {st.key} ({c['seconds']:.1f} s)")


C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
RIDGE_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)


def run_baselines(args, log):
    """scikit-learn's LogisticRegression at its default and over C_GRID
    (every binary set); Ridge over RIDGE_GRID (regression sets)."""
    path = Path(args.out) / "baselines.jsonl"
    done = _done(path)
    for name in _names(args, SETS):
        split = load_set(name, args.size, args.data_root)
        if split is None:
            continue
        grid = ([("sk_lr", C) for C in ("default",) + C_GRID] if split.task == "binary"
                else [("ridge", a) for a in RIDGE_GRID])
        for kind, p in grid:
            key = f"{kind}:{p}"
            if (name, key) in done:
                continue
            t0 = time.perf_counter()
            if kind == "sk_lr":
                est = LogisticRegression() if p == "default" else LogisticRegression(
                    C=p, max_iter=1000)
                est.fit(split.X_train, split.y_train)
                pr = est.predict_proba(split.X_test)[:, 1]
                m = dict(auc=float(roc_auc_score(split.y_test, pr)),
                         logloss=float(log_loss(split.y_test, pr, labels=[0, 1])))
            else:
                est = Ridge(alpha=p).fit(split.X_train, split.y_train)
                m = dict(rmse=float(np.sqrt(np.mean((est.predict(split.X_test)
                                                     - split.y_test) ** 2))))
            _append(path, dict(set=name, task=split.task, key=key,
                               seconds=time.perf_counter() - t0, **m))
            log(f"{name} {key}: {m}")


def default_estimators(task):
    """The estimators at their defaults, as a user makes them (CPU)."""
    from sklearn_cuwide import (GPUFactorizationMachine, GPUFactorizationMachineRegressor,
                                GPULogisticRegression)

    if task == "regression":
        return {"fm_reg": GPUFactorizationMachineRegressor(device="cpu", random_state=0)}
    return {"fm": GPUFactorizationMachine(device="cpu", random_state=0),
            "lr_adagrad": GPULogisticRegression(solver="adagrad", device="cpu",
                                                random_state=0),
            "lr_lbfgs": GPULogisticRegression(device="cpu")}


def run_confirm(args, log):
    """The estimators at their defaults on every set."""
    path = Path(args.out) / "confirm.jsonl"
    done = _done(path)
    for name in _names(args, SETS):
        split = load_set(name, args.size, args.data_root)
        if split is None:
            continue
        for key, est in default_estimators(split.task).items():
            if (name, key) in done:
                continue
            t0 = time.perf_counter()
            est.fit(split.X_train, split.y_train)
            secs = time.perf_counter() - t0
            if split.task == "binary":
                pr = est.predict_proba(split.X_test)[:, 1]
                m = dict(auc=float(roc_auc_score(split.y_test, pr)),
                         logloss=float(log_loss(split.y_test, pr, labels=[0, 1])))
            else:
                m = dict(rmse=float(np.sqrt(np.mean((est.predict(split.X_test)
                                                     - split.y_test) ** 2))))
            n_iter = int(np.ravel(est.n_iter_)[0])
            best = getattr(est, "best_iteration_", None)
            _append(path, dict(set=name, task=split.task, key=key, seconds=secs,
                               n_iter=n_iter, best_iteration=best, **m))
            log(f"{name} {key}: {m} n_iter={n_iter} best={best} ({secs:.1f} s)")


# --------------------------------------------------------------------------
# the PyTorch FM peer, tuned per set
# --------------------------------------------------------------------------
#: the sets small enough for the peer's grid on a CPU
TORCH_SETS = ("agaricus", "avazu_9k", "criteo_kaggle_8k", "rcv1_vw_small",
              "criteo_xlearn_ffm", "syn_fm_10k")
TORCH_RATES = (0.003, 0.01, 0.03, 0.1)
TORCH_OPTIMIZERS = ("adagrad", "adam")
TORCH_BATCHES = (1024, 4096)
TORCH_EPOCHS = 20


def _padded(X, pad):
    """Rows of a CSR matrix as (n, L) index and value arrays, padded with
    feature ``pad`` and value 0 (rows of any length)."""
    lengths = np.diff(X.indptr)
    L = max(int(lengths.max()), 1)
    idx = np.full((X.shape[0], L), pad, dtype=np.int64)
    val = np.zeros((X.shape[0], L), dtype=np.float32)
    rows = np.repeat(np.arange(X.shape[0]), lengths)
    cols = np.arange(X.nnz) - np.repeat(X.indptr[:-1], lengths)
    idx[rows, cols] = X.indices
    val[rows, cols] = X.data
    return idx, val


def torch_fm_curve(split, *, lr, optimizer, batch_size, epochs=TORCH_EPOCHS,
                   n_factors=8, init_scale=0.01, seed=0):
    """Test AUC after each epoch of a PyTorch FM (sparse embeddings; sparse
    Adagrad or SparseAdam), logistic loss, no penalty."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    d = split.X_train.shape[1]
    V = torch.nn.Embedding(d + 1, n_factors, sparse=True, padding_idx=d)
    torch.nn.init.normal_(V.weight, std=init_scale)
    lin = torch.nn.Embedding(d + 1, 1, sparse=True, padding_idx=d)
    torch.nn.init.zeros_(lin.weight)
    with torch.no_grad():
        V.weight[d].zero_()
    bias = torch.zeros(1, requires_grad=True)
    if optimizer == "adagrad":
        opts = [torch.optim.Adagrad([V.weight, lin.weight], lr=lr),
                torch.optim.Adagrad([bias], lr=lr)]
    else:
        opts = [torch.optim.SparseAdam([V.weight, lin.weight], lr=lr),
                torch.optim.Adam([bias], lr=lr)]
    bce = torch.nn.BCEWithLogitsLoss()

    def forward(idx, val):
        e = V(idx) * val.unsqueeze(-1)
        s = e.sum(1)
        return bias + (lin(idx).squeeze(-1) * val).sum(1) + 0.5 * (s * s - (e * e).sum(1)).sum(1)

    tr_i, tr_v = (torch.as_tensor(a) for a in _padded(sp.csr_matrix(split.X_train), d))
    te_i, te_v = (torch.as_tensor(a) for a in _padded(sp.csr_matrix(split.X_test), d))
    y = torch.as_tensor(np.asarray(split.y_train, dtype=np.float32))
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    aucs = []
    for _ in range(epochs):
        perm = torch.as_tensor(rng.permutation(n))
        for a in range(0, n, batch_size):
            rows = perm[a:a + batch_size]
            loss = bce(forward(tr_i[rows], tr_v[rows]), y[rows])
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
        with torch.no_grad():
            z = forward(te_i, te_v).numpy().astype(np.float64)
        aucs.append(float(roc_auc_score(split.y_test, z)) if np.isfinite(z).all() else 0.5)
    return aucs


def run_torch(args, log):
    """The PyTorch FM over its grid on the small sets: the best AUC of any
    setting at any epoch (the peer tuned on the test set: its upper bound)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        log("torch is not installed: the PyTorch FM peer is skipped")
        return
    path = Path(args.out) / "torch.jsonl"
    done = _done(path)
    for name in _names(args, TORCH_SETS):
        split = load_set(name, args.size, args.data_root)
        if split is None:
            continue
        for lr in TORCH_RATES:
            for opt in TORCH_OPTIMIZERS:
                for bs in TORCH_BATCHES:
                    key = f"torch_fm:{opt},lr={lr},batch={bs}"
                    if (name, key) in done:
                        continue
                    t0 = time.perf_counter()
                    aucs = torch_fm_curve(split, lr=lr, optimizer=opt, batch_size=bs,
                                          epochs=3 if args.size == "tiny" else TORCH_EPOCHS)
                    _append(path, dict(set=name, task="binary", key=key, aucs=aucs,
                                       seconds=time.perf_counter() - t0))
                    log(f"{name} {key}: best AUC {max(aucs):.4f} at epoch "
                        f"{int(np.argmax(aucs)) + 1}")


# --------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------
def _fmt(v, nd=4):
    return "–" if v is None else f"{v:.{nd}f}"


def grid_table(records, policy, sets, top=12):
    """Markdown: the settings of least mean regret on ``sets``, best first,
    with their regret per set."""
    table = regrets([r for r in records if r["set"] in sets], policy)
    rows = [(float(np.mean([v[s] for s in sets])), k, v) for k, v in table.items()
            if all(s in v for s in sets)]
    rows.sort()
    head = "| setting | mean regret | " + " | ".join(sets) + " |\n"
    head += "|---|---|" + "---|" * len(sets) + "\n"
    body = "".join(
        f"| `{k}` | {m:.4f} | " + " | ".join(f"{v[s]:.4f}" for s in sets) + " |\n"
        for m, k, v in rows[:top])
    return head + body


def policy_table(records, key, sets, policies):
    """Markdown: one setting's regret per set under each stopping policy."""
    rows = []
    for pol in policies:
        reg = regrets(records, pol)[key]
        rows.append(f"| {pol[0]} {pol[1]} | {np.mean([reg[s] for s in sets]):.4f} | "
                    + " | ".join(f"{reg[s]:.4f}" for s in sets) + " |\n")
    return ("| epochs | mean regret | " + " | ".join(sets) + " |\n|---|---|"
            + "---|" * len(sets) + "\n" + "".join(rows))


def confirm_table(confirm, baselines, grid, torch_recs=()):
    """Markdown: per set, our defaults beside scikit-learn's LogisticRegression
    (default C, best C) and the lbfgs optimum's logloss."""
    by = {}
    for r in confirm:
        by.setdefault(r["set"], {})[r["key"]] = r
    base = {}
    for r in baselines:
        base.setdefault(r["set"], []).append(r)
    peer = {}
    for r in torch_recs:
        peer[r["set"]] = max(peer.get(r["set"], 0.0), max(r["aucs"]))
    lines = ["| set | half | FM AUC (epochs) | LR adagrad AUC | LR lbfgs AUC | "
             "sk LR() AUC | sk LR best-C AUC | torch FM best AUC | FM − sk LR() | "
             "adagrad logloss − best-C logloss | FM − LR (lbfgs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    reg_lines = ["| set | half | FM regressor RMSE (epochs) | Ridge best RMSE |",
                 "|---|---|---|---|"]
    for name in SETS:
        if name not in by:
            continue
        half = "choose" if name in CHOOSE else "confirm"
        d, b = by[name], base.get(name, [])
        if task_of(name) == "regression":
            f = d.get("fm_reg")
            rb = min((r["rmse"] for r in b), default=None)
            reg_lines.append(f"| {name} | {half} | {_fmt(f['rmse'] if f else None)} "
                             f"({f['n_iter'] if f else '–'}) | {_fmt(rb)} |")
            continue
        f, la, ll = d.get("fm"), d.get("lr_adagrad"), d.get("lr_lbfgs")
        skd = next((r for r in b if r["key"] == "sk_lr:default"), None)
        grid_b = [r for r in b if r["key"] != "sk_lr:default"]
        best_auc = max((r["auc"] for r in grid_b), default=None)
        best_ll = min((r["logloss"] for r in grid_b), default=None)
        lines.append(
            f"| {name} | {half} | {_fmt(f['auc'] if f else None)} "
            f"({f['n_iter'] if f else '–'}) | {_fmt(la['auc'] if la else None)} | "
            f"{_fmt(ll['auc'] if ll else None)} | {_fmt(skd['auc'] if skd else None)} | "
            f"{_fmt(best_auc)} | {_fmt(peer.get(name))} | "
            f"{_fmt(f['auc'] - skd['auc'] if f and skd else None)} | "
            f"{_fmt(la['logloss'] - best_ll if la and best_ll is not None else None)} | "
            f"{_fmt(f['auc'] - ll['auc'] if f and ll else None)} |")
    return "\n".join(lines) + "\n\n" + "\n".join(reg_lines) + "\n"


def targets_table(confirm, baselines, torch_recs=()):
    """Markdown: the issue's targets, checked set by set where the CPU can
    check them (pass / fail with the margin)."""
    by = {}
    for r in confirm:
        by.setdefault(r["set"], {})[r["key"]] = r
    base = {}
    for r in baselines:
        base.setdefault(r["set"], {})[r["key"]] = r
    peer = {}
    for r in torch_recs:
        peer[r["set"]] = max(peer.get(r["set"], 0.0), max(r["aucs"]))
    rows = []

    def add(target, name, margin, ok):
        rows.append(f"| {target} | {name} | {margin:+.4f} | {'yes' if ok else 'no'} |")

    for name in SETS:
        d, b = by.get(name, {}), base.get(name, {})
        if task_of(name) == "binary" and "fm" in d and "sk_lr:default" in b:
            m = d["fm"]["auc"] - b["sk_lr:default"]["auc"]
            add("FM AUC ≥ LogisticRegression() − 0.002", name, m, m >= -0.002)
    for name in SETS:
        d = by.get(name, {})
        if name in peer and "fm" in d:
            m = d["fm"]["auc"] - peer[name]
            add("FM AUC ≥ tuned PyTorch FM − 0.002", name, m, m >= -0.002)
    for name in SETS:
        d = by.get(name, {})
        if name in SYNTHETIC and SYNTHETIC[name]["model"] == "fm" and "fm" in d \
                and "lr_lbfgs" in d:
            m = d["fm"]["auc"] - d["lr_lbfgs"]["auc"]
            add("FM AUC − LR AUC ≥ 0.02 (both defaults)", name, m, m >= 0.02)
    for name in REAL_REGRESSION:
        d = by.get(name, {})
        if "fm_reg" in d:
            m = d["fm_reg"]["rmse"] - 0.91
            add("FM regressor RMSE ≤ 0.91", name, m, m <= 0)
    for name in SETS:
        d, b = by.get(name, {}), base.get(name, {})
        lls = [r["logloss"] for k, r in b.items() if k.startswith("sk_lr:")
               and k != "sk_lr:default"]
        if "lr_adagrad" in d and lls:
            m = d["lr_adagrad"]["logloss"] - min(lls)
            add("adagrad LR logloss ≤ best-C lbfgs + 0.002", name, m, m <= 0.002)
    for name in SETS:
        d = by.get(name, {})
        if "lr_adagrad" in d and "lr_lbfgs" in d:
            m = d["lr_adagrad"]["logloss"] - d["lr_lbfgs"]["logloss"]
            add("(same C = 1) adagrad LR logloss ≤ lbfgs + 0.002", name, m, m <= 0.002)
    return ("| target | set | margin | holds |\n|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def run_report(args, log):
    out = Path(args.out)
    grid, base, conf, peer = (_read(out / "grid.jsonl"), _read(out / "baselines.jsonl"),
                              _read(out / "confirm.jsonl"), _read(out / "torch.jsonl"))
    parts = []
    for task, model in (("binary", "fm"), ("regression", "fm"), ("binary", "lr")):
        recs = [r for r in grid if r["task"] == task and r["model"] == model]
        sets = sorted({r["set"] for r in recs})
        if not recs:
            continue
        parts.append(f"### {model.upper()} ({task}), choosing half, "
                     "early_stopping='auto' epochs\n\n"
                     + grid_table(recs, ("auto", 100), sets))
        key = choose(recs, ("auto", 100), sets)
        pols = [("es", 5), ("es", 2), ("fixed", 1), ("fixed", 2), ("fixed", 3),
                ("fixed", 5), ("fixed", 10), ("tol", 100)]
        parts.append(f"### Epochs of `{key}`\n\n" + policy_table(recs, key, sets, pols))
        now = Setting("fm", tuple(sorted(DEFAULT_FM.items()))).key
        if model == "fm" and now != key and all(
                any(r["key"] == now and r["set"] == s for r in recs) for s in sets):
            parts.append(f"### Epochs of the defaults `{now}`\n\n"
                         + policy_table(recs, now, sets, pols))
        old = Setting("fm", tuple(sorted(OLD_FM.items()))).key
        if model == "fm" and any(r["key"] == old for r in recs):
            parts.append(f"### Old defaults `{old}`\n\n"
                         + policy_table(recs, old, sets, [("tol", 100), ("fixed", 1)]))
    if conf:
        parts.append("### The defaults on every set\n\n" + confirm_table(conf, base, grid, peer))
        parts.append("### The targets\n\n" + targets_table(conf, base, peer))
    text = "\n\n".join(parts)
    (out / "report.md").write_text(text)
    log(text)


def _names(args, default):
    """The sets of ``default`` that ``--sets`` selects, in ``default``'s order."""
    names = {"all": SETS, "choose": CHOOSE, "confirm": CONFIRM}.get(
        args.sets, tuple(args.sets.split(",")))
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise SystemExit(f"unknown set(s) {unknown}; known: {', '.join(SETS)}")
    return [n for n in default if n in names]


STAGES = {"grid": run_grid, "baselines": run_baselines, "confirm": run_confirm,
          "torch": run_torch, "report": run_report}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.defaults_study",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="all",
                   help="grid, baselines, confirm, torch, report (comma-separated), "
                        "or all of them in that order")
    p.add_argument("--sets", default="all",
                   help="all, choose, confirm, or comma-separated names")
    p.add_argument("--size", default="full", choices=("full", "tiny"))
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "defaults_study"),
                   help="folder of the records (*.jsonl: a rerun skips what is "
                        "there) and report.md")
    p.add_argument("--data-root", default=None)
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)

    stages = list(STAGES) if args.stage == "all" else args.stage.split(",")
    for s in stages:
        if s not in STAGES:
            raise SystemExit(f"unknown stage {s!r}; known: {', '.join(STAGES)}")
        STAGES[s](args, log)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
