"""CUDA backend: the cuWide kernels of ``cuda/`` through CuPy.

The only module of the package that imports cupy.  It has the same
functions as :mod:`._cpu`; the solver functions call them without knowing
which backend they got.

Data movement.  :func:`put_layout` copies the small index arrays of a
:class:`~sklearn_cuwide._layout.TileLayout` to the device at once and leaves
the nonzeros (``feat``, ``row``, ``val``: nearly all the bytes) on the host.
They stream in during the first epoch: the mini-batches are cut into chunks,
and while the kernel trains on chunk ``c`` the next chunk is staged in pinned
host memory and copied on a second stream (events order the two).  If the
layout fits the device-memory budget, the chunks are copied into resident
device arrays and later epochs run from device memory; if not, every epoch
streams the chunks through two device buffers.
"""

import itertools
import math

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from .._kernels import get_kernel, kernel_name
from .._sparse import canonical_csr
from .._state import ModelState
from . import _concurrency, _tiles

name = "cuda"
xp = cp

_MODEL = {"linear": "cuwide::LINEAR", "fm": "cuwide::FM"}
_LOSS = {
    "logistic": "cuwide::LOGISTIC",
    "multinomial": "cuwide::MULTINOMIAL",
    "squared": "cuwide::SQUARED",
}
_SOLVER = {"sgd": "cuwide::SGD", "adagrad": "cuwide::ADAGRAD"}
_CTYPE = {
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}
_NULL = np.uint64(0)
_device_id = 0


def use_device(i):
    global _device_id
    _device_id = int(i)
    cp.cuda.Device(_device_id).use()


def device_name():
    n = _props()["name"]
    return n.decode() if isinstance(n, bytes) else str(n)


_PROPS = {}


def _props():
    """Device properties, read once per device (the call costs ~1 ms)."""
    p = _PROPS.get(_device_id)
    if p is None:
        p = _PROPS[_device_id] = cp.cuda.runtime.getDeviceProperties(_device_id)
    return p


def tile_shape(params, n_outputs, n_factors, batch_size):
    """Sample-block rows and most hot features, from this device's shared memory."""
    per_sm = _props()["sharedMemPerMultiprocessor"]
    return _tiles.tile_shape(per_sm, params, n_outputs, n_factors, batch_size)


# --------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------
def to_device(a):
    return cp.asarray(a)


def to_host(a):
    if isinstance(a, cp.ndarray):
        return cp.asnumpy(a)
    return np.asarray(a)


def synchronize():
    cp.cuda.get_current_stream().synchronize()


def put_csr(X, dtype=None):
    """A canonical cupyx CSR matrix on the device (no host round trip for cupy input)."""
    if isinstance(X, cp.ndarray):
        X = cpsp.csr_matrix(X)
    elif not cpsp.issparse(X):
        X = cpsp.csr_matrix(canonical_csr(X))  # canonical on the host, then copied
    return canonical_csr(X, dtype)


def put_state(state):
    out = ModelState(w=None, b=None)
    for k, a in state.arrays().items():
        setattr(out, k, cp.ascontiguousarray(cp.asarray(a)))
    out.extra = dict(state.extra)
    return out


def get_state(state):
    out = ModelState(w=None, b=None)
    for k, a in state.arrays().items():
        setattr(out, k, cp.asnumpy(a))
    out.extra = dict(state.extra)
    return out


layout_xp = cp


def build_layout(X, memory_budget=None, **kw):
    """Build the training layout on the GPU (cupy sorts, chunk by chunk).

    When the layout would not fit ``memory_budget`` (default: 80% of the
    free device memory), it is built on the host instead and streamed in
    every epoch.
    """
    from .._layout import build_layout as _build

    nnz = int(X.nnz)
    need = nnz * 10 + (64 << 20)
    if memory_budget is None:
        memory_budget = int(0.8 * free_memory())
    if need > memory_budget:
        if cpsp.issparse(X):  # streamed from the host every epoch anyway
            X = X.get()
        return _build(X, xp=np, **kw)
    kw.setdefault("chunk_nnz", 1 << 23)
    return _build(X, xp=cp, **kw)


def free_memory():
    """Bytes the device has free (cupy's pool included)."""
    free, _ = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.free_bytes())


class DeviceLayout:
    """A TileLayout whose index arrays are on the device; nonzeros stream in.

    Parameters
    ----------
    layout : TileLayout (host)
    memory_budget : int or None
        Device bytes the nonzeros may take; ``None``: 80% of what is free.
    chunk_bytes : int
        Bytes of nonzeros per streamed chunk.
    """

    def __init__(self, layout, memory_budget=None, chunk_bytes=64 << 20):
        self.host = layout
        self.n_hot = layout.n_hot
        self.sample_block = layout.sample_block
        self.n_batches = layout.n_batches
        self.n_rows = layout.n_rows
        self.tile_ptr = cp.asarray(layout.tile_ptr)
        self.sblock_row_ptr = cp.asarray(layout.sblock_row_ptr)
        self.batch_sblock_ptr = cp.asarray(layout.batch_sblock_ptr)
        self.bytes_per_nnz = (
            layout.feat.itemsize + layout.row.itemsize + layout.val.itemsize
        )
        self._pinned = None
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.counts = layout.feature_counts[layout.feature_order]
        self._scale = self._q = self._pscale = None
        if isinstance(layout.feat, cp.ndarray):  # built on the device
            self.resident = self.uploaded = True
            self.feat, self.row, self.val = layout.feat, layout.row, layout.val
            self.chunks = [(0, layout.n_batches)]
            self.chunk_nnz = [(0, layout.nnz)]
            self.max_chunk = layout.nnz
            return
        nnz_bytes = layout.nnz * self.bytes_per_nnz
        if memory_budget is None:
            memory_budget = int(0.8 * free_memory())
        self.resident = nnz_bytes <= memory_budget
        # chunks: contiguous runs of mini-batches of about chunk_bytes
        bstart = layout.tile_ptr[2 * layout.batch_sblock_ptr]  # nnz start per batch
        per_chunk = max(1, int(chunk_bytes // self.bytes_per_nnz))
        bounds = [0]
        if layout.n_batches:
            targets = np.arange(per_chunk, layout.nnz, per_chunk)
            cut = np.unique(np.searchsorted(bstart[:-1], targets, side="left"))
            bounds += [int(c) for c in cut if 0 < c < layout.n_batches]
            bounds.append(layout.n_batches)
        self.chunks = list(zip(bounds[:-1], bounds[1:]))
        self.chunk_nnz = [
            (int(bstart[a]), int(bstart[b])) for a, b in self.chunks
        ]
        self.max_chunk = max((b - a for a, b in self.chunk_nnz), default=0)
        self.uploaded = False
        if self.resident:
            self.feat = cp.empty(layout.nnz, dtype=layout.feat.dtype)
            self.row = cp.empty(layout.nnz, dtype=layout.row.dtype)
            self.val = cp.empty(layout.nnz, dtype=layout.val.dtype)
        else:
            self.buffers = [
                tuple(
                    cp.empty(max(self.max_chunk, 1), dtype=a.dtype)
                    for a in (layout.feat, layout.row, layout.val)
                )
                for _ in range(2)
            ]

    def batch_weight_on_device(self, batch_weight):
        """The per-batch weights as a device array (uploaded once)."""
        cached = getattr(self, "_bw", None)
        if cached is not None and cached[0] is batch_weight:
            return cached[1]
        dev = cp.asarray(np.asarray(batch_weight, dtype=np.float32))
        self._bw = (batch_weight, dev)
        return dev

    def concurrency_scale(self, n_concurrent, power=1.0, cap=None):
        """Per-feature step scale for ``n_concurrent`` blocks in flight.

        A feature present in a fraction ``q`` of the mini-batches is updated
        by about ``1 + (P - 1) q`` blocks from the same stale weights; its
        step is divided by that (staleness-aware asynchronous SGD).  Returns
        (device array in layout order, the number of leading features that
        it damps, scale of the intercept): every feature from that index on
        has a scale of 1, so the kernel reads no scale for it (with a cap,
        these are the cold features, which few blocks update at once).
        """
        P = int(n_concurrent)
        key = (P, float(power), cap)
        if self._scale is None or self._scale[0] != key:
            if self._q is None:
                q = -np.expm1(-self.counts * (self.host.batch_size / max(self.n_rows, 1)))
                self._q = cp.asarray(np.clip(q, 0.0, 1.0).astype(np.float32))
            updaters = 1.0 + (P - 1) * self._q
            if cap is not None:  # undamped up to `cap` concurrent updaters
                s, sb = cp.minimum(1.0, cap / updaters), min(1.0, cap / P)
            else:
                s, sb = updaters ** (-power), float(P) ** -power
            damped = cp.flatnonzero(s < 1.0)
            n_scaled = int(damped[-1]) + 1 if damped.size else 0
            # one level kept: 4 bytes per feature, not 4 per level of the ramp
            self._scale = (key, (s.astype(cp.float32), n_scaled, sb))
        return self._scale[1]

    def penalty_scale(self):
        """:func:`sklearn_cuwide._layout.penalty_scale` on the device (float32,
        layout order), computed once: where the nonzeros are (on the device
        when built there, else on the host)."""
        if self._pscale is None:
            from .._layout import penalty_scale

            if isinstance(self.host.feat, cp.ndarray):
                self._pscale = penalty_scale(self.host, cp)
            else:
                self._pscale = cp.asarray(penalty_scale(self.host, np))
            self._pscale_token = next(_TOKENS)
        return self._pscale

    @property
    def nbytes(self):
        """Device bytes this layout holds."""
        small = self.tile_ptr.nbytes + self.sblock_row_ptr.nbytes
        small += self.batch_sblock_ptr.nbytes
        if self.resident:
            return small + self.host.nnz * self.bytes_per_nnz
        return small + 2 * self.max_chunk * self.bytes_per_nnz

    def _pinned_buffers(self):
        if self._pinned is None:
            h = self.host
            self._pinned = []
            for _ in range(2):
                bufs = []
                for a in (h.feat, h.row, h.val):
                    n = max(self.max_chunk, 1)
                    mem = cp.cuda.alloc_pinned_memory(n * a.itemsize)
                    bufs.append(np.frombuffer(mem, dtype=a.dtype, count=n))
                self._pinned.append(bufs)
            self._pinned_events = [None, None]
        return self._pinned

    def _stage(self, k, slot, wait_for):
        """Copy chunk ``k`` host -> pinned buffer ``slot`` -> device, async.

        ``wait_for``: an event the device copy must wait for (the kernel
        that last read the device buffer of this slot), or None.
        """
        pinned = self._pinned_buffers()
        h = self.host
        a, b = self.chunk_nnz[k]
        ev_prev = self._pinned_events[slot]
        if ev_prev is not None:
            ev_prev.synchronize()  # the copy that last read this pinned buffer is done
        pb = pinned[slot]
        for src, dst in zip((h.feat, h.row, h.val), pb):
            dst[: b - a] = src[a:b]
        if self.resident:
            targets = (self.feat[a:b], self.row[a:b], self.val[a:b])
            arrays, base = (self.feat, self.row, self.val), 0
        else:
            targets = tuple(buf[: b - a] for buf in self.buffers[slot])
            arrays, base = self.buffers[slot], a
        if wait_for is not None:
            self.copy_stream.wait_event(wait_for)
        for src, dst in zip(pb, targets):
            dst.set(src[: b - a], stream=self.copy_stream)
        ev = self.copy_stream.record()
        self._pinned_events[slot] = ev
        return ev, arrays, base

    def stream_chunks(self, order_chunks, compute_stream):
        """Yield ``(chunk, (feat, row, val), nnz_base)`` for each chunk, after
        making ``compute_stream`` wait for its copy.  The caller launches the
        chunk's kernel; the next chunk's copy is then issued, so it overlaps
        that kernel."""
        kernel_done = [None, None]  # per slot: event after the last kernel on it
        staged = self._stage(order_chunks[0], 0, None) if order_chunks else None
        for n, k in enumerate(order_chunks):
            ev, arrays, base = staged
            compute_stream.wait_event(ev)
            yield k, arrays, base
            kernel_done[n % 2] = compute_stream.record()
            if n + 1 < len(order_chunks):
                slot = (n + 1) % 2
                wait = None if self.resident else kernel_done[slot]
                staged = self._stage(order_chunks[n + 1], slot, wait)
        if self.resident:
            self.uploaded = True


def put_layout(layout, memory_budget=None, chunk_bytes=64 << 20):
    return DeviceLayout(layout, memory_budget=memory_budget, chunk_bytes=chunk_bytes)


# --------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------
def _n_factors(state):
    return 0 if state.V is None else int(state.V.shape[1])


_TOKENS = itertools.count(1)
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
        return _NULL
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


CLUSTER_SIZES = _concurrency.CLUSTER_SIZES


def cluster_sizes():
    """Thread blocks per worker this device can run: clusters need compute
    capability 9.0 (Hopper) or later; before, one block per worker."""
    return CLUSTER_SIZES if _props()["major"] >= 9 else (1,)


def cluster_for(workers):
    """Thread blocks per worker for ``workers`` concurrent workers on this
    device (:func:`sklearn_cuwide._backends._concurrency.cluster_for`)."""
    return _concurrency.cluster_for(workers, full_grid(), cluster_sizes())


def default_staleness(params):
    """Step scaling under concurrency, as measured on an H200
    (``benchmarks/results/2026-11-30_policies/``) and in the CPU model of the
    concurrency (``2026-11-30_s7_lr_staleness_sim/``): LR with plain sgd (a
    step of 1 / L) needs its concurrent steps divided by sqrt(#updaters);
    the FM's features take undamped steps from up to C = max(4, P / 11)
    expected concurrent updaters and steps scaled by C / updaters beyond
    (``"cap-auto"``); LR with Adagrad the same with C = max(4, 2 / lr)
    (``"cap-step"``).  Plain lock-free sums keep LR's AUC but not its logloss
    at 244 workers: the features in every row take P steps from the same
    stale weights, and the margins overshoot; the FM's smaller cap damps LR
    too much at 61 workers."""
    if params.solver == "sgd":
        return "sqrt"
    return "cap-auto" if params.model == "fm" else "cap-step"


#: ``"cap-step"``: the summed undamped first steps of a feature (Adagrad's
#: first step is ``learning_rate`` in size) move it by at most this much
STEP_BOUND = 2.0


def staleness_cap(staleness, n_blocks, learning_rate=None):
    """C of a ``"capC"`` / ``"cap-auto"`` / ``"cap-step"`` policy for
    ``n_blocks`` in flight (None for the other policies).

    ``"cap-auto"``: C = max(4, P / 11), the best of the caps measured on
    Criteo-like data at P = 12, 24 (cap 4) and 264 blocks (cap 24), for the FM.
    ``"cap-step"``: C = max(4, STEP_BOUND / learning_rate), for LR: in the
    CPU model of 244 and 61 workers on 4M and 1M Criteo-like rows, caps of
    40-88 keep the AUC and the logloss of the sequential order, while no cap
    (244) loses the logloss and P / 11 (5.5 at 61 workers) the AUC.
    ``run_epoch`` takes P from its full grid, also in the warm-up stages.
    """
    if not (isinstance(staleness, str) and staleness.startswith("cap")):
        return None
    if staleness == "cap-auto":
        return max(4.0, n_blocks / 11.0)
    if staleness == "cap-step":
        return max(4.0, STEP_BOUND / float(learning_rate))
    return float(staleness[3:])


def full_grid():
    """Thread blocks of the training kernel that run at once on the device
    (the most workers)."""
    return _props()["multiProcessorCount"] * _tiles.BLOCKS_PER_SM


def default_grid(n_batches):
    """Workers an epoch of ``n_batches`` mini-batches runs on when none are
    asked for: the full grid, but at least MIN_BATCHES_PER_BLOCK mini-batches
    per worker (small data runs on fewer, with less staleness)."""
    return _concurrency.grid_for(n_batches, full_grid())


def concurrent_blocks(concurrency, params, n_batches):
    """Workers (concurrent mini-batches) for the estimators' ``concurrency``
    ("auto", "max" or an int): see :mod:`sklearn_cuwide._backends._concurrency`;
    each worker gets :func:`cluster_for` blocks."""
    return _concurrency.blocks(concurrency, params.model, params.solver, n_batches,
                               full_grid())


def default_ramp(params):
    """Mini-batches per block of each concurrency warm-up stage (first epoch)."""
    return 32 if params.model == "fm" else 8


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
    :func:`staleness_cap`).
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
        staleness = default_staleness(params)
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
    gw, gstride, pscale, pstride = _NULL, 0, _NULL, 1
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
    null = _NULL
    V = state.V if state.V is not None else null
    gV = state.gV if state.gV is not None else null
    gb = state.gb if state.gb is not None else null
    stream = cp.cuda.get_current_stream()
    batch_order = np.asarray(batch_order, dtype=np.int64)

    # the cap of a capped policy comes from the full grid and holds in the
    # warm-up stages too (their fewer blocks are then damped less or not at all)
    cap = staleness_cap(staleness, grid, params.learning_rate)
    # warm-up stages: (blocks, mini-batches), consumed by the first launches
    stages = []
    if ramp and not deterministic:
        P = 1
        while P < grid:
            stages.append((P, int(ramp) * P))
            P *= 2

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


# --------------------------------------------------------------------------
# prediction and full-batch products
# --------------------------------------------------------------------------
def _csr_arrays(X):
    """(indptr, indices, data, shape) of a canonical CSR on the device.

    scipy input keeps its index dtype (int64 indices beyond 2**31 nonzeros
    work: the predict kernel is templated on it); cupy input is used in place.
    """
    if cpsp.issparse(X) or isinstance(X, cp.ndarray):
        X = put_csr(X)
        return X.indptr, X.indices, X.data, X.shape
    X = canonical_csr(X)
    return cp.asarray(X.indptr), cp.asarray(X.indices), cp.asarray(X.data), X.shape


def decision_function(X, w, b, V=None, fit_linear=True, out=None):
    """Decision values (n_samples, n_outputs), float64 cupy array.

    ``out``: optional float32 (n_samples, n_outputs) device array the kernel
    writes (the tests poison it first); the float64 result is a copy.
    """
    indptr, indices, data, shape = _csr_arrays(X)
    if data.dtype not in (np.float32, np.float64):
        data = data.astype(cp.float32)
    w = cp.ascontiguousarray(cp.asarray(w, dtype=cp.float32))
    b = cp.ascontiguousarray(cp.asarray(b, dtype=cp.float32).reshape(-1))
    D = int(w.shape[1])
    n = int(shape[0])
    if out is None:
        out = cp.empty((n, D), dtype=cp.float32)
    if n == 0:
        return out.astype(cp.float64)
    model = "cuwide::FM" if V is not None else "cuwide::LINEAR"
    k = 0 if V is None else int(V.shape[1])
    Vd = _NULL if V is None else cp.ascontiguousarray(cp.asarray(V, dtype=cp.float32))
    expr = kernel_name(
        "cuwide_predict",
        _CTYPE[np.dtype(indptr.dtype)],
        _CTYPE[np.dtype(indices.dtype)],
        _CTYPE[np.dtype(data.dtype)],
        model,
        1 if V is not None else D,
        k,
    )
    kern = get_kernel("cuwide_predict.cu", expr)
    threads = 256
    blocks = max(1, min(int(math.ceil(n * 32 / threads)), 65535 * 8))
    kern(
        (blocks,),
        (threads,),
        (indptr, indices, data, np.int64(n), w, Vd, b, np.int32(fit_linear), out),
    )
    return out.astype(cp.float64)


def matmul(X, W):
    """X @ W for a device CSR X and a dense W (cuSPARSE)."""
    return X @ W.astype(X.dtype, copy=False)


def rmatmul(X, E):
    """X.T @ E for a device CSR X and a dense E (cuSPARSE)."""
    return X.T @ E.astype(X.dtype, copy=False)


#: most nonzeros of one feature a warp sums in the L-BFGS gradient
LBFGS_PIECE = 512


def fused_objective(X, y, ws, *, loss, n_outputs, lam, fit_intercept):
    """``fun_grad(x) -> (f, g)`` of binary logistic regression for L-BFGS, in
    two fused kernels (``cuda/cuwide_lbfgs.cu``); ``None`` for other losses.

    ``f`` stays on the device (a 0-d array read with the line search's other
    scalars).  The data keep their dtype (float32 values are exact in the
    float64 sums); a transposed copy of X (CSR of X.T, built once by
    cuSPARSE) makes the gradient a gather instead of scattered atomics.
    """
    if loss != "logistic" or n_outputs != 1:
        return None
    X = put_csr(X)
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(cp.float32)
    Xt = X.T.tocsr()
    Xt.sum_duplicates()
    n, d = X.shape
    y = cp.ascontiguousarray(y, dtype=cp.float64)
    ws = cp.ascontiguousarray(ws, dtype=cp.float64)
    targs = (_CTYPE[np.dtype(X.indices.dtype)], _CTYPE[np.dtype(X.dtype)])
    fwd = get_kernel("cuwide_lbfgs.cu", kernel_name("cuwide_lbfgs_logistic_forward", *targs))
    bwd = get_kernel("cuwide_lbfgs.cu", kernel_name("cuwide_lbfgs_logistic_backward", *targs))
    threads = 256
    cap = 32 * _props()["multiProcessorCount"]
    grid_f = (max(1, min(-(-n // (threads // 32)), cap)),)
    # pieces of at most LBFGS_PIECE nonzeros per feature (see the kernel)
    lens = cp.diff(Xt.indptr.astype(cp.int64))
    n_pieces_of = cp.maximum(1, -(-lens // LBFGS_PIECE))
    piece_ptr = cp.zeros(d + 1, dtype=cp.int64)
    cp.cumsum(n_pieces_of, out=piece_ptr[1:])
    n_pieces = int(piece_ptr[-1])
    piece_col = (cp.searchsorted(piece_ptr, cp.arange(n_pieces, dtype=cp.int64),
                                 side="right") - 1).astype(cp.int32)
    del lens, n_pieces_of
    grid_b = (max(1, min(-(-n_pieces // (threads // 32)), cap)),)
    E = cp.empty(n, dtype=cp.float64)
    acc = cp.zeros(3, dtype=cp.float64)
    half_lam = cp.float64(0.5 * lam)
    n_par = d + (1 if fit_intercept else 0)
    fi = np.int32(bool(fit_intercept))

    def fun_grad(x):
        x = cp.ascontiguousarray(x, dtype=cp.float64)
        acc.fill(0)
        fwd(grid_f, (threads,), (X.indptr, X.indices, X.data, np.int64(n), x,
                                 np.int64(d), fi, y, ws, E, acc))
        g = cp.zeros(n_par, dtype=cp.float64)
        bwd(grid_b, (threads,), (Xt.indptr, Xt.indices, Xt.data, piece_col, piece_ptr,
                                 np.int64(n_pieces), np.int32(LBFGS_PIECE), np.int64(d),
                                 E, x, np.float64(lam), fi, g, acc))
        return acc[0] + half_lam * acc[2], g

    return fun_grad


class LbfgsMemoryOps:
    """L-BFGS's products with its stored pairs in one pass over them each
    (``cuwide_lbfgs_gram`` / ``cuwide_lbfgs_direction``): cuBLAS's
    matrix-vector product of a few long rows runs on a few blocks only."""

    threads = 256

    def _kernel(self, name, nb):
        return get_kernel("cuwide_lbfgs.cu", kernel_name(name, nb))

    def _grid(self, n):
        return (max(1, min(-(-n // self.threads), 4 * _props()["multiProcessorCount"])),)

    def gram(self, B, s, y, g):
        nb, n = B.shape
        out = cp.zeros(3 * nb, dtype=cp.float64)
        self._kernel("cuwide_lbfgs_gram", nb)(
            self._grid(n), (self.threads,), (B, np.int64(n), s, y, g, out))
        return cp.asnumpy(out).reshape(3, nb)

    def direction(self, B, c, cg, g):
        nb, n = B.shape
        coef = cp.asarray(np.append(np.asarray(c, dtype=np.float64), cg))
        d = cp.empty(n, dtype=cp.float64)
        self._kernel("cuwide_lbfgs_direction", nb)(
            self._grid(n), (self.threads,), (B, np.int64(n), coef, g, d))
        return d


def lbfgs_memory_ops():
    return LbfgsMemoryOps()


# --------------------------------------------------------------------------
# the classic schema (ablation baseline of the benchmarks)
# --------------------------------------------------------------------------
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
        1, min(-(-n * 32 // threads), _props()["multiProcessorCount"] * 8)
    )
    kern(
        (blocks,),
        (threads,),
        (
            X.indptr.astype(cp.int32, copy=False), X.indices.astype(cp.int32, copy=False),
            X.data, rows, np.int64(n), y, sw,
            state.w, state.V if state.V is not None else _NULL, state.b,
            # the classic kernel indexes the sums densely: unpack a packed state
            _dense_gw(state),
            state.gV if state.gV is not None else _NULL,
            state.gb if state.gb is not None else _NULL,
            np.float32(params.learning_rate), np.float32(params.l2_w),
            np.float32(params.l2_v), np.float32(params.eps), loss,
        ),
    )
    return float(loss.get()[0])


# --------------------------------------------------------------------------
# input validation on the device (cupy / cupyx input to the estimators)
# --------------------------------------------------------------------------
def validate_input(X, estimator_name=None):
    """Check cupy / cupyx input on the device; return a canonical cupyx CSR.

    The device counterpart of scikit-learn's ``check_array(X,
    accept_sparse=..., dtype=[float32, float64])``, with its error messages:
    ``X`` must be 2-D, have at least one sample and one feature, not be
    complex, and hold no NaN or infinity.  float32 and float64 are kept;
    other dtypes (bool, integers, float16) become float32.  A dense cupy
    array becomes a cupyx CSR matrix; CSC, COO (and other cupyx formats)
    are converted; the result is canonical (sorted indices, duplicates
    summed) and never the user's matrix modified.

    Nothing of ``X`` goes to the host: the finiteness check is one scalar
    read (and, only when it fails, one more to tell NaN from infinity).

    Parameters
    ----------
    X : cupy.ndarray or cupyx.scipy.sparse matrix
    estimator_name : str or None
        Named in the messages as scikit-learn does.

    Returns
    -------
    cupyx.scipy.sparse.csr_matrix
    """
    sparse = bool(cpsp.issparse(X))
    if not sparse and not isinstance(X, cp.ndarray):
        raise TypeError(
            "expected a cupy.ndarray or a cupyx.scipy.sparse matrix, got "
            f"{type(X).__module__}.{type(X).__qualname__}"
        )
    by = f" by {estimator_name}" if estimator_name else ""
    what = (
        f"<{type(X).__module__}.{type(X).__qualname__} of shape "
        f"{tuple(X.shape)} and dtype {X.dtype}>"
    )
    dtype = np.dtype(X.dtype)
    if dtype.kind == "c":
        raise ValueError(f"Complex data not supported\n{what}\n")
    if dtype.kind not in "biuf":
        raise ValueError(
            f"dtype {dtype} is not supported{by}: convert the data to numeric "
            "values explicitly."
        )
    if X.ndim == 0:
        raise ValueError(
            f"Expected 2D array, got scalar array instead:\narray={what}.\n"
            "Reshape your data either using array.reshape(-1, 1) if "
            "your data has a single feature or array.reshape(1, -1) "
            "if it contains a single sample."
        )
    if X.ndim == 1:
        raise ValueError(
            f"Expected 2D array, got 1D array instead:\narray={what}.\n"
            "Reshape your data either using array.reshape(-1, 1) if "
            "your data has a single feature or array.reshape(1, -1) "
            "if it contains a single sample."
        )
    if X.ndim > 2:
        raise ValueError(
            f"Found array with dim {X.ndim}, while dim <= 2 is required{by}."
        )
    n_samples, n_features = (int(s) for s in X.shape)
    if n_samples < 1:
        raise ValueError(
            f"Found array with {n_samples} sample(s) (shape={tuple(X.shape)}) "
            f"while a minimum of 1 is required{by}."
        )
    if n_features < 1:
        raise ValueError(
            f"Found array with {n_features} feature(s) (shape={tuple(X.shape)}) "
            f"while a minimum of 1 is required{by}."
        )
    if dtype not in (np.float32, np.float64):
        X = X.astype(cp.float32)  # a new array / matrix
    if dtype.kind == "f":  # bool and integers are finite
        values = X.data if sparse else X
        if values.size and not bool(cp.isfinite(values).all()):  # one sync
            if bool(cp.isnan(values).any()):
                msg = "Input X contains NaN."
                if estimator_name:
                    msg += (
                        f"\n{estimator_name} does not accept missing values "
                        "encoded as NaN natively."
                    )
            else:
                msg = (
                    "Input X contains infinity or a value too large for "
                    f"{np.dtype(X.dtype)!r}."
                )
            raise ValueError(msg)
    if not sparse:
        X = cpsp.csr_matrix(X)  # cuSPARSE dense -> CSR (any memory order)
    return canonical_csr(X)
