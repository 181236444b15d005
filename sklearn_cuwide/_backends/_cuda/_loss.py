"""The weighted mean of a pointwise loss on the device
(``cuda/cuwide_loss.cu``): early stopping's validation loss in one kernel,
the same bits from run to run."""

import math

import cupy as cp
import numpy as np

from ..._kernels import get_kernel, loss_instantiation
from ..._loss import weighted_loss as _weighted_loss

__all__ = ["weighted_loss"]

_THREADS = 256
_MAX_BLOCKS = 1024


def weighted_loss(Z, y, w, loss):
    """``sum(w * loss(Z, y)) / sum(w)`` (float) for decision values ``Z``
    (n, n_outputs) and float64 targets and weights ``y`` and ``w``, all on
    the device; the multinomial loss through :func:`pointwise_loss`."""
    n = int(Z.shape[0])
    if loss == "multinomial" or n == 0:
        return _weighted_loss(cp, Z, y, w, loss)
    z = cp.ascontiguousarray(Z[:, 0], dtype=cp.float64)
    blocks = max(1, min(math.ceil(n / _THREADS), _MAX_BLOCKS))  # a function of n alone
    partial = cp.empty(2 * blocks, dtype=cp.float64)
    get_kernel("cuwide_loss.cu", loss_instantiation(loss))(
        (blocks,), (_THREADS,),
        (z, cp.ascontiguousarray(y, dtype=cp.float64),
         cp.ascontiguousarray(w, dtype=cp.float64), np.int64(n), partial))
    num, den = np.add.reduce(partial.get().reshape(blocks, 2), axis=0)  # in block order
    return float(num / den)
