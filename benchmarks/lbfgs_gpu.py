"""L-BFGS on the GPU: time per iteration and where it goes (GPU only; the
side-by-side ratio against scikit-learn is bench_gpu.py's ``lbfgs`` part).

    PYTHONPATH=. python benchmarks/lbfgs_gpu.py [--rows 100000] [--sklearn]
"""

import argparse
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--features", type=int, default=2**18)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--sklearn", action="store_true")
    args = ap.parse_args(argv)
    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import fit_lbfgs_linear
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(n_samples=args.rows, n_features=args.features,
                                   random_state=0)
    be = get_backend("cuda:0")
    calls = [0]
    fused = be.fused_objective

    def counting(*a, **k):  # count the objective's evaluations
        fg = fused(*a, **k)
        if fg is None:
            return None

        def wrapped(x):
            calls[0] += 1
            return fg(x)

        return wrapped

    be.fused_objective = counting
    kw = dict(loss="logistic", n_outputs=1, C=1.0, fit_intercept=True, max_iter=1000,
              tol=args.tol)
    fit_lbfgs_linear(X[:2000], y[:2000].astype(float), np.ones(2000), backend=be, **kw)
    be.synchronize()
    t0 = time.perf_counter()
    coef, ic, n_iter, curve = fit_lbfgs_linear(X, y.astype(float), np.ones(X.shape[0]),
                                               backend=be, **kw)
    be.synchronize()
    t = time.perf_counter() - t0
    n_eval = calls[0]
    print(f"gpu lbfgs: {t:.3f} s, {n_iter} iterations, {1e3 * t / max(n_iter, 1):.3f} ms/iteration, "
          f"{n_eval} objective evaluations, final objective {curve[-1]:.8f}")
    # the objective alone (two fused kernels), timed with events
    import cupy as cp

    from baselines import time_events  # benchmarks/ is on sys.path as the script's folder

    ws = cp.full(X.shape[0], 1.0 / X.shape[0])
    fg = fused(X, cp.asarray(y, dtype=cp.float64), ws, loss="logistic", n_outputs=1,
               lam=1.0 / X.shape[0], fit_intercept=True)
    x = cp.asarray(np.concatenate([coef.ravel(), ic]))
    fg(x)
    ms = time_events(lambda: [fg(x) for _ in range(20)]) / 20
    print(f"objective + gradient: {ms:.3f} ms per evaluation; everything else "
          f"{(1e3 * t - ms * n_eval) / max(n_iter, 1):.3f} ms per iteration")
    if args.sklearn:
        from sklearn.linear_model import LogisticRegression

        t0 = time.perf_counter()
        sk = LogisticRegression(C=1.0, tol=args.tol, max_iter=1000).fit(X.astype(np.float64), y)
        ts = time.perf_counter() - t0
        rel = float(np.abs(coef - sk.coef_).max() / np.abs(sk.coef_).max())
        print(f"sklearn: {ts:.2f} s, {int(sk.n_iter_[0])} iterations; speed-up {ts / t:.1f}x; "
              f"coef rel diff {rel:.2e}")


if __name__ == "__main__":
    main()
