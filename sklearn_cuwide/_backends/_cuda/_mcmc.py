"""Gibbs sampling's block draws (``cuda/cuwide_mcmc.cu``): the joint draw
of :func:`sklearn_cuwide._mcmc._draw_block` in one launch per block, a warp
per feature.

Rule: :func:`mcmc_block_draw` hands the kernel to ``fit_mcmc`` for
features of at most :data:`MAX_PARAMETERS` parameters; beyond, the array
operations draw.  Why: a warp keeps its feature's ``p x p`` precision and a
batch of its rows' ``h`` in shared memory, which a larger ``p`` outgrows;
a sweep of array operations costs some sixty launches per block whatever
the data (the launches were a GPU sweep's cost: docs/design/defaults.rst).
"""

import math

import cupy as cp
import numpy as np

from ... import _kernels
from ..._kernels import MCMC_DRAW, get_kernel

__all__ = ["MAX_PARAMETERS", "mcmc_block_draw"]

#: the most parameters per feature (``fit_linear + n_factors``) the kernel draws
MAX_PARAMETERS = 33
#: cuwide_mcmc.cu's CUWIDE_MCMC_BATCH: the nonzeros whose h a warp holds at once
_BATCH = 32
_MAX_WARPS = 8
#: a block's dynamic shared memory without the opt-in to more
_SHARED_BYTES = 48 << 10
_MAX_BLOCKS = 1 << 16


def _warp_bytes(p):
    """cuwide_mcmc_shared_doubles(p), in bytes."""
    return 8 * (p * p + _BATCH * (p + 2) + 3 * p)


def mcmc_block_draw(n_parameters):
    """The kernel's draw of a block for features of ``n_parameters``
    parameters (its compilation started now, in the background), or None
    beyond :data:`MAX_PARAMETERS`.  The draw is ``draw(feats, ends, rows,
    x, sr, z, w, V, q, e, *, alpha, mu, lam, lin, jitter)``: the block's
    features, each one's cumulative nonzeros (from 1), each nonzero's row,
    value and row weight in feature order, the standard normal draws
    (features x parameters); the model's ``w`` and ``V`` and the rows'
    ``q`` and ``e``, updated in place; ``mu`` and ``lam`` the priors of a
    feature's parameters (device arrays). Integer arrays int64, the others
    C-contiguous float64."""
    if not 0 < int(n_parameters) <= MAX_PARAMETERS:
        return None
    _kernels.prefetch((_kernels.get_kernels, "cuwide_mcmc.cu", [MCMC_DRAW]))
    return _draw


def _draw(feats, ends, rows, x, sr, z, w, V, q, e, *, alpha, mu, lam, lin, jitter):
    m = int(feats.shape[0])
    if m == 0:
        return
    k = int(V.shape[1])
    per_warp = _warp_bytes(int(lin) + k)
    warps = max(1, min(_MAX_WARPS, _SHARED_BYTES // per_warp))
    blocks = max(1, min(math.ceil(m / warps), _MAX_BLOCKS))
    kern = get_kernel("cuwide_mcmc.cu", MCMC_DRAW)
    kern((blocks,), (32 * warps,),
         (feats, ends, rows, x, sr, z, np.int64(m), np.int32(lin), np.int32(k),
          np.float64(alpha), mu, lam, np.float64(jitter), w, V, q, e),
         shared_mem=warps * per_warp)

