"""Models and data larger than the device: the out-of-core targets, measured.

``python -m benchmarks.out_of_core --out DIR`` (on the GPU machine; ``--smoke``
runs every part on a few thousand rows, on the CPU when there is no GPU)
writes ``DIR/out_of_core.json`` and prints a table.  Three parts, each the
public estimators as a user runs them, with ``verbose=1`` read for the epoch
times:

``model``
    A factorization machine wider than ``--limit`` (``n_factors=32`` over
    ``2**--log2-features`` features by default: about 35 GB of parameters
    and Adagrad sums at 2\\ :sup:`27`), trained resident (no limit) and under
    ``sklearn_cuwide.config_context(device_memory_limit=limit)``, in order
    (``concurrency=1``: the out-of-core model then equals the resident one to
    rounding) and at the default concurrency.  Targets: the limited epoch at
    most 2x the resident one, the test AUC within 0.002, CuPy's pool never
    above the limit.
``stream``
    Logistic regression whose training layout is twice the limit (it
    streams in every epoch): the layout's bytes per epoch second against the
    pinned host-to-device rate measured in the same run (target: 80%).
``partial``
    ``partial_fit`` over ``--chunks`` chunks of ``--chunk-rows`` rows (4 of
    1M by default) read from files on disk (``--readers``): a CSR's arrays
    as ``.npy`` files (``numpy.load``; "mmap": the same files mapped, with
    ``mmap_mode="r"``, read by the call's own passes), an uncompressed ``.npz``
    (``scipy.sparse.load_npz``) and svmlight text (``load_svmlight_file``),
    reads and ``partial_fit`` timed apart, and the user guide's recipe (the
    chunks through :func:`sklearn_cuwide.read_ahead`: the next read while
    this chunk trains) timed whole, against ``fit(max_iter=1)`` of the same
    rows in memory (target: 70% of its rows per second); medians of
    ``--repeats`` runs.

Every limited fit runs with a wrapper of CuPy's pool as the allocator,
which records the pool's peaks in use and held (cached blocks included);
"pool within limit" compares the held peak with the limit.  Beside it,
``nvidia-smi`` samples the device's memory in use every 20 ms through the
fit: its peak over the figure before the fit (the CUDA context, the
kernels already loaded) is what the fit took of the device, CuPy's pool
and everything outside it (libraries' workspaces, modules loaded during
the fit) together.
"""

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
import threading
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import dump_svmlight_file, load_svmlight_file
from sklearn.metrics import roc_auc_score

from sklearn_cuwide import read_ahead

from .suite import gpu_available
from .systems import h2d_bandwidth

#: the targets of the issue
EPOCH_RATIO_TARGET = 2.0
AUC_GAP_TARGET = 0.002
STREAM_SHARE_TARGET = 0.8
PARTIAL_SHARE_TARGET = 0.7

_EPOCH = re.compile(r"^(?:\w[\w ,]* )?[Ee]poch (\d+)/\d+ in ([\d.]+) s", re.M)


def epoch_seconds(text):
    """The seconds of each epoch line of a ``verbose=1`` log."""
    return [float(m.group(2)) for m in _EPOCH.finditer(text)]


def _gpu():
    """cupy when there is a GPU, else None (the CPU)."""
    if not gpu_available():
        return None
    import cupy as cp

    return cp


def _pool_reset(cp):
    if cp is not None:
        cp.cuda.Device().synchronize()
        cp.get_default_memory_pool().free_all_blocks()


@contextlib.contextmanager
def pool_peaks(cp):
    """``{"used": bytes, "held": bytes}``: the most bytes CuPy's pool had in
    use, and held (cached blocks included: what the device sees taken), at
    any allocation inside, above what it had in use and held on entry (a
    wrapper of the pool's ``malloc`` as CuPy's allocator, the allocator
    before it restored after); empty on the CPU."""
    out = {}
    if cp is None:
        yield out
        return
    pool = cp.get_default_memory_pool()
    used0, held0 = int(pool.used_bytes()), int(pool.total_bytes())
    before = cp.cuda.get_allocator()
    out.update(used=0, held=0)

    def alloc(size):
        mem = pool.malloc(size)
        out["used"] = max(out["used"], int(pool.used_bytes()) - used0)
        out["held"] = max(out["held"], int(pool.total_bytes()) - held0)
        return mem

    cp.cuda.set_allocator(alloc)
    try:
        yield out
    finally:
        cp.cuda.set_allocator(before)


@contextlib.contextmanager
def smi_peak(cp):
    """``{"base": bytes, "peak": bytes, "samples": n}``: the device's memory
    in use as ``nvidia-smi`` reports it (every 20 ms, one process printing
    in a loop) before and at most during the block; empty on the CPU or
    without ``nvidia-smi``."""
    out = {}
    if cp is None:
        yield out
        return
    bus = cp.cuda.Device().pci_bus_id
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
           "-i", bus]
    try:
        base = int(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                  timeout=30).stdout.split()[0])
        proc = subprocess.Popen(cmd + ["-lms", "20"], stdout=subprocess.PIPE, text=True)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        yield out
        return
    peak, n = [base], [0]

    def read():
        for line in proc.stdout:
            if line.strip().isdigit():
                peak[0] = max(peak[0], int(line))
                n[0] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield out
    finally:
        time.sleep(0.1)  # a sample after the last allocation
        proc.terminate()
        reader.join(5)
        proc.wait(5)
        proc.stdout.close()
        out.update(base=base << 20, peak=peak[0] << 20, samples=n[0])


def timed_fit(make, X, y, Xt, yt, *, limit, cp):
    """One fit under ``device_memory_limit=limit``: its wall-clock, epoch
    times, test AUC and the pool's peaks (:func:`pool_peaks`), or the
    error that stopped it."""
    from sklearn_cuwide import config_context

    est = make()
    est.set_params(verbose=1)
    _pool_reset(cp)
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        with config_context(device_memory_limit=limit), pool_peaks(cp) as peaks, \
                smi_peak(cp) as smi, contextlib.redirect_stdout(log):
            est.fit(X, y)
    except Exception as exc:  # the plan's refusal, the device or pinned memory ran out
        if not (isinstance(exc, MemoryError) or "MemoryAllocation" in str(exc)):
            raise
        return {"limit": limit, "error": f"{type(exc).__name__}: {exc}"[:2000],
                "log": log.getvalue().splitlines()}
    fit_s = time.perf_counter() - t0
    return {"limit": limit, "fit_s": fit_s, "epoch_s": epoch_seconds(log.getvalue()),
            "test_auc": float(roc_auc_score(yt, est.decision_function(Xt))),
            "pool_used_peak": peaks.get("used"), "pool_held_peak": peaks.get("held"),
            "smi_over_base": smi["peak"] - smi["base"] if smi else None,
            "smi_samples": smi.get("samples"), "log": log.getvalue().splitlines()}


def _data(n, log2_features, seed, zipf_a=1.05, test=0.1):
    from sklearn_cuwide.datasets import make_ctr_classification

    n_test = max(1, int(n * test))
    X, y = make_ctr_classification(n + n_test, n_features=2**int(log2_features),
                                   model="fm", zipf_a=zipf_a, random_state=seed)[:2]
    return X[:n], y[:n], X[n:], y[n:]


def part_model(args, cp, device):
    from sklearn_cuwide import GPUFactorizationMachine

    X, y, Xt, yt = _data(args.rows, args.log2_features, 0)
    out = {"rows": X.shape[0], "features": X.shape[1], "n_factors": args.n_factors,
           "limit": args.limit, "runs": {}}
    for conc in args.concurrency.split(","):
        def make():
            return GPUFactorizationMachine(
                n_factors=args.n_factors, max_iter=args.epochs, tol=None,
                early_stopping=False, random_state=0, device=device,
                concurrency=1 if conc == "1" else "auto")

        make().fit(X[:4096], y[:4096])  # the kernels compiled before any timing
        res = timed_fit(make, X, y, Xt, yt, limit=None, cp=cp)
        lim = timed_fit(make, X, y, Xt, yt, limit=args.limit, cp=cp)
        ok = "error" not in res and "error" not in lim
        ratio = (lim["epoch_s"][-1] / res["epoch_s"][-1]
                 if ok and res["epoch_s"] and lim["epoch_s"] else None)
        held, smi = lim.get("pool_held_peak"), lim.get("smi_over_base")
        out["runs"][conc] = {
            "resident": res, "limited": lim, "epoch_ratio": ratio,
            "auc_gap": res["test_auc"] - lim["test_auc"] if ok else None,
            "pool_within_limit": None if held is None else held <= args.limit,
            "smi_within_limit": None if smi is None else smi <= args.limit,
        }
    return out


def part_stream(args, cp, device):
    from sklearn_cuwide import GPULogisticRegression

    # 2^20 features: the model and its per-feature factors (about 60 bytes a
    # feature) stay resident beside two streamed chunks under half the
    # layout's bytes, so the part measures the layout's streaming alone
    X, y, Xt, yt = _data(args.rows, 20 if not args.smoke else 12, 1)
    layout_bytes = 10 * X.nnz  # the layout: 10 bytes a nonzero (docs/user_guide)
    limit = max(1, layout_bytes // 2)

    def make():
        return GPULogisticRegression(solver="adagrad", max_iter=max(2, args.epochs),
                                     tol=None, early_stopping=False, random_state=0,
                                     device=device)

    make().fit(X[:4096], y[:4096])  # the kernels compiled before any timing
    run = timed_fit(make, X, y, Xt, yt, limit=limit, cp=cp)
    rate = None if cp is None else h2d_bandwidth()
    epoch = run["epoch_s"][-1] if run.get("epoch_s") else None
    streamed = layout_bytes / epoch if epoch else None
    held = run.get("pool_held_peak")
    return {"rows": X.shape[0], "layout_bytes": layout_bytes, "limit": limit, "run": run,
            "model_resident": not any(line.startswith("Out of core")
                                      for line in run.get("log", [])),
            "pinned_rate": rate, "stream_rate": streamed,
            "share": streamed / rate if streamed and rate else None,
            "pool_within_limit": None if held is None else held <= limit,
            "smi_within_limit": (None if run.get("smi_over_base") is None
                                 else run["smi_over_base"] <= limit)}


#: the partial part's file formats: how a chunk is written, and read back
#: ("mmap": the "npy" files mapped, read where partial_fit reads them)
READERS = ("npy", "mmap", "npz", "svmlight")


def _write_chunk(reader, stem, X, y):
    """Chunk ``X, y`` as the files of ``reader`` (paths from ``stem``)."""
    import scipy.sparse as sp

    if reader in ("npy", "mmap"):  # the CSR's arrays as they are: no archive, no parser
        for name in ("indptr", "indices", "data"):
            np.save(f"{stem}.{name}.npy", getattr(X, name))
    elif reader == "npz":
        sp.save_npz(f"{stem}.npz", X, compressed=False)
    else:
        dump_svmlight_file(X, y, f"{stem}.svm", zero_based=True)
    np.save(f"{stem}.y.npy", y)


def _read_chunk(reader, stem, n_features):
    """The chunk ``(X, y)`` that :func:`_write_chunk` wrote, read from disk."""
    import scipy.sparse as sp

    y = np.load(f"{stem}.y.npy")
    if reader in ("npy", "mmap"):
        mode = "r" if reader == "mmap" else None
        arrays = [np.load(f"{stem}.{name}.npy", mmap_mode=mode)
                  for name in ("data", "indices", "indptr")]
        return sp.csr_matrix(tuple(arrays), shape=(arrays[2].size - 1, n_features)), y
    if reader == "npz":
        return sp.load_npz(f"{stem}.npz"), y
    X, _ = load_svmlight_file(f"{stem}.svm", n_features=n_features, zero_based=True,
                              dtype=np.float32)
    return X, y


def part_partial(args, cp, device):
    """``partial_fit`` over chunks on disk, in each of ``--readers``' formats
    (:data:`READERS`: a CSR's arrays as ``.npy`` files, an uncompressed
    ``.npz``, svmlight text), the reads and the ``partial_fit`` calls timed
    apart, and the user guide's recipe (the next chunk read by
    :func:`~sklearn_cuwide.read_ahead` while this one trains) timed whole,
    against ``fit(max_iter=1)`` of the same rows in memory.  Each figure is
    the median of ``--repeats`` runs (svmlight's: one run); the files are
    in the page cache (written just before)."""
    from sklearn_cuwide import GPULogisticRegression

    readers = [r for r in args.readers.split(",") if r]
    if not readers or set(readers) - set(READERS):
        raise ValueError(f"--readers takes some of {', '.join(READERS)}, got {args.readers!r}")

    # --chunks chunks of --chunk-rows rows: a stream of several chunks, in
    # which read_ahead hides every read but the first
    step = args.chunk_rows
    X, y, Xt, yt = _data(step * args.chunks, 22 if not args.smoke else 12, 2)
    d = X.shape[1]
    repeats = max(1, int(args.repeats))
    with tempfile.TemporaryDirectory() as tmp:
        stems = [str(Path(tmp) / f"part{k}") for k in range(-(-X.shape[0] // step))]
        for reader in readers:
            if reader == "mmap" and "npy" in readers:
                continue  # the same files
            for k, stem in enumerate(stems):
                _write_chunk(reader, stem, X[k * step : (k + 1) * step],
                             y[k * step : (k + 1) * step])

        def make():
            return GPULogisticRegression(solver="adagrad", max_iter=1, tol=None,
                                         early_stopping=False, random_state=0,
                                         device=device)

        # the kernels a fit of every row launches compiled (and loaded) before
        # any timing: a 4096-row warm-up leaves the larger launches' kernels
        # to the first timed call
        make().fit(X, y)
        fits = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            make().fit(X, y)
            fits.append(time.perf_counter() - t0)
        fit_s = float(np.median(fits))
        out = {"rows": X.shape[0], "chunk_rows": step, "chunks": len(stems),
               "repeats": repeats, "fit_s": fit_s, "fit_runs_s": fits}
        for reader in readers:
            runs = []
            for _ in range(1 if reader == "svmlight" else repeats):
                model = make()
                read_s = train_s = 0.0
                for stem in stems:
                    t0 = time.perf_counter()
                    Xc, yc = _read_chunk(reader, stem, d)
                    t1 = time.perf_counter()
                    model.partial_fit(Xc, yc, classes=[0, 1])
                    train_s += time.perf_counter() - t1
                    read_s += t1 - t0
                runs.append((read_s + train_s, read_s, train_s, model))
            total, read_s, train_s, model = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            out[reader] = {
                "read_s": read_s, "partial_fit_s": train_s,
                "partial_fit_runs_s": [r[2] for r in runs],
                "share": fit_s / total if total > 0 else None,
                "share_partial_fit_only": fit_s / train_s if train_s > 0 else None,
                "test_auc": float(roc_auc_score(yt, model.decision_function(Xt)))}

        # the user guide's recipe: the next chunk read while this one trains
        # (not for mapped files: they are read during the call, on its threads)
        for reader in [r for r in readers if r in ("npy", "npz")]:
            walls = []
            for _ in range(repeats):
                model = make()
                t0 = time.perf_counter()
                for Xc, yc in read_ahead(_read_chunk(reader, stem, d) for stem in stems):
                    model.partial_fit(Xc, yc, classes=[0, 1])
                walls.append(time.perf_counter() - t0)
            wall = float(np.median(walls))
            out[f"{reader}_read_ahead"] = {
                "wall_s": wall, "runs_s": walls, "share": fit_s / wall if wall > 0 else None,
                "test_auc": float(roc_auc_score(yt, model.decision_function(Xt)))}
    return out


PARTS = {"model": part_model, "stream": part_stream, "partial": part_partial}


def table(res):
    """The short table printed last."""
    L = []
    m = res.get("model")
    if m:
        for conc, r in m["runs"].items():
            L.append(f"model FM k={m['n_factors']} 2^{int(np.log2(m['features']))} "
                     f"concurrency={conc}: epoch x{_f(r['epoch_ratio'])} (target <= "
                     f"{EPOCH_RATIO_TARGET}), AUC gap {_f(r['auc_gap'], '.4f')} (target <= "
                     f"{AUC_GAP_TARGET}), pool within limit {r['pool_within_limit']}, "
                     f"nvidia-smi {_f(r['limited'].get('smi_over_base') and r['limited']['smi_over_base'] / 1e9)}"
                     f" GB over its start (within limit {r['smi_within_limit']})"
                     + "".join(f", {w} {r[w]['error'][:200]}" for w in ("resident", "limited")
                               if "error" in r[w]))
    s = res.get("stream")
    if s:
        L.append(f"stream: {_f(s['stream_rate'] and s['stream_rate'] / 1e9)} GB/s of "
                 f"layout against pinned {_f(s['pinned_rate'] and s['pinned_rate'] / 1e9)}"
                 f" GB/s: {_f(s['share'])} (target >= {STREAM_SHARE_TARGET}), fit "
                 f"{_f(s['run'].get('fit_s'))} s, pool within limit {s['pool_within_limit']}"
                 f", nvidia-smi within limit {s['smi_within_limit']}"
                 + ("" if s.get("model_resident", True) else ", the model out of core")
                 + (f", {s['run']['error'][:200]}" if "error" in s["run"] else ""))
    p = res.get("partial")
    if p:
        for reader in READERS:
            if reader not in p:
                continue
            r = p[reader]
            L.append(f"partial_fit from {reader} files: read {_f(r['read_s'])} s + "
                     f"partial_fit {_f(r['partial_fit_s'])} s against fit {_f(p['fit_s'])} s:"
                     f" {_f(r['share'])} of its rate ({_f(r['share_partial_fit_only'])} "
                     f"without the reads; target >= {PARTIAL_SHARE_TARGET})")
        for reader in READERS:
            r = p.get(f"{reader}_read_ahead")
            if r:
                L.append(f"partial_fit from {reader} files with read_ahead: "
                         f"{_f(r['wall_s'])} s against fit {_f(p['fit_s'])} s: "
                         f"{_f(r['share'])} of its rate (target >= {PARTIAL_SHARE_TARGET})")
    return "\n".join(L)


def _f(v, fmt=".2f"):
    return "-" if v is None else format(v, fmt)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--smoke", action="store_true", help="a few thousand rows")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--log2-features", type=int, default=None)
    ap.add_argument("--n-factors", type=int, default=32)
    ap.add_argument("--limit", type=int, default=8 * 10**9, help="bytes")
    ap.add_argument("--epochs", type=int, default=2, help="the last one is compared")
    ap.add_argument("--chunk-rows", type=int, default=None)
    ap.add_argument("--chunks", type=int, default=4,
                    help="the partial part's chunks, of --chunk-rows rows each (its "
                         "rows; --rows is the other parts')")
    ap.add_argument("--readers", default=",".join(READERS),
                    help="the partial part's file formats: some of " + ", ".join(READERS))
    ap.add_argument("--repeats", type=int, default=3,
                    help="the partial part's runs of each measurement (the median)")
    ap.add_argument("--concurrency", default="1,auto",
                    help="the model part's runs: 1 (in order), auto, or both")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows = args.rows or 3000
        args.log2_features = args.log2_features or 12
        args.n_factors = min(args.n_factors, 4)
        args.limit = min(args.limit, 2**20)
        args.chunk_rows = args.chunk_rows or 1000
    args.rows = args.rows or 2_000_000
    args.log2_features = args.log2_features or 27
    args.chunk_rows = args.chunk_rows or 1_000_000
    cp = _gpu()
    device = "cuda" if cp is not None else "cpu"
    res = {"device": device, "args": vars(args), "date_utc": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.gmtime())}
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        res[name] = PARTS[name](args, cp, device)
        res[f"{name}_s"] = time.perf_counter() - t0
        print(f"{name} done in {res[f'{name}_s']:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "out_of_core.json").write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {out / 'out_of_core.json'}")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
