"""Exploration on the GPU: where an epoch's time goes, and how concurrent
(Hogwild) training should scale its steps to learn as well as the
sequential order.  Prints tables; writes explore.json to --out.

    PYTHONPATH=. python benchmarks/explore_gpu.py --out $OUT
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--test-rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=2**22)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ncu", action="store_true", help="one small launch for ncu")
    args = ap.parse_args()
    import cupy as cp
    from sklearn.metrics import roc_auc_score

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import batch_weights
    from sklearn_cuwide._state import ModelState, StepParams
    from sklearn_cuwide.datasets import make_ctr_classification

    be = get_backend("cuda:0")
    if args.ncu:
        args.rows, args.test_rows = 400_000, 1000
    t0 = time.perf_counter()
    X, y = make_ctr_classification(n_samples=args.rows + args.test_rows,
                                   n_features=args.features, model="fm", random_state=0)
    Xtr, ytr, Xte, yte = X[: args.rows], y[: args.rows], X[args.rows:], y[args.rows:]
    print(f"data {time.perf_counter()-t0:.1f}s nnz {Xtr.nnz}", flush=True)
    out = {}

    def ev_time(fn):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(); fn(); b.record(); b.synchronize()
        return cp.cuda.get_elapsed_time(a, b)

    for name, k, lr in (("LR", 0, 0.05), ("FM", 16, 0.05)):
        params = StepParams(model="fm" if k else "linear", loss="logistic", solver="adagrad",
                            learning_rate=lr, l2_w=1e-7, l2_v=1e-6 if k else 0.0)
        sb, nh = be.tile_shape(params, 1, k, args.batch)
        pool = cp.get_default_memory_pool(); pool.free_all_blocks(); base = pool.total_bytes()
        t0 = time.perf_counter()
        L = be.build_layout(Xtr, batch_size=args.batch, sample_block=sb, n_hot_max=nh,
                            shuffle=True, random_state=0)
        cp.cuda.Device().synchronize()
        t_layout = time.perf_counter() - t0
        dl = be.put_layout(L)
        layout_peak = pool.total_bytes() - base
        print(f"{name}: layout {t_layout:.2f}s on {'gpu' if dl.uploaded else 'host'}, "
              f"sb {sb} hot {L.n_hot} peak {layout_peak/1e9:.2f} GB (csr {(Xtr.data.nbytes+Xtr.indices.nbytes+Xtr.indptr.nbytes)/1e9:.2f})", flush=True)
        ro = L.row_order
        yl = cp.asarray(ytr[ro].astype(np.float32)); swl = cp.ones(L.n_rows, dtype=cp.float32)
        bw = batch_weights(L, np.ones(L.n_rows))

        def fresh():
            st = ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01, random_state=0)
            return be.put_state(st.permute_features(L.feature_order))

        def auc_of(dst):
            h = be.get_state(dst).permute_features(L.feature_rank)
            d = be.to_host(be.decision_function(Xte, h.w, h.b, h.V))[:, 0]
            return roc_auc_score(yte, d)

        if args.ncu:
            dst = fresh()
            for _ in range(3):
                be.run_epoch(dl, yl, swl, bw, dst, params, np.arange(L.n_batches))
            continue
        # ---- timing: grid sizes and skipped stages ----
        rows = []
        dst = fresh()
        order = np.random.default_rng(0).permutation(L.n_batches)
        be.run_epoch(dl, yl, swl, bw, dst, params, order)  # compile, warm
        for label, kw in (("full", {}), ("grid132", {"grid": 132}), ("grid528", {"grid": 528}),
                          ("no-aggregate", {"skip": 1}), ("no-hot-apply", {"skip": 2}),
                          ("no-cold-apply", {"skip": 4}), ("no-flush", {"skip": 8}),
                          ("only-loss", {"skip": 15}), ("no-staleness", {"staleness": False})):
            ts = [ev_time(lambda: be.run_epoch(dl, yl, swl, bw, dst, params, order, **kw)) for _ in range(3)]
            rows.append((label, float(np.median(ts))))
        t1 = ev_time(lambda: be.run_epoch(dl, yl, swl, bw, dst, params, order[:200], deterministic=True))
        rows.append(("sequential, per batch", t1 / 200))
        for r in rows:
            print(f"  {name} time {r[0]:>22}: {r[1]:.3f} ms", flush=True)
        out[name + "_time"] = rows
        # ---- quality: 3 epochs per variant ----
        qrows = []
        variants = [("hogwild-sum", dict(staleness=False)),
                    ("staleness-linear", dict(staleness=True)),
                    ("staleness-sqrt", dict(staleness="sqrt")),
                    ("sqrt+warm2000", dict(staleness="sqrt", sequential_prefix=2000)),
                    ("hogwild+warm2000", dict(staleness=False, sequential_prefix=2000)),
                    ("grid132-sqrt", dict(staleness="sqrt", grid=132))]
        for label, kw in variants:
            for lr_mult in (1.0, 4.0):
                p2 = params.replace(learning_rate=params.learning_rate * lr_mult)
                dst = fresh()
                rng = np.random.default_rng(0)
                losses = []
                t0 = time.perf_counter()
                for ep in range(3):
                    o = rng.permutation(L.n_batches)
                    kw2 = dict(kw)
                    if ep > 0:
                        kw2.pop("sequential_prefix", None)
                    losses.append(be.run_epoch(dl, yl, swl, bw, dst, p2, o, **kw2) / L.n_rows)
                cp.cuda.Device().synchronize()
                el = time.perf_counter() - t0
                a = auc_of(dst)
                qrows.append((label, lr_mult, a, losses, el))
                print(f"  {name} {label:>18} lr x{lr_mult}: AUC {a:.4f} loss {['%.4f' % l for l in losses]} {el:.2f}s", flush=True)
        # deterministic reference on the first 400k rows' batches is too slow for 4M: use 1 epoch of 1000 batches
        out[name + "_quality"] = qrows
        del dl, L
        pool.free_all_blocks()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "explore.json").write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
