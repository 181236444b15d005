"""One resident training epoch of the suite's LR or FM16 row, bracketed by
cudaProfilerStart/Stop, for Nsight Compute: where the kernel's time goes
(stall reasons, memory throughput, L2 hit rates), measured rather than
inferred from stage ablations.

    ncu --profile-from-start off --clock-control none --set full \\
        python benchmarks/profile_epoch.py --model lr

Without ncu it only prints the epoch time.  The task is the suite's
(``run_all.py``): 4M Criteo-like rows x 2^22 features, batch 1024, Adagrad
lr 0.05; LR with C = 0.1 and the concurrency "auto" (every block), FM16
with concurrency "max" and scale_penalty.  Two epochs run first (the first
with the concurrency warm-up), so the profiled one is a resident, steady
epoch with one kernel launch.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_all as ra  # noqa: E402
from baselines import time_events  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("lr", "fm"), default="lr")
    ap.add_argument("--rows", type=int, default=4_000_000)
    a = ap.parse_args(argv)
    import cupy as cp

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._solvers import batch_weights
    from sklearn_cuwide.datasets import make_ctr_classification

    be = get_backend("cuda:0")
    k = 16 if a.model == "fm" else 0
    t0 = time.perf_counter()
    X, y = make_ctr_classification(n_samples=a.rows, n_features=2**22, model="fm",
                                   random_state=0)
    print(f"data {time.perf_counter() - t0:.1f} s, {X.nnz} nonzeros", flush=True)
    l2_w, l2_v = (1e-7, 1e-6) if k else (1.0 / (ra.C_LR * a.rows), 0.0)
    params = ra.make_params("fm" if k else "linear", k, "adagrad", "logistic",
                            ra.LEARNING_RATE, l2_w, l2_v, True if k else None)
    sb, nh = be.tile_shape(params, 1, k, ra.BATCH)
    L = be.build_layout(X, batch_size=ra.BATCH, sample_block=sb, n_hot_max=nh,
                        shuffle=True, random_state=0, dtype=np.float32)
    dl = be.put_layout(L)
    yl = be.to_device(y[L.row_order].astype(np.float32))
    sw = be.to_device(np.ones(L.n_rows, dtype=np.float32))
    bw = batch_weights(L, np.ones(L.n_rows))
    from sklearn_cuwide._state import ModelState

    st = be.put_state(ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01,
                                       random_state=0).permute_features(L.feature_order))
    grid = be.concurrent_blocks("max" if k else "auto", params, L.n_batches)
    rng = np.random.default_rng(0)
    kw = dict(grid=grid)
    be.run_epoch(dl, yl, sw, bw, st, params, rng.permutation(L.n_batches),
                 ramp=be.default_ramp(params), **kw)
    be.run_epoch(dl, yl, sw, bw, st, params, rng.permutation(L.n_batches), **kw)
    order = rng.permutation(L.n_batches)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    ms = time_events(lambda: be.run_epoch(dl, yl, sw, bw, st, params, order, **kw))
    cp.cuda.profiler.stop()
    print(f"{a.model} epoch {ms:.3f} ms ({grid} workers, sample block {L.sample_block}, "
          f"{L.n_hot} hot features)", flush=True)


if __name__ == "__main__":
    main()
