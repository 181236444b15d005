"""The CUDA backend: the cuWide kernels of ``cuda/`` through CuPy.

The only package of sklearn-cuwide that imports cupy.  It has the functions
of the backend interface (:class:`sklearn_cuwide._backends.Backend`); its
modules mirror ``cuda/``:

* :mod:`._runtime` -- the device (per fit and thread: ``device_scope``), its
  properties and memory, moving arrays to and from it;
* :mod:`._layout` -- the training layout on the device (built there, or a
  host layout streamed in);
* :mod:`._train` -- ``cuwide_train.cu`` and its launcher, :func:`run_epoch`;
* :mod:`._predict` -- ``cuwide_predict.cu``, decision values from CSR;
* :mod:`._lbfgs` -- ``cuwide_lbfgs.cu`` and the full-batch products;
* :mod:`._build` -- ``cuwide_build.cu``: the layout build's passes over the
  nonzeros, fused;
* :mod:`._factors` -- ``cuwide_factors.cu``: the initial factors;
* :mod:`._mcmc` -- ``cuwide_mcmc.cu``: Gibbs sampling's draws of a block of
  features;
* :mod:`._loss` -- ``cuwide_loss.cu``: early stopping's validation loss;
* :mod:`._validate` -- checks of cupy / cupyx input, on the device;
* :mod:`._upload` -- the pinned double-buffered uploader of the layout;
* :mod:`._warmup` -- CuPy's own kernels a fit runs, compiled ahead in
  threads when it starts;
* :mod:`._rows` -- ``cuwide_rows.cu``: the cold rows of a model wider than
  the device, gathered from and scattered to page-locked host memory;
* :mod:`._ablation` -- the benchmarks' ablation, never used by the
  estimators: ``cuwide_classic.cu`` (the classic schema) and the flow
  kernel with one optimisation off.
"""

import cupy as cp

from ._build import take_rows
from ._factors import draw_factors
from ._layout import build_layout, put_layout, stage_layout_input
from ._lbfgs import fused_objective, lbfgs_memory_ops, matmul, rmatmul
from ._loss import weighted_loss
from ._mcmc import mcmc_block_draw
from ._predict import decision_function
from ._runtime import (
    all_finite,
    concurrent_blocks,
    csr_in_layout_order,
    device_memory,
    device_scope,
    holds,
    holds_zero,
    free_memory,
    get_state,
    put_csr,
    put_state,
    release_cached,
    synchronize,
    tile_shape,
    to_device,
    to_host,
    use_device,
)
from ._rows import empty_host_rows, gather_rows, host_rows, scatter_rows
from ._train import prepare_fit, run_epoch
from ._validate import validate_input

name = "cuda"
xp = cp
stage_names = {}  # the copies' own names

__all__ = [
    "name", "xp", "stage_names", "use_device", "device_scope", "device_memory", "holds",
    "tile_shape", "concurrent_blocks", "free_memory",
    "to_device", "to_host", "all_finite", "holds_zero", "synchronize", "put_csr",
    "csr_in_layout_order",
    "take_rows",
    "put_state", "get_state",
    "build_layout", "put_layout", "run_epoch", "decision_function", "matmul",
    "rmatmul", "fused_objective", "lbfgs_memory_ops", "validate_input",
    "host_rows", "empty_host_rows", "gather_rows", "scatter_rows", "release_cached",
    "weighted_loss", "draw_factors", "prepare_fit", "stage_layout_input", "mcmc_block_draw",
]
