"""The benchmarks' paper-style ablation of the cuWide training kernel, and a
diagnostic entry point for the tests.  The estimators never use this module:
they call :func:`._train.run_epoch` only.

* :func:`run_epoch_classic` -- the classic schema (``cuda/cuwide_classic.cu``):
  per-sample Hogwild training straight from CSR, the baseline;
* :func:`run_epoch_ablation` -- the flow-based kernel with one optimisation
  off (``cuwide_train_ablation`` in ``cuda/cuwide_train.cu``).  The third
  ablation, no hot-feature cache, is a layout built with ``n_hot_max=0``;
* :func:`run_epoch_diagnostic` -- :func:`._train.run_epoch` with the choices
  it makes itself forced (the thread blocks per worker, the staleness
  policy), for the tests and profiling.

Both flow-based entry points share :func:`._train.run_epoch`'s launcher.
"""

import cupy as cp
import numpy as np

from ..._kernels import classic_instantiation, get_kernel
from ._runtime import NULL, props, put_csr
from ._train import VARIANTS, _dense_gw, _epoch, _n_factors

#: the optimisations :func:`run_epoch_ablation` can leave out:
#: ``"no_replicas"``, one copy of the hot gradient accumulators instead of
#: :func:`~sklearn_cuwide._backends._tiles.replicas`; ``"global_accumulators"``,
#: the per-sample accumulators in global memory instead of shared memory
#: (no cross-stage caching)
ABLATION_VARIANTS = tuple(VARIANTS)


def run_epoch_ablation(dl, y, sw, batch_weight, state, params, batch_order, *, variant,
                       workers=None, ramp=0):
    """One epoch of the flow-based kernel with the optimisation ``variant``
    (one of :data:`ABLATION_VARIANTS`) left out; otherwise as
    :func:`~._train.run_epoch` (the same arguments, workers and warm-up).
    Returns the sum of ``sample_weight * loss``."""
    if variant not in ABLATION_VARIANTS:
        raise ValueError(f"variant must be one of {ABLATION_VARIANTS}, got {variant!r}")
    return _epoch(dl, y, sw, batch_weight, state, params, batch_order, workers=workers,
                  ramp=ramp, variant=variant)


def run_epoch_diagnostic(dl, y, sw, batch_weight, state, params, batch_order, *, workers=None,
                         ramp=0, cluster=None, staleness="auto", variant=None):
    """:func:`~._train.run_epoch` with its own choices forced, for tests and
    profiling.

    ``cluster``: thread blocks per worker (1, 2, 4 or 8 on compute
    capability 9.0+; None: :func:`~._runtime.cluster_for` the workers, as
    :func:`~._train.run_epoch` does).  ``workers=1, cluster=1``: one plain
    thread block that applies the mini-batches strictly in order.
    ``staleness``: the step policy under concurrency instead of the default
    (``"auto"``): False (none), True (1 / updaters), ``"sqrt"``, ``"capC"``,
    ``"cap-auto"`` or ``"cap-step"`` (see
    :func:`~sklearn_cuwide._backends._concurrency.staleness_cap`).
    ``variant``: one of :data:`ABLATION_VARIANTS`, or None.
    """
    return _epoch(dl, y, sw, batch_weight, state, params, batch_order, workers=workers,
                  ramp=ramp, cluster=cluster, staleness=staleness, variant=variant)


def run_epoch_classic(X, y, sw, state, params, order_rows, deterministic=False):
    """One epoch of per-sample Hogwild training straight from CSR.

    ``X``: device CSR (cupyx, int32 indices, float32 values), ``y``/``sw``
    device float32 arrays in X's row order, ``state`` in X's feature order
    (device arrays), ``order_rows``: the order the rows are visited in;
    ``deterministic``: one warp, strictly in that order.  The "classic
    schema" the flow-based kernel is compared with.  Returns the sum of
    sample_weight * loss.
    """
    X = put_csr(X, dtype=np.float32)
    k = _n_factors(state)
    if params.model == "linear" and state.n_outputs != 1:
        raise ValueError("the classic kernel is binary / regression only")
    expr = classic_instantiation(params.model, k, params.solver, params.loss)
    kern = get_kernel("cuwide_classic.cu", expr)
    rows = cp.asarray(np.asarray(order_rows, dtype=np.int32))
    loss = cp.zeros(1, dtype=cp.float64)
    n = int(rows.size)
    threads = 32 if deterministic else 256  # one warp: strictly in order
    blocks = 1 if deterministic else max(
        1, min(-(-n * 32 // threads), props()["multiProcessorCount"] * 8)
    )
    kern(
        (blocks,),
        (threads,),
        (
            X.indptr.astype(cp.int32, copy=False), X.indices.astype(cp.int32, copy=False),
            X.data, rows, np.int64(n), y, sw,
            state.w, state.V if state.V is not None else NULL, state.b,
            # the classic kernel indexes the sums densely: unpack a packed state
            _dense_gw(state),
            state.gV if state.gV is not None else NULL,
            state.gb if state.gb is not None else NULL,
            np.float32(params.learning_rate), np.float32(params.l2_w),
            np.float32(params.l2_v), np.float32(params.eps), loss,
        ),
    )
    return float(loss.get()[0])
