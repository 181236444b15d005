"""GPU against CPU test AUC of small mini-batch fits (the data of
tests/test_gpu_estimators.py::test_minibatch_gpu_auc_close_to_cpu, and a
400k-row one like the demo's), over seeds and step policies under
concurrency (exploration: which policy keeps each solver on par with the
CPU's sequential order).

    PYTHONPATH=. python benchmarks/explore_small.py [--lr-sgd | --second]

``--lr-sgd``: the round that found plain sgd's gap (small data, 3 seeds);
default: the first round of policies; ``--second``: after choosing
``cap-auto``.
"""

import numpy as np
from sklearn.base import clone
from sklearn.metrics import roc_auc_score

from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression
from sklearn_cuwide._backends import _cuda
from sklearn_cuwide.datasets import make_ctr_classification

orig = _cuda.default_staleness


def data(n, d, **kw):
    X, y = make_ctr_classification(n_samples=n + n // 5, n_features=d, model="fm",
                                   random_state=3, **kw)
    return X[:n], y[:n], X[n:], y[n:]


small = data(50000, 2**14, n_fields=8, n_numeric=3)
large = data(400000, 2**16)
import sys

FIRST = [  # the first run (benchmarks/results/2026-11-30_policies/small_1.log)
    ("small", "lr-sgd", small, GPULogisticRegression(solver="sgd", batch_size=256, max_iter=5),
     (False, "sqrt", "cap4")),
    ("small", "lr-adagrad", small, GPULogisticRegression(solver="adagrad", batch_size=256,
                                                         max_iter=5), (False, "sqrt")),
    ("small", "fm", small, GPUFactorizationMachine(batch_size=256, max_iter=5, n_factors=8),
     ("sqrt", "cap4", "cap8", "cap24", False)),
    ("400k", "fm", large, GPUFactorizationMachine(max_iter=5, n_factors=8),
     ("sqrt", "cap4", "cap8", "cap24")),
    ("400k", "lr-sgd", large, GPULogisticRegression(solver="sgd", max_iter=5),
     (False, "sqrt")),
]
SECOND = [  # after choosing "cap-auto" for the FM
    ("small", "fm", small, GPUFactorizationMachine(batch_size=256, max_iter=5, n_factors=8),
     ("cap-auto",)),
    ("400k", "fm", large, GPUFactorizationMachine(max_iter=5, n_factors=8),
     ("cap-auto", "cap2", "cap6")),
    ("400k", "lr-sgd", large, GPULogisticRegression(solver="sgd", max_iter=5),
     (True, "cap2", "cap8")),
]
LR_SGD = [  # benchmarks/results/2026-11-30_s2_policies/lr_sgd.log (3 seeds)
    ("small", solver, small, GPULogisticRegression(solver=solver, batch_size=256, max_iter=5),
     (False, "sqrt", "cap2", "cap4", True))
    for solver in ("sgd", "adagrad")
]
cases = SECOND if "--second" in sys.argv else LR_SGD if "--lr-sgd" in sys.argv else FIRST
n_seeds = 3 if "--lr-sgd" in sys.argv else 2
for dname, name, (Xtr, ytr, Xte, yte), est, policies in cases:
    seeds = range(n_seeds)
    cpu = [roc_auc_score(yte, clone(est).set_params(device="cpu", random_state=s)
                         .fit(Xtr, ytr).decision_function(Xte)) for s in seeds]
    print(f"{dname} {name} cpu {np.round(cpu, 4)}", flush=True)
    for pol in policies:
        _cuda.default_staleness = lambda params, pol=pol: pol
        gpu = [roc_auc_score(yte, clone(est).set_params(device="cuda", random_state=s)
                             .fit(Xtr, ytr).decision_function(Xte)) for s in seeds]
        print(f"{dname} {name} gpu staleness={pol}: {np.round(gpu, 4)}", flush=True)
    _cuda.default_staleness = orig
