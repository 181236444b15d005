"""The benchmark suite of issue 4, in one command.

On the GPU machine (the default when cupy sees a GPU)::

    PYTHONPATH=. python benchmarks/run_all.py --gpu --out benchmarks/results/suite

On a CPU (a small variant; every GPU-only system is recorded as not
available instead of run)::

    PYTHONPATH=. python benchmarks/run_all.py --cpu
    PYTHONPATH=. python benchmarks/run_all.py --cpu --smoke   # seconds; the test

Parts (``--parts``, all by default; ``env`` always runs):

``floors``
    The measured device copy bandwidth (bytes read + written per second) and
    the pinned host->device rate; per dataset the floor of an epoch, one read
    of its CSR bytes at that bandwidth.  On the CPU: a numpy copy.
``systems``
    Side by side on the Criteo-like synthetic data: this project's kernels
    through the backend (LR adagrad / sgd, FM adagrad: per-epoch time, test
    metrics after every epoch) and its estimators (end-to-end ``fit`` time,
    LR adagrad / sgd / lbfgs, FM classifier; the FM regressor on the
    regression twin), scikit-learn ``LogisticRegression``, ``SGDClassifier``
    and ``Ridge`` (CPU, on at most ``sk_rows`` rows; ``SGDClassifier`` on
    ``sgd_rows``), a PyTorch
    ``EmbeddingBag`` LR and FM, and the CuPy cuSPARSE mini-batch baseline
    (timed over a capped number of batches and scaled to an epoch).
``real``
    The same systems on every real dataset of ``../shared/data`` that is
    present (``$SKLEARN_CUWIDE_DATA`` overrides the place).
``ablation``
    As in the cuWide paper, LR and FM: the classic schema (per-sample pull /
    push) against the flow-based kernel, then each optimisation off in turn
    (2D partition, hot-feature caching, cross-stage caching, replication,
    multi-stream upload).
``scaling``
    Epoch time against rows, features and ``n_factors`` (log-log plots; the
    slope of the rows curve is fitted and reported).

Output in ``--out``: ``results.json``, ``results.md`` and three PNG plots
(``systems.png``, ``ablation.png``, ``scaling.png``; ``benchmarks/plots.py``
redraws them from ``results.json``).  A short table is printed last.

Every system runs inside a guard: an exception (a missing package, a kernel
that does not exist yet, running out of memory) is recorded in the JSON under
``error`` and the run goes on.  A time budget (``--budget-s``) skips what
would start after it and says so.
"""

import argparse
import dataclasses
import inspect
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from plots import busy_grid  # noqa: E402

PARTS = ("floors", "systems", "real", "ablation", "scaling")
SKIPPABLE = ("kernel", "estimators", "lbfgs", "sgd", "sklearn", "torch", "cusparse",
             "classic", "regression", "plots")

#: sizes and settings of the three variants
CONFIGS = {
    "gpu": dict(
        systems_data=[(4_000_000, 22)],
        test_rows=400_000,
        n_factors=16,
        epochs=3,
        sk_rows=250_000,  # LogisticRegression (and our lbfgs beside it), Ridge
        sgd_rows=1_000_000,  # SGDClassifier
        reg_rows=1_000_000,
        cusparse_batches=400,
        real_epochs=10,
        real_max_rows=None,
        real_datasets=None,
        ablation_data=(4_000_000, 22),
        scale_rows=[1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000],
        scale_rows_features=22,
        scale_features=[20, 22, 24, 26],
        scale_features_rows=1_000_000,
        scale_factors=[4, 16, 64, 128],
        scale_factors_data=(1_000_000, 22),
        scale_epochs=3,
        fm_l2=(1e-7, 1e-6),
        budget_s=420.0,
        sk_workers=3,
        estimates={"env": 3, "floors": 8, "systems": 170, "real": 40,
                   "ablation": 50, "scaling": 160, "finish": 10},
    ),
    "cpu": dict(
        systems_data=[(100_000, 18)],
        test_rows=20_000,
        n_factors=16,
        epochs=3,
        sk_rows=100_000,
        sgd_rows=100_000,
        reg_rows=50_000,
        cusparse_batches=50,
        real_epochs=5,
        real_max_rows=None,
        real_datasets=None,
        ablation_data=(50_000, 18),
        scale_rows=[50_000, 100_000, 200_000],
        scale_rows_features=18,
        scale_features=[16, 18, 20],
        scale_features_rows=50_000,
        scale_factors=[4, 16, 64],
        scale_factors_data=(50_000, 18),
        scale_epochs=2,
        fm_l2=(3e-4, 3e-4),
        budget_s=1800.0,
        sk_workers=0,
        estimates={"env": 1, "floors": 2, "systems": 60, "real": 60,
                   "ablation": 30, "scaling": 60, "finish": 5},
    ),
    "smoke": dict(
        systems_data=[(4_000, 12)],
        test_rows=1_000,
        n_factors=4,
        epochs=2,
        sk_rows=3_000,
        sgd_rows=3_000,
        reg_rows=2_000,
        cusparse_batches=3,
        real_epochs=2,
        real_max_rows=2_000,
        real_datasets=["criteo_xlearn_ffm", "movielens_100k"],
        ablation_data=(3_000, 12),
        scale_rows=[1_000, 2_000, 4_000],
        scale_rows_features=12,
        scale_features=[10, 12],
        scale_features_rows=2_000,
        scale_factors=[2, 4],
        scale_factors_data=(2_000, 12),
        scale_epochs=1,
        fm_l2=(3e-4, 3e-4),
        budget_s=600.0,
        sk_workers=0,
        estimates={"env": 1, "floors": 1, "systems": 10, "real": 5,
                   "ablation": 5, "scaling": 5, "finish": 2},
    ),
}

#: fixed settings of every run
BATCH = 1024
LEARNING_RATE = 0.05
INIT_SCALE = 0.01
C_LR = 0.1  # inverse L2 strength of every logistic regression (as sklearn's C)
#: lbfgs (ours and scikit-learn's): converged, not capped, on the Criteo-like
#: data (scikit-learn stops after ~130 iterations at 1e-5 on 100k x 2^18)
LBFGS_TOL = 1e-5
LBFGS_MAX_ITER = 300
RIDGE_ALPHA = 1.0
TARGET_SLACK = 1.01  # target logloss = sklearn LR's test logloss * this
WARM_ROWS = 4096


def log(*a):
    print(*a, flush=True)


class NotAvailable(Exception):
    """A system that cannot run here (no GPU, no package, no kernel)."""


class Skipped(Exception):
    """A system that does not apply to this data."""


def _err(exc):
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def guarded(label, fn, *a, **kw):
    """Run ``fn``; on an exception return a record that says what happened."""
    t0 = time.perf_counter()
    try:
        out = fn(*a, **kw)
    except NotAvailable as exc:
        out = {"error": f"not available: {exc}"}
    except Skipped as exc:
        out = {"skipped": str(exc)}
    except Exception as exc:  # recorded, the run goes on
        out = {"error": _err(exc), "traceback": traceback.format_exc()[-2000:]}
        log(f"    ! {label}: {out['error']}")
    out.setdefault("wall_s", time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------
def metrics(task, y, z):
    """Test metrics from decision values ``z`` (log-odds, or predictions)."""
    z = np.asarray(z, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if task == "regression":
        return {"test_rmse": float(np.sqrt(np.mean((z - y) ** 2)))}
    from sklearn.metrics import roc_auc_score

    out = {"test_logloss": float(np.mean(np.logaddexp(0.0, z) - y * z))}
    out["test_auc"] = float(roc_auc_score(y, z)) if 0 < y.sum() < y.size else math.nan
    return out


def logit_prior(y):
    p = min(max(float(np.mean(y)), 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def time_to_target(curve, target):
    """First cumulative time at which the test logloss is at most ``target``."""
    if target is None or not curve:
        return None
    for pt in curve:
        lo = pt.get("test_logloss")
        if lo is not None and lo <= target:
            return float(pt["time_s"])
    return math.inf


def loglog_slope(xs, ys):
    """Slope and R^2 of log(y) against log(x)."""
    x = np.log(np.asarray(xs, dtype=np.float64))
    y = np.log(np.asarray(ys, dtype=np.float64))
    if x.size < 2 or not np.all(np.isfinite(y)):
        return None
    slope, icpt = np.polyfit(x, y, 1)
    pred = slope * x + icpt
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"slope": float(slope), "r2": r2}


# --------------------------------------------------------------------------
# scikit-learn jobs (in this process, or in worker processes beside the GPU)
# --------------------------------------------------------------------------
def sklearn_job(spec):
    """Fit one scikit-learn model; returns a plain dict (picklable)."""
    warnings.simplefilter("ignore")
    kind = spec["kind"]
    X, y, Xt, yt = spec["X"], spec["y"], spec["Xt"], spec["yt"]
    out = {"rows": int(X.shape[0]), "device": "cpu"}
    t_start = time.perf_counter()
    try:
        if kind == "lr":
            from sklearn.linear_model import LogisticRegression

            m = LogisticRegression(C=spec["C"], tol=spec["tol"], max_iter=spec["max_iter"])
            t0 = time.perf_counter()
            m.fit(X, y)
            out["fit_s"] = time.perf_counter() - t0
            out["n_iter"] = int(np.max(m.n_iter_))
            out.update(metrics("binary", yt, m.decision_function(Xt)))
            out["curve"] = [dict(epoch=None, time_s=out["fit_s"],
                                 test_logloss=out["test_logloss"], test_auc=out["test_auc"])]
            out["coef"] = np.asarray(m.coef_, dtype=np.float64).ravel()
        elif kind == "sgd":
            from sklearn.linear_model import SGDClassifier

            m = SGDClassifier(loss="log_loss", alpha=1.0 / (spec["C"] * X.shape[0]),
                              tol=None, random_state=spec["seed"])
            curve, times, total = [], [], 0.0
            for ep in range(spec["epochs"]):
                t0 = time.perf_counter()
                m.partial_fit(X, y, classes=np.array([0, 1]))
                dt = time.perf_counter() - t0
                times.append(dt * 1e3)
                total += dt
                curve.append(dict(epoch=ep + 1, time_s=total,
                                  **metrics("binary", yt, m.decision_function(Xt))))
            out["epoch_ms_list"] = times
            out["epoch_ms"] = float(np.median(times))
            out["fit_s"] = total
            out["curve"] = curve
            out.update({k: v for k, v in curve[-1].items() if k.startswith("test_")})
        elif kind == "ridge":
            from sklearn.linear_model import Ridge

            m = Ridge(alpha=spec["alpha"])
            t0 = time.perf_counter()
            m.fit(X, y)
            out["fit_s"] = time.perf_counter() - t0
            out.update(metrics("regression", yt, m.predict(Xt)))
        else:
            raise ValueError(f"unknown sklearn job {kind!r}")
    except Exception as exc:
        out["error"] = _err(exc)
        out["traceback"] = traceback.format_exc()[-2000:]
    out["wall_s"] = time.perf_counter() - t_start
    return out


class Jobs:
    """scikit-learn fits, run at once (``workers=0``) or in worker processes
    (spawned, so no GPU state is inherited) while the GPU parts run."""

    def __init__(self, workers):
        self.pool = None
        self.error = None
        self.cache = {}
        if workers > 0:
            try:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor

                self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
            except Exception as exc:  # fall back to running them here
                self.error = _err(exc)
                self.pool = None

    def submit(self, spec, key=None):
        """Start a job; ``key``: jobs with the same key (the same rows of the
        same data) run once and share the result."""
        if key is not None and key in self.cache:
            return self.cache[key]
        handle = None
        if self.pool is not None:
            try:
                handle = ("future", self.pool.submit(sklearn_job, spec), spec)
            except Exception as exc:
                self.error = _err(exc)
        if handle is None:
            handle = ("done", sklearn_job(spec), None)
        if key is not None:
            self.cache[key] = handle
        return handle

    def result(self, handle, timeout):
        kind, v, spec = handle
        if kind == "done":
            return dict(v)
        try:
            return dict(v.result(timeout=max(timeout, 0.0)))
        except Exception as exc:
            if type(exc).__name__ == "TimeoutError":
                return {"error": f"did not finish within the time budget ({_err(exc)})"}
            # a broken worker process: run it here instead
            out = sklearn_job(spec)
            out["note"] = f"worker process failed ({_err(exc)}); ran in the main process"
            return out

    def close(self, kill=False):
        if self.pool is None:
            return
        if kill:  # end the worker processes this run started, one by one
            for p in list(getattr(self.pool, "_processes", {}).values()):
                try:
                    p.terminate()
                except Exception:
                    pass
        self.pool.shutdown(wait=not kill, cancel_futures=True)


# --------------------------------------------------------------------------
# the run context: backend, timing, memory, caches
# --------------------------------------------------------------------------
class Ctx:
    def __init__(self, gpu, cfg, args):
        from sklearn_cuwide._backends import get_backend

        self.gpu = gpu
        self.cfg = cfg
        self.args = args
        self.device = "cuda:0" if gpu else "cpu"
        self.be = get_backend(self.device)
        self.xp = self.be.xp
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + float(args.budget_s)
        self.skip = set(args.skip)
        self.compile_s = {}
        self.layouts = OrderedDict()
        self.layout_nnz_cap = (1 << 31) if gpu else (1 << 26)
        self.tests = {}
        self.warmed = set()
        self.notes = []
        self.dead = None  # set when the CUDA context failed (a sticky error)

    # -- time and budget --
    def sync(self):
        self.be.synchronize()

    def timed(self, fn):
        """(seconds, result) of ``fn()``, the device synchronised around it."""
        self.sync()
        t0 = time.perf_counter()
        r = fn()
        self.sync()
        return time.perf_counter() - t0, r

    def left(self):
        return self.deadline - time.perf_counter()

    def check_budget(self):
        if self.dead:
            raise Skipped(f"the device failed earlier ({self.dead})")
        if self.left() <= 0:
            raise Skipped(f"time budget of {self.args.budget_s:.0f} s used up")

    def run(self, label, fn, *a, **kw):
        """``guarded``; after a failure, check that the device still works
        (a kernel fault leaves the CUDA context unusable: what follows on
        the GPU is then skipped and says why)."""
        rec = guarded(label, fn, *a, **kw)
        if "error" in rec and self.gpu and not self.dead:
            try:
                self.sync()  # raises once the context has a sticky error
            except Exception as exc:
                self.dead = f"after {label}: {_err(exc)}"
                self.notes.append(f"The CUDA context failed {self.dead}; the GPU work after it "
                                  "was skipped.")
                log(f"  !!! the device failed ({self.dead}); skipping further GPU work")
        return rec

    def skipped(self, *tags):
        return any(t in self.skip for t in tags)

    # -- GPU memory (cupy's pool around a fit; None on the CPU) --
    def mem_begin(self):
        if not self.gpu:
            return None
        import cupy as cp

        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        return int(pool.total_bytes())

    def mem_peak(self, token):
        if token is None:
            return None
        import cupy as cp

        return int(cp.get_default_memory_pool().total_bytes() - token)

    def gpu_opts(self, opts):
        """Options only the CUDA backend's run_epoch takes (dropped on the CPU)."""
        return dict(opts or {}) if self.gpu else {}

    def first_opts(self, params):
        """The concurrency warm-up of a fresh model's first epoch (as the
        estimators do on the GPU)."""
        if self.gpu and hasattr(self.be, "default_ramp"):
            return {"ramp": self.be.default_ramp(params)}
        return {}

    # -- layouts (cached; evicted oldest first past a nonzero cap) --
    def layout(self, data, batch, sample_block, n_hot_max, seed=0):
        key = (data.key, batch, sample_block, n_hot_max, seed)
        hit = self.layouts.get(key)
        if hit is not None:
            self.layouts.move_to_end(key)
            return hit
        def held():
            return sum(L.nnz for L, _ in self.layouts.values())

        while self.layouts and held() + data.X.nnz > self.layout_nnz_cap:
            self.layouts.popitem(last=False)
        t, L = self.timed(lambda: self.be.build_layout(
            data.X, batch_size=batch, sample_block=sample_block, n_hot_max=n_hot_max,
            shuffle=True, random_state=seed, dtype=np.float32))
        self.layouts[key] = (L, t)
        return L, t

    def layout_cached(self, data, batch, sample_block, n_hot_max, seed=0):
        return (data.key, batch, sample_block, n_hot_max, seed) in self.layouts

    def drop_layouts(self, data_key=None):
        """Forget cached layouts and test matrices (of one dataset, or all)."""
        for cache in (self.layouts, self.tests):
            for key in [k for k in cache if data_key is None or k[0] == data_key]:
                del cache[key]
        if self.gpu:
            import cupy as cp

            cp.get_default_memory_pool().free_all_blocks()

    def test_matrix(self, data, feature_rank=None):
        """The test matrix on the device, its columns renumbered into a
        layout's feature order when ``feature_rank`` is given."""
        key = (data.key, feature_rank is not None)
        hit = self.tests.get(key)
        if hit is not None and (feature_rank is None or np.array_equal(hit[0], feature_rank)):
            return hit[1]
        import scipy.sparse as sp

        Xt = data.Xt
        if feature_rank is not None:
            # new arrays: sorting the renumbered rows moves their values, and
            # data.Xt (which every other system predicts) must keep its own
            idx = np.asarray(feature_rank)[Xt.indices].astype(Xt.indices.dtype)
            Xt = sp.csr_matrix((Xt.data.copy(), idx, Xt.indptr.copy()), shape=Xt.shape)
            Xt.sort_indices()
        dev = self.be.put_csr(Xt)
        self.tests[key] = (None if feature_rank is None else np.asarray(feature_rank), dev)
        return dev


@dataclasses.dataclass
class Data:
    key: str
    task: str  # "binary" or "regression"
    X: object
    y: np.ndarray
    Xt: object
    yt: np.ndarray
    source: str = "synthetic"
    base: str = None  # the generated array this is a row prefix of

    @property
    def n(self):
        return int(self.X.shape[0])

    @property
    def d(self):
        return int(self.X.shape[1])


def csr_bytes(X):
    return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)


def _csr_rows(X, a, b):
    """Rows ``a:b`` of a CSR matrix as views of its arrays (no copy of the
    nonzeros)."""
    import scipy.sparse as sp

    ip = X.indptr
    s, e = int(ip[a]), int(ip[b])
    indptr = ip[a : b + 1] - ip[a] if a else ip[: b + 1]
    return sp.csr_matrix((X.data[s:e], X.indices[s:e], indptr), shape=(b - a, X.shape[1]),
                         copy=False)


class DataPool:
    """Synthetic datasets, generated once per (task, n_features) at the
    largest size any selected part asks for; smaller sizes are row prefixes.
    The test rows (when asked for) are the rows after the largest prefix,
    the same for every size."""

    def __init__(self, test_rows, seed=0):
        self.test_rows = test_rows
        self.seed = seed
        self.need = {}
        self.full = {}
        self.generated = {}

    def plan(self, task, log2_features, rows, test=True):
        k = (task, int(log2_features))
        r, t = self.need.get(k, (0, False))
        self.need[k] = (max(r, int(rows)), t or test)

    def get(self, task, log2_features, rows, test=True):
        k = (task, int(log2_features))
        if k not in self.full or self.full[k][2] < rows or (test and not self.full[k][3]):
            self.plan(task, log2_features, rows, test)
            n_train, want_test = self.need[k]
            n_test = self.test_rows if want_test else 0
            from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

            gen = make_ctr_classification if task == "binary" else make_ctr_regression
            t0 = time.perf_counter()
            X, y = gen(n_samples=n_train + n_test, n_features=2 ** int(log2_features),
                       model="fm", random_state=self.seed)
            dt = time.perf_counter() - t0
            self.full[k] = (X, y, n_train, want_test)
            self.generated[f"{task} {n_train + n_test}x2^{log2_features}"] = dt
            log(f"  data: {gen.__name__}({n_train + n_test:,} x 2^{log2_features}, model='fm') "
                f"{dt:.1f} s")
        X, y, n_train, has_test = self.full[k]
        Xtr = _csr_rows(X, 0, rows)
        if has_test:
            Xt, yt = _csr_rows(X, n_train, X.shape[0]), y[n_train:]
        else:
            Xt, yt = _csr_rows(X, 0, 0), y[:0]
        name = "ctr" if task == "binary" else "ctr-regression"
        return Data(f"{name} {rows}x2^{log2_features}", task, Xtr, y[:rows], Xt, yt,
                    base=f"{task} {n_train}+{X.shape[0] - n_train}x2^{log2_features}")

    def tiled(self, task, log2_features, rows, base_rows):
        """``rows`` training rows (no test rows) made of the first ``base_rows``
        rows repeated: for timing epochs beyond what the host can generate in
        a session (an epoch's time depends on the nonzeros and the features'
        popularity, which repeating keeps; the layout shuffles the rows)."""
        import scipy.sparse as sp

        base = self.get(task, log2_features, base_rows, test=False)
        key = ("tiled", task, int(log2_features), int(base_rows))
        have = self.full.get(key)
        if have is None or have.shape[0] < rows:
            B = base.X
            reps = -(-int(rows) // B.shape[0])
            t0 = time.perf_counter()
            ip = B.indptr.astype(np.int64)
            nnz = int(ip[-1])
            indptr = np.concatenate([ip[:-1] + i * nnz for i in range(reps)]
                                    + [np.array([reps * nnz], dtype=np.int64)])
            # past 2^31 nonzeros scipy wants int64 indices: tile them as int64
            # (no int32 copy to upcast: 128M rows peak at ~60 GB, not ~80)
            idx = B.indices.astype(np.int64) if reps * nnz > np.iinfo(np.int32).max \
                else B.indices
            T = sp.csr_matrix((np.tile(B.data, reps), np.tile(idx, reps), indptr),
                              shape=(B.shape[0] * reps, B.shape[1]), copy=False)
            self.full[key] = have = T
            self.generated[f"{task} {T.shape[0]}x2^{log2_features} (tiled)"] = \
                time.perf_counter() - t0
            log(f"  data: {base_rows:,} rows x {reps} tiled to {T.shape[0]:,} rows "
                f"{time.perf_counter() - t0:.1f} s")
        name = "ctr" if task == "binary" else "ctr-regression"
        y = np.resize(base.y, rows)
        return Data(f"{name} {rows}x2^{log2_features} (tiled from {base_rows})", task,
                    _csr_rows(have, 0, rows), y, _csr_rows(have, 0, 0), y[:0],
                    base=f"{task} tiled {base_rows}x2^{log2_features}")


# --------------------------------------------------------------------------
# this project: kernels through the backend
# --------------------------------------------------------------------------
def make_params(model, k, solver, loss, lr, l2_w, l2_v, scale_penalty=None):
    from sklearn_cuwide._state import StepParams

    # as the estimators: logistic regression's penalty is C's full objective's
    # per epoch (penalty_scaled), the FM's libFM's per-step one unless asked
    # (GPUFactorizationMachine(scale_penalty=True))
    return StepParams(model="fm" if k else "linear", loss=loss, solver=solver,
                      learning_rate=lr, l2_w=l2_w, l2_v=l2_v if k else 0.0,
                      penalty_scaled=(not k) if scale_penalty is None else bool(scale_penalty))


def fresh_state(ctx, n_features, k, adagrad, b0, seed=0):
    """A new model in layout order on the backend's device (the factors are
    i.i.d., so no permutation is needed)."""
    from sklearn_cuwide._state import ModelState

    xp = ctx.xp
    f32 = np.float32
    w = xp.zeros((n_features, 1), dtype=f32)
    b = xp.full((1,), b0, dtype=f32)
    V = None
    if k:
        try:
            V = xp.random.default_rng(seed).standard_normal((n_features, k), dtype=f32)
        except Exception:  # an older cupy without Generator.standard_normal(dtype=)
            V = xp.random.RandomState(seed).standard_normal((n_features, k)).astype(f32)
        V *= f32(INIT_SCALE)
    st = ModelState(w=w, b=b, V=V)
    if adagrad:
        st.gw = xp.zeros_like(w)
        st.gb = xp.zeros_like(b)
        st.gV = None if V is None else xp.zeros_like(V)
    return st


def host_layout(ctx, L):
    """The same layout with its nonzeros in host memory."""
    be = ctx.be
    return dataclasses.replace(L, feat=be.to_host(L.feat), row=be.to_host(L.row),
                               val=be.to_host(L.val))


def device_layout(ctx, L):
    """The same layout with its nonzeros copied to the device at once
    (``put_layout`` then treats it as resident: no streaming)."""
    be = ctx.be
    return dataclasses.replace(L, feat=be.to_device(L.feat), row=be.to_device(L.row),
                               val=be.to_device(L.val))


def warm_kernels(ctx, data, params, k):
    """Compile (NVRTC) the training and predict kernels of a model on a few
    rows, once, so that no timed epoch includes a compilation."""
    key = (params.model, k, params.solver, params.loss)
    if not ctx.gpu or key in ctx.warmed:
        return
    from sklearn_cuwide._solvers import batch_weights

    be = ctx.be
    t0 = time.perf_counter()
    n = min(data.n, WARM_ROWS)
    sub = Data(data.key + " warm", data.task, _csr_rows(data.X, 0, n), data.y[:n],
               data.Xt, data.yt)
    sb, nh = be.tile_shape(params, 1, k, BATCH)
    L = be.build_layout(sub.X, batch_size=BATCH, sample_block=sb, n_hot_max=nh,
                        shuffle=True, random_state=0, dtype=np.float32)
    dl = be.put_layout(L)
    st = fresh_state(ctx, data.d, k, params.solver == "adagrad", 0.0)
    y = be.to_device(sub.y[L.row_order].astype(np.float32))
    sw = be.to_device(np.ones(L.n_rows, dtype=np.float32))
    bw = batch_weights(L, np.ones(L.n_rows))
    order = np.arange(L.n_batches)
    be.run_epoch(dl, y, sw, bw, st, params, order, **ctx.first_opts(params))
    be.run_epoch(dl, y, sw, bw, st, params, order)
    # every thread-block-cluster variant a timed run may launch (the CUDA
    # backend picks one per number of workers: the warm-up's few rows use
    # clusters, the full grid plain blocks)
    for cl in (be.cluster_sizes() if hasattr(be, "cluster_sizes") else ()):
        be.run_epoch(dl, y, sw, bw, st, params, order, grid=1, cluster=cl)
    Xp = be.put_csr(_csr_rows(data.X, 0, min(n, 64)))
    be.decision_function(Xp, st.w, st.b, st.V)
    ctx.sync()
    ctx.warmed.add(key)
    ctx.compile_s[f"kernel {key}"] = time.perf_counter() - t0


def run_kernel(ctx, data, *, k, solver="adagrad", loss="logistic", lr=LEARNING_RATE,
               l2_w=0.0, l2_v=0.0, epochs, sample_block=None, n_hot_max=None, opts=None,
               upload=None, evaluate=True, seed=0, concurrency=None, scale_penalty=None):
    """Epochs of this project's flow-based kernel through the backend.

    ``scale_penalty``: the FM's option of that name (None: the estimators'
    default, scaled for logistic regression only).

    ``concurrency``: the estimators' parameter ("auto", "max", an int),
    resolved into thread blocks by the CUDA backend; None runs the backend's
    default grid (the same as "max").  Ignored on the CPU (always in order).

    ``sample_block`` / ``n_hot_max`` override the tile shape (ablation);
    ``opts`` go to every ``run_epoch`` (GPU only: the ablation switches);
    ``upload``: None (the layout as the backend built it), ``"stream"`` (a
    host layout streamed in during the first epoch, which is timed with the
    upload) or ``"sync"`` (copied to the device in full, then the first epoch;
    timed together).
    """
    from sklearn_cuwide._solvers import batch_weights

    ctx.check_budget()
    be = ctx.be
    params = make_params("fm" if k else "linear", k, solver, loss, lr, l2_w, l2_v,
                         scale_penalty)
    warm_kernels(ctx, data, params, k)
    sb, nh = be.tile_shape(params, 1, k, BATCH)
    if sample_block is not None:
        sb = sample_block
    if n_hot_max is not None:
        nh = n_hot_max
    tok = ctx.mem_begin()
    cached = ctx.layout_cached(data, BATCH, sb, nh, seed)
    L, t_layout = ctx.layout(data, BATCH, sb, nh, seed)
    y_l = be.to_device(data.y[L.row_order].astype(np.float32))
    sw_l = be.to_device(np.ones(L.n_rows, dtype=np.float32))
    bw = batch_weights(L, np.ones(L.n_rows))
    b0 = logit_prior(data.y) if loss == "logistic" else float(np.mean(data.y))
    st = fresh_state(ctx, data.d, k, solver == "adagrad", b0, seed)
    Xt = ctx.test_matrix(data, L.feature_rank) if evaluate and data.Xt.shape[0] else None
    rec = {"device": ctx.device, "rows": data.n, "epochs": epochs, "layout_s": t_layout,
           "sample_block": int(L.sample_block), "n_hot": int(L.n_hot),
           "layout_bytes": int(L.nbytes), "learning_rate": lr}
    opts = dict(opts or {})
    if ctx.gpu and concurrency is not None:
        opts["grid"] = be.concurrent_blocks(concurrency, params, L.n_batches)
        rec.update(concurrency=concurrency, blocks=int(opts["grid"]))
    if ctx.gpu and hasattr(be, "cluster_for"):
        # thread blocks per worker (a thread block cluster when > 1)
        g = opts.get("grid") or be.default_grid(L.n_batches)
        rec["cluster"] = int(opts.get("cluster") or be.cluster_for(g))
    if upload is None:
        t_put, dl = ctx.timed(lambda: be.put_layout(L))
        box = {"dl": dl}
    else:
        L_host = host_layout(ctx, L)
        box = {}
        t_put = 0.0
    rng = np.random.default_rng(seed)
    times, curve, losses = [], [], []
    total = t_layout + t_put
    for ep in range(epochs):
        order = rng.permutation(L.n_batches)
        kw = ctx.gpu_opts(opts)
        if ep == 0:
            kw.update(ctx.first_opts(params))

        def one_epoch():
            if "dl" not in box:
                src = L_host if upload == "stream" else device_layout(ctx, L_host)
                box["dl"] = be.put_layout(src)
            return be.run_epoch(box["dl"], y_l, sw_l, bw, st, params, order, **kw)

        dt, lsum = ctx.timed(one_epoch)
        times.append(dt * 1e3)
        losses.append(float(lsum) / L.n_rows)
        total += dt
        pt = {"epoch": ep + 1, "time_s": total, "train_loss": losses[-1]}
        if Xt is not None:
            z = be.to_host(be.decision_function(Xt, st.w, st.b, st.V))[:, 0]
            pt.update(metrics(data.task, data.yt, z))
        curve.append(pt)
    rec["gpu_peak_bytes"] = ctx.mem_peak(tok)
    if rec["gpu_peak_bytes"] is not None and cached and upload is None \
            and not isinstance(L.feat, np.ndarray):
        rec["gpu_peak_bytes"] += int(L.nbytes)  # a cached layout predates the token
    rec["first_epoch_ms"] = times[0]
    rec["epoch_ms_list"] = times
    rec["epoch_ms"] = float(np.median(times[1:])) if len(times) > 1 else times[0]
    rec["setup_s"] = t_layout + t_put
    rec["train_loss"] = losses
    rec["curve"] = curve
    if curve and len(curve[-1]) > 3:
        rec.update({k2: v for k2, v in curve[-1].items() if k2.startswith("test_")})
    return rec


def run_classic(ctx, data, *, k, lr=LEARNING_RATE, l2_w=0.0, l2_v=0.0, epochs, seed=0):
    """The classic schema: per-sample pull/push through global memory,
    straight from CSR (``_cuda.run_epoch_classic``)."""
    ctx.check_budget()
    be = ctx.be
    params = make_params("fm" if k else "linear", k, "adagrad", "logistic", lr, l2_w, l2_v)
    t_put, Xd = ctx.timed(lambda: be.put_csr(data.X, dtype=np.float32))
    y = be.to_device(data.y.astype(np.float32))
    sw = be.to_device(np.ones(data.n, dtype=np.float32))
    st = fresh_state(ctx, data.d, k, True, logit_prior(data.y), seed)
    Xt = ctx.test_matrix(data)
    fn = getattr(be, "run_epoch_classic", None)
    if fn is None:
        raise NotAvailable(f"the {be.name} backend has no run_epoch_classic")
    names = inspect.signature(fn).parameters
    kw = {n: BATCH for n in ("batch_size", "batch") if n in names}
    if ctx.gpu:  # compile first
        t0 = time.perf_counter()
        n = min(data.n, WARM_ROWS)
        ws = fresh_state(ctx, data.d, k, True, 0.0)
        fn(be.put_csr(_csr_rows(data.X, 0, n), dtype=np.float32), y[:n], sw[:n], ws, params,
           np.arange(n), **kw)
        ctx.sync()
        ctx.compile_s[f"classic k={k}"] = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    times, curve, total = [], [], t_put
    for ep in range(epochs):
        order = rng.permutation(data.n)
        dt, lsum = ctx.timed(lambda: fn(Xd, y, sw, st, params, order, **kw))
        times.append(dt * 1e3)
        total += dt
        z = be.to_host(be.decision_function(Xt, st.w, st.b, st.V))[:, 0]
        curve.append({"epoch": ep + 1, "time_s": total, "train_loss": float(lsum) / data.n,
                      **metrics(data.task, data.yt, z)})
    rec = {"device": ctx.device, "rows": data.n, "epochs": epochs, "setup_s": t_put,
           "first_epoch_ms": times[0], "epoch_ms_list": times,
           "epoch_ms": float(np.median(times[1:])) if len(times) > 1 else times[0],
           "curve": curve}
    rec.update({k2: v for k2, v in curve[-1].items() if k2.startswith("test_")})
    return rec


# --------------------------------------------------------------------------
# this project: the estimators, end to end
# --------------------------------------------------------------------------
def run_estimator(ctx, data, make, *, rows=None):
    ctx.check_budget()
    rows = data.n if rows is None else min(rows, data.n)
    X, y = _csr_rows(data.X, 0, rows), data.y[:rows]
    name = type(make()).__name__ + repr(sorted(make().get_params().items()))
    if ctx.gpu and name not in ctx.warmed:  # compile the kernels on a few rows first
        t0 = time.perf_counter()
        n = min(rows, WARM_ROWS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = make()
            if "max_iter" in est.get_params() and est.get_params().get("solver") != "lbfgs":
                est.set_params(max_iter=1)
            est.fit(_csr_rows(X, 0, n), y[:n])
            est.predict(_csr_rows(data.Xt, 0, min(64, data.Xt.shape[0])))
        ctx.warmed.add(name)
        ctx.compile_s[f"estimator {type(est).__name__}"] = time.perf_counter() - t0
    tok = ctx.mem_begin()
    est = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_s, _ = ctx.timed(lambda: est.fit(X, y))
    rec = {"device": str(getattr(est, "device_", ctx.device)), "rows": rows, "fit_s": fit_s,
           "gpu_peak_bytes": ctx.mem_peak(tok)}
    n_iter = getattr(est, "n_iter_", None)
    if n_iter is not None:
        rec["n_iter"] = int(np.max(n_iter))
    if data.Xt.shape[0]:
        z = est.predict(data.Xt) if data.task == "regression" else est.decision_function(data.Xt)
        rec.update(metrics(data.task, data.yt, z))
        if data.task != "regression":
            rec["curve"] = [{"epoch": rec.get("n_iter"), "time_s": fit_s,
                             "test_logloss": rec["test_logloss"], "test_auc": rec["test_auc"]}]
    if hasattr(est, "coef_") and getattr(est, "solver", "") == "lbfgs":
        rec["coef"] = np.asarray(est.coef_, dtype=np.float64).ravel()
    return rec


# --------------------------------------------------------------------------
# GPU-only baselines (thin: baselines.py holds the models)
# --------------------------------------------------------------------------
def run_torch(ctx, data, *, k, epochs, lr=LEARNING_RATE, seed=0):
    ctx.check_budget()
    if not ctx.gpu:
        raise NotAvailable("the PyTorch baseline runs on the GPU only")
    if data.task != "binary":
        raise Skipped("the PyTorch baseline is logistic only")
    lens = np.diff(data.X.indptr)
    if k and lens.size and lens.min() != lens.max():
        raise Skipped("the PyTorch FM baseline needs the same number of nonzeros in every row")
    import torch

    from baselines import TorchWide

    n = min(data.n, WARM_ROWS)
    Xw = _csr_rows(data.X, 0, n)
    m = TorchWide(Xw, n_factors=k, lr=lr, seed=seed)
    m.epoch(m.put(Xw, data.y[:n]), BATCH, range(-(-n // BATCH)))
    m.decision(m.put(_csr_rows(data.Xt, 0, min(64, data.Xt.shape[0]))))
    torch.cuda.synchronize()
    del m
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    m = TorchWide(data.X, n_factors=k, lr=lr, seed=seed)
    train = m.put(data.X, data.y)
    test = m.put(data.Xt)
    torch.cuda.synchronize()
    setup = time.perf_counter() - t0
    nb = -(-data.n // BATCH)
    rng = np.random.default_rng(seed)
    times, curve, total = [], [], setup
    for ep in range(epochs):
        ms = m.timed_epoch(train, BATCH, rng.permutation(nb))
        dt = ms * 1e-3
        times.append(ms)
        total += dt
        curve.append({"epoch": ep + 1, "time_s": total,
                      **metrics(data.task, data.yt, m.decision(test))})
    rec = {"device": "cuda:0", "rows": data.n, "epochs": epochs, "setup_s": setup,
           "first_epoch_ms": times[0], "epoch_ms_list": times,
           "epoch_ms": float(np.median(times[1:])) if len(times) > 1 else times[0],
           "gpu_peak_bytes": int(torch.cuda.max_memory_allocated()), "curve": curve}
    rec.update({k2: v for k2, v in curve[-1].items() if k2.startswith("test_")})
    del m, train, test
    torch.cuda.empty_cache()
    return rec


def run_cusparse(ctx, data, *, k, lr=LEARNING_RATE, max_batches):
    ctx.check_budget()
    if not ctx.gpu:
        raise NotAvailable("the cuSPARSE baseline runs on the GPU only")
    if data.task != "binary":
        raise Skipped("the cuSPARSE baseline is logistic only")
    from baselines import CusparseWide

    nb = -(-data.n // BATCH)
    used = min(nb, int(max_batches))
    rows = min(data.n, used * BATCH)
    tok = ctx.mem_begin()
    m = CusparseWide(_csr_rows(data.X, 0, rows), data.y[:rows], BATCH, n_factors=k, lr=lr)
    m.epoch(range(min(20, used)))  # warm-up (cuSPARSE handles, kernels)
    order = np.random.default_rng(0).permutation(used)
    dt, _ = ctx.timed(lambda: m.epoch(order))
    rec = {"device": "cuda:0", "rows": data.n, "batches_timed": used, "batches_per_epoch": nb,
           "epoch_ms": dt * 1e3 * nb / used, "gpu_peak_bytes": ctx.mem_peak(tok),
           "note": f"timed over {used} of {nb} mini-batches, scaled to an epoch"}
    return rec


# --------------------------------------------------------------------------
# parts
# --------------------------------------------------------------------------
def _version(mod):
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception as exc:
        return f"absent ({type(exc).__name__})"


def part_env(ctx, argv):
    import scipy
    import sklearn

    env = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + list(argv)),
        "cwd": os.getcwd(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "mode": ctx.args.mode,
        "device": ctx.device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        "sklearn_cuwide": _version("sklearn_cuwide"),
        "cupy": _version("cupy"),
        "torch": _version("torch"),
        "matplotlib": _version("matplotlib"),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    env["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except Exception:
        pass
    try:
        env["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout
        env["git_dirty_files"] = len([x for x in dirty.splitlines() if x.strip()])
    except Exception:
        env["git_commit"] = None
    if ctx.gpu:
        try:
            import cupy as cp

            rt = cp.cuda.runtime
            p = rt.getDeviceProperties(0)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            env.update(gpu=name, gpu_sms=int(p["multiProcessorCount"]),
                       gpu_memory_bytes=int(p["totalGlobalMem"]),
                       compute_capability=f"{p['major']}.{p['minor']}",
                       shared_mem_per_sm=int(p["sharedMemPerMultiprocessor"]),
                       cuda_driver_api=int(rt.driverGetVersion()),
                       cuda_runtime=int(rt.runtimeGetVersion()))
        except Exception as exc:
            env["gpu_error"] = _err(exc)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=20)
            env["nvidia_smi"] = q.stdout.strip()
            env["driver"] = q.stdout.strip().split(",")[1].strip() if q.stdout.strip() else None
        except Exception as exc:
            env["driver"] = f"unknown ({_err(exc)})"
    return env


def host_copy_bandwidth(nbytes):
    """numpy copy rate on this host, bytes read + written per second."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    return 2 * a.nbytes / float(np.median(times))


def part_floors(ctx):
    if ctx.gpu:
        from baselines import copy_bandwidth, h2d_bandwidth

        out = {"kind": "device"}
        out["copy_bw"] = float(copy_bandwidth())
        out["h2d_bw"] = float(guarded("h2d", lambda: {"v": h2d_bandwidth()}).get("v", math.nan))
    else:
        out = {"kind": "host (numpy copy; no device)",
               "copy_bw": host_copy_bandwidth(16 << 20 if ctx.args.smoke else 256 << 20),
               "h2d_bw": None}
    log(f"  copy {out['copy_bw'] / 1e9:.1f} GB/s (read+write)"
        + (f", pinned host->device {out['h2d_bw'] / 1e9:.1f} GB/s" if out.get("h2d_bw") else ""))
    return out


def dataset_info(data, floors):
    info = {"key": data.key, "source": data.source, "task": data.task, "rows": data.n,
            "test_rows": int(data.Xt.shape[0]), "features": data.d, "nnz": int(data.X.nnz),
            "nnz_per_row": data.X.nnz / max(data.n, 1), "csr_bytes": csr_bytes(data.X)}
    if floors and floors.get("copy_bw"):
        info["floor_ms"] = info["csr_bytes"] / floors["copy_bw"] * 1e3
    if floors and floors.get("h2d_bw"):
        info["h2d_ms"] = info["csr_bytes"] / floors["h2d_bw"] * 1e3
    return info


def sklearn_specs(data, *, epochs, sk_rows, sgd_rows, seed=0):
    """``{id: (rows, spec)}``: the scikit-learn jobs of a dataset."""
    def part(rows):
        rows = min(data.n, rows)
        return rows, dict(X=_csr_rows(data.X, 0, rows), y=data.y[:rows], Xt=data.Xt,
                          yt=data.yt, C=C_LR, seed=seed)

    if data.task != "binary":
        rows, base = part(sk_rows)
        return {"sk_ridge": (rows, dict(base, kind="ridge", alpha=RIDGE_ALPHA))}
    (r1, b1), (r2, b2) = part(sk_rows), part(sgd_rows)
    return {"sk_lr": (r1, dict(b1, kind="lr", tol=LBFGS_TOL, max_iter=LBFGS_MAX_ITER)),
            "sk_sgd": (r2, dict(b2, kind="sgd", epochs=epochs))}


def system_list(ctx, data, *, epochs, fm_l2, sk_rows, cusparse_batches, real):
    """(id, label, family, thunk) of every system that runs on ``data`` here."""
    from sklearn_cuwide import (
        GPUFactorizationMachine,
        GPUFactorizationMachineRegressor,
        GPULogisticRegression,
    )

    k = ctx.cfg["n_factors"]
    n = data.n
    l2_w = 1.0 / (C_LR * n)
    dev = "cuda" if ctx.gpu else "cpu"
    fa, fb = fm_l2
    mb = dict(batch_size=BATCH, max_iter=epochs, random_state=0, device=dev)
    out = []

    def add(sid, label, family, tags, thunk):
        if not ctx.skipped(*tags):
            out.append((sid, label, family, thunk))

    if data.task == "binary":
        def sgd_rate():
            from sklearn_cuwide._base import _sgd_auto_learning_rate

            return float(_sgd_auto_learning_rate(data.X, np.ones(n), loss="logistic",
                                                 fit_intercept=True))

        # "auto" and "max": the estimators' ``concurrency`` (thread blocks
        # training mini-batches at once); LR with adagrad runs the full grid
        # either way
        add("ours_lr_adagrad", "ours LR adagrad (kernel)", "LR", ("kernel",),
            lambda: run_kernel(ctx, data, k=0, l2_w=l2_w, epochs=epochs, concurrency="auto"))
        if not real:
            def _sgd(conc):
                rate = sgd_rate()
                return run_kernel(ctx, data, k=0, solver="sgd", lr=rate, l2_w=l2_w,
                                  epochs=epochs, concurrency=conc)

            add("ours_lr_sgd", "ours LR sgd (kernel, concurrency=auto)", "LR",
                ("kernel", "sgd"), lambda: _sgd("auto"))
            add("ours_lr_sgd_max", "ours LR sgd (kernel, concurrency=max)", "LR",
                ("kernel", "sgd"), lambda: _sgd("max"))
        add("ours_fm", f"ours FM{k} adagrad (kernel, concurrency=max)", "FM", ("kernel",),
            lambda: run_kernel(ctx, data, k=k, l2_w=fa, l2_v=fb, epochs=epochs,
                               concurrency="max"))
        add("ours_fm_auto", f"ours FM{k} adagrad (kernel, concurrency=auto)", "FM",
            ("kernel",), lambda: run_kernel(ctx, data, k=k, l2_w=fa, l2_v=fb, epochs=epochs,
                                            concurrency="auto"))
        add("ours_fm_scaled", f"ours FM{k} adagrad (kernel, concurrency=max, scale_penalty)",
            "FM", ("kernel",),
            lambda: run_kernel(ctx, data, k=k, l2_w=fa, l2_v=fb, epochs=epochs,
                               concurrency="max", scale_penalty=True))
        add("est_lr_adagrad", "ours GPULogisticRegression adagrad (fit)", "LR-fit",
            ("estimators",),
            lambda: run_estimator(ctx, data, lambda: GPULogisticRegression(
                solver="adagrad", C=C_LR, learning_rate=LEARNING_RATE, tol=1e-4, **mb)))
        if not real:
            add("est_lr_sgd", "ours GPULogisticRegression sgd (fit)", "LR-fit",
                ("estimators", "sgd"),
                lambda: run_estimator(ctx, data, lambda: GPULogisticRegression(
                    solver="sgd", C=C_LR, tol=1e-4, **mb)))
        add("est_lr_lbfgs", "ours GPULogisticRegression lbfgs (fit)", "lbfgs",
            ("estimators", "lbfgs"),
            lambda: run_estimator(ctx, data, lambda: GPULogisticRegression(
                solver="lbfgs", C=C_LR, tol=LBFGS_TOL, max_iter=LBFGS_MAX_ITER, device=dev),
                rows=sk_rows))
        add("est_fm", f"ours GPUFactorizationMachine k={k} (fit)", "FM-fit", ("estimators",),
            lambda: run_estimator(ctx, data, lambda: GPUFactorizationMachine(
                n_factors=k, learning_rate=LEARNING_RATE, alpha=fa, beta=fb, tol=None, **mb)))
        add("torch_lr", "PyTorch EmbeddingBag LR (GPU)", "LR", ("torch",),
            lambda: run_torch(ctx, data, k=0, epochs=epochs))
        add("torch_fm", f"PyTorch FM{k} (GPU)", "FM", ("torch",),
            lambda: run_torch(ctx, data, k=k, epochs=epochs))
        add("cusparse_lr", "CuPy cuSPARSE LR (GPU)", "LR", ("cusparse",),
            lambda: run_cusparse(ctx, data, k=0, max_batches=cusparse_batches))
        if not real:
            add("cusparse_fm", f"CuPy cuSPARSE FM{k} (GPU)", "FM", ("cusparse",),
                lambda: run_cusparse(ctx, data, k=k, max_batches=cusparse_batches))
    else:
        add("ours_fm_reg", f"ours FM{k} squared (kernel)", "FM", ("kernel", "regression"),
            lambda: run_kernel(ctx, data, k=k, loss="squared", lr=0.02, l2_w=fa, l2_v=fb,
                               epochs=epochs))
        add("est_fm_reg", f"ours GPUFactorizationMachineRegressor k={k} (fit)", "FM-fit",
            ("estimators", "regression"),
            lambda: run_estimator(ctx, data, lambda: GPUFactorizationMachineRegressor(
                n_factors=k, learning_rate=0.02, alpha=fa, beta=fb, tol=None, **mb)))
    return out


SK_LABELS = {"sk_lr": ("sklearn LogisticRegression lbfgs (CPU)", "lbfgs"),
             "sk_sgd": ("sklearn SGDClassifier log_loss (CPU)", "LR"),
             "sk_ridge": ("sklearn Ridge (CPU)", "reg-fit")}


def submit_sklearn(ctx, jobs, data, *, epochs, sk_rows, sgd_rows):
    """Start the scikit-learn fits of a dataset; returns {id: handle}."""
    if ctx.skipped("sklearn"):
        return {}
    specs = sklearn_specs(data, epochs=epochs, sk_rows=sk_rows, sgd_rows=sgd_rows)
    base = data.base or data.key
    return {sid: jobs.submit(spec, key=(base, rows, sid)) for sid, (rows, spec) in specs.items()}


def run_dataset(ctx, data, jobs, floors, *, epochs, sk_rows, cusparse_batches, fm_l2, real,
                sgd_rows=None):
    """Every system on one dataset; scikit-learn jobs are left pending."""
    info = dataset_info(data, floors)
    log(f"\n== {data.key}: {data.n:,} train rows, {info['test_rows']:,} test, "
        f"{data.d:,} features, {info['nnz_per_row']:.1f} nnz/row"
        + (f", floor {info['floor_ms']:.3f} ms" if "floor_ms" in info else ""))
    pending = submit_sklearn(ctx, jobs, data, epochs=epochs, sk_rows=sk_rows,
                             sgd_rows=sk_rows if sgd_rows is None else sgd_rows)
    systems = {}
    for sid, label, family, thunk in system_list(ctx, data, epochs=epochs, fm_l2=fm_l2,
                                                 sk_rows=sk_rows,
                                                 cusparse_batches=cusparse_batches, real=real):
        rec = ctx.run(label, thunk)
        rec.update(label=label, family=family)
        systems[sid] = rec
        log("  " + one_line(label, rec))
    return {"info": info, "systems": systems, "pending": pending}


def one_line(label, rec):
    if "error" in rec:
        return f"{label:48s} ERROR {rec['error'][:110]}"
    if "skipped" in rec:
        return f"{label:48s} skipped: {rec['skipped'][:100]}"
    bits = []
    if rec.get("epoch_ms") is not None:
        bits.append(f"epoch {rec['epoch_ms']:.3f} ms")
    if rec.get("fit_s") is not None:
        bits.append(f"fit {rec['fit_s']:.2f} s")
    for key, fmt in (("test_auc", "AUC {:.4f}"), ("test_logloss", "logloss {:.4f}"),
                     ("test_rmse", "RMSE {:.4f}")):
        if rec.get(key) is not None:
            bits.append(fmt.format(rec[key]))
    if rec.get("gpu_peak_bytes"):
        bits.append(f"GPU peak {rec['gpu_peak_bytes'] / 2**20:.0f} MiB")
    return f"{label:48s} " + ", ".join(bits)


def part_systems(ctx, pool, jobs, floors):
    cfg = ctx.cfg
    out = {}
    main_rows = max(r for r, _ in cfg["systems_data"])
    for rows, lf in cfg["systems_data"]:
        data = pool.get("binary", lf, rows)
        out[data.key] = run_dataset(ctx, data, jobs, floors, epochs=cfg["epochs"],
                                    sk_rows=cfg["sk_rows"], sgd_rows=cfg["sgd_rows"],
                                    cusparse_batches=cfg["cusparse_batches"],
                                    fm_l2=cfg["fm_l2"], real=False)
        out[data.key]["main"] = rows == main_rows
    if not ctx.skipped("regression"):
        rows, lf = cfg["systems_data"][0]
        data = pool.get("regression", lf, min(rows, cfg["reg_rows"]))
        out[data.key] = run_dataset(ctx, data, jobs, floors, epochs=cfg["epochs"],
                                    sk_rows=cfg["sk_rows"], sgd_rows=cfg["sgd_rows"],
                                    cusparse_batches=cfg["cusparse_batches"],
                                    fm_l2=cfg["fm_l2"], real=False)
    return out


def part_real(ctx, jobs, floors):
    import real_data

    cfg = ctx.cfg
    names = ctx.args.datasets or cfg["real_datasets"]
    avail = real_data.available_datasets()
    out, absent = {}, []
    for name in (names or real_data.DATASETS):
        if name not in avail:
            absent.append(name)
            continue
        if ctx.left() <= 0:
            out[name] = {"skipped": "time budget used up"}
            continue
        try:
            ds = real_data.load(name)
        except Exception as exc:
            out[name] = {"error": _err(exc)}
            continue
        if ds.task not in ("binary", "regression"):
            out[name] = {"skipped": f"task {ds.task!r} is not benchmarked"}
            continue
        X, y, Xt, yt = ds.X_train, ds.y_train, ds.X_test, ds.y_test
        cap = ctx.args.real_max_rows or cfg["real_max_rows"]
        if cap:
            X, y = _csr_rows(X, 0, min(cap, X.shape[0])), y[:cap]
            Xt, yt = _csr_rows(Xt, 0, min(cap, Xt.shape[0])), yt[:cap]
        data = Data(name, ds.task, X, np.asarray(y), Xt, np.asarray(yt), source="real")
        out[name] = run_dataset(ctx, data, jobs, floors, epochs=cfg["real_epochs"],
                                sk_rows=data.n, cusparse_batches=10**9,
                                fm_l2=(3e-4, 3e-4), real=True)
        ctx.drop_layouts(data.key)
    return {"datasets": out, "info": {"data_dir": str(real_data.data_dir()), "absent": absent}}


ABLATION = [
    # id, label, what it changes
    ("classic", "classic schema (per-sample pull/push, global atomics)", {}),
    ("flow", "flow-based kernel, all optimisations", {}),
    ("no_2d", "- 2D partition (one sample block per batch, no feature blocks)",
     {"sample_block": BATCH, "n_hot_max": 0}),
    ("no_hot", "- hot-feature caching (n_hot_max=0)", {"n_hot_max": 0}),
    ("no_cross_stage", "- cross-stage caching (per-sample accumulators in global memory)",
     {"opts": {"acc_global": True}}),
    ("no_replication", "- replication (n_rep=1)", {"opts": {"n_rep": 1}}),
    ("stream", "multi-stream on: host layout, upload overlapped with the first epoch",
     {"upload": "stream"}),
    ("no_multistream", "- multi-stream: synchronous full upload, then the first epoch",
     {"upload": "sync"}),
]


def part_ablation(ctx, pool):
    cfg = ctx.cfg
    rows, lf = cfg["ablation_data"]
    data = pool.get("binary", lf, rows)
    k = cfg["n_factors"]
    fa, fb = cfg["fm_l2"]
    out = {"data": data.key, "models": {}}
    models = (("LR", 0), (f"FM{k}", k))
    recs = {}
    # the flow-based variants first, the classic schema (a separate kernel)
    # last: a fault there cannot cost the other rows
    plan = [(m, kk, v) for m, kk in models for v in ABLATION if v[0] != "classic"]
    if not ctx.skipped("classic"):
        plan += [(m, kk, v) for m, kk in models for v in ABLATION if v[0] == "classic"]
    for model, kk, (vid, label, change) in plan:
        l2 = dict(l2_w=1.0 / (C_LR * data.n)) if not kk else dict(l2_w=fa, l2_v=fb)
        if vid == "classic":
            rec = ctx.run(label, run_classic, ctx, data, k=kk, epochs=cfg["epochs"], **l2)
        else:
            rec = ctx.run(label, run_kernel, ctx, data, k=kk, epochs=cfg["epochs"], **l2,
                          **change)
        rec.update(id=vid, label=label)
        if not ctx.gpu and vid in ("no_cross_stage", "no_replication"):
            rec["note"] = "GPU-only switch: ignored by the CPU backend"
        recs[model, vid] = rec
        log(f"  {model:5s} " + one_line(label, rec))
    for model, _ in models:
        rows_out = [recs[model, v[0]] for v in ABLATION if (model, v[0]) in recs]
        flow = recs.get((model, "flow"))
        for r in rows_out:
            if flow and flow.get("epoch_ms") and r.get("epoch_ms"):
                r["x_flow"] = r["epoch_ms"] / flow["epoch_ms"]
        out["models"][model] = rows_out
    return out


def concurrent_blocks(ctx, n_rows):
    """``(workers, blocks per worker, full grid)`` of an epoch of ``n_rows``
    by default: the CUDA backend gives each worker at least
    MIN_BATCHES_PER_BLOCK mini-batches, so small data runs on fewer workers,
    each a thread block cluster when few; (1, 1, 1) on the CPU."""
    if not ctx.device.startswith("cuda"):
        return 1, 1, 1
    from sklearn_cuwide._backends import _cuda

    workers = _cuda.default_grid(-(-n_rows // BATCH))
    return workers, _cuda.cluster_for(workers), _cuda.full_grid()


def scaling_point(ctx, data, k, epochs):
    r = run_kernel(ctx, data, k=k, l2_w=1e-7, l2_v=1e-6, epochs=epochs + 1, evaluate=False)
    blocks, cluster, full = concurrent_blocks(ctx, data.n)
    return {"epoch_ms": r["epoch_ms"], "epoch_ms_list": r["epoch_ms_list"],
            "first_epoch_ms": r["first_epoch_ms"], "layout_s": r["layout_s"],
            "nnz": int(data.X.nnz), "csr_bytes": csr_bytes(data.X), "n_hot": r["n_hot"],
            "sample_block": r["sample_block"], "blocks": blocks, "cluster": cluster,
            "full_grid": full}


def part_scaling(ctx, pool, floors):
    cfg = ctx.cfg
    k = cfg["n_factors"]
    ep = cfg["scale_epochs"]
    out = {"rows": {}, "features": {}, "factors": {}, "fits": {}}
    models = (("LR", 0), (f"FM{k}", k))

    def point(sweep, model, x, data, kk):
        rec = ctx.run(f"{sweep} {model} {x}", scaling_point, ctx, data, kk, ep)
        rec["x"] = x
        if floors and floors.get("copy_bw") and "csr_bytes" in rec:
            rec["floor_ms"] = rec["csr_bytes"] / floors["copy_bw"] * 1e3
        out[sweep].setdefault(model, []).append(rec)
        log(f"  {sweep:8s} {model:5s} {x:>12,}: "
            + (f"epoch {rec['epoch_ms']:.3f} ms" if "epoch_ms" in rec else
               rec.get("error", rec.get("skipped", ""))[:100]))

    lf = cfg["scale_rows_features"]
    base = cfg.get("scale_rows_base")
    sweeps = cfg.get("scale_sweeps", ("rows", "features", "factors"))
    for n in (cfg["scale_rows"] if "rows" in sweeps else ()):
        if base and n > base:
            data = pool.tiled("binary", lf, n, base)
        else:
            data = pool.get("binary", lf, n, test=False)
        for model, kk in models:
            point("rows", model, n, data, kk)
            if base and n > base:
                out["rows"][model][-1]["tiled_from_rows"] = base
    ctx.drop_layouts()
    for lf2 in (cfg["scale_features"] if "features" in sweeps else ()):
        data = pool.get("binary", lf2, cfg["scale_features_rows"], test=False)
        for model, kk in models:
            point("features", model, 2 ** lf2, data, kk)
        ctx.drop_layouts()
    n, lf3 = cfg["scale_factors_data"]
    for kk in (cfg["scale_factors"] if "factors" in sweeps else ()):
        data = pool.get("binary", lf3, n, test=False)
        point("factors", "FM", kk, data, kk)
    ctx.drop_layouts()
    out["fits"] = scaling_fits(out)
    return out


def scaling_fits(out):
    """Log-log slope fits of every sweep and model of a scaling part."""
    fits = {}
    for sweep in ("rows", "features", "factors"):
        for model, pts in (out.get(sweep) or {}).items():
            ok = [p for p in pts if p.get("epoch_ms")]
            fit = loglog_slope([p["x"] for p in ok], [p["epoch_ms"] for p in ok]) \
                if len(ok) >= 2 else None
            if fit is not None and sweep == "rows":
                # with fewer busy blocks than the device runs the epoch is
                # latency-bound by design (fewer workers, each with >= 16
                # mini-batches); linearity is judged where the blocks are busy
                sat = [p for p in ok if busy_grid(p)]
                sat_fit = loglog_slope([p["x"] for p in sat], [p["epoch_ms"] for p in sat]) \
                    if len(sat) >= 2 else None
                judged = sat_fit or fit
                fit["saturated"] = sat_fit
                fit["linear"] = bool(abs(judged["slope"] - 1.0) <= 0.15 and judged["r2"] >= 0.98)
            fits[f"{sweep} {model}"] = fit
    return fits


# --------------------------------------------------------------------------
# finishing: scikit-learn results, targets, ratios
# --------------------------------------------------------------------------
def derive_rates(entry):
    """Samples per second, time per million rows, the floor's and ours'
    ratios of a dataset's systems, from their epoch times."""
    systems, info = entry["systems"], entry["info"]
    for r in systems.values():
        if r.get("epoch_ms") and r.get("rows"):
            r["samples_per_s"] = r["rows"] / (r["epoch_ms"] / 1e3)
            r["ms_per_mrow"] = r["epoch_ms"] / r["rows"] * 1e6
            if info.get("floor_ms") and r["rows"] == info["rows"]:
                r["x_floor"] = r["epoch_ms"] / info["floor_ms"]
    refs = {"LR": systems.get("ours_lr_adagrad"), "FM": systems.get("ours_fm") or
            systems.get("ours_fm_reg")}
    for r in systems.values():
        ref = refs.get(r.get("family"))
        if ref and ref.get("ms_per_mrow") and r.get("ms_per_mrow"):
            r["x_ours"] = r["ms_per_mrow"] / ref["ms_per_mrow"]


def finish_dataset(ctx, entry, jobs):
    systems = entry["systems"]
    for sid, handle in entry.pop("pending", {}).items():
        rec = jobs.result(handle, timeout=ctx.left() + 30)
        label, family = SK_LABELS[sid]
        rec.update(label=label, family=family)
        systems[sid] = rec
        log("  " + one_line(label, rec))
    # target logloss: scikit-learn's LogisticRegression (else our lbfgs), + 1%
    target, by = None, None
    for sid in ("sk_lr", "est_lr_lbfgs"):
        r = systems.get(sid, {})
        if r.get("test_logloss") is not None and math.isfinite(r["test_logloss"]):
            target, by = r["test_logloss"] * TARGET_SLACK, sid
            break
    entry["target_logloss"] = target
    entry["target_from"] = by
    for r in systems.values():
        if "curve" in r and target is not None:
            r["time_to_target_s"] = time_to_target(r["curve"], target)
    derive_rates(entry)
    # lbfgs: scikit-learn against ours on the same rows
    sk, ours = systems.get("sk_lr", {}), systems.get("est_lr_lbfgs", {})
    if sk.get("fit_s") and ours.get("fit_s") and sk.get("rows") == ours.get("rows"):
        ours["x_sklearn_fit"] = sk["fit_s"] / ours["fit_s"]
        sk["x_ours_fit"] = sk["fit_s"] / ours["fit_s"]
        if sk.get("coef") is not None and ours.get("coef") is not None:
            a, b = np.asarray(ours["coef"]), np.asarray(sk["coef"])
            if a.shape == b.shape:
                rel = np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)
                ours["coef_rel_diff_vs_sklearn"] = float(rel)
    for r in systems.values():
        r.pop("coef", None)


def finish(ctx, res, jobs):
    for part in ("systems", "real"):
        block = res.get(part) or {}
        if "error" in block and not isinstance(block.get("error"), dict):
            continue
        for name, entry in block.items():
            if isinstance(entry, dict) and "systems" in entry:
                if part == "real":
                    log(f"\n== {name} (scikit-learn)")
                finish_dataset(ctx, entry, jobs)


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------
def _f(v, fmt, dash="-"):
    if v is None:
        return dash
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float) and math.isnan(v):
        return dash
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def _mib(b):
    return None if b is None else b / 2**20


def systems_table(entry):
    rows = ["| system | rows | epoch ms | samples/s | x ours | fit s | time to target s "
            "| test AUC | logloss | RMSE | GPU peak MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for sid, r in entry["systems"].items():
        label = r.get("label", sid)
        if "error" in r or "skipped" in r:
            what = ("error: " + r["error"]) if "error" in r else ("skipped: " + r["skipped"])
            rows.append(f"| {label} | {what[:150].replace('|', '/')} ||||||||||")
            continue
        rows.append(
            f"| {label} | {_f(r.get('rows'), ',')} | {_f(r.get('epoch_ms'), '.3f')} | "
            f"{_f(r.get('samples_per_s'), '.3g')} | {_f(r.get('x_ours'), '.2f')} | "
            f"{_f(r.get('fit_s'), '.2f')} | {_f(r.get('time_to_target_s'), '.3g')} | "
            f"{_f(r.get('test_auc'), '.4f')} | {_f(r.get('test_logloss'), '.4f')} | "
            f"{_f(r.get('test_rmse'), '.4f')} | {_f(_mib(r.get('gpu_peak_bytes')), '.0f')} |")
    return "\n".join(rows)


def _md_header(res):
    env = res.get("env") or {}
    g = env.get
    return ["# sklearn-cuwide benchmark suite", "",
            f"Command: `{g('command')}`  ", f"Date (UTC): {g('date_utc')}  ",
            f"Mode: {g('mode')} on {g('device')}"
            + (f" — {g('gpu')}, driver {g('driver')}, CUDA runtime {g('cuda_runtime')}"
               if g("gpu") else "") + "  ",
            f"CPU: {g('cpu_model', '?')} ({g('cpu_count')} cores)  ",
            "Versions: " + ", ".join(f"{k} {g(k)}" for k in (
                "python", "numpy", "scipy", "sklearn", "sklearn_cuwide", "cupy", "torch")) + "  ",
            f"Commit: {g('git_commit')} ({g('git_dirty_files', '?')} files changed)", ""]


def _md_floors(res):
    fl = res.get("floors")
    if not fl:
        return []
    if "copy_bw" not in fl:
        return ["## Floors", "", f"Not measured: {fl.get('error')}", ""]
    return ["## Floors", "",
            f"Copy bandwidth ({fl.get('kind')}): {fl['copy_bw'] / 1e9:.1f} GB/s read+write"
            + (f"; pinned host->device {fl['h2d_bw'] / 1e9:.1f} GB/s"
               if isinstance(fl.get("h2d_bw"), float) and math.isfinite(fl["h2d_bw"]) else "")
            + ". The floor of an epoch is one read of the CSR bytes at the copy bandwidth.", ""]


def _md_systems(res, part, title):
    block = res.get(part) or {}
    if not block:
        return []
    L = [f"## {title}", ""]
    if "error" in block and isinstance(block["error"], str):
        return L + [f"The part failed: {block['error']}", ""]
    for name, entry in block.items():
        if not isinstance(entry, dict) or "systems" not in entry:
            what = entry.get("error") or entry.get("skipped") if isinstance(entry, dict) else entry
            L += [f"### {name}", "", f"{what}", ""]
            continue
        i = entry["info"]
        L += [f"### {name}", "",
              f"{i['rows']:,} train / {i['test_rows']:,} test rows, {i['features']:,} "
              f"features, {i['nnz_per_row']:.1f} nonzeros per row, CSR "
              f"{i['csr_bytes'] / 2**20:.1f} MiB"
              + (f"; floor {i['floor_ms']:.3f} ms" if "floor_ms" in i else "")
              + (f"; host->device {i['h2d_ms']:.1f} ms" if "h2d_ms" in i else "")
              + (f"; target logloss {entry['target_logloss']:.5f} (from "
                 f"{entry['target_from']} + {TARGET_SLACK - 1:.0%})"
                 if entry.get("target_logloss") else ""), "",
              systems_table(entry), ""]
    if part == "real":
        L += _md_real_summary(block)
    info = res.get("real_info") if part == "real" else None
    if info and info.get("absent"):
        L += [f"Absent (skipped): {', '.join(info['absent'])} (looked in {info['data_dir']}).", ""]
    return L


REAL_SUMMARY = ("ours_lr_adagrad", "ours_fm", "ours_fm_auto", "ours_fm_scaled", "est_lr_lbfgs",
                "sk_lr", "sk_sgd", "torch_lr", "torch_fm", "ours_fm_reg", "est_fm_reg", "sk_ridge")


def _md_real_summary(block):
    """One line per real dataset: test AUC (RMSE for regression) of each system."""
    entries = {n: e for n, e in block.items() if isinstance(e, dict) and "systems" in e}
    if not entries:
        return []
    cols = [c for c in REAL_SUMMARY if any(c in e["systems"] for e in entries.values())]
    label = {c: next(e["systems"][c]["label"] for e in entries.values() if c in e["systems"])
             for c in cols}
    L = ["### Summary: test AUC (RMSE for regression)", "",
         "| dataset | " + " | ".join(label[c] for c in cols) + " | ours LR epoch ms |",
         "|---|" + "---:|" * (len(cols) + 1)]
    for name, e in entries.items():
        cells = []
        for c in cols:
            r = e["systems"].get(c, {})
            v = r.get("test_auc", r.get("test_rmse"))
            cells.append(_f(v, ".4f") if v is not None else ("err" if "error" in r else "-"))
        ep = e["systems"].get("ours_lr_adagrad", e["systems"].get("ours_fm_reg", {}))
        L.append(f"| {name} | " + " | ".join(cells) + f" | {_f(ep.get('epoch_ms'), '.3f')} |")
    return L + [""]


def _md_ablation(res):
    ab = res.get("ablation")
    if not ab:
        return []
    if "models" not in ab:
        return ["## Ablation", "", f"The part failed: {ab.get('error')}", ""]
    L = ["## Ablation (cuWide paper style)", "", f"Data: {ab['data']}.", ""]
    for model, rows in ab["models"].items():
        L += [f"### {model}", "",
              "| variant | epoch ms | x flow | first epoch ms | test AUC | note |",
              "|---|---:|---:|---:|---:|---|"]
        for r in rows:
            note = r.get("error") or r.get("skipped") or r.get("note") or ""
            L.append(f"| {r['label']} | {_f(r.get('epoch_ms'), '.3f')} | "
                     f"{_f(r.get('x_flow'), '.2f')} | {_f(r.get('first_epoch_ms'), '.2f')} | "
                     f"{_f(r.get('test_auc'), '.4f')} | {note[:120].replace('|', '/')} |")
        L.append("")
    return L + ["First epoch ms of the two multi-stream rows include the upload of the layout "
                "(overlapped with the kernels, or before them).", ""]


def _md_scaling(res):
    sc = res.get("scaling")
    if not sc:
        return []
    if "fits" not in sc:
        return ["## Scaling", "", f"The part failed: {sc.get('error')}", ""]
    L = ["## Scaling", ""]
    for sweep, xname in (("rows", "rows"), ("features", "features"), ("factors", "n_factors")):
        for model, pts in (sc.get(sweep) or {}).items():
            fit = sc["fits"].get(f"{sweep} {model}")
            sat = (fit or {}).get("saturated")
            L += [f"### epoch time vs {xname}, {model}"
                  + (f" — log-log slope {fit['slope']:.3f} (R² {fit['r2']:.3f})"
                     + (f"; with every block busy {sat['slope']:.3f} (R² {sat['r2']:.3f})"
                        if sat else "")
                     + (f", linear: {fit['linear']}" if "linear" in fit else "")
                     if fit else ""), "",
                  f"| {xname} | epoch ms | first epoch ms | floor ms | layout s | blocks |",
                  "|---:|---:|---:|---:|---:|---:|"]
            for p in pts:
                if "epoch_ms" in p:
                    blocks = "-"
                    if "blocks" in p:
                        cl = p.get("cluster", 1)
                        blocks = (f"{p['blocks']}" + (f" x {cl}" if cl > 1 else "")
                                  + f" of {p['full_grid']}")
                    L.append(f"| {p['x']:,} | {p['epoch_ms']:.3f} | {p['first_epoch_ms']:.2f} | "
                             f"{_f(p.get('floor_ms'), '.3f')} | {p['layout_s']:.2f} | {blocks} |")
                else:
                    L.append(f"| {p['x']:,} | {(p.get('error') or p.get('skipped', ''))[:80]} "
                             "|||||")
            L.append("")
    return L


def _md_tail(res):
    est = (res.get("config") or {}).get("estimates", {})
    L = ["## Part timings", "", "| part | seconds | estimate |", "|---|---:|---:|"]
    for part, s in res.get("timings", {}).items():
        L.append(f"| {part} | {s:.1f} | {est.get(part, '-')} |")
    if res.get("compile_s"):
        L += ["", "Kernel compilation and warm-up (excluded from timings): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in res["compile_s"].items())]
    if res.get("data_generated"):
        L += ["", "Data generation: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in res["data_generated"].items())]
    L += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    if res.get("errors"):
        L += ["", "## Errors recorded", ""] + [f"- {e}" for e in res["errors"]]
    return L


def write_markdown(res, path):
    """results.md: every section is written even when another one fails."""
    L = []
    for fn, a in ((_md_header, ()), (_md_floors, ()),
                  (_md_systems, ("systems", "Systems side by side (synthetic data)")),
                  (_md_systems, ("real", "Systems side by side (real datasets)")),
                  (_md_ablation, ()), (_md_scaling, ()), (_md_tail, ())):
        try:
            L += fn(res, *a)
        except Exception as exc:
            L += [f"(section {fn.__name__}{a[:1]} could not be written: {_err(exc)})", ""]
    Path(path).write_text("\n".join(L) + "\n")


def short_table(res):
    """The table printed last: the main synthetic dataset, the ablation, the slopes."""
    out = []
    for name, entry in (res.get("systems") or {}).items():
        if not entry.get("main") or "systems" not in entry:
            continue
        out.append(f"\n{name} (epoch floor {_f(entry['info'].get('floor_ms'), '.3f')} ms; "
                   f"target logloss {_f(entry.get('target_logloss'), '.4f')})")
        out.append(f"{'system':48s} {'epoch ms':>10s} {'x ours':>7s} {'fit s':>7s} "
                   f"{'t->tgt s':>8s} {'AUC':>7s} {'logloss':>8s} {'GPU MiB':>8s}")
        for r in entry["systems"].values():
            if "error" in r or "skipped" in r:
                what = ("ERROR " + r["error"]) if "error" in r else "skipped: " + r["skipped"]
                out.append(f"{r['label'][:48]:48s} " + what[:60])
                continue
            out.append(f"{r['label'][:48]:48s} {_f(r.get('epoch_ms'), '10.3f'):>10s} "
                       f"{_f(r.get('x_ours'), '7.2f'):>7s} {_f(r.get('fit_s'), '7.2f'):>7s} "
                       f"{_f(r.get('time_to_target_s'), '8.3g'):>8s} "
                       f"{_f(r.get('test_auc'), '7.4f'):>7s} "
                       f"{_f(r.get('test_logloss'), '8.4f'):>8s} "
                       f"{_f(_mib(r.get('gpu_peak_bytes')), '8.0f'):>8s}")
    ab = res.get("ablation")
    if ab and ab.get("models"):
        out.append(f"\nablation ({ab['data']}): epoch ms (x flow) / first epoch ms / AUC")
        for model, rows in ab["models"].items():
            for r in rows:
                if "epoch_ms" in r:
                    out.append(f"  {model:5s} {r['id']:16s} {r['epoch_ms']:10.3f} "
                               f"({_f(r.get('x_flow'), '.2f')}) / {r['first_epoch_ms']:.2f} / "
                               f"{_f(r.get('test_auc'), '.4f')}")
                else:
                    out.append(f"  {model:5s} {r['id']:16s} "
                               + (r.get("error") or r.get("skipped") or "")[:70])
    sc = res.get("scaling")
    if sc and "fits" in sc:
        out.append("\nscaling (log-log slopes)")
        for key, fit in sc["fits"].items():
            if fit:
                sat = fit.get("saturated")
                out.append(f"  {key:16s} slope {fit['slope']:.3f}  R2 {fit['r2']:.3f}"
                           + (f"  busy-grid slope {sat['slope']:.3f}" if sat else "")
                           + (f"  linear: {fit['linear']}" if "linear" in fit else ""))
    out.append("\nparts: " + ", ".join(f"{p} {s:.0f}s" for p, s in res.get("timings", {}).items()))
    n_err = len(res.get("errors", []))
    out.append(f"errors recorded: {n_err} (see results.json / results.md)")
    return "\n".join(out)


def collect_errors(res):
    errs = []

    def walk(node, path):
        if isinstance(node, dict):
            if "error" in node and isinstance(node["error"], str):
                errs.append(f"{path}: {node['error']}")
            for k, v in node.items():
                if k not in ("error", "traceback"):
                    walk(v, f"{path}/{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk({k: v for k, v in res.items() if k != "errors"}, "")
    return errs


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
def _gpu_available():
    try:
        from sklearn_cuwide import _device

        return _device.cuda_device_count() > 0
    except Exception:
        return False


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gpu", action="store_true", help="the full GPU run (default with a GPU)")
    g.add_argument("--cpu", action="store_true", help="the small CPU variant")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; for the test)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "suite"))
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma list of {', '.join(PARTS)} (env always runs)")
    ap.add_argument("--skip", default="",
                    help=f"comma list of systems to leave out: {', '.join(SKIPPABLE)}")
    ap.add_argument("--datasets", default=None, help="real datasets (comma list; default all)")
    ap.add_argument("--real-max-rows", type=int, default=None,
                    help="cap the train and test rows of each real dataset")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="nothing new starts after this many seconds (default per mode)")
    ap.add_argument("--sk-workers", type=int, default=None,
                    help="processes for the scikit-learn fits (0: in this process; "
                         "default 3 on the GPU, 0 on the CPU)")
    ap.add_argument("--systems-data", default=None,
                    help="synthetic datasets of the systems part, ROWSxLOG2FEATURES,... "
                         "(default 4000000x22 on the GPU)")
    ap.add_argument("--scale-sweeps", default=None,
                    help="which scaling sweeps run: comma list of rows, features, factors "
                         "(default all)")
    ap.add_argument("--scale-rows-base", type=float, default=None,
                    help="generate at most this many rows for the rows sweep; larger "
                         "points repeat them (timing only)")
    ap.add_argument("--scale-rows", default=None,
                    help="training rows of the rows-scaling sweep, comma list "
                         "(default 1M, 2M, 4M, 8M, 16M on the GPU)")
    args = ap.parse_args(argv)
    if args.gpu:
        args.mode = "gpu"
    elif args.cpu:
        args.mode = "cpu"
    else:
        args.mode = "gpu" if _gpu_available() else "cpu"
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in args.parts if p not in PARTS + ("env",)]
    if bad:
        ap.error(f"unknown part(s) {bad}; choose from {', '.join(PARTS)}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    bad = [s for s in args.skip if s not in SKIPPABLE]
    if bad:
        ap.error(f"unknown --skip value(s) {bad}; choose from {', '.join(SKIPPABLE)}")
    if args.datasets:
        args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return args


def make_config(args):
    cfg = dict(CONFIGS["smoke" if args.smoke else args.mode])
    if args.systems_data:
        cfg["systems_data"] = [tuple(int(v) for v in s.lower().split("x"))
                               for s in args.systems_data.split(",") if s.strip()]
    if args.scale_sweeps:
        cfg["scale_sweeps"] = tuple(v.strip() for v in args.scale_sweeps.split(",") if v.strip())
    if args.scale_rows_base:
        cfg["scale_rows_base"] = int(args.scale_rows_base)
    if args.scale_rows:
        cfg["scale_rows"] = [int(float(v)) for v in args.scale_rows.split(",") if v.strip()]
    if args.budget_s is None:
        args.budget_s = cfg["budget_s"]
    if args.sk_workers is None:
        args.sk_workers = cfg["sk_workers"]
    return cfg


def plan_data(pool, cfg, parts, skip):
    if "systems" in parts:
        for rows, lf in cfg["systems_data"]:
            pool.plan("binary", lf, rows)
        if "regression" not in skip:
            rows, lf = cfg["systems_data"][0]
            pool.plan("regression", lf, min(rows, cfg["reg_rows"]))
    if "ablation" in parts:
        rows, lf = cfg["ablation_data"]
        pool.plan("binary", lf, rows)
    if "scaling" in parts:
        for n in cfg["scale_rows"]:
            n = min(n, cfg.get("scale_rows_base") or n)
            pool.plan("binary", cfg["scale_rows_features"], n, test=False)
        for lf in cfg["scale_features"]:
            pool.plan("binary", lf, cfg["scale_features_rows"], test=False)
        n, lf = cfg["scale_factors_data"]
        pool.plan("binary", lf, n, test=False)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.mode == "gpu" and not _gpu_available():
        print("error: --gpu needs cupy and a usable CUDA GPU; use --cpu", file=sys.stderr)
        return 2
    cfg = make_config(args)
    warnings.simplefilter("ignore")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args.mode == "gpu", cfg, args)
    res = {"config": {k: v for k, v in cfg.items()}, "timings": {}, "notes": []}
    res["config"].update(mode=args.mode, smoke=args.smoke, parts=args.parts, skip=args.skip,
                         budget_s=args.budget_s, sk_workers=args.sk_workers, batch_size=BATCH,
                         learning_rate=LEARNING_RATE, C=C_LR, lbfgs_tol=LBFGS_TOL,
                         lbfgs_max_iter=LBFGS_MAX_ITER)
    est = cfg["estimates"]

    def part(name, fn, *a):
        if name != "env" and name not in args.parts:
            return None
        log(f"\n##### {name} (estimate {est.get(name, '?')} s; "
            f"{max(ctx.left(), 0):.0f} s of the budget left)")
        t0 = time.perf_counter()
        try:
            r = fn(*a)
        except Exception as exc:  # recorded; the other parts still run
            r = {"error": _err(exc), "traceback": traceback.format_exc()[-3000:]}
            log(f"  ! part {name} failed: {r['error']}")
        res["timings"][name] = time.perf_counter() - t0
        log(f"##### {name} done in {res['timings'][name]:.1f} s")
        return r

    res["env"] = part("env", part_env, ctx, argv)
    log("  " + ", ".join(f"{k}={v}" for k, v in res["env"].items() if k not in ("cwd",)))
    floors = res["floors"] = part("floors", part_floors, ctx)
    if floors is not None and "error" in floors:
        floors = None
    pool = DataPool(cfg["test_rows"])
    plan_data(pool, cfg, args.parts, args.skip)
    jobs = Jobs(args.sk_workers)
    if jobs.error:
        res["notes"].append(
            f"scikit-learn worker processes unavailable ({jobs.error}); ran in-process")
    killed = False
    try:
        res["systems"] = part("systems", part_systems, ctx, pool, jobs, floors)
        real = part("real", part_real, ctx, jobs, floors)
        if real is not None:
            res["real"] = real.get("datasets", real)
            res["real_info"] = real.get("info")
        res["ablation"] = part("ablation", part_ablation, ctx, pool)
        res["scaling"] = part("scaling", part_scaling, ctx, pool, floors)
        log("\n##### finish (scikit-learn results, targets, ratios)")
        t0 = time.perf_counter()
        try:
            finish(ctx, res, jobs)
        except Exception as exc:  # still write what there is
            res["notes"].append(f"finishing failed: {_err(exc)}")
            log(traceback.format_exc())
        killed = ctx.left() + 30 <= 0
        res["timings"]["finish"] = time.perf_counter() - t0
    finally:
        jobs.close(kill=killed or ctx.left() + 30 <= 0)
    for key in ("floors", "systems", "real", "real_info", "ablation", "scaling"):
        if res.get(key) is None:
            res.pop(key, None)
    res["compile_s"] = ctx.compile_s
    res["data_generated"] = pool.generated
    notes = res["notes"]
    notes += [
        f"Mini-batch systems: batch_size {BATCH}, learning rate {LEARNING_RATE} "
        f"(adagrad; sgd's from the data), {cfg['epochs']} epochs on synthetic data, "
        f"{cfg['real_epochs']} on the real datasets; LR C={C_LR} everywhere (l2 = 1/(C n) per "
        f"mini-batch in the kernels); FM alpha/beta {cfg['fm_l2']} (synthetic), (3e-4, 3e-4) "
        "(real).",
        "epoch ms: median of the epochs after the first (the first includes the upload of the "
        "layout and the concurrency warm-up); kernels are compiled in a warm-up before any timing.",
        f"scikit-learn runs on the CPU on at most {cfg['sk_rows']:,} training rows of the "
        f"synthetic data ({cfg['sgd_rows']:,} for SGDClassifier; all rows of the real "
        f"datasets); LogisticRegression tol={LBFGS_TOL}, "
        f"max_iter={LBFGS_MAX_ITER}; ours lbfgs runs on the same rows for the fit-time ratio and "
        "coefficient agreement"
        + (f"; its fits ran in {args.sk_workers} worker process(es) beside the GPU parts"
           if args.sk_workers else "") + ".",
        "x ours: a system's time per row of an epoch over ours (LR: ours LR adagrad kernel; FM: "
        "ours FM adagrad kernel); above 1 means slower than ours.",
        "time to target: setup (layout, upload) plus training time until the test logloss first "
        f"reaches the target (scikit-learn LogisticRegression's test logloss x {TARGET_SLACK}); "
        "inf: never within the epochs run; for fit-only systems the whole fit counts when its "
        "final logloss reaches it.  The test split plays the validation set.",
        "GPU peak: cupy memory-pool bytes reserved during the run (the layout included); PyTorch: "
        "torch.cuda.max_memory_allocated.  cuSPARSE: timed over a capped number of mini-batches "
        "and scaled to an epoch.",
        "The PyTorch FM needs the same number of nonzeros in every row (synthetic data only).",
        "Ablation: the multi-stream pair starts from a layout whose nonzeros are in host memory "
        "(built on the device, then copied back: the same layout as a host build).",
    ]
    res["errors"] = collect_errors(res)
    (out_dir / "results.json").write_text(json.dumps(res, indent=1, default=_json_default))
    write_markdown(res, out_dir / "results.md")
    if "plots" not in args.skip:
        try:
            import plots

            made = plots.make_plots(res, out_dir)
            log(f"\nplots: {', '.join(str(p) for p in made)}")
        except Exception as exc:
            log(f"\nplots not made: {_err(exc)}")
    log(f"\nwrote {out_dir / 'results.json'} and {out_dir / 'results.md'} "
        f"({time.perf_counter() - ctx.t0:.0f} s in all)")
    try:
        print(short_table(res), flush=True)
    except Exception as exc:
        print(f"(the short table could not be printed: {_err(exc)}; see results.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
