"""The GPU layout build with and without overlapped host -> device copies.

``build_layout(X, xp=cupy)`` on a host (scipy) matrix copies the chunks of
mini-batches to the device.  With ``_overlap=True`` (the default) chunk
``i + 1`` is gathered into pinned memory by a worker thread while the GPU
sorts chunk ``i``, and copied on a second stream while the GPU finishes
chunk ``i``; ``_overlap=False`` copies each chunk synchronously from
pageable memory (the build before the overlap).  This script times both on Criteo-like data and prints
a markdown table, measured with CUDA events:

* ``build``: the whole ``build_layout`` call (events on the current stream;
  wall-clock too), median of ``--repeat`` builds after a first one, whose
  time is reported apart (the kernels are compiled before, on a small
  prefix, so it shows the cost of allocating the pinned buffers);
* ``loop``: the chunk loop alone (the plan before it is the same host work
  in both modes);
* ``copies``: the sum of the host -> device copy times of the chunks, and
  its ratio to the build time.  With the overlap the copies (and the host
  gathers) run alongside the GPU's work, so the loop time should drop by
  up to the copy time (plus the gather time it hides).

Usage::

    # on the GPU machine: 4M rows x 2^22 features, 39 nonzeros per row
    PYTHONPATH=. python benchmarks/layout_overlap.py --out benchmarks/results/layout_overlap

    # anywhere: tiny data, numpy only (keeps the script from rotting)
    PYTHONPATH=. python benchmarks/layout_overlap.py --smoke
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn_cuwide._layout import build_layout  # noqa: E402
from sklearn_cuwide.datasets import make_ctr_classification  # noqa: E402


def _build_gpu(cp, X, kw, overlap):
    """One GPU build; times in milliseconds."""
    timing = {}
    stream = cp.cuda.get_current_stream()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    start = stream.record()
    L = build_layout(X, xp=cp, _overlap=overlap, _timing=timing, **kw)
    end = stream.record()
    end.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    build = cp.cuda.get_elapsed_time(start, end)
    loop = cp.cuda.get_elapsed_time(*timing["loop"])
    copies = sum(cp.cuda.get_elapsed_time(a, b) for a, b in timing["copies"])
    n_chunks = len(timing["copies"])
    del L
    return dict(wall_ms=wall, build_ms=build, loop_ms=loop, copies_ms=copies,
                n_chunks=n_chunks)


def _build_cpu(X, kw):
    t0 = time.perf_counter()
    build_layout(X, **kw)
    ms = (time.perf_counter() - t0) * 1e3
    return dict(wall_ms=ms, build_ms=ms, loop_ms=float("nan"),
                copies_ms=float("nan"), n_chunks=0)


def measure(X, kw, *, xp=None, repeat=3):
    """Rows of the table: one per (shuffle, mode).  ``xp``: cupy, or None
    for the numpy build."""
    rows = []
    modes = [("overlap", True), ("sync", False)] if xp is not None else [("numpy", None)]
    if xp is not None:  # compile the kernels first, on a small prefix
        for _, overlap in modes:
            _build_gpu(xp, X[: min(X.shape[0], 20_000)], dict(kw, shuffle=True), overlap)
    for shuffle in (False, True):
        for mode, overlap in modes:
            k = dict(kw, shuffle=shuffle, random_state=0)
            if xp is not None:
                def run():
                    return _build_gpu(xp, X, k, overlap)
            else:
                def run():
                    return _build_cpu(X, k)
            first = run()
            runs = [run() for _ in range(repeat)]
            row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            row.update(shuffle=shuffle, mode=mode, first_ms=first["build_ms"],
                       n_chunks=runs[0]["n_chunks"])
            row["copy_ratio"] = row["copies_ms"] / row["build_ms"]
            rows.append(row)
            print(f"  shuffle={shuffle} {mode}: {row['build_ms']:.1f} ms", flush=True)
    return rows


def table(rows):
    lines = [
        "| shuffle | mode | chunks | build (ms) | wall (ms) | loop (ms) | copies (ms) "
        "| copies / build | first build (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shuffle']} | {r['mode']} | {r['n_chunks']} | {r['build_ms']:.1f} "
            f"| {r['wall_ms']:.1f} | {r['loop_ms']:.1f} | {r['copies_ms']:.1f} "
            f"| {r['copy_ratio']:.2f} | {r['first_ms']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny data, numpy only (runs without a GPU)")
    ap.add_argument("--n-samples", type=int, default=4_000_000)
    ap.add_argument("--n-features", type=int, default=2**22)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--sample-block", type=int, default=1024)
    ap.add_argument("--n-hot", type=int, default=4096)
    ap.add_argument("--chunk-nnz", type=int, default=1 << 23)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for results.json and results.md")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n_samples, args.n_features, args.repeat = 3000, 2**12, 1
        args.chunk_nnz = 20_000
    gpu = not args.smoke

    t0 = time.perf_counter()
    X, _ = make_ctr_classification(n_samples=args.n_samples, n_features=args.n_features,
                                   random_state=0)
    print(f"data: {X.shape[0]} x {X.shape[1]}, {X.nnz} nonzeros "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    kw = dict(batch_size=args.batch, sample_block=args.sample_block,
              n_hot_max=args.n_hot, chunk_nnz=args.chunk_nnz)
    if gpu:
        import cupy as cp
    rows = measure(X, kw, xp=cp if gpu else None, repeat=args.repeat)
    md = table(rows)
    print()
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = dict(command=" ".join([sys.executable, *sys.argv]), args={
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
        if gpu:
            props = cp.cuda.runtime.getDeviceProperties(0)
            name = props["name"]
            meta["gpu"] = name.decode() if isinstance(name, bytes) else name
            meta["cupy"] = cp.__version__
        (args.out / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                          indent=1))
        (args.out / "results.md").write_text(f"`{meta['command']}`\n\n{md}\n")
    return rows


if __name__ == "__main__":
    main()
