"""A CPU model of the GPU's concurrent (Hogwild) mini-batches, to compare step
policies without a GPU.

P thread blocks are modelled as rounds: the P mini-batches of a round all
start from the same weights (each runs the CPU backend's exact step on its
own copy), and their changes are then added together, each feature's step
scaled by the policy.  Adagrad's accumulators add up unscaled, as the
kernel's atomics do.  The first epoch can warm the concurrency up as the
CUDA backend's ``ramp`` does (1, 2, 4, ... blocks, K mini-batches each).

    PYTHONPATH=. python benchmarks/simulate_concurrency.py --rows 400000 \\
        --features 65536 --factors 8 --blocks 19 --epochs 5

Prints test AUC per epoch for the sequential order and each policy.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.metrics import log_loss, roc_auc_score  # noqa: E402

from sklearn_cuwide._backends import _cpu  # noqa: E402
from sklearn_cuwide._solvers import batch_weights  # noqa: E402
from sklearn_cuwide._state import ModelState, StepParams  # noqa: E402
from sklearn_cuwide.datasets import make_ctr_classification  # noqa: E402

WEIGHTS = ("w", "V", "b")
ACCUMULATORS = {"w": "gw", "V": "gV", "b": "gb"}


def _copy(state):
    out = ModelState(w=None, b=None)
    for k, a in state.arrays().items():
        setattr(out, k, a.copy())
    return out


def _run_batch(L, y, sw, bw, S, params, bt):
    for g in range(int(L.batch_sblock_ptr[bt]), int(L.batch_sblock_ptr[bt + 1])):
        _cpu.sblock_step(L, g, y, sw, float(bw[bt]), S, params)


def concurrent_round(L, y, sw, bw, state, params, batches, scale_w, scale_b):
    """P mini-batches from the same weights; changes summed with scaling."""
    if len(batches) == 1:
        _run_batch(L, y, sw, bw, state, params, batches[0])
        return
    base = _copy(state)
    delta = {k: np.zeros_like(a) for k, a in base.arrays().items()}
    for bt in batches:
        S = _copy(base)
        _run_batch(L, y, sw, bw, S, params, bt)
        for k, a in S.arrays().items():
            delta[k] += a - getattr(base, k)
    for k in WEIGHTS:
        a = getattr(base, k)
        if a is None:
            continue
        s = scale_b if k == "b" else scale_w[:, None]
        setattr(state, k, a + s * delta[k])
        acc = ACCUMULATORS[k]
        if getattr(base, acc) is not None:
            setattr(state, acc, getattr(base, acc) + delta[acc])


def epoch(L, y, sw, bw, state, params, order, P, policy, q, ramp):
    stages = []
    if ramp:
        p = 1
        while p < P:
            stages.append((p, ramp * p))
            p *= 2
    i = 0
    while i < len(order):
        if stages:
            p, cnt = stages[0]
            stages.pop(0)
        else:
            p, cnt = P, len(order) - i
        end = min(len(order), i + cnt)
        scale_w = np.ones(L.n_features)
        scale_b = 1.0
        if policy.startswith("cap") and p > 1:
            # undamped up to c concurrent updaters, damped beyond
            c = float(policy[3:])
            scale_w = np.minimum(1.0, c / (1.0 + (p - 1) * q))
            scale_b = min(1.0, c / p)
        elif policy != "sum" and p > 1:
            power = 0.5 if policy == "sqrt" else 1.0
            scale_w = (1.0 + (p - 1) * q) ** -power
            scale_b = float(p) ** -power
        while i < end:
            concurrent_round(L, y, sw, bw, state, params, order[i:min(end, i + p)],
                             scale_w, scale_b)
            i += p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--test-rows", type=int, default=80_000)
    ap.add_argument("--features", type=int, default=65536)
    ap.add_argument("--factors", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=19)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--beta", type=float, default=3e-4)
    ap.add_argument("--ramp", type=int, default=32)
    ap.add_argument("--prior-intercept", action="store_true",
                    help="start the intercept at the training labels' log-odds (as the "
                         "suite's kernel rows do)")
    ap.add_argument("--scale-penalty", action="store_true",
                    help="the penalty scaled per feature (StepParams.penalty_scaled)")
    ap.add_argument("--policies", default="sequential,sum,sqrt,linear",
                    help="comma list: sequential, sum, sqrt, linear, capC (undamped "
                    "up to C concurrent updaters of a feature, damped beyond)")
    args = ap.parse_args()
    X, y = make_ctr_classification(n_samples=args.rows + args.test_rows,
                                   n_features=args.features, model="fm", random_state=0)
    Xtr, ytr, Xte, yte = X[: args.rows], y[: args.rows], X[args.rows:], y[args.rows:]
    k = args.factors
    params = StepParams(model="fm" if k else "linear", loss="logistic", solver="adagrad",
                        learning_rate=args.lr, l2_w=args.beta, l2_v=args.beta,
                        penalty_scaled=args.scale_penalty)
    sb, nh = _cpu.tile_shape(params, 1, k, args.batch)
    L = _cpu.build_layout(Xtr, batch_size=args.batch, sample_block=sb, n_hot_max=nh,
                          shuffle=True, random_state=0)
    ro = L.row_order
    yl = ytr[ro].astype(np.float32)
    sw = np.ones(L.n_rows, dtype=np.float32)
    bw = batch_weights(L, np.ones(L.n_rows))
    counts = L.feature_counts[L.feature_order]
    q = np.clip(-np.expm1(-counts * (args.batch / L.n_rows)), 0, 1)
    for policy in args.policies.split(","):
        st = ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01, random_state=0)
        st = st.permute_features(L.feature_order)
        if args.prior_intercept:
            p1 = float(np.clip(np.mean(ytr), 1e-6, 1 - 1e-6))
            st.b[:] = np.log(p1 / (1 - p1))
        rng = np.random.default_rng(0)
        aucs, lls, bs = [], [], []
        t0 = time.perf_counter()
        for ep in range(args.epochs):
            order = rng.permutation(L.n_batches)
            if policy == "sequential":
                _cpu.run_epoch(L, yl, sw, bw, st, params, order)
            else:
                epoch(L, yl, sw, bw, st, params, order, args.blocks, policy, q,
                      args.ramp if ep == 0 else 0)
            h = st.permute_features(L.feature_rank)
            d = _cpu.decision_function(Xte, h.w, h.b, h.V)[:, 0]
            aucs.append(roc_auc_score(yte, d))
            lls.append(log_loss(yte, 1.0 / (1.0 + np.exp(-d))))
            bs.append(float(st.b[0]))
        print(f"{policy:>10} P={args.blocks} lr={args.lr} beta={args.beta} ramp={args.ramp}"
              f"{' scaled' if args.scale_penalty else ''}: "
              f"AUC/epoch {' '.join('%.4f' % a for a in aucs)} "
              f"logloss/epoch {' '.join('%.4f' % v for v in lls)} "
              f"intercept/epoch {' '.join('%.3f' % v for v in bs)} ({time.perf_counter()-t0:.0f}s)",
              flush=True)


if __name__ == "__main__":
    main()
