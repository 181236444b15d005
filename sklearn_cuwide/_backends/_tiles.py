"""Tile sizing: how many rows a sample block holds and how many hot features
a thread block caches, from the shared memory of one multiprocessor.

Shared by both backends so that the CPU reference walks the same tiles as
the kernels (the CPU backend assumes an H200's 228 KiB per multiprocessor).
The byte count mirrors the shared-memory carve-up in ``cuda/cuwide_train.cu``.
"""

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
    w = hot_width(params, n_outputs, n_factors)
    if w == 1:
        return 4
    if w <= 17:
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


def tile_shape(shared_per_sm, params, n_outputs, n_factors, batch_size):
    """Return ``(sample_block, n_hot_max)``.

    Half of a block's budget goes to the per-sample accumulators (sample
    blocks are balanced: a 1024-row batch that needs two blocks gets two of
    512), the rest to the hot cache and its gradient replicas.
    """
    budget = block_budget(shared_per_sm)
    rs = row_stride(params, n_outputs, n_factors)
    hw = hot_width(params, n_outputs, n_factors)
    rep = replicas(params, n_outputs, n_factors)
    avail = budget - smem_bytes(0, 0, rs, hw, rep, n_outputs)
    sb_max = max(1, min(65536, (avail // 2) // (4 * rs)))
    batch_size = max(1, int(batch_size))
    n_sb = -(-batch_size // sb_max)
    sb = -(-batch_size // n_sb)
    left = avail - 4 * rs * sb
    n_hot = max(0, min(MAX_HOT, left // (4 * hw * (1 + rep) + 4)))
    return int(sb), int(n_hot)
