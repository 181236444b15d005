"""How many concurrent thread blocks a mini-batch fit can use before it stops
converging as well as the sequential order (the measurement behind
``concurrency="auto"``), and the FM's per-sample accumulators in shared
vs global memory over ``n_factors``.

    PYTHONPATH=. python benchmarks/explore_grid.py [--part grid,accglobal,big]
        [--sizes 400000,1000000,2000000] [--out DIR]

``grid``: Criteo-like data (2^16 features, the demo's shape) at several
sizes; each estimator (FM k=8, LR sgd, LR adagrad; 5 epochs, defaults) is
fitted on the GPU with ``concurrency=P`` blocks (the results in
``benchmarks/results/2026-11-30_s3_grid/`` were taken before that parameter
existed, with ``_cuda.default_grid`` patched to return P: the same grid).  P=1 is
the sequential order (one block, the CPU backend's semantics).  Prints test
AUC and fit time per P.

``accglobal``: 4M x 2^22 FM epochs for n_factors 4..128 with the per-sample
accumulators in shared memory (default) and in global memory.

``big``: 4M rows (2^22 and 2^16 features), the estimators with
``concurrency`` 1 (the sequential order), 4, 16, 64 and "max" (3 epochs).
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sklearn.base import clone  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression  # noqa: E402
from sklearn_cuwide._backends import _cuda  # noqa: E402
from sklearn_cuwide.datasets import make_ctr_classification  # noqa: E402

ESTIMATORS = {
    "fm8": GPUFactorizationMachine(n_factors=8, max_iter=5),
    "lr-sgd": GPULogisticRegression(solver="sgd", max_iter=5),
    "lr-adagrad": GPULogisticRegression(solver="adagrad", max_iter=5),
}


def _timed_fit(est, concurrency, Xtr, ytr, Xte, yte):
    """(test AUC, fit seconds) of ``est`` on the GPU with that ``concurrency``."""
    t0 = time.perf_counter()
    m = clone(est).set_params(device="cuda", random_state=0,
                              concurrency=concurrency).fit(Xtr, ytr)
    t = time.perf_counter() - t0
    return roc_auc_score(yte, m.decision_function(Xte)), t


def part_grid(sizes, out):
    rows = []
    for n in sizes:
        X, y = make_ctr_classification(n_samples=n + n // 5, n_features=2**16, model="fm",
                                       random_state=3)
        Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
        nb = -(-n // 1024)
        full = _cuda.default_grid(nb)
        Ps = sorted({p for p in (1, 2, 4, 8, 16, 32, 64, 128) if p < full} | {full})
        for name, est in ESTIMATORS.items():
            clone(est).set_params(device="cuda", max_iter=1).fit(Xtr[:5000], ytr[:5000])
            for P in Ps:
                a, t = _timed_fit(est, P, Xtr, ytr, Xte, yte)
                rows.append(dict(rows=n, batches=nb, model=name, P=P, auc=a, fit_s=t,
                                 current_default=full))
                print(f"grid rows={n} batches={nb} {name:10s} P={P:4d} auc={a:.4f} "
                      f"fit={t:.2f}s", flush=True)
    (out / "grid.json").write_text(json.dumps(rows, indent=1))
    # summary: AUC loss against P=1 per (rows, model)
    print("\nAUC - AUC(P=1)")
    for n in sizes:
        for name in ESTIMATORS:
            rs = [r for r in rows if r["rows"] == n and r["model"] == name]
            base = [r["auc"] for r in rs if r["P"] == 1][0]
            print(f"{n:>8} {name:10s} " + " ".join(
                f"P{r['P']}:{r['auc'] - base:+.4f}" for r in rs))


def part_big(out):
    """The benchmark's size (4M rows): the estimators' ``concurrency``."""
    rows = []
    FM = dict(learning_rate=0.05, alpha=3e-4, beta=3e-4, max_iter=3, tol=None)
    plan = {
        2**22: [("fm16", GPUFactorizationMachine(n_factors=16, **FM), (1, 4, 16, 64, "max")),
                ("fm8", GPUFactorizationMachine(n_factors=8, **FM), (1, 4, "max")),
                ("lr-sgd", GPULogisticRegression(solver="sgd", max_iter=3),
                 (1, 2, "max"))],
        2**16: [("fm8", GPUFactorizationMachine(n_factors=8, **FM), (1, 4, 16, "max"))],
    }
    n = 4_000_000
    for d, cases in plan.items():
        X, y = make_ctr_classification(n_samples=n + n // 20, n_features=d, model="fm",
                                       random_state=0)
        Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
        for name, est, concs in cases:
            clone(est).set_params(device="cuda", max_iter=1).fit(Xtr[:5000], ytr[:5000])
            for c in concs:
                a, t = _timed_fit(est, c, Xtr, ytr, Xte, yte)
                rows.append(dict(features=d, model=name, concurrency=c, auc=a, fit_s=t))
                print(f"big 4M x 2^{d.bit_length() - 1} {name:7s} concurrency={c!s:4s} "
                      f"auc={a:.4f} fit={t:.2f}s", flush=True)
    (out / "big.json").write_text(json.dumps(rows, indent=1))


def part_accglobal(out):
    import bench_gpu

    X, y = make_ctr_classification(n_samples=4_200_000, n_features=2**22, model="fm",
                                   random_state=0)
    Xtr, ytr, Xte, yte = X[:4_000_000], y[:4_000_000], X[4_000_000:], y[4_000_000:]
    rows = []
    for k in (4, 8, 16, 32, 64, 128):
        for ag in (False, True):
            r = bench_gpu.run_ours(Xtr, ytr, Xte, yte, model="fm", n_factors=k,
                                   batch_size=1024, epochs=2, lr=0.05, l2_w=3e-4, l2_v=3e-4,
                                   extra_epochs=3, acc_global=ag)
            rows.append(dict(k=k, acc_global=ag, epoch_ms=r["epoch_ms"], auc=r["test_auc"],
                             n_hot=r["n_hot"], sample_block=r["sample_block"]))
            print(f"accglobal k={k:3d} acc_global={ag!s:5s} epoch={r['epoch_ms']:.2f} ms "
                  f"auc={r['test_auc']:.4f} n_hot={r['n_hot']} sb={r['sample_block']}",
                  flush=True)
    (out / "accglobal.json").write_text(json.dumps(rows, indent=1))
    print("\nk   shared_ms  global_ms  global/shared")
    for k in (4, 8, 16, 32, 64, 128):
        s, g = [r["epoch_ms"] for r in rows if r["k"] == k]
        print(f"{k:<4d}{s:9.2f}  {g:9.2f}  {g / s:6.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="grid,accglobal")
    ap.add_argument("--sizes", default="400000,1000000,2000000")
    ap.add_argument("--out", default="benchmarks/results/device")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if "big" in a.part:
        part_big(out)
    if "accglobal" in a.part:
        part_accglobal(out)
    if "grid" in a.part:
        part_grid([int(s) for s in a.sizes.split(",")], out)


if __name__ == "__main__":
    main()
