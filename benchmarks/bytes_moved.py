"""Bytes an epoch of the flow-based kernel moves, counted from the layout
(CPU only, no GPU): the stored nonzeros read by each stage, the model rows
gathered and updated for the cold nonzeros and segments, and the hot cache's
loads and flushes, for the suite's LR and FM16 tasks.  Divided by a measured
epoch time it gives the traffic the kernel sustains, against the device's
copy bandwidth: what bounds the epoch.

    PYTHONPATH=. python benchmarks/bytes_moved.py [--rows 4000000] [--epoch-ms LR=2.989,FM=33.0]

The counts follow cuda/cuwide_train.cu: per nonzero 10 bytes of layout
(int32 feature, uint16 row, float32 value), read by the aggregate and again
by the apply; a cold nonzero gathers its feature's model row (LR: w; FM:
V's k floats and w) in the aggregate; a cold segment (one feature in one
sample block) reads the row, Adagrad's sums and the penalty factor and adds
to the row and the sums with atomics in the apply; every sample block loads
the n_hot cached rows and flushes the touched ones (reads and atomics).
Atomic adds are counted as a read and a write of their bytes.  Sector
granularity (32 bytes) is counted for the gathers of fewer bytes.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SECTOR = 32


def _sectors(nbytes):
    return -(-nbytes // SECTOR) * SECTOR


def count(L, k):
    """Bytes per epoch by stage, from layout ``L`` (numpy arrays)."""
    tp = np.asarray(L.tile_ptr)
    n_sb = (tp.size - 1) // 2
    hot_nnz = int(np.sum(tp[1:2 * n_sb:2] - tp[0:2 * n_sb:2]))
    cold_nnz = int(tp[-1] - tp[0]) - hot_nnz
    feat = np.asarray(L.feat)
    # segment heads: a change of feature, or a tile start
    heads = np.ones(feat.size, dtype=bool)
    heads[1:] = feat[1:] != feat[:-1]
    heads[tp[:-1][tp[:-1] < feat.size]] = True
    tile_of = np.searchsorted(tp, np.arange(feat.size), side="right") - 1
    cold = (tile_of % 2) == 1
    cold_seg = int(np.sum(heads & cold))
    hot_seg = int(np.sum(heads & ~cold))
    row = 4 * (k + 1) if k else 4  # model floats per feature (FM: V row + w)
    nnz = hot_nnz + cold_nnz
    out = {
        "nonzeros": nnz, "hot nonzeros": hot_nnz, "cold nonzeros": cold_nnz,
        "cold segments": cold_seg, "hot segments (touched hot features)": hot_seg,
        "sample blocks": n_sb, "n_hot": int(L.n_hot),
    }
    b = {}
    b["layout, aggregate"] = 10 * nnz
    b["layout, apply"] = 10 * nnz
    b["cold gathers, aggregate"] = cold_nnz * _sectors(row)
    # apply, per cold segment: the model row and Adagrad's sums (+ the packed
    # penalty factor) read, then both added to with atomics (read + write)
    b["cold segments, apply"] = cold_seg * (3 * _sectors(row) + 3 * _sectors(row))
    b["hot cache loads"] = n_sb * int(L.n_hot) * row
    # flush, per touched hot feature: Adagrad's sums read, atomics to the
    # parameters and the sums
    b["hot flush"] = hot_seg * 5 * row
    b["labels and weights, loss"] = 8 * int(L.n_rows)
    return out, b


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--epoch-ms", default="LR=2.989,FM=33.017",
                    help="measured epoch times to divide by (suite run 9)")
    ap.add_argument("--fm-hot", default="",
                    help="also count the FM with these numbers of hot features, e.g. "
                         "567,1000 (what a larger hot cache would save)")
    ap.add_argument("--bandwidth", type=float, default=4143.0,
                    help="GB/s, the device's copy bandwidth (suite run 9's floor)")
    a = ap.parse_args(argv)
    from sklearn_cuwide._backends import _cpu
    from sklearn_cuwide._state import StepParams
    from sklearn_cuwide.datasets import make_ctr_classification

    ms = dict(kv.split("=") for kv in a.epoch_ms.split(","))
    t0 = time.perf_counter()
    X, _ = make_ctr_classification(n_samples=a.rows, n_features=2**22, model="fm",
                                   random_state=0)
    print(f"data {time.perf_counter() - t0:.0f} s", flush=True)
    runs = [("LR", 0, None), ("FM", 16, None)]
    runs += [(f"FM with {h} hot", 16, int(h)) for h in a.fm_hot.split(",") if h]
    for name, k, hot in runs:
        params = StepParams(model="fm" if k else "linear", loss="logistic", solver="adagrad")
        sb, nh = _cpu.tile_shape(params, 1, k, 1024)
        nh = nh if hot is None else hot
        L = _cpu.build_layout(X, batch_size=1024, sample_block=sb, n_hot_max=nh,
                              shuffle=True, random_state=0)
        info, b = count(L, k)
        total = sum(b.values())
        print(f"\n{name} (sample block {sb}, n_hot {info['n_hot']})")
        for key, v in info.items():
            print(f"  {key:38s} {v:>14,d}")
        for key, v in b.items():
            print(f"  {key:38s} {v / 1e9:8.3f} GB")
        print(f"  {'total':38s} {total / 1e9:8.3f} GB")
        if name in ms:
            t = float(ms[name]) / 1e3
            print(f"  at {ms[name]} ms per epoch: {total / t / 1e9:.0f} GB/s, "
                  f"{100 * total / t / 1e9 / a.bandwidth:.0f}% of the copy bandwidth "
                  f"({a.bandwidth:.0f} GB/s); at that bandwidth the epoch would take "
                  f"{total / (a.bandwidth * 1e9) * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
