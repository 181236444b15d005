"""The flow-based training kernel (``cuda/cuwide_train.cu``) and its launcher,
:func:`run_epoch`."""

import cupy as cp
import numpy as np

from ..._kernels import get_kernel, kernel_name
from .. import _concurrency, _tiles
from ._runtime import NULL, cluster_for, cluster_sizes, default_grid, full_grid

_MODEL = {"linear": "cuwide::LINEAR", "fm": "cuwide::FM"}
_LOSS = {
    "logistic": "cuwide::LOGISTIC",
    "multinomial": "cuwide::MULTINOMIAL",
    "squared": "cuwide::SQUARED",
}
_SOLVER = {"sgd": "cuwide::SGD", "adagrad": "cuwide::ADAGRAD"}


def _n_factors(state):
    return 0 if state.V is None else int(state.V.shape[1])


#: packed buffer's device address -> token of the penalty factors it holds
_PACKED_FOR = {}


def pack_penalty(state, dl):
    """Adagrad's sums of the linear weights and the layout's penalty factors
    in one device buffer of shape (n_features, n_outputs + 1), the factors in
    the last column, so that the training kernel's cold apply reads a
    feature's sums and factor from one 32-byte sector instead of two.

    ``state.gw`` becomes a view of the buffer's first columns (made once per
    state; the factors are written again only when the layout changes).
    Returns (gw buffer, gstride, factors, pstride) for the kernel.
    """
    pscale = dl.penalty_scale()
    gw = state.gw
    n, k = gw.shape
    base = _packed_base(gw)
    if base is None:
        base = cp.empty((n, k + 1), dtype=gw.dtype)
        base[:, :k] = gw
        state.gw = base[:, :k]
        _PACKED_FOR[base.data.ptr] = None
    if _PACKED_FOR.get(base.data.ptr) != dl._pscale_token:
        base[:, k] = pscale
        _PACKED_FOR[base.data.ptr] = dl._pscale_token
    return base, k + 1, base.ravel()[k:], k + 1


def _packed_base(gw):
    """The buffer :func:`pack_penalty` made, when ``gw`` is its view; else None."""
    base = gw.base
    n, k = gw.shape
    if (base is not None and base.data.ptr in _PACKED_FOR and base.shape == (n, k + 1)
            and gw.data.ptr == base.data.ptr):
        return base
    return None


def _gw_argument(state):
    """(buffer, stride) of Adagrad's sums of the linear weights for the
    training kernel, without the penalty factors: a packed state passes its
    buffer (stride n_outputs + 1), any other a C-contiguous array."""
    base = _packed_base(state.gw)
    if base is not None:
        return base, base.shape[1]
    return _dense_gw(state), state.gw.shape[1]


def _dense_gw(state):
    """``state.gw`` as a C-contiguous array (a packed state gets a copy)."""
    if state.gw is None:
        return NULL
    if not state.gw.flags.c_contiguous:
        state.gw = cp.ascontiguousarray(state.gw)
    return state.gw


def train_kernel(params, n_outputs, n_factors, cluster=1, acc_global=False):
    """The training kernel; ``cluster > 1``: the variant whose workers are
    thread block clusters of that many blocks; ``acc_global``: the ablation
    whose per-sample accumulators are in global memory."""
    model = params.model
    args = [
        _MODEL[model],
        1 if model == "fm" else int(n_outputs),
        int(n_factors) if model == "fm" else 0,
        _SOLVER[params.solver],
        _LOSS[params.loss],
    ]
    name = "cuwide_train"
    if cluster > 1:
        name, args = "cuwide_train_cluster", args + [int(cluster)]
    return get_kernel("cuwide_train.cu", kernel_name(name, *args, 1 if acc_global else 0))


def run_epoch(
    dl,
    y,
    sw,
    batch_weight,
    state,
    params,
    batch_order,
    *,
    deterministic=False,
    n_rep=None,
    acc_global=False,
    grid=None,
    staleness="auto",
    ramp=0,
    skip=0,
    cluster=None,
):
    """One pass over the mini-batches with the flow-based kernel.

    ``deterministic=True`` runs one thread block that applies the
    mini-batches strictly in ``batch_order`` (the CPU backend's semantics);
    otherwise every multiprocessor takes mini-batches concurrently
    (Hogwild, lock-free atomic updates), with each feature's step scaled
    down by the number of blocks expected to update it at once
    (``staleness=True``; ``"sqrt"`` divides by its square root; ``"capC"``
    leaves features with at most C expected concurrent updaters undamped and
    scales the others by C / updaters; ``"cap-auto"`` takes C from the
    number of blocks, ``"cap-step"`` from the learning rate, see
    :func:`~sklearn_cuwide._backends._concurrency.staleness_cap`).
    ``ramp=K``: warm up the
    concurrency, 1, 2, 4, ... blocks, each stage taking ``K`` mini-batches
    per block, before the full grid (used in the first epoch of a fit: the
    first steps move the model most, and move it from the freshest weights).  ``n_rep`` and ``acc_global`` are
    the ablation switches (replicas of the hot accumulators; per-sample
    accumulators in global memory instead of shared memory); ``skip`` is a
    profiling bit mask (1 aggregate, 2 hot apply, 4 cold apply, 8 flush;
    16: the apply reads the nonzeros with plain loads, not streaming ones).
    ``grid`` counts workers (concurrent mini-batches); ``cluster`` is the
    thread blocks per worker (1, 2, 4 or 8; default :func:`cluster_for`
    the workers, 1 with ``deterministic``).  A worker trains its
    mini-batches in order, so one worker keeps the sequential semantics
    with any cluster.
    Returns the sum of ``sample_weight * loss`` (a float; one sync).
    """
    D = state.n_outputs
    k = _n_factors(state)
    if staleness == "auto":
        staleness = _concurrency.default_staleness(params.model, params.solver)
    if cluster is not None and int(cluster) not in cluster_sizes():
        raise ValueError(
            f"cluster must be one of {cluster_sizes()} on this device (thread block "
            f"clusters need compute capability 9.0), got {cluster!r}")

    def cluster_of(g):
        if cluster is not None:
            return int(cluster)
        return 1 if deterministic else cluster_for(g)

    rs = _tiles.row_stride(params, D, k)
    hw = _tiles.hot_width(params, D, k)
    rep = _tiles.replicas(params, D, k) if n_rep is None else int(n_rep)
    sb = dl.sample_block
    smem = _tiles.smem_bytes(sb, dl.n_hot, rs, hw, rep, D, acc_in_smem=not acc_global)

    def kernel_of(cl):
        kern = train_kernel(params, D, k, cl, acc_global=bool(acc_global))
        if smem > kern.max_dynamic_shared_size_bytes:
            kern.max_dynamic_shared_size_bytes = smem
        return kern

    if grid is None:
        # a data set of under 2 * MIN_BATCHES_PER_BLOCK mini-batches
        # (_concurrency) is trained strictly in order
        grid = 1 if deterministic else default_grid(dl.n_batches)
    bw = dl.batch_weight_on_device(batch_weight)
    # the kernel gets contiguous buffers and the floats from one feature's
    # Adagrad sums (and penalty factor) to the next
    gw, gstride, pscale, pstride = NULL, 0, NULL, 1
    if params.penalty_scaled and state.gw is not None:
        gw, gstride, pscale, pstride = pack_penalty(state, dl)
    elif params.penalty_scaled:
        pscale = dl.penalty_scale()
    elif state.gw is not None:
        gw, gstride = _gw_argument(state)
    loss = cp.zeros(1, dtype=cp.float64)
    acc_buf = None
    if acc_global:
        # one slice per block of any launch below: cluster_for keeps a
        # launch within the device's slots, an explicit cluster within grid's
        most = max(full_grid(), grid * cluster_of(grid))
        acc_buf = cp.empty(most * sb * rs, dtype=cp.float32)
    null = NULL
    V = state.V if state.V is not None else null
    gV = state.gV if state.gV is not None else null
    gb = state.gb if state.gb is not None else null
    stream = cp.cuda.get_current_stream()
    batch_order = np.asarray(batch_order, dtype=np.int64)

    # the cap of a capped policy comes from the full grid and holds in the
    # warm-up stages too (their fewer blocks are then damped less or not at all)
    cap = _concurrency.staleness_cap(staleness, grid, params.learning_rate)
    # warm-up stages: (blocks, mini-batches), consumed by the first launches
    stages = [] if deterministic else _concurrency.ramp_stages(ramp, grid)

    def launch_one(order_np, arrays, base, g):
        n_work = int(order_np.size)
        seq = g == 1
        order = cp.asarray(order_np.astype(np.int32))
        counter = null if seq else cp.zeros(1, dtype=cp.int32)
        g = min(g, n_work)
        if staleness and g > 1:
            if cap is not None:
                fscale, n_scaled, bscale = dl.concurrency_scale(g, cap=cap)
            else:
                power = 0.5 if staleness == "sqrt" else 1.0
                fscale, n_scaled, bscale = dl.concurrency_scale(g, power)
        else:
            fscale, n_scaled, bscale = null, 0, 1.0
        feat, row, val = arrays
        cl = cluster_of(g)
        kernel_of(cl)(
            (g * cl,),
            (_tiles.THREADS,),
            (
                feat, row, val, np.int64(base),
                dl.tile_ptr, dl.sblock_row_ptr, dl.batch_sblock_ptr,
                order, np.int32(n_work), counter,
                y, sw, bw,
                state.w, V, state.b, gw, gV, gb,
                np.int32(sb), np.int32(dl.n_hot), np.int32(rep),
                acc_buf if acc_buf is not None else null,
                np.float32(params.learning_rate), np.float32(params.l2_w),
                np.float32(params.l2_v), np.float32(params.l1), np.float32(params.eps),
                np.int32(params.fit_intercept), np.int32(params.fit_linear),
                fscale, np.int32(n_scaled), np.float32(bscale),
                pscale, np.int32(gstride), np.int32(pstride), np.int32(skip),
                loss,
            ),
            shared_mem=smem,
        )

    def launch(order_np, arrays, base):
        while stages and order_np.size:
            P, cnt = stages[0]
            take = min(cnt, int(order_np.size))
            launch_one(order_np[:take], arrays, base, P)
            order_np = order_np[take:]
            if take == cnt:
                stages.pop(0)
            else:
                stages[0] = (P, cnt - take)
        if order_np.size:
            launch_one(order_np, arrays, base, 1 if deterministic else grid)

    if dl.resident and dl.uploaded:
        launch(batch_order, (dl.feat, dl.row, dl.val), 0)
    else:
        # stream the chunks: keep batch_order's relative order inside each
        # chunk, visit the chunks in the order their first batch appears
        chunk_of = np.empty(dl.n_batches, dtype=np.int64)
        for c, (a, b) in enumerate(dl.chunks):
            chunk_of[a:b] = c
        ch = chunk_of[batch_order]
        first = {}
        for c in ch.tolist():
            first.setdefault(c, len(first))
        order_chunks = sorted(first, key=first.get)
        for c, arrays, base in dl.stream_chunks(order_chunks, stream):
            launch(batch_order[ch == c], arrays, base)
    return float(loss.get()[0])
