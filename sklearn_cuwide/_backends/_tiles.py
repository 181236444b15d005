"""Tile sizing: how many rows a sample block holds and how many hot features
a thread block caches, from the shared memory of one multiprocessor; and the
training kernel's scalar arguments, :data:`STEP_ARGS`.

Shared by both backends so that the CPU reference walks the same tiles as
the kernels (the CPU backend assumes an H200's 228 KiB per multiprocessor).
The byte count mirrors the shared-memory carve-up in ``cuda/cuwide_train.cu``.
Plain numpy (no cupy): ``tests/test_cuda_sources.py`` checks :data:`STEP_ARGS`
and :func:`replicas_of_width` against the CUDA source with nvcc alone.
"""

import numpy as np

from .._layout import MAX_SAMPLE_BLOCK

#: threads per block of the training kernel
THREADS = 512
#: thread blocks resident per multiprocessor (each gets half the memory)
BLOCKS_PER_SM = 2
#: shared memory the driver reserves per block
DRIVER_RESERVED = 1024
#: the kernel's static shared memory (the work item, the cluster's split
#: points; 48 bytes with clusters), rounded up
STATIC_SMEM = 64
#: most hot features a thread block caches
MAX_HOT = 16384


def _width(params, n_outputs, n_factors):
    return n_factors + 1 if params.model == "fm" else int(n_outputs)


def row_stride(params, n_outputs, n_factors):
    """Floats per sample in shared memory (odd when > 1: no bank conflicts)."""
    w = _width(params, n_outputs, n_factors)
    return w + 1 if (w > 1 and w % 2 == 0) else w


def hot_width(params, n_outputs, n_factors):
    """Model floats per hot feature (weights; the gradient replicas likewise)."""
    return _width(params, n_outputs, n_factors)


def replicas(params, n_outputs, n_factors):
    """Copies of each hot gradient accumulator (fewer atomic conflicts)."""
    return replicas_of_width(hot_width(params, n_outputs, n_factors))


def replicas_of_width(hot_width):
    """:func:`replicas` for ``hot_width`` model floats per hot feature: the
    kernel's compile-time ``hot_replicas`` (``cuda/cuwide_train.cu``)."""
    if hot_width == 1:
        return 4
    if hot_width <= 17:
        return 2
    return 1


def smem_bytes(sample_block, n_hot, rs, hw, n_rep, n_outputs, acc_in_smem=True):
    """Dynamic shared memory of one training block (see cuwide_train.cu)."""
    n = 4 * ((sample_block * rs if acc_in_smem else 0) + n_hot * hw * (1 + n_rep))
    n += 4 * (THREADS + 33) + 4 * int(n_outputs) + 4 * int(n_hot)
    return n


def block_budget(shared_per_sm):
    """Shared memory one of the BLOCKS_PER_SM blocks of an SM may use."""
    return int(shared_per_sm) // BLOCKS_PER_SM - DRIVER_RESERVED - STATIC_SMEM


def tile_shape(shared_per_sm, params, n_outputs, n_factors, batch_size, in_order=False):
    """Return ``(sample_block, n_hot_max)``.

    Half of a block's budget goes to the per-sample accumulators (sample
    blocks are balanced: a 1024-row batch that needs two blocks gets two of
    512), the rest to the hot cache and its gradient replicas.

    ``in_order``: the mini-batches are trained in order.  An FM's in-order
    kernel keeps no per-sample state in shared memory, so a sample block is
    the whole mini-batch (one step per mini-batch, the fewest grid-wide
    steps) and the hot features are the layout rule's (up to MAX_HOT).
    """
    if in_order and params.model == "fm":
        return int(min(max(1, int(batch_size)), MAX_SAMPLE_BLOCK)), MAX_HOT
    budget = block_budget(shared_per_sm)
    rs = row_stride(params, n_outputs, n_factors)
    hw = hot_width(params, n_outputs, n_factors)
    rep = replicas(params, n_outputs, n_factors)
    avail = budget - smem_bytes(0, 0, rs, hw, rep, n_outputs)
    sb_max = max(1, min(MAX_SAMPLE_BLOCK, (avail // 2) // (4 * rs)))
    batch_size = max(1, int(batch_size))
    n_sb = -(-batch_size // sb_max)
    sb = -(-batch_size // n_sb)
    left = avail - 4 * rs * sb
    n_hot = max(0, min(MAX_HOT, left // (4 * hw * (1 + rep) + 4)))
    return int(sb), int(n_hot)


def in_order_row_stride(n_factors):
    """Floats per sample of the in-order FM kernel's per-sample sums
    (``cuwide::InOrderRow``): the factors' sums, then one float; padded to
    16 bytes where a lane adds four factors with one vector atomic (``NF /
    4`` a power of two up to 32)."""
    q, r = divmod(int(n_factors), 4)
    vec = r == 0 and 1 <= q <= 32 and q & (q - 1) == 0
    return int(n_factors) + (4 if vec else 1)


def in_order_scratch_sizes(sample_block, n_hot, n_factors):
    """Sizes, in 4-byte words and in the kernel's argument order, of the
    in-order FM kernel's scratch: two sample blocks' per-sample sums, the
    hot features' gradients, two sets of touched flags, two intercept
    gradients and the grid barrier's word."""
    sb = int(min(sample_block, MAX_SAMPLE_BLOCK))
    return (2 * sb * in_order_row_stride(n_factors), int(n_hot) * (int(n_factors) + 1),
            2 * int(n_hot), 2, 1)


# --------------------------------------------------------------------------
# the training kernel's scalar arguments
# --------------------------------------------------------------------------
#: ``cuwide::StepArgs`` of ``cuda/cuwide_train.cu``, field by field, in its
#: order: (name, C type).  The struct documents each field.
STEP_ARGS_FIELDS = (
    ("nnz_base", "long long"),
    ("n_work", "int"),
    ("sample_block", "int"),
    ("n_hot", "int"),
    ("n_scaled", "int"),
    ("gstride", "int"),
    ("pstride", "int"),
    ("lr", "float"),
    ("l2w", "float"),
    ("l2v", "float"),
    ("l1", "float"),
    ("eps", "float"),
    ("bscale", "float"),
    ("fit_intercept", "int"),
    ("fit_linear", "int"),
)

_NUMPY_OF_C = {"int": np.int32, "long long": np.int64, "float": np.float32}

#: The numpy structured dtype of ``cuwide::StepArgs``: the same field order,
#: offsets and size as the C struct (``align=True`` lays the fields out as a
#: C compiler does).  A one-element array of it is the kernel's argument,
#: passed by value.
STEP_ARGS = np.dtype(
    {
        "names": [name for name, _ in STEP_ARGS_FIELDS],
        "formats": [_NUMPY_OF_C[c] for _, c in STEP_ARGS_FIELDS],
    },
    align=True,
)
