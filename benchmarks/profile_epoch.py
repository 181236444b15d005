"""One resident training epoch of the suite's LR or FM16 row, bracketed by
cudaProfilerStart/Stop, for Nsight Compute: where the kernel's time goes
(stall reasons, memory throughput, L2 hit rates), measured rather than
inferred from stage ablations.

    ncu --profile-from-start off --clock-control none --set full \\
        python benchmarks/profile_epoch.py --model lr

Without ncu it only prints the epoch time.  ``--timing`` (no ncu) splits
the suite's epoch time (the wall time of ``run_epoch``, synchronised around
it) into the training kernel's own time (CUDA events around its launch) and
what the host adds before and after it, over ``--repeat`` epochs, with the
SM clock and power that ``nvidia-smi`` samples meanwhile.  The task is the suite's
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


class _TimedKernel:
    """A compiled kernel whose launches record CUDA events around them."""

    def __init__(self, kern, log):
        object.__setattr__(self, "_k", kern)
        object.__setattr__(self, "_log", log)

    def __call__(self, *args, **kw):
        import cupy as cp

        a, b = cp.cuda.Event(), cp.cuda.Event()
        t = time.perf_counter()
        a.record()
        self._k(*args, **kw)
        b.record()
        self._log.append((t, a, b))

    def __getattr__(self, name):
        return getattr(self._k, name)

    def __setattr__(self, name, value):
        setattr(self._k, name, value)


def timing(one_epoch, repeat):
    """Per epoch: the wall time of ``one_epoch()`` synchronised around it,
    the kernels' event time, the host time before the first launch, and the
    device's idle time before it (event); medians over ``repeat`` epochs."""
    import subprocess

    import cupy as cp

    from sklearn_cuwide._backends import _cuda

    log, orig = [], _cuda.train_kernel
    _cuda.train_kernel = lambda *a, **k: _TimedKernel(orig(*a, **k), log)
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
         "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        for _ in range(repeat):
            log.clear()
            cp.cuda.Device().synchronize()
            start = cp.cuda.Event()
            t0 = time.perf_counter()
            start.record()
            one_epoch()
            cp.cuda.Device().synchronize()
            wall = (time.perf_counter() - t0) * 1e3
            kern = sum(cp.cuda.get_elapsed_time(a, b) for _, a, b in log)
            pre_host = (log[0][0] - t0) * 1e3
            pre_dev = cp.cuda.get_elapsed_time(start, log[0][1])
            rows.append((wall, kern, pre_host, pre_dev, len(log)))
    finally:
        _cuda.train_kernel = orig
        smi.terminate()
    samples = [[float(x) for x in ln.split(",")] for ln in smi.communicate()[0].splitlines()
               if ln.strip() and "N/A" not in ln]
    med = np.median(np.array(rows), axis=0)
    clk = np.median(np.array(samples), axis=0) if samples else [np.nan] * 4
    return dict(wall_ms=med[0], kernel_ms=med[1], pre_host_ms=med[2], pre_device_ms=med[3],
                launches=int(med[4]), sm_mhz=clk[0], mem_mhz=clk[1], watts=clk[2],
                temp_c=clk[3])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lr", help="lr, fm or lr,fm")
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--timing", action="store_true",
                    help="no profile: the epoch time split into kernel and host time")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args(argv)
    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide.datasets import make_ctr_classification

    be = get_backend("cuda:0")
    t0 = time.perf_counter()
    X, y = make_ctr_classification(n_samples=a.rows, n_features=2**22, model="fm",
                                   random_state=0)
    print(f"data {time.perf_counter() - t0:.1f} s, {X.nnz} nonzeros", flush=True)
    for model in a.model.split(","):
        one_model(be, X, y, model, a)


def one_model(be, X, y, model, a):
    import cupy as cp

    from sklearn_cuwide._solvers import batch_weights
    from sklearn_cuwide._state import ModelState

    k = 16 if model == "fm" else 0
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
    st = be.put_state(ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01,
                                       random_state=0).permute_features(L.feature_order))
    grid = be.concurrent_blocks("max" if k else "auto", params, L.n_batches)
    rng = np.random.default_rng(0)
    kw = dict(grid=grid)
    be.run_epoch(dl, yl, sw, bw, st, params, rng.permutation(L.n_batches),
                 ramp=be.default_ramp(params), **kw)
    be.run_epoch(dl, yl, sw, bw, st, params, rng.permutation(L.n_batches), **kw)
    if a.timing:
        r = timing(lambda: be.run_epoch(dl, yl, sw, bw, st, params,
                                        rng.permutation(L.n_batches), **kw), a.repeat)
        print(f"{model} timing: epoch (wall) {r['wall_ms']:.3f} ms, kernel {r['kernel_ms']:.3f} "
              f"ms in {r['launches']} launch(es), host before the launch {r['pre_host_ms']:.3f} "
              f"ms, device idle before it {r['pre_device_ms']:.3f} ms; SM {r['sm_mhz']:.0f} "
              f"MHz, memory {r['mem_mhz']:.0f} MHz, {r['watts']:.0f} W, {r['temp_c']:.0f} C",
              flush=True)
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            be.run_epoch(dl, yl, sw, bw, st, params, rng.permutation(L.n_batches), **kw)
        prof.disable()
        print(f"{model}: host profile of 10 epochs (the device's wait included where the "
              "host synchronises)", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
        return
    order = rng.permutation(L.n_batches)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    ms = time_events(lambda: be.run_epoch(dl, yl, sw, bw, st, params, order, **kw))
    cp.cuda.profiler.stop()
    print(f"{model} epoch {ms:.3f} ms ({grid} workers, sample block {L.sample_block}, "
          f"{L.n_hot} hot features)", flush=True)


if __name__ == "__main__":
    main()
