"""The classic schema (``cuda/cuwide_classic.cu``): per-sample Hogwild
training straight from CSR, the ablation baseline of the benchmarks.  The
estimators never use it."""

import cupy as cp
import numpy as np

from ..._kernels import get_kernel, kernel_name
from ._runtime import NULL, props, put_csr
from ._train import _LOSS, _MODEL, _SOLVER, _dense_gw, _n_factors


def run_epoch_classic(X, y, sw, state, params, order_rows, deterministic=False):
    """One epoch of per-sample Hogwild training straight from CSR.

    ``X``: device CSR (cupyx, int32 indices, float32 values), ``y``/``sw``
    device float32 arrays in X's row order, ``state`` in X's feature order
    (device arrays), ``order_rows``: the order the rows are visited in.
    Not used by the estimators: it is the "classic schema" the flow-based
    kernel is compared with.  Returns the sum of sample_weight * loss.
    """
    X = put_csr(X, dtype=np.float32)
    k = _n_factors(state)
    if params.model == "linear" and state.n_outputs != 1:
        raise ValueError("the classic kernel is binary / regression only")
    expr = kernel_name(
        "cuwide_classic",
        _MODEL[params.model],
        k,
        _SOLVER[params.solver],
        _LOSS[params.loss],
    )
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
