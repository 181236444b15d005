"""Every system the harness compares, and the floors they are measured against.

Ours, through the public estimators only:

* ``ours_*`` rows train for a fixed number of epochs through
  :func:`sklearn_cuwide._profiling.time_epochs` (the estimator's own fit code;
  device time of each epoch, test metrics after each epoch);
* ``est_*`` rows time ``fit`` end to end (at the suite's settings, and at the
  estimators' defaults).

Peers: scikit-learn's ``LogisticRegression`` / ``SGDClassifier`` / ``Ridge`` on
the CPU (in worker processes beside the GPU work on the GPU machine), a
PyTorch ``EmbeddingBag`` LR and ``Embedding`` FM, and a CuPy cuSPARSE
mini-batch baseline.  Floors: the device copy bandwidth (one read of the CSR
bytes at it is the floor of an epoch) and the pinned host->device rate.

Every system runs inside a guard (:meth:`Ctx.run`): an exception is recorded
under ``error`` and the run goes on.
"""

import math
import time
import traceback
import warnings

import numpy as np

from .configs import (
    AUC_TIE,
    BATCH,
    C_LR,
    INIT_SCALE,
    LBFGS_MAX_ITER,
    LBFGS_TOL,
    FIT_REPEATS,
    LEARNING_RATE,
    MCMC_SWEEPS,
    PREDICT_ROWS,
    REAL_FM_L2,
    REG_LEARNING_RATE,
    RIDGE_ALPHA,
    WARM_ROWS,
)
from .data import csr_rows
from .stages import stage_times, verbose_fit


class NotAvailable(Exception):
    """A system that cannot run here (no GPU, no package)."""


class Skipped(Exception):
    """A system that does not apply to this data, or the budget is spent."""


def log(*a):
    print(*a, flush=True)


def err_text(exc):
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def guarded(label, fn, *a, **kw):
    """``fn(*a, **kw)``, or a record of what stopped it."""
    t0 = time.perf_counter()
    try:
        out = fn(*a, **kw)
    except NotAvailable as exc:
        out = {"error": f"not available: {exc}"}
    except Skipped as exc:
        out = {"skipped": str(exc)}
    except Exception as exc:  # recorded; the run goes on
        out = {"error": err_text(exc), "traceback": traceback.format_exc()[-2000:]}
        log(f"    ! {label}: {out['error']}")
    out.setdefault("wall_s", time.perf_counter() - t0)
    return out


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


def epoch_summary(rec, times_ms):
    """Per-epoch times into a record: the first apart (uploads, warm-up), the
    median of the others as the epoch time."""
    rec["first_epoch_ms"] = times_ms[0]
    rec["epoch_ms_list"] = list(times_ms)
    rec["epoch_ms"] = float(np.median(times_ms[1:])) if len(times_ms) > 1 else times_ms[0]
    return rec


class Ctx:
    """A run: the device, the budget, the kernels already compiled."""

    def __init__(self, gpu, cfg, skip=(), budget_s=None):
        self.gpu = bool(gpu)
        self.cfg = cfg
        self.skip = set(skip)
        self.device = "cuda" if gpu else "cpu"  # the estimators' device parameter
        self.device_name = "cuda:0" if gpu else "cpu"  # where it ran, as recorded
        self.t0 = time.perf_counter()
        self.budget_s = float(cfg["budget_s"] if budget_s is None else budget_s)
        self.deadline = self.t0 + self.budget_s
        self.warmed = set()
        self.tuned = {}  # data set key -> our LR's tuned setting (tune_lr)
        self.compile_s = {}
        self.notes = []
        self.dead = None  # why the GPU stopped working, once it did

    def skipped(self, *tags):
        return any(t in self.skip for t in tags)

    def left(self):
        return self.deadline - time.perf_counter()

    def check_budget(self):
        if self.dead:
            raise Skipped(f"the device failed earlier ({self.dead})")
        if self.left() <= 0:
            raise Skipped(f"time budget of {self.budget_s:.0f} s used up")

    def sync(self):
        if self.gpu:
            import cupy as cp

            cp.cuda.Device().synchronize()

    def run(self, label, fn, *a, **kw):
        """``guarded``; after a failure on the GPU, check the device still
        works (a kernel fault leaves the CUDA context unusable: the GPU work
        after it is then skipped and says why)."""
        rec = guarded(label, fn, *a, **kw)
        if "error" in rec and self.gpu and not self.dead:
            try:
                self.sync()
            except Exception as exc:
                self.dead = f"after {label}: {err_text(exc)}"
                self.notes.append(f"The CUDA context failed {self.dead}; the GPU work after "
                                  "it was skipped.")
                log(f"  !!! the device failed ({self.dead}); skipping further GPU work")
        return rec

    def mem_begin(self):
        """Start watching the cupy memory pool's bytes for a GPU run (None on
        the CPU): the pool's size after each allocation from the device, so
        the peak counts although a fit gives the pool's cached blocks back
        between its phases (the allocations of this thread)."""
        if not self.gpu:
            return None
        import cupy as cp
        from cupy.cuda import memory_hook

        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        base = int(pool.total_bytes())

        class PoolPeak(memory_hook.MemoryHook):
            name = "benchmark_pool_peak"

            def __init__(self):
                self.peak = base

            def alloc_postprocess(self, **kwargs):
                self.peak = max(self.peak, int(pool.total_bytes()))

        # a run that raised left its hook registered: replace it
        memory_hook.get_memory_hooks().pop(PoolPeak.name, None)
        hook = PoolPeak()
        hook.__enter__()
        return base, hook

    def mem_peak(self, token):
        """The pool's peak bytes over those at :meth:`mem_begin`."""
        if token is None:
            return None
        import cupy as cp

        base, hook = token
        hook.__exit__(None, None, None)
        return max(hook.peak, int(cp.get_default_memory_pool().total_bytes())) - base


# --------------------------------------------------------------------------
# ours
# --------------------------------------------------------------------------
def _settings(est):
    keep = ("solver", "learning_rate", "C", "alpha", "beta", "n_factors", "batch_size",
            "concurrency", "scale_penalty", "max_iter", "tol")
    return {k: v for k, v in est.get_params().items() if k in keep}


def ours_epochs(ctx, data, make, *, epochs, variant="flow", evaluate=True):
    """``epochs`` epochs of an estimator's model through ``time_epochs``."""
    from sklearn_cuwide._profiling import time_epochs

    ctx.check_budget()
    est = make()
    Xt = data.Xt if evaluate and data.Xt.shape[0] else None
    key = ("epochs", repr(est), variant)
    if ctx.gpu and key not in ctx.warmed:  # compile before any timing
        t0 = time.perf_counter()
        w = data.rows(WARM_ROWS)
        time_epochs(est, w.X, w.y, epochs=1, variant=variant,
                    eval_X=None if Xt is None else csr_rows(Xt, 0, min(64, Xt.shape[0])))
        ctx.warmed.add(key)
        ctx.compile_s[f"{type(est).__name__} {variant}"] = time.perf_counter() - t0
    tok = ctx.mem_begin()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time_epochs(est, data.X, data.y, epochs=epochs, variant=variant, eval_X=Xt)
    rec = {"device": ctx.device_name, "rows": data.n, "epochs": epochs, "setup_s": t.setup_s,
           "workers": t.workers, "n_hot": t.n_hot, "settings": _settings(est),
           "gpu_peak_bytes": ctx.mem_peak(tok), "train_loss": list(t.loss)}
    epoch_summary(rec, [s * 1e3 for s in t.epoch_s])
    total, curve = t.setup_s, []
    for e, s in enumerate(t.epoch_s):
        total += s
        pt = {"epoch": e + 1, "time_s": total, "train_loss": t.loss[e]}
        if t.eval_decision:
            pt.update(metrics(data.task, data.yt, t.eval_decision[e]))
        curve.append(pt)
    rec["curve"] = curve
    if curve:
        rec.update({k: v for k, v in curve[-1].items() if k.startswith("test_")})
    return rec


def _on_device(X, y):
    """``X`` as a cupyx CSR matrix and ``y`` as a cupy array (the data of a
    user whose matrix is on the GPU already)."""
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    return cpsp.csr_matrix(X), cp.asarray(y)


def ours_fit(ctx, data, make, *, rows=None, on_device=False):
    """``fit`` end to end, then the test metrics.  ``on_device``: the
    training rows are given as a cupyx CSR matrix (uploaded before any
    timing); the prediction is not timed again for it."""
    ctx.check_budget()
    d = data if rows is None else data.rows(rows)
    X, y = _on_device(d.X, d.y) if on_device else (d.X, d.y)
    est = make()
    key = ("fit", repr(est)) + (("cupyx",) if on_device else ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if ctx.gpu and key not in ctx.warmed:
            # compile first: one epoch on the same rows, which takes the fit's
            # own paths (a few thousand rows take the small data's: their checks
            # on the host, one worker), so no timed fit compiles; a cold
            # process's compilation is the start-up part's
            t0 = time.perf_counter()
            w = make()
            if "max_iter" in w.get_params() and w.get_params().get("solver") != "lbfgs":
                w.set_params(max_iter=1)
            w.fit(X, y)
            if d.Xt.shape[0]:
                w.predict(csr_rows(d.Xt, 0, min(64, d.Xt.shape[0])))
            ctx.warmed.add(key)
            ctx.compile_s[f"{type(est).__name__} fit"] = time.perf_counter() - t0
        # the first fit after the warm-up (what a process whose kernels are
        # compiled waits for: the buffers, pools and threads made on first
        # use) and the median of FIT_REPEATS (the steady state), fresh
        # estimators each; the last one is scored
        times, peak = [], None
        for i in range(FIT_REPEATS if ctx.gpu else 1):
            if i:
                if ctx.left() <= 0:  # the budget is spent: keep the fits timed
                    break
                est = make()
            tok = ctx.mem_begin()
            ctx.sync()
            t0 = time.perf_counter()
            est.fit(X, y)
            ctx.sync()
            times.append(time.perf_counter() - t0)
            p = ctx.mem_peak(tok)
            peak = p if peak is None or (p is not None and p > peak) else peak
        # where the time goes: one more fit, its verbose stage lines (not timed above)
        stages, total = stage_times(verbose_fit(make(), X, y)[1])
    del X, y
    rec = {"device": str(getattr(est, "device_", ctx.device_name)), "rows": d.n,
           "fit_s": float(np.median(times)), "fit_first_s": times[0],
           "fit_repeats": len(times), "gpu_peak_bytes": peak, "settings": _settings(est),
           "stages": stages, "stages_fit_s": total}
    if getattr(est, "n_iter_", None) is not None:
        rec["n_iter"] = int(np.max(est.n_iter_))
    fit_s = rec["fit_first_s"]  # the time to target, as the peers' one fit
    if d.Xt.shape[0]:
        z = est.predict(d.Xt) if d.task == "regression" else est.decision_function(d.Xt)
        rec.update(metrics(d.task, d.yt, z))
        if d.task != "regression":
            rec["curve"] = [{"epoch": rec.get("n_iter"), "time_s": fit_s,
                             "test_logloss": rec["test_logloss"], "test_auc": rec["test_auc"]}]
        if not on_device:
            rec.update(time_prediction(ctx, est, d))
    if getattr(est, "solver", "") == "lbfgs":
        rec["coef"] = np.asarray(est.coef_, dtype=np.float64).ravel()
    return rec


def time_prediction(ctx, est, d, rows=PREDICT_ROWS):
    """What scoring costs a user: ``predict_proba`` (``predict`` for a
    regressor) of the first ``rows`` test rows from a scipy CSR in host
    memory, the fitted model kept where it was fitted; on the GPU the median
    of three calls after one untimed call, on the CPU one call."""
    Xp = csr_rows(d.Xt, 0, min(int(rows), d.Xt.shape[0]))
    score = est.predict if d.task == "regression" else est.predict_proba
    if ctx.gpu:
        score(Xp)
    times = []
    for _ in range(3 if ctx.gpu else 1):
        ctx.sync()
        t0 = time.perf_counter()
        score(Xp)
        ctx.sync()
        times.append(time.perf_counter() - t0)
    return {"predict_rows": int(Xp.shape[0]), "predict_s": float(np.median(times))}


def system_list(ctx, data, *, real):
    """``(id, label, family, thunk)`` of every system that runs on ``data``."""
    from sklearn_cuwide import (
        GPUFactorizationMachine,
        GPUFactorizationMachineRegressor,
        GPULogisticRegression,
    )

    cfg = ctx.cfg
    k = cfg["n_factors"]
    epochs = cfg["real_epochs"] if real else cfg["epochs"]
    fa, fb = REAL_FM_L2 if real else cfg["fm_l2"]
    dev = ctx.device
    mb = dict(batch_size=BATCH, random_state=0, device=dev)
    out = []

    def add(sid, label, family, tags, thunk):
        if not ctx.skipped(*tags):
            out.append((sid, label, family, thunk))

    def lr(solver, **kw):
        if solver == "adagrad":  # at its tuned setting, as PyTorch's LR
            def make():
                t = tune_lr(ctx, data, epochs)
                return GPULogisticRegression(solver=solver, C=t["C"],
                                             learning_rate=t["learning_rate"], **mb, **kw)
            return make
        return lambda: GPULogisticRegression(solver=solver, C=C_LR, learning_rate="auto",
                                             **mb, **kw)

    def tuned(thunk):  # the record with the grid that chose its setting
        def run():
            rec = thunk()
            t = tune_lr(ctx, data, epochs)
            rec.update(grid=t["grid"], grid_best=t["grid_best"], tuned_on=t["tuned_on"])
            return rec
        return run

    def fm(**kw):
        return lambda: GPUFactorizationMachine(n_factors=k, learning_rate=LEARNING_RATE,
                                               alpha=fa, beta=fb, init_scale=INIT_SCALE,
                                               **mb, **kw)

    def epochs_of(make):
        return lambda: ours_epochs(ctx, data, make, epochs=epochs)

    def fit_of(make, rows=None, on_device=False):
        return lambda: ours_fit(ctx, data, make, rows=rows, on_device=on_device)

    if data.task == "binary":
        add("ours_lr_adagrad", "ours LR adagrad (epochs)", "LR", ("kernel",),
            tuned(epochs_of(lr("adagrad", concurrency="auto"))))
        if not real:
            add("ours_lr_sgd", "ours LR sgd (epochs, concurrency=auto)", "LR",
                ("kernel", "sgd"), epochs_of(lr("sgd", concurrency="auto")))
            add("ours_lr_sgd_max", "ours LR sgd (epochs, concurrency=max)", "LR",
                ("kernel", "sgd"), epochs_of(lr("sgd", concurrency="max")))
        add("ours_fm", f"ours FM{k} adagrad (epochs, concurrency=max)", "FM", ("kernel",),
            epochs_of(fm(concurrency="max")))
        add("ours_fm_auto", f"ours FM{k} adagrad (epochs, concurrency=auto)", "FM",
            ("kernel",), epochs_of(fm(concurrency="auto")))
        add("ours_fm_scaled", f"ours FM{k} adagrad (epochs, concurrency=max, scale_penalty)",
            "FM", ("kernel",), epochs_of(fm(concurrency="max", scale_penalty=True)))
        # the fits timed from a host CSR, and from a cupyx one (below) the same
        lr_fit = lr("adagrad", max_iter=epochs, tol=1e-4)
        fm_max_fit = fm(max_iter=epochs, tol=None, concurrency="max")
        add("est_lr_adagrad", "ours GPULogisticRegression adagrad (fit)", "LR-fit",
            ("estimators",), tuned(fit_of(lr_fit)))
        if not real:
            add("est_lr_sgd", "ours GPULogisticRegression sgd (fit)", "LR-fit",
                ("estimators", "sgd"), fit_of(lr("sgd", max_iter=epochs, tol=1e-4)))
        add("est_lr_lbfgs", "ours GPULogisticRegression lbfgs (fit)", "lbfgs",
            ("estimators", "lbfgs"),
            fit_of(lambda: GPULogisticRegression(C=C_LR, tol=LBFGS_TOL,
                                                 max_iter=LBFGS_MAX_ITER, device=dev),
                   rows=cfg["sk_rows"] if not real else None))
        add("est_fm", f"ours GPUFactorizationMachine k={k} (fit)", "FM-fit", ("estimators",),
            fit_of(fm(max_iter=epochs, tol=None)))
        if not real:  # the setting of the fit-time target (issue: FM16 at "max")
            add("est_fm_max", f"ours GPUFactorizationMachine k={k} (fit, concurrency=max)",
                "FM-fit", ("estimators",),
                fit_of(fm_max_fit))
        if ctx.gpu and not real:  # the same fits from a matrix on the GPU already
            add("est_lr_adagrad_cupy", "ours GPULogisticRegression adagrad (fit, cupyx input)",
                "LR-fit", ("estimators", "cupy"),
                tuned(fit_of(lr_fit, on_device=True)))
            add("est_fm_cupy", f"ours GPUFactorizationMachine k={k} (fit, concurrency=max, "
                "cupyx input)", "FM-fit", ("estimators", "cupy"),
                fit_of(fm_max_fit, on_device=True))
        add("est_lr_default", "ours GPULogisticRegression() defaults (fit)", "lbfgs",
            ("estimators", "defaults"), fit_of(lambda: GPULogisticRegression(device=dev)))
        add("est_fm_default", "ours GPUFactorizationMachine() defaults (fit)", "FM-fit",
            ("estimators", "defaults"),
            fit_of(lambda: GPUFactorizationMachine(random_state=0, device=dev)))
        add("torch_lr", "PyTorch EmbeddingBag LR (tuned)", "LR", ("torch",),
            lambda: run_torch(ctx, data, k=0, epochs=epochs))
        add("torch_fm", f"PyTorch FM{k} (tuned)", "FM", ("torch",),
            lambda: run_torch(ctx, data, k=k, epochs=epochs))
        add("cusparse_lr", "CuPy cuSPARSE LR (GPU)", "LR", ("cusparse",),
            lambda: run_cusparse(ctx, data, k=0))
        if not real:
            add("cusparse_fm", f"CuPy cuSPARSE FM{k} (GPU)", "FM", ("cusparse",),
                lambda: run_cusparse(ctx, data, k=k))
    else:
        def fm_reg(**kw):
            return lambda: GPUFactorizationMachineRegressor(
                n_factors=k, learning_rate=REG_LEARNING_RATE, alpha=fa, beta=fb, **mb, **kw)

        add("ours_fm_reg", f"ours FM{k} squared (epochs, concurrency=max)", "FM",
            ("kernel", "regression"), epochs_of(fm_reg(concurrency="max")))
        add("est_fm_reg", f"ours GPUFactorizationMachineRegressor k={k} (fit)", "FM-fit",
            ("estimators", "regression"), fit_of(fm_reg(max_iter=epochs, tol=None)))
        add("est_fm_reg_default", "ours GPUFactorizationMachineRegressor() defaults (fit)",
            "FM-fit", ("estimators", "regression", "defaults"),
            fit_of(lambda: GPUFactorizationMachineRegressor(random_state=0, device=dev)))
        if real:  # ratings, whose rows outnumber the model's parameters (MCMC's data)
            add("est_fm_reg_mcmc", f"ours GPUFactorizationMachineRegressor(solver='mcmc', "
                f"max_iter={MCMC_SWEEPS}) (fit)", "FM-fit", ("estimators", "regression"),
                fit_of(lambda: GPUFactorizationMachineRegressor(
                    solver="mcmc", max_iter=MCMC_SWEEPS, random_state=0, device=dev)))
    return out


def tune_lr(ctx, data, epochs):
    """Our adagrad logistic regression's setting on ``data``, tuned as the
    PyTorch baselines are (:func:`run_torch`): every learning rate x ``C`` of
    the run's ``lr_grid`` trained on the PyTorch grid's tuning rows and
    epochs (at most the run's ``epochs``), the best by test AUC
    (:func:`select_best`).  Once per data set:
    ``{"learning_rate", "C", "grid", "grid_best", "tuned_on"}``."""
    from sklearn_cuwide import GPULogisticRegression
    from sklearn_cuwide._profiling import time_epochs

    if data.key in ctx.tuned:
        return ctx.tuned[data.key]
    grid = ctx.cfg["lr_grid"]
    settings = [(r, c) for r in grid["learning_rates"] for c in grid["C"]]
    tg = ctx.cfg.get("torch_grid") or {}
    rows = min(data.n, tg.get("tune_rows") or data.n)
    epochs = min(epochs, tg.get("tune_epochs") or epochs)
    tried = []
    if len(settings) > 1:
        d = data if rows == data.n else data.rows(rows)
        for rate, c in settings:
            est = GPULogisticRegression(solver="adagrad", C=c, learning_rate=rate,
                                        batch_size=BATCH, random_state=0, device=ctx.device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = time_epochs(est, d.X, d.y, epochs=epochs, eval_X=d.Xt)
            total, curve = t.setup_s, []
            for s, z in zip(t.epoch_s, t.eval_decision):
                total += s
                curve.append({"time_s": total, **metrics(d.task, d.yt, z)})
            auc, when = peak_auc(curve)
            tried.append({"learning_rate": rate, "C": c, "best_auc": auc, "time_to_best_s": when})
    i = select_best(tried) if tried else None
    rate, c = settings[0] if i is None else (tried[i]["learning_rate"], tried[i]["C"])
    ctx.tuned[data.key] = out = {"learning_rate": rate, "C": c, "grid": tried,
                                 "grid_best": i, "tuned_on": {"rows": rows, "epochs": epochs}}
    return out


# --------------------------------------------------------------------------
# scikit-learn (CPU; in worker processes beside the GPU work, or here)
# --------------------------------------------------------------------------
SK_LABELS = {"sk_lr": ("sklearn LogisticRegression lbfgs (CPU)", "lbfgs"),
             "sk_lr_default": ("sklearn LogisticRegression() defaults (CPU)", "sk-ref"),
             "sk_lr_best": ("sklearn LogisticRegression, C by validation (CPU)", "sk-ref"),
             "sk_sgd": ("sklearn SGDClassifier log_loss (CPU)", "LR"),
             "sk_ridge": ("sklearn Ridge (CPU)", "reg-fit")}
#: the C grid of ``sk_lr_best``: chosen by the log loss of a stratified tenth
#: of the training rows, then refitted on all of them (never on the test set)
SK_C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


def sklearn_specs(data, *, epochs, sk_rows, sgd_rows, real=False):
    """``{id: (rows, spec)}``: the scikit-learn fits of a dataset; on the
    real (small) binary ones also ``LogisticRegression()`` at its defaults
    and at the ``C`` a validation split picks, the peers of our defaults."""
    def part(rows):
        rows = min(data.n, rows)
        return rows, dict(X=csr_rows(data.X, 0, rows), y=data.y[:rows], Xt=data.Xt,
                          yt=data.yt, C=C_LR, seed=0)

    if data.task != "binary":
        rows, base = part(sk_rows)
        return {"sk_ridge": (rows, dict(base, kind="ridge", alpha=RIDGE_ALPHA))}
    (r1, b1), (r2, b2) = part(sk_rows), part(sgd_rows)
    specs = {"sk_lr": (r1, dict(b1, kind="lr", tol=LBFGS_TOL, max_iter=LBFGS_MAX_ITER)),
             "sk_sgd": (r2, dict(b2, kind="sgd", epochs=epochs))}
    if real:
        specs["sk_lr_default"] = (r1, dict(b1, kind="lr_default"))
        specs["sk_lr_best"] = (r1, dict(b1, kind="lr_best", grid=SK_C_GRID))
    return specs


def _lr_best_c(X, y, grid, seed):
    """The ``C`` of ``grid`` whose ``LogisticRegression(C)``, fitted on 90%
    of the rows (stratified), has the least log loss on the other 10%."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.model_selection import train_test_split

    tr, va = train_test_split(np.arange(X.shape[0]), test_size=0.1, stratify=y,
                              random_state=seed)
    losses = [log_loss(y[va], LogisticRegression(C=c, max_iter=1000).fit(X[tr], y[tr])
                       .predict_proba(X[va])[:, 1], labels=[0, 1]) for c in grid]
    return float(grid[int(np.argmin(losses))])


def sklearn_job(spec):
    """Fit one scikit-learn model; a plain (picklable) dict back."""
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
        elif kind in ("lr_default", "lr_best"):
            from sklearn.linear_model import LogisticRegression

            t0 = time.perf_counter()
            if kind == "lr_best":
                c = _lr_best_c(X, y, spec["grid"], spec["seed"])
                m = LogisticRegression(C=c, max_iter=1000)
                out["settings"] = f"C={c:g} (of {', '.join(f'{g:g}' for g in spec['grid'])})"
            else:
                m = LogisticRegression()
                out["settings"] = "defaults"
            m.fit(X, y)
            out["fit_s"] = time.perf_counter() - t0
            out["n_iter"] = int(np.max(m.n_iter_))
            out.update(metrics("binary", yt, m.decision_function(Xt)))
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
            epoch_summary(out, times)
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
            raise ValueError(f"unknown scikit-learn job {kind!r}")
    except Exception as exc:
        out["error"] = err_text(exc)
        out["traceback"] = traceback.format_exc()[-2000:]
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _split_cores(n_workers):
    """``(the main process's cores, the workers')``: the last ``n_workers``
    of this process's cores for the workers, when more are left for the
    main process; ``None`` where they cannot be split (too few cores, no
    affinity on this system)."""
    import os

    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None
    if len(cores) <= n_workers:
        return None
    return cores[:-n_workers], cores[-n_workers:]


def _worker_start(cores):
    """A worker process keeps to ``cores`` (None: wherever it is) with one
    BLAS/OpenMP thread (scikit-learn's lbfgs and SGD use one core for these
    models)."""
    import os

    if cores is not None:
        try:
            os.sched_setaffinity(0, cores)
        except (AttributeError, OSError):
            pass
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except Exception:  # noqa: BLE001 - without it the environment's limits hold
        pass


def _file_job(path):
    """:func:`sklearn_job` of a spec pickled to ``path`` (see :class:`Jobs`)."""
    import pickle

    with open(path, "rb") as f:
        return sklearn_job(pickle.load(f))


class Jobs:
    """scikit-learn fits: at once (``workers=0``) or in spawned worker
    processes (no GPU state inherited) while the GPU parts run.

    Rule: the workers and the timed work of the main process share no core
    and no lock.  Why: the data reaches a worker through a file the main
    process writes at submission, before any timing (a pipe is fed by a
    thread of the main process while the GPU fits run, and holds its lock);
    the workers run on the last ``workers`` cores with one thread each, the
    main process on the others (:func:`_split_cores`; where they cannot be
    split, as they come)."""

    def __init__(self, workers):
        self.pool = None
        self.error = None
        self.cache = {}
        self.tmp = None
        self.cores = None
        if workers > 0:
            try:
                import multiprocessing as mp
                import os
                import tempfile
                from concurrent.futures import ProcessPoolExecutor

                ctx = mp.get_context("spawn")
                split = _split_cores(workers)
                if split is not None:
                    os.sched_setaffinity(0, split[0])
                self.cores = split
                self.pool = ProcessPoolExecutor(
                    workers, mp_context=ctx, initializer=_worker_start,
                    initargs=(None if split is None else split[1],))
                self.tmp = tempfile.TemporaryDirectory(prefix="cuwide-bench-")
            except Exception as exc:  # run them here instead
                self.error = err_text(exc)
                self.pool = None

    def _to_file(self, spec):
        import os
        import pickle

        path = os.path.join(self.tmp.name, f"job{len(os.listdir(self.tmp.name))}.pkl")
        with open(path, "wb") as f:
            pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def submit(self, spec, key=None):
        """Start a fit; fits with the same ``key`` (the same rows) run once."""
        if key is not None and key in self.cache:
            return self.cache[key]
        handle = None
        if self.pool is not None:
            try:
                handle = ("future", self.pool.submit(_file_job, self._to_file(spec)), spec)
            except Exception as exc:
                self.error = err_text(exc)
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
                return {"error": f"did not finish within the time budget ({err_text(exc)})"}
            out = sklearn_job(spec)  # a broken worker: run it here
            out["note"] = f"worker process failed ({err_text(exc)}); ran in the main process"
            return out

    def close(self, kill=False):
        if self.pool is None:
            return
        if kill:  # end this run's worker processes, one by one
            for p in list(getattr(self.pool, "_processes", {}).values()):
                try:
                    p.terminate()
                except Exception:
                    pass
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        if self.tmp is not None:
            self.tmp.cleanup()
        if self.cores is not None:  # the main process's cores back
            import os

            os.sched_setaffinity(0, self.cores[0] + self.cores[1])


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------
class TorchWide:
    """LR (``EmbeddingBag``, sum, per-sample weights) or FM (``Embedding``
    per row, fixed-length rows as the usual PyTorch FMs have), sparse
    gradients, sparse Adagrad or SparseAdam (the hand-written model users
    have today)."""

    def __init__(self, n_features, *, n_factors=0, nnz_row=None, optimizer="adagrad",
                 lr=LEARNING_RATE, init_scale=INIT_SCALE, seed=0, device="cuda"):
        import torch

        self.torch = torch
        self.dev = torch.device(device)
        torch.manual_seed(seed)
        self.k = n_factors
        self.nnz_row = nnz_row
        if n_factors:
            self.V = torch.nn.Embedding(n_features, n_factors, sparse=True).to(self.dev)
            torch.nn.init.normal_(self.V.weight, std=init_scale)
            self.lin = torch.nn.Embedding(n_features, 1, sparse=True).to(self.dev)
            torch.nn.init.zeros_(self.lin.weight)
            sparse = [self.V.weight, self.lin.weight]
        else:
            self.emb = torch.nn.EmbeddingBag(n_features, 1, mode="sum",
                                             sparse=True).to(self.dev)
            torch.nn.init.zeros_(self.emb.weight)
            sparse = [self.emb.weight]
        self.bias = torch.zeros(1, device=self.dev, requires_grad=True)
        if optimizer == "adagrad":
            self.opts = [torch.optim.Adagrad(sparse, lr=lr),
                         torch.optim.Adagrad([self.bias], lr=lr)]
        elif optimizer == "adam":
            self.opts = [torch.optim.SparseAdam(sparse, lr=lr),
                         torch.optim.Adam([self.bias], lr=lr)]
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}")
        self.loss = torch.nn.BCEWithLogitsLoss()

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def put(self, X, y=None):
        t = self.torch
        out = (t.as_tensor(X.indptr.astype(np.int64), device=self.dev),
               t.as_tensor(X.indices.astype(np.int64), device=self.dev),
               t.as_tensor(X.data.astype(np.float32), device=self.dev))
        if y is not None:
            out = out + (t.as_tensor(np.asarray(y, dtype=np.float32), device=self.dev),)
        return out

    def _forward(self, indptr, indices, data, a, b):
        s, e = indptr[a], indptr[b]
        idx, x = indices[s:e], data[s:e]
        if self.k:
            n = b - a
            idx = idx.view(n, self.nnz_row)
            x = x.view(n, self.nnz_row)
            emb = self.V(idx) * x.unsqueeze(-1)
            ssum = emb.sum(1)
            q = (emb * emb).sum(1)
            lin = (self.lin(idx).squeeze(-1) * x).sum(1)
            return self.bias + lin + 0.5 * (ssum * ssum - q).sum(1)
        return self.emb(idx, indptr[a:b] - s, per_sample_weights=x).squeeze(1) + self.bias

    def epoch(self, data, batch_size, order):
        indptr, indices, vals, y = data
        n = indptr.numel() - 1
        for bi in order:
            a = int(bi) * batch_size
            b = min(n, a + batch_size)
            loss = self.loss(self._forward(indptr, indices, vals, a, b), y[a:b])
            for o in self.opts:
                o.zero_grad()
            loss.backward()
            for o in self.opts:
                o.step()

    def decision(self, data, batch_size=1 << 16):
        indptr, indices, vals = data[:3]
        n = indptr.numel() - 1
        with self.torch.no_grad():
            outs = [self._forward(indptr, indices, vals, a, min(n, a + batch_size))
                    for a in range(0, n, batch_size)]
        return self.torch.cat(outs).float().cpu().numpy()


def _torch_once(ctx, data, *, k, epochs, optimizer, batch_size, lr, device, nnz_row):
    """One PyTorch setting trained end to end: the model, the host CSR's
    copy to the device (train and test), then ``epochs`` epochs, each
    followed by the test metrics (not timed).  ``fit_s``: the setup and the
    epochs, the wall-clock a user waits for."""
    import torch

    def model():
        return TorchWide(data.d, n_factors=k, nnz_row=nnz_row, optimizer=optimizer, lr=lr,
                         device=device)

    # a warm-up on a few rows first (CUDA context, kernels)
    w = data.rows(WARM_ROWS)
    m = model()
    m.epoch(m.put(w.X, w.y), batch_size, range(-(-w.n // batch_size)))
    m.decision(m.put(csr_rows(data.Xt, 0, min(64, data.Xt.shape[0]))))
    m.sync()
    del m
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    m = model()
    train, test = m.put(data.X, data.y), m.put(data.Xt)
    m.sync()
    setup = time.perf_counter() - t0
    nb = -(-data.n // batch_size)
    rng = np.random.default_rng(0)
    times, curve, total = [], [], setup
    for ep in range(epochs):
        order = rng.permutation(nb)
        m.sync()
        t0 = time.perf_counter()
        m.epoch(train, batch_size, order)
        m.sync()
        dt = time.perf_counter() - t0
        times.append(dt * 1e3)
        total += dt
        curve.append({"epoch": ep + 1, "time_s": total,
                      **metrics(data.task, data.yt, m.decision(test))})
    rec = {"device": ctx.device_name, "rows": data.n, "epochs": epochs, "setup_s": setup,
           "fit_s": total, "optimizer": optimizer, "batch_size": batch_size,
           "learning_rate": lr, "gpu_peak_bytes": int(torch.cuda.max_memory_allocated())
           if device == "cuda" else None, "curve": curve}
    epoch_summary(rec, times)
    rec.update({k2: v for k2, v in curve[-1].items() if k2.startswith("test_")})
    rec["best_auc"], rec["time_to_best_s"] = peak_auc(curve)
    del m, train, test
    if device == "cuda":
        torch.cuda.empty_cache()
    return rec


def peak_auc(curve):
    """``(auc, time_s)``: a curve's highest test AUC and the time it first
    reached it (``(nan, inf)`` without a finite AUC)."""
    pts = [p for p in curve if isinstance(p.get("test_auc"), float)
           and math.isfinite(p["test_auc"])]
    if not pts:
        return math.nan, math.inf
    best = max(p["test_auc"] for p in pts)
    return best, min(p["time_s"] for p in pts if p["test_auc"] == best)


def select_best(tried, tie=AUC_TIE):
    """Index of the best setting of a grid: the highest test AUC (``best_auc``),
    and among those within ``tie`` of it the fastest to reach its own
    (``time_to_best_s``); None when no setting has a finite AUC."""
    ok = [i for i, t in enumerate(tried) if isinstance(t.get("best_auc"), float)
          and math.isfinite(t["best_auc"])]
    if not ok:
        return None
    top = max(tried[i]["best_auc"] for i in ok)
    near = [i for i in ok if tried[i]["best_auc"] >= top - tie]
    return min(near, key=lambda i: (tried[i].get("time_to_best_s", math.inf), -tried[i]["best_auc"]))


def grid_settings(grid):
    """``[(optimizer, batch size, learning rate), ...]`` of a PyTorch grid."""
    rates = grid["learning_rates"]
    return [(o, b, lr) for o in grid["optimizers"] for b in grid["batch_sizes"]
            for lr in (rates[o] if isinstance(rates, dict) else rates)]


def run_torch(ctx, data, *, k, epochs):
    """The PyTorch baseline at its best setting on this data set: every
    setting of the run's grid (:data:`~benchmarks.configs.TORCH_GRIDS`)
    trained on the grid's tuning rows and epochs, the best by test AUC
    (:func:`select_best`), then, when tuned on less, trained again on all
    the rows for all the epochs: the record of that run, with the grid."""
    ctx.check_budget()
    try:
        import torch
    except ImportError as exc:
        raise NotAvailable(f"torch is not installed ({exc})") from None
    if data.task != "binary":
        raise Skipped("the PyTorch baseline is logistic only")
    lens = np.diff(data.X.indptr)
    if k and lens.size and lens.min() != lens.max():
        raise Skipped("the PyTorch FM needs the same number of nonzeros in every row")
    device = "cuda" if ctx.gpu else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise NotAvailable("torch sees no CUDA device")
    grid = ctx.cfg.get("torch_grid") or {
        "optimizers": ("adagrad",), "batch_sizes": (BATCH,),
        "learning_rates": (LEARNING_RATE,), "tune_rows": None, "tune_epochs": None}
    settings = grid_settings(grid)
    tune_rows = min(data.n, grid.get("tune_rows") or data.n)
    tune_epochs = min(epochs, grid.get("tune_epochs") or epochs)
    tuned_on_all = tune_rows == data.n and tune_epochs == epochs
    tune_data = data if tune_rows == data.n else data.rows(tune_rows)
    nnz_row = int(lens[0]) if k and lens.size else None
    runs, tried = [], []
    for optimizer, bs, lr in settings:
        if tried and ctx.left() <= 0:
            break  # the budget is spent: the best of what ran
        rec = _torch_once(ctx, tune_data, k=k, epochs=tune_epochs, optimizer=optimizer,
                          batch_size=bs, lr=lr, device=device, nnz_row=nnz_row)
        runs.append(rec)
        tried.append({key: rec.get(key) for key in (
            "optimizer", "batch_size", "learning_rate", "epoch_ms", "fit_s", "best_auc",
            "time_to_best_s", "test_logloss", "test_auc")})
    i = select_best(tried)
    if i is None:
        i = 0
    if tuned_on_all:
        best = runs[i]
    else:
        t = tried[i]
        best = _torch_once(ctx, data, k=k, epochs=epochs, optimizer=t["optimizer"],
                           batch_size=t["batch_size"], lr=t["learning_rate"], device=device,
                           nnz_row=nnz_row)
    best["grid"] = tried
    best["grid_best"] = i
    best["tuned_on"] = {"rows": tune_rows, "epochs": tune_epochs}
    best["note"] = (
        f"best test AUC of {len(tried)} of {len(settings)} settings (optimizer x batch size "
        f"x learning rate; tuned on {tune_rows:,} rows, {tune_epochs} epoch(s)): "
        f"{best['optimizer']}, batch {best['batch_size']}, rate {best['learning_rate']}")
    return best


# --------------------------------------------------------------------------
# CuPy cuSPARSE
# --------------------------------------------------------------------------
class CusparseWide:
    """Mini-batch Adagrad with cuSPARSE products and dense model updates."""

    def __init__(self, X, y, batch_size, n_factors=0, lr=LEARNING_RATE,
                 init_scale=INIT_SCALE, seed=0):
        import cupy as cp
        import cupyx.scipy.sparse as cpsp

        self.cp = cp
        d = X.shape[1]
        self.k = n_factors
        self.batches = []
        for a in range(0, X.shape[0], batch_size):
            Xb = cpsp.csr_matrix(X[a : a + batch_size])
            Xb2 = Xb.multiply(Xb).tocsr() if n_factors else None
            self.batches.append((Xb, Xb2, cp.asarray(y[a : a + batch_size], dtype=cp.float32)))
        self.w = cp.zeros(d, dtype=cp.float32)
        self.Gw = cp.zeros(d, dtype=cp.float32)
        self.b = cp.zeros(1, dtype=cp.float32)
        self.Gb = cp.zeros(1, dtype=cp.float32)
        if n_factors:
            rs = cp.random.RandomState(seed)
            self.V = (rs.standard_normal((d, n_factors)) * init_scale).astype(cp.float32)
            self.GV = cp.zeros_like(self.V)
        self.lr = lr

    def _ada(self, p, G, g):
        G += g * g
        p -= self.lr * g / (self.cp.sqrt(G) + 1e-7)

    def step(self, i):
        cp = self.cp
        Xb, Xb2, yb = self.batches[i]
        z = Xb @ self.w + self.b
        if self.k:
            S = Xb @ self.V
            Q = Xb2 @ (self.V * self.V)
            z = z + 0.5 * (S * S - Q).sum(1)
        e = (1 / (1 + cp.exp(-z)) - yb) / yb.size
        self._ada(self.w, self.Gw, Xb.T @ e)
        self._ada(self.b, self.Gb, e.sum(keepdims=True))
        if self.k:
            gV = Xb.T @ (e[:, None] * S) - self.V * (Xb2.T @ e)[:, None]
            self._ada(self.V, self.GV, gV)

    def epoch(self, order):
        for i in order:
            self.step(int(i))


def run_cusparse(ctx, data, *, k):
    """Timed over at most ``cusparse_batches`` mini-batches, scaled to an epoch."""
    ctx.check_budget()
    if not ctx.gpu:
        raise NotAvailable("the cuSPARSE baseline runs on the GPU only")
    if data.task != "binary":
        raise Skipped("the cuSPARSE baseline is logistic only")
    nb = -(-data.n // BATCH)
    used = min(nb, int(ctx.cfg["cusparse_batches"]))
    rows = min(data.n, used * BATCH)
    tok = ctx.mem_begin()
    m = CusparseWide(csr_rows(data.X, 0, rows), data.y[:rows], BATCH, n_factors=k)
    m.epoch(range(min(20, used)))  # warm-up (cuSPARSE handles, kernels)
    order = np.random.default_rng(0).permutation(used)
    ctx.sync()
    t0 = time.perf_counter()
    m.epoch(order)
    ctx.sync()
    dt = time.perf_counter() - t0
    return {"device": ctx.device_name, "rows": data.n, "batches_timed": used,
            "batches_per_epoch": nb,
            "epoch_ms": dt * 1e3 * nb / used, "gpu_peak_bytes": ctx.mem_peak(tok),
            "note": f"timed over {used} of {nb} mini-batches, scaled to an epoch"}


# --------------------------------------------------------------------------
# floors
# --------------------------------------------------------------------------
def _event_ms(fn, repeat, warmup=2):
    """Median milliseconds of device time of ``fn()`` (CUDA events)."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(out))


def copy_bandwidth(nbytes=2 << 30):
    """Device-to-device copy rate, bytes read + written per second."""
    import cupy as cp

    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = _event_ms(lambda: dst.__setitem__(Ellipsis, src), repeat=12)
    return 2 * nbytes / (ms * 1e-3)


def h2d_bandwidth(nbytes=1 << 30):
    """Pinned host -> device copy rate, bytes per second."""
    import cupy as cp

    mem = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, dtype=cp.uint8)
    return nbytes / (_event_ms(lambda: dev.set(host), repeat=5) * 1e-3)


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


def floors(ctx):
    if ctx.gpu:
        out = {"kind": "device", "copy_bw": float(copy_bandwidth())}
        h2d = guarded("h2d", lambda: {"v": h2d_bandwidth()})
        out["h2d_bw"] = float(h2d.get("v", math.nan))
    else:
        out = {"kind": "host (numpy copy; no device)", "h2d_bw": None,
               "copy_bw": host_copy_bandwidth(16 << 20 if ctx.cfg["smoke"] else 256 << 20)}
    log(f"  copy {out['copy_bw'] / 1e9:.1f} GB/s (read+write)"
        + (f", pinned host->device {out['h2d_bw'] / 1e9:.1f} GB/s" if out.get("h2d_bw") else ""))
    return out
