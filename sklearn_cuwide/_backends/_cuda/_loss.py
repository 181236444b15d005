"""The weighted mean of a pointwise loss on the device
(``cuda/cuwide_loss.cu``): early stopping's validation loss in one kernel."""

import math

import cupy as cp
import numpy as np

from ..._kernels import get_kernel, loss_instantiation
from ..._loss import pointwise_loss

__all__ = ["weighted_loss"]

_THREADS = 256
_MAX_BLOCKS = 1024


def weighted_loss(Z, y, w, loss):
    """``sum(w * loss(Z, y)) / sum(w)`` (float) for decision values ``Z``
    (n, n_outputs) and float64 targets and weights ``y`` and ``w``, all on
    the device; the multinomial loss through :func:`pointwise_loss`."""
    n = int(Z.shape[0])
    if loss == "multinomial" or n == 0:
        lo, _ = pointwise_loss(cp, cp.asarray(Z, dtype=cp.float64), y, loss)
        return float(cp.dot(w, lo)) / float(w.sum())
    z = cp.ascontiguousarray(Z[:, 0], dtype=cp.float64)
    sums = cp.zeros(2, dtype=cp.float64)
    blocks = max(1, min(math.ceil(n / _THREADS), _MAX_BLOCKS))
    get_kernel("cuwide_loss.cu", loss_instantiation(loss))(
        (blocks,), (_THREADS,),
        (z, cp.ascontiguousarray(y, dtype=cp.float64),
         cp.ascontiguousarray(w, dtype=cp.float64), np.int64(n), sums))
    num, den = sums.get()
    return float(num / den)
