"""Tile sizing: how many rows a sample block holds and how many hot features
a thread block caches, from the shared memory a thread block may use.

Shared by both backends so that the CPU reference walks the same tiles as
the kernels (the CPU backend assumes an H200's 227 KiB).
"""

#: bytes kept free for the kernels' own scratch (warp partials, flags)
RESERVED = 2048
#: most hot features a thread block caches
MAX_HOT = 16384


def row_width(params, n_outputs, n_factors):
    """Floats of per-sample state a tile keeps in shared memory."""
    if params.model == "fm":
        return n_factors + 1  # the factor sums s_i and one scalar margin
    return n_outputs


def hot_width(params, n_outputs, n_factors):
    """Floats of model per hot feature (weights, then gradient replicas)."""
    if params.model == "fm":
        return n_factors + 1
    return n_outputs


def replicas(params, n_outputs, n_factors):
    """Copies of each hot gradient accumulator (fewer atomic conflicts)."""
    w = hot_width(params, n_outputs, n_factors)
    if w == 1:
        return 4
    if w <= 16:
        return 2
    return 1


def tile_shape(shared_bytes, params, n_outputs, n_factors, batch_size):
    """Return ``(sample_block, n_hot_max)`` for a shared-memory budget."""
    budget = max(int(shared_bytes) - RESERVED, 4096)
    rw = row_width(params, n_outputs, n_factors)
    sb = max(1, min(int(batch_size), 65536, (budget // 2) // (4 * rw)))
    left = budget - 4 * rw * sb
    hw = hot_width(params, n_outputs, n_factors)
    rep = replicas(params, n_outputs, n_factors)
    n_hot = max(0, min(MAX_HOT, left // (4 * hw * (1 + rep))))
    return int(sb), int(n_hot)
