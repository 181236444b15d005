"""CPU study: the mini-batch solvers' L2 as the kernels apply it (lazily, to the
features present in a sample block) against L2 scaled so that each feature's
expected L2 per epoch is the full objective's (``n_batches`` steps of
``l2 * w``), on the benchmark task in the sequential order.

    PYTHONPATH=. python benchmarks/cpu_l2_study.py N_FACTORS {lazy,scaled} ROWS L2_W L2_V

``lazy`` (``StepParams(penalty_scaled=False)``, the FM's penalty): a feature
in c of the epoch's sample blocks gets c L2 steps instead of the objective's
n_batches, so rare features are barely regularised.  ``scaled``
(``penalty_scaled=True``, logistic regression's since this study): each
present feature's penalty times n_batches / c (``_layout.penalty_scale``).
Test AUC on the 400k rows after ROWS.  (The committed logs of
``benchmarks/results/2026-11-30_s5_cpu_l2/`` came from the first version of
this script, which patched the CPU backend's L2 term in its own process,
without the proximal damping of the step; ``*_branch.log`` from this one.)
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.metrics import roc_auc_score  # noqa: E402

from sklearn_cuwide._backends import _cpu as be  # noqa: E402
from sklearn_cuwide._layout import penalty_scale  # noqa: E402
from sklearn_cuwide._solvers import batch_weights  # noqa: E402
from sklearn_cuwide._state import ModelState, StepParams  # noqa: E402
from sklearn_cuwide.datasets import make_ctr_classification  # noqa: E402


def main(argv):
    k, mode, rows = int(argv[0]), argv[1], int(argv[2])
    l2w, l2v = float(argv[3]), float(argv[4])
    X, y = make_ctr_classification(n_samples=rows + 400_000, n_features=2**22, model="fm",
                                   random_state=0)
    Xtr, ytr, Xte, yte = X[:rows], y[:rows], X[rows:], y[rows:]
    params = StepParams(model="fm" if k else "linear", loss="logistic", solver="adagrad",
                        learning_rate=0.05, l2_w=l2w, l2_v=l2v if k else 0.0,
                        penalty_scaled=mode == "scaled")
    sb, nh = be.tile_shape(params, 1, k, 1024)
    L = be.build_layout(Xtr, batch_size=1024, sample_block=sb, n_hot_max=nh, shuffle=True,
                        random_state=0)
    if mode == "scaled":
        scale = penalty_scale(L)
        print(f"scale: median {np.median(scale[scale > 0]):.1f}, max {scale.max():.1f}",
              flush=True)
    yl = ytr[L.row_order].astype(np.float32)
    sw = np.ones(L.n_rows, np.float32)
    bw = batch_weights(L, np.ones(L.n_rows))
    st = ModelState.zeros(X.shape[1], 1, k, adagrad=True, init_scale=0.01,
                          random_state=0).permute_features(L.feature_order)
    rng = np.random.default_rng(0)
    for ep in range(3):
        t = time.time()
        lo = be.run_epoch(L, yl, sw, bw, st, params, rng.permutation(L.n_batches)) / L.n_rows
        h = st.permute_features(L.feature_rank)
        d = be.decision_function(Xte, h.w, h.b, h.V)[:, 0]
        print(f"k {k} {mode} rows {rows} l2 {l2w:g}/{l2v:g} epoch {ep + 1} train loss {lo:.4f} "
              f"test AUC {roc_auc_score(yte, d):.4f} ({time.time() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
