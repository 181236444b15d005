"""Exploration on the GPU: where an epoch's time goes, and which step
scaling lets concurrent (Hogwild) training learn as well as the sequential
order.  Prints tables; writes explore.json to --out.

    PYTHONPATH=. python benchmarks/explore_gpu.py --out $OUT
"""
import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import time_events  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--test-rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=2**22)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", default="LR,FM")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--ramp-sweep", action="store_true")
    ap.add_argument("--policy-sweep", action="store_true",
                    help="FM: capC step policies against sqrt and plain sums")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--grid", default="",
                    help="FM quality grid 'staleness:lr:l2_v:ramp,...' (staleness False/True/sqrt/capC)")
    args = ap.parse_args()
    import cupy as cp
    from sklearn.metrics import roc_auc_score

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import batch_weights
    from sklearn_cuwide._state import ModelState, StepParams
    from sklearn_cuwide.datasets import make_ctr_classification

    be = get_backend("cuda:0")
    t0 = time.perf_counter()
    X, y = make_ctr_classification(n_samples=args.rows + args.test_rows,
                                   n_features=args.features, model="fm", random_state=0)
    Xtr, ytr, Xte, yte = X[: args.rows], y[: args.rows], X[args.rows:], y[args.rows:]
    print(f"data {time.perf_counter()-t0:.1f}s nnz {Xtr.nnz}", flush=True)
    out = {}

    for name in args.models.split(","):
        k = 16 if name == "FM" else 0
        params = StepParams(model="fm" if k else "linear", loss="logistic", solver="adagrad",
                            learning_rate=0.05, l2_w=1e-7, l2_v=1e-6 if k else 0.0)
        sb, nh = be.tile_shape(params, 1, k, args.batch)
        t0 = time.perf_counter()
        L = be.build_layout(Xtr, batch_size=args.batch, sample_block=sb, n_hot_max=nh,
                            shuffle=True, random_state=0)
        dl = be.put_layout(L)
        cp.cuda.Device().synchronize()
        print(f"{name}: layout {time.perf_counter()-t0:.2f}s sb {sb} hot {L.n_hot}", flush=True)
        ro = L.row_order
        yl = cp.asarray(ytr[ro].astype(np.float32)); swl = cp.ones(L.n_rows, dtype=cp.float32)
        bw = batch_weights(L, np.ones(L.n_rows))

        def fresh(G0=0.0):
            st = ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01, random_state=0)
            for a in (st.gw, st.gV, st.gb):
                if a is not None:
                    a[:] = G0
            return be.put_state(st.permute_features(L.feature_order))

        def auc_of(dst):
            h = be.get_state(dst).permute_features(L.feature_rank)
            d = be.to_host(be.decision_function(Xte, h.w, h.b, h.V))[:, 0]
            return roc_auc_score(yte, d)

        rows = []
        dst = fresh()
        order = np.random.default_rng(0).permutation(L.n_batches)
        be.run_epoch(dl, yl, swl, bw, dst, params, order)  # compile, warm
        for label, kw in () if args.no_timing else (("full", {}), ("grid132", {"grid": 132}),
                          ("no-aggregate", {"skip": 1}), ("no-hot-apply", {"skip": 2}),
                          ("no-cold-apply", {"skip": 4}), ("no-flush", {"skip": 8}),
                          ("only-loss", {"skip": 15})):
            ts = [time_events(lambda: be.run_epoch(dl, yl, swl, bw, dst, params, order, **kw)) for _ in range(3)]
            rows.append((label, float(np.median(ts))))
        if not args.no_timing:
            t1 = time_events(lambda: be.run_epoch(dl, yl, swl, bw, dst, params, order[:100], deterministic=True))
            rows.append(("sequential, per batch", t1 / 100))
        for r in rows:
            print(f"  {name} time {r[0]:>22}: {r[1]:.3f} ms", flush=True)
        out[name + "_time"] = rows
        if args.no_quality:
            continue
        qrows = []
        if args.grid and k:
            conv = {"False": False, "True": True}
            grid = []
            for item in args.grid.split(","):
                s_, lr_, l2_, r_ = item.split(":")
                grid.append((conv.get(s_, s_), 0.0, float(lr_), float(l2_), int(r_)))
        elif args.policy_sweep and k:
            grid = [(s_, 0.0, lr_, 1e-6, r_) for s_, lr_, r_ in (
                ("sqrt", 0.05, 32), (False, 0.02, 32), ("cap6", 0.05, 32), ("cap4", 0.05, 32),
                ("cap8", 0.05, 32), ("cap12", 0.05, 32), ("cap24", 0.05, 32), ("cap6", 0.1, 32),
                ("cap6", 0.02, 32), ("cap6", 0.05, 128), ("cap12", 0.02, 32), (False, 0.01, 32),
                ("cap4", 0.1, 32), ("sqrt", 0.1, 32), (False, 0.02, 128), ("cap6", 0.03, 64))]
        elif args.ramp_sweep and k:
            grid = [(s_, 0.0, lr_, l2_, r_) for s_, lr_, l2_, r_ in (
                ("sqrt", 0.05, 1e-6, 8), ("sqrt", 0.05, 1e-6, 32), (False, 0.05, 1e-6, 8),
                (False, 0.05, 1e-6, 32), ("sqrt", 0.1, 1e-6, 32), ("sqrt", 0.05, 1e-4, 32),
                (True, 0.05, 1e-6, 32), ("sqrt", 0.05, 1e-6, 128), (False, 0.02, 1e-6, 32))]
            grid.append(("sqrt", 0.1, 0.05, 1e-6, 32))
        elif args.ramp_sweep:
            grid = [(s_, 0.0, lr_, 1e-7, r_) for s_, lr_, r_ in (
                (False, 0.05, 0), (False, 0.05, 8), (False, 0.05, 32), ("sqrt", 0.05, 8),
                (False, 0.02, 8), ("sqrt", 0.05, 32))]
        elif k:
            grid = [g + (0,) for g in itertools.product([False, "sqrt", True], [0.0, 0.1, 1.0], [0.05, 0.2], [1e-6, 1e-4])]
        else:
            grid = [g + (0,) for g in itertools.product([False, "sqrt"], [0.0, 0.1], [0.05, 0.02], [1e-7, 1e-5])]
        for stale, G0, lr, l2, ramp in grid:
            p2 = params.replace(learning_rate=lr, **({"l2_v": l2} if k else {"l2_w": l2}))
            dst = fresh(G0)
            rng = np.random.default_rng(0)
            losses, aucs = [], []
            t_ep = []
            for ep in range(args.epochs):
                o = rng.permutation(L.n_batches)
                kw = dict(staleness=stale, ramp=ramp if ep == 0 else 0)
                box = {}
                t_ep.append(time_events(lambda: box.setdefault("l", be.run_epoch(dl, yl, swl, bw, dst, p2, o, **kw))))
                losses.append(box["l"] / L.n_rows)
                aucs.append(auc_of(dst))
            qrows.append(dict(staleness=str(stale), G0=G0, lr=lr, l2=l2, ramp=ramp, loss=losses, auc=aucs, ms=t_ep))
            print(f"  {name} stale={str(stale):5} G0={G0:<4} lr={lr:<5} l2={l2:<6} ramp={ramp:<3}: AUC/epoch "
                  f"{' '.join('%.4f' % a for a in aucs)} loss {' '.join('%.3f' % l for l in losses)} "
                  f"ms {' '.join('%.1f' % t for t in t_ep)}", flush=True)
        out[name + "_quality"] = qrows
        best = max(qrows, key=lambda r: r["auc"][min(2, len(r["auc"]) - 1)])
        print(f"  {name} best after 3 epochs: {best}", flush=True)
        del dl, L
        cp.get_default_memory_pool().free_all_blocks()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "explore.json").write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
