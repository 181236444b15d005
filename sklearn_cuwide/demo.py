"""The demo: ``python -m sklearn_cuwide.demo``.

Fits the three estimators of sklearn-cuwide on built-in Criteo-like synthetic
data (:func:`~sklearn_cuwide.datasets.make_ctr_classification` with a planted
factorization machine, and :func:`~sklearn_cuwide.datasets.make_ctr_regression`)
beside scikit-learn's ``LogisticRegression``, ``SGDClassifier`` and ``Ridge``
on the same train/test split, and prints one table: model, device, fit time,
test AUC, test logloss and test RMSE.

The default size finishes in well under a minute on a 2-core CPU; on a GPU
(``device_`` is ``"cuda:N"``) it uses five times as many rows and 16 times as
many features.  On a GPU the kernels are compiled (NVRTC, once per device) in
a short warm-up fit before the timed fits, and that compile time is printed
on its own.

Run ``python -m sklearn_cuwide.demo --help`` for the options.  The exit
status is 0 when every model fitted, 1 otherwise (the table then says which
failed and why).
"""

import argparse
import math
import platform
import sys
import time
import traceback
import warnings

import numpy as np

__all__ = ["main"]

#: rows (train + test) and columns of the default run, on the CPU and on a GPU
DEFAULT_ROWS = {"cpu": 200_000, "cuda": 1_000_000}
DEFAULT_FEATURES = {"cpu": 2**12, "cuda": 2**16}
TEST_FRACTION = 0.2
#: inverse L2 strength of the logistic regressions (scikit-learn's and ours)
LR_C = 0.1


def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m sklearn_cuwide.demo",
        description=(
            "Fit GPULogisticRegression, GPUFactorizationMachine and "
            "GPUFactorizationMachineRegressor on Criteo-like synthetic data "
            "beside scikit-learn, and print a table of fit times and test scores."
        ),
    )
    p.add_argument(
        "--n-samples", type=int, default=None,
        help=(
            "rows of each dataset, train + test (default: "
            f"{DEFAULT_ROWS['cpu']:,} on the CPU, {DEFAULT_ROWS['cuda']:,} on a GPU)"
        ),
    )
    p.add_argument(
        "--n-features", type=int, default=None,
        help=(
            "columns, split among 13 numeric features and 26 categorical fields "
            f"(default: {DEFAULT_FEATURES['cpu']:,} on the CPU, "
            f"{DEFAULT_FEATURES['cuda']:,} on a GPU)"
        ),
    )
    p.add_argument(
        "--device", default="auto",
        help="'auto' (default: the GPU when one is usable), 'cpu', 'cuda' or 'cuda:N'",
    )
    p.add_argument(
        "--n-factors", type=int, default=8,
        help="factors of the factorization machines (default: 8)",
    )
    p.add_argument(
        "--epochs", type=int, default=5,
        help="epochs (max_iter) of the mini-batch solvers (default: 5)",
    )
    p.add_argument(
        "--batch-size", type=int, default=1024,
        help="rows per mini-batch of the mini-batch solvers (default: 1024)",
    )
    p.add_argument(
        "--random-state", type=int, default=0,
        help="seed of the data, the split and the models (default: 0)",
    )
    p.add_argument(
        "--no-sklearn", action="store_true",
        help="skip the scikit-learn reference models",
    )
    p.add_argument(
        "--verbose", action="store_true",
        help="print the full traceback of a model that fails",
    )
    args = p.parse_args(argv)
    for name in ("n_factors", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.n_features is not None and args.n_features < 39:
        p.error("--n-features must be at least 39 (13 numeric + 26 fields)")
    if args.n_samples is not None and args.n_samples < 100:
        p.error("--n-samples must be at least 100")
    if not 0 <= args.random_state < 2**32:  # numpy's seeds
        p.error("--random-state must be in [0, 2**32 - 1]")
    return args


# --------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------
def _scores(task, model, X_test, y_test):
    """``(auc, logloss, rmse)`` of a fitted model on the test set (NaN when
    a metric does not apply)."""
    from sklearn.metrics import log_loss, mean_squared_error, roc_auc_score

    if task == "classification":
        proba = np.asarray(model.predict_proba(X_test))[:, 1]
        return (
            roc_auc_score(y_test, proba),
            log_loss(y_test, np.clip(proba, 1e-15, 1 - 1e-15), labels=[0, 1]),
            math.nan,
        )
    pred = np.asarray(model.predict(X_test), dtype=np.float64)
    return math.nan, math.nan, math.sqrt(mean_squared_error(y_test, pred))


def _fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


class _Table:
    """The result table, printed a row at a time as the fits finish."""

    header = ("model", "device", "fit time", "test AUC", "logloss", "RMSE")
    align = ("<", "<", ">", ">", ">", ">")

    def __init__(self, names, out):
        self.out = out
        self.widths = [
            max([len(self.header[0])] + [len(n) for n in names]),
            len("cuda:0"), 9, 8, 7, 7,
        ]

    def _line(self, cells):
        return "  ".join(
            f"{str(c):{a}{w}}" for c, a, w in zip(cells, self.align, self.widths)
        ).rstrip()

    def print_header(self):
        print(self._line(self.header), file=self.out)
        print("  ".join("-" * w for w in self.widths), file=self.out)
        self.out.flush()

    def print_row(self, r):
        if r.get("error"):
            line = self._line((r["name"], r["device"])) + f"  FAILED: {r['error']}"
        else:
            line = self._line((
                r["name"],
                r["device"],
                f"{r['fit_s']:.2f} s",
                _fmt(r["auc"], ".4f"),
                _fmt(r["logloss"], ".4f"),
                _fmt(r["rmse"], ".4f"),
            ))
        print(line, file=self.out)
        self.out.flush()


# --------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------
def _models(args, device, n_train):
    """``(task, name, factory)`` of every model, in table order."""
    from sklearn.linear_model import LogisticRegression, Ridge, SGDClassifier

    from . import (
        GPUFactorizationMachine,
        GPUFactorizationMachineRegressor,
        GPULogisticRegression,
    )

    seed = args.random_state
    mb = dict(
        batch_size=args.batch_size, max_iter=args.epochs, random_state=seed, device=device
    )
    # the factorization machines at their defaults (step, penalties, early
    # stopping keeping the best epoch) but the shared mini-batch settings
    fm = dict(n_factors=args.n_factors, **mb)
    models = []
    if not args.no_sklearn:
        models += [
            ("classification", "sklearn LogisticRegression (lbfgs)",
             lambda: LogisticRegression(C=LR_C, max_iter=1000)),
            ("classification", "sklearn SGDClassifier (log_loss)",
             lambda: SGDClassifier(
                 loss="log_loss", alpha=1.0 / (LR_C * n_train), max_iter=args.epochs,
                 tol=None, random_state=seed)),
        ]
    models += [
        ("classification", "GPULogisticRegression (lbfgs)",
         lambda: GPULogisticRegression(C=LR_C, solver="lbfgs", max_iter=1000, device=device)),
        ("classification", "GPULogisticRegression (adagrad)",
         lambda: GPULogisticRegression(C=LR_C, solver="adagrad", **mb)),
        ("classification", f"GPUFactorizationMachine (k={args.n_factors})",
         lambda: GPUFactorizationMachine(**fm)),
    ]
    if not args.no_sklearn:
        models += [("regression", "sklearn Ridge", lambda: Ridge(alpha=1.0))]
    models += [
        ("regression", f"GPUFactorizationMachineRegressor (k={args.n_factors})",
         lambda: GPUFactorizationMachineRegressor(**fm)),
    ]
    return models


def _warm_up(models, data, out):
    """Fit every sklearn-cuwide model once on a few rows (GPU only): the
    kernels are compiled by NVRTC on first use, and that should not count
    as fit time."""
    t0 = time.perf_counter()
    for task, name, make in models:
        if name.startswith("sklearn"):
            continue
        X_train, _, y_train, _ = data[task]
        n = min(X_train.shape[0], 4096)
        try:
            est = make().set_params(max_iter=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X_train[:n], y_train[:n])
        except Exception:  # the timed fit reports it
            pass
    print(f"GPU warm-up (kernel compilation): {time.perf_counter() - t0:.1f} s", file=out)


def _fit_one(task, name, make, data, verbose):
    X_train, X_test, y_train, y_test = data[task]
    row = {"name": name, "device": "cpu"}
    try:
        est = make()
        with warnings.catch_warnings():
            # convergence warnings of the short runs are expected here
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            est.fit(X_train, y_train)
            row["fit_s"] = time.perf_counter() - t0
            row["device"] = str(getattr(est, "device_", "cpu"))
            row["auc"], row["logloss"], row["rmse"] = _scores(task, est, X_test, y_test)
    except Exception as exc:  # keep going: the table says what failed
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        row["error"] = f"{type(exc).__name__}: {msg}"[:200]
        if verbose:
            traceback.print_exc()
    return row


def _make_data(args, n_samples):
    from sklearn.model_selection import train_test_split

    from .datasets import make_ctr_classification, make_ctr_regression

    seed = args.random_state
    Xc, yc = make_ctr_classification(
        n_samples=n_samples, n_features=args.n_features, model="fm", random_state=seed
    )
    Xr, yr = make_ctr_regression(
        n_samples=n_samples, n_features=args.n_features, model="fm", random_state=seed
    )
    split = dict(test_size=TEST_FRACTION, random_state=seed)
    return {
        "classification": train_test_split(Xc, yc, stratify=yc, **split),
        "regression": train_test_split(Xr, yr, **split),
    }


def main(argv=None, out=None):
    """Run the demo; return the exit status (0 when every model fitted).

    Parameters
    ----------
    argv : list of str or None, default=None
        Command-line arguments (``sys.argv[1:]`` when None).
    out : file-like or None, default=None
        Where to print (``sys.stdout`` when None).
    """
    out = sys.stdout if out is None else out
    args = _parse_args(argv)

    import scipy
    import sklearn

    from . import _device

    try:
        device = _device.resolve_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    on_gpu = device.startswith("cuda")
    size = "cuda" if on_gpu else "cpu"
    n_samples = args.n_samples or DEFAULT_ROWS[size]
    if args.n_features is None:
        args.n_features = DEFAULT_FEATURES[size]

    try:
        from . import __version__ as version
    except ImportError:
        version = "dev"
    print(
        f"sklearn-cuwide {version} demo | Python {platform.python_version()}, "
        f"numpy {np.__version__}, scipy {scipy.__version__}, "
        f"scikit-learn {sklearn.__version__}",
        file=out,
    )
    print(f"device: {args.device!r} -> {device}", file=out)

    t0 = time.perf_counter()
    data = _make_data(args, n_samples)
    Xc = data["classification"][0]
    n_train = Xc.shape[0]
    print(
        f"data: make_ctr_classification / make_ctr_regression (planted FM), "
        f"{n_samples:,} rows ({n_train:,} train / {n_samples - n_train:,} test), "
        f"{args.n_features:,} features, {Xc.nnz / max(n_train, 1):.0f} nonzeros per row "
        f"[{time.perf_counter() - t0:.1f} s]",
        file=out,
    )
    print(
        f"settings: C={LR_C} for the logistic regressions; mini-batch solvers "
        f"adagrad, {args.epochs} epochs of batch_size={args.batch_size};\n"
        f"          factorization machines n_factors={args.n_factors}, their defaults "
        f"otherwise (at most {args.epochs} epochs, the best kept)",
        file=out,
    )

    models = _models(args, device, n_train)
    if on_gpu:
        _warm_up(models, data, out)
    print(file=out)

    table = _Table([name for _, name, _ in models], out)
    table.print_header()
    rows = []
    for task, name, make in models:
        rows.append(_fit_one(task, name, make, data, args.verbose))
        table.print_row(rows[-1])
    print(
        "\nAUC and logloss: click prediction; RMSE: regression. "
        "Fit time is wall-clock time of fit().",
        file=out,
    )
    failed = [r for r in rows if r.get("error")]
    if failed:
        hint = " (--verbose prints the tracebacks"
        if on_gpu:
            hint += "; --device cpu runs the CPU backend"
        print(f"{len(failed)} model(s) failed{hint}).", file=out)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the output was piped into head or the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
