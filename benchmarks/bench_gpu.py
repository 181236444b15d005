"""GPU benchmark of the cuWide kernels against the anchors, in one run.

Usage (on the GPU machine, from the source tree)::

    PYTHONPATH=. python benchmarks/bench_gpu.py --out benchmarks/results/gpu
    PYTHONPATH=. python benchmarks/bench_gpu.py --quick      # small smoke run

Data: ``make_ctr_classification`` shaped like Criteo (26 Zipf categorical
fields + 13 numeric, 39 nonzeros per row, 2^22 features, an FM planted).
For LR and FM (16 factors), Adagrad, the same batch size everywhere:

* this project's flow-based kernel (Hogwild across thread blocks), epoch
  time (CUDA events, median over resident epochs), test AUC after 3 epochs;
* a PyTorch ``EmbeddingBag``/``Embedding`` model with sparse Adagrad;
* a CuPy cuSPARSE mini-batch baseline;
* the floor: one read of the CSR bytes at the measured copy bandwidth;
* L-BFGS LR against scikit-learn's ``LogisticRegression`` on this CPU;
* the GPU memory peak of a fit against the CSR bytes.

It prints a markdown table last and writes ``results.json`` / ``results.md``
to ``--out``.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import (  # noqa: E402
    CusparseWide,
    TorchWide,
    copy_bandwidth,
    csr_bytes,
    h2d_bandwidth,
    time_events,
)


def log(*a):
    print(*a, flush=True)


def env_info():
    import cupy as cp
    import scipy
    import sklearn

    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    info = {
        "gpu": name,
        "sms": props["multiProcessorCount"],
        "driver": cp.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:
        pass
    return info


def auc(y, s):
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s))


def logloss(y, s):
    s = np.asarray(s, dtype=np.float64)
    return float(np.mean(np.logaddexp(0, s) - y * s))


def run_ours(X, y, Xt, yt, *, model, n_factors, batch_size, epochs, lr, l2_w, l2_v,
             extra_epochs=3, init_scale=0.01, deterministic=False, **switches):
    import cupy as cp

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import batch_weights
    from sklearn_cuwide._state import ModelState, StepParams

    be = get_backend("cuda:0")
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base_used = pool.total_bytes()
    params = StepParams(model="fm" if n_factors else "linear", loss="logistic",
                        solver="adagrad", learning_rate=lr, l2_w=l2_w, l2_v=l2_v,
                        penalty_scaled=not n_factors)  # as the estimators
    sb, nh = be.tile_shape(params, 1, n_factors, batch_size)
    if switches.get("no_hot"):
        nh = 0
    if switches.get("no_2d"):
        sb, nh = batch_size, 0
    t0 = time.perf_counter()
    L = be.build_layout(X, batch_size=batch_size, sample_block=sb, n_hot_max=nh,
                        shuffle=True, random_state=0)
    cp.cuda.Device().synchronize()
    t_layout = time.perf_counter() - t0
    ro = L.row_order
    y_l = cp.asarray(y[ro].astype(np.float32))
    sw_l = cp.ones(L.n_rows, dtype=cp.float32)
    bw = batch_weights(L, np.ones(L.n_rows))
    dl = be.put_layout(L, memory_budget=switches.get("memory_budget"))
    st = ModelState.zeros(X.shape[1], 1, n_factors, adagrad=True, init_scale=init_scale,
                          random_state=0)
    dst = be.put_state(st.permute_features(L.feature_order))
    rng = np.random.default_rng(0)
    kw = dict(deterministic=deterministic)
    if switches.get("n_rep"):
        kw["n_rep"] = switches["n_rep"]
    if switches.get("acc_global"):
        kw["acc_global"] = True
    times, losses = [], []
    for ep in range(epochs):
        order = rng.permutation(L.n_batches)
        box = {}
        # the first epoch of a fresh model warms the concurrency up, as the
        # estimators do (1, 2, 4, ... blocks)
        ekw = dict(kw, ramp=be.default_ramp(params)) if ep == 0 and not deterministic else kw
        times.append(time_events(lambda: box.setdefault(
            "l", be.run_epoch(dl, y_l, sw_l, bw, dst, params, order, **ekw))))
        losses.append(box["l"] / L.n_rows)
    peak = pool.total_bytes() - base_used
    host = be.get_state(dst).permute_features(L.feature_rank)
    dec = be.to_host(be.decision_function(Xt, host.w, host.b, host.V))[:, 0]
    res = {
        "layout_s": t_layout,
        "layout_bytes": L.nbytes,
        "n_hot": L.n_hot,
        "sample_block": L.sample_block,
        "first_epoch_ms": times[0],
        "epoch_ms_list": times,
        "train_loss": losses,
        "test_auc": auc(yt, dec),
        "test_logloss": logloss(yt, dec),
        "gpu_peak_bytes": int(peak),
        "resident": bool(dl.resident),
    }
    more = []
    for _ in range(extra_epochs):
        order = rng.permutation(L.n_batches)
        more.append(time_events(lambda: be.run_epoch(dl, y_l, sw_l, bw, dst, params, order, **kw)))
    later = times[1:] + more
    res["epoch_ms"] = float(np.median(later)) if later else times[0]
    del dl, dst
    pool.free_all_blocks()
    return res


def run_torch(X, y, Xt, yt, *, n_factors, batch_size, epochs, lr, init_scale=0.01):
    m = TorchWide(X, n_factors=n_factors, lr=lr, init_scale=init_scale)
    data = m.put(X, y)
    test = m.put(Xt)
    nb = -(-X.shape[0] // batch_size)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(epochs):
        times.append(m.timed_epoch(data, batch_size, rng.permutation(nb)))
    dec = m.decision(test)
    return {"epoch_ms": float(np.median(times)), "epoch_ms_list": times,
            "test_auc": auc(yt, dec), "test_logloss": logloss(yt, dec)}


def run_cusparse(X, y, *, n_factors, batch_size, lr, max_batches):
    import cupy as cp

    nb = -(-X.shape[0] // batch_size)
    used = min(nb, max_batches)
    m = CusparseWide(X[: used * batch_size], y[: used * batch_size], batch_size,
                     n_factors=n_factors, lr=lr)
    m.epoch(range(min(20, used)))  # warm-up
    cp.cuda.Device().synchronize()
    ms = time_events(lambda: m.epoch(np.random.default_rng(0).permutation(used)))
    return {"epoch_ms": ms * nb / used, "batches_timed": used, "batches_per_epoch": nb}


def run_lbfgs(X, y, tol):
    from sklearn.linear_model import LogisticRegression

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import fit_lbfgs_linear

    be = get_backend("cuda:0")
    kw = dict(loss="logistic", n_outputs=1, C=1.0, fit_intercept=True, max_iter=1000, tol=tol)
    fit_lbfgs_linear(X[:2000], y[:2000].astype(float), np.ones(2000), backend=be, **kw)  # warm-up
    be.synchronize()
    t0 = time.perf_counter()
    coef, ic, n_iter, _ = fit_lbfgs_linear(X, y.astype(float), np.ones(X.shape[0]), backend=be, **kw)
    be.synchronize()
    t_gpu = time.perf_counter() - t0
    X64 = X.astype(np.float64)
    t0 = time.perf_counter()
    sk = LogisticRegression(C=1.0, tol=tol, max_iter=1000).fit(X64, y)
    t_sk = time.perf_counter() - t0
    rel = float(np.abs(coef - sk.coef_).max() / np.abs(sk.coef_).max())
    return {"gpu_s": t_gpu, "sklearn_s": t_sk, "speedup": t_sk / t_gpu, "coef_rel_diff": rel,
            "gpu_iters": int(n_iter), "sklearn_iters": int(sk.n_iter_[0])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--test-rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=2**22)
    ap.add_argument("--factors", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--lbfgs-rows", type=int, default=100_000)
    ap.add_argument("--lbfgs-tol", type=float, default=1e-6)
    ap.add_argument("--cusparse-batches", type=int, default=400)
    ap.add_argument("--skip", default="", help="comma list: torch,cusparse,lbfgs,ablation")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="LR,FM", help="comma list of LR, FM")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/gpu"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.test_rows, args.features = 200_000, 50_000, 2**18
        args.lbfgs_rows, args.cusparse_batches = 50_000, 50
    skip = set(filter(None, args.skip.split(",")))
    from sklearn_cuwide.datasets import make_ctr_classification

    out = {"args": vars(args), "env": env_info()}
    log("env", out["env"])
    out["copy_bw"] = copy_bandwidth()
    out["h2d_bw"] = h2d_bandwidth()
    log(f"copy {out['copy_bw']/1e12:.2f} TB/s (read+write), pinned h2d {out['h2d_bw']/1e9:.1f} GB/s")

    t0 = time.perf_counter()
    X, y = make_ctr_classification(n_samples=args.rows + args.test_rows, n_features=args.features,
                                   model="fm", random_state=0)
    Xtr, ytr, Xte, yte = X[: args.rows], y[: args.rows], X[args.rows:], y[args.rows:]
    del X
    out["data"] = {"rows": args.rows, "features": args.features, "nnz": int(Xtr.nnz),
                   "csr_bytes": csr_bytes(Xtr), "gen_s": time.perf_counter() - t0}
    floor_ms = csr_bytes(Xtr) / out["copy_bw"] * 1e3
    out["floor_ms"] = floor_ms
    log("data", out["data"], f"floor {floor_ms:.3f} ms")

    lr_kw = dict(batch_size=args.batch, epochs=args.epochs)
    res = {}
    for name, k in (("LR", 0), ("FM", args.factors)):
        if name not in args.models.split(","):
            continue
        # the configuration chosen before this run (benchmarks/results/explore_*):
        # LR adagrad lr 0.05; FM adagrad lr 0.05 with beta 1e-4
        l2 = dict(l2_w=1e-7, l2_v=1e-4 if k else 0.0)
        r = run_ours(Xtr, ytr, Xte, yte, model=name, n_factors=k, lr=args.lr, **lr_kw, **l2)
        log(f"ours {name}", r)
        res[f"ours_{name}"] = r
        if k and "variants" not in skip:
            for lr_v, l2v in ((0.02, 1e-4), (0.05, 1e-3), (0.02, 1e-3)):
                r = run_ours(Xtr, ytr, Xte, yte, model=name, n_factors=k, lr=lr_v, l2_w=1e-7,
                             l2_v=l2v, extra_epochs=0, **lr_kw)
                log(f"ours {name} lr {lr_v} beta {l2v}", r)
                res[f"ours_{name}_lr{lr_v}_beta{l2v}"] = r
        if "torch" not in skip:
            r = run_torch(Xtr, ytr, Xte, yte, n_factors=k, batch_size=args.batch,
                          epochs=args.epochs, lr=args.lr)
            log(f"torch {name}", r)
            res[f"torch_{name}"] = r
        if "cusparse" not in skip:
            r = run_cusparse(Xtr, ytr, n_factors=k, batch_size=args.batch, lr=args.lr,
                             max_batches=args.cusparse_batches)
            log(f"cusparse {name}", r)
            res[f"cusparse_{name}"] = r
    if "lbfgs" not in skip:
        Xl, yl = make_ctr_classification(n_samples=args.lbfgs_rows, n_features=2**18,
                                         model="lr", random_state=1)
        r = run_lbfgs(Xl, yl, args.lbfgs_tol)
        log("lbfgs", r)
        res["lbfgs"] = r
    out["results"] = res

    # ---- table ----
    rows = ["| system | epoch ms | x floor | ours faster by | test AUC (3 ep) | GPU peak / CSR |",
            "|---|---|---|---|---|---|"]
    for name in ("LR", "FM"):
        if f"ours_{name}" not in res:
            continue
        o = res[f"ours_{name}"]
        rows.append(f"| ours {name} | {o['epoch_ms']:.2f} | {o['epoch_ms']/floor_ms:.1f} | 1.0 | "
                    f"{o['test_auc']:.4f} | {o['gpu_peak_bytes']/csr_bytes(Xtr):.2f} |")
        for sysname in ("torch", "cusparse"):
            r = res.get(f"{sysname}_{name}")
            if r:
                a = f"{r['test_auc']:.4f}" if "test_auc" in r else "-"
                rows.append(f"| {sysname} {name} | {r['epoch_ms']:.2f} | {r['epoch_ms']/floor_ms:.1f} | "
                            f"{r['epoch_ms']/o['epoch_ms']:.1f} | {a} | - |")
    for key, r in res.items():
        if key.startswith("ours_FM_lr"):
            rows.append(f"| {key[5:]} | {r['epoch_ms']:.2f} | {r['epoch_ms']/floor_ms:.1f} | - | "
                        f"{r['test_auc']:.4f} | {r['gpu_peak_bytes']/csr_bytes(Xtr):.2f} |")
    if "lbfgs" in res:
        r = res["lbfgs"]
        rows.append(f"| lbfgs LR vs sklearn | gpu {r['gpu_s']:.2f}s / sk {r['sklearn_s']:.1f}s | - | "
                    f"{r['speedup']:.0f} | coef rel diff {r['coef_rel_diff']:.1e} | - |")
    rows.append(f"\nfloor {floor_ms:.3f} ms = {csr_bytes(Xtr)/1e9:.2f} GB CSR at "
                f"{out['copy_bw']/1e12:.2f} TB/s; GPU {out['env']['gpu']}")
    table = "\n".join(rows)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "results.json").write_text(json.dumps(out, indent=1, default=float))
    Path(args.out, "results.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
