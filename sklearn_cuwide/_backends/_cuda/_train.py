"""The flow-based training kernel (``cuda/cuwide_train.cu``) and its launcher,
:func:`run_epoch`, the one the estimators call.

The kernel takes the layout's and the model's arrays as pointers and the
scalars as one ``cuwide::StepArgs``, passed by value: a one-element numpy
array of :data:`sklearn_cuwide._backends._tiles.STEP_ARGS` (cupy hands a
numpy array of one element to a kernel by value).  The benchmarks' ablation
and the tests' diagnostic runs go through the same launcher, :func:`_epoch`,
from :mod:`._ablation`.
"""

import cupy as cp
import numpy as np

from ... import _kernels
from ..._kernels import VARIANTS
from .. import _concurrency, _tiles
from ._runtime import NULL, cluster_for, cluster_sizes, default_grid, full_grid
from ._warmup import warm_up

#: the training kernels' source
SOURCE = "cuwide_train.cu"


def _n_factors(state):
    return 0 if state.V is None else int(state.V.shape[1])


# --------------------------------------------------------------------------
# Adagrad's sums and the penalty factors in one buffer
# --------------------------------------------------------------------------
def pack_penalty(state, dl):
    """Adagrad's sums of the linear weights and the layout's penalty factors
    in one device buffer of shape (n_features, n_outputs + 1), the factors in
    the last column, so that the training kernel's cold apply reads a
    feature's sums and factor from one 32-byte sector instead of two.

    ``state.gw`` becomes a view of the buffer's first columns (made once per
    state); the factors are written again only when the layout's factors
    change.  The buffer and the token of the factors it holds are recorded in
    ``state.packed`` (a :class:`._runtime.DeviceState`: they go with it).
    Returns (gw buffer, gstride, factors, pstride) for the kernel.
    """
    pscale = dl.penalty_scale()
    rec = _packed(state)
    if rec is None:
        gw = state.gw
        n, k = gw.shape
        base = cp.empty((n, k + 1), dtype=gw.dtype)
        base[:, :k] = gw
        state.gw = base[:, :k]
        rec = state.packed = {"buffer": base, "token": None}
    base = rec["buffer"]
    k = base.shape[1] - 1
    if rec["token"] != dl._pscale_token:
        base[:, k] = pscale
        rec["token"] = dl._pscale_token
    return base, k + 1, base.ravel()[k:], k + 1


def _packed(state):
    """The record of the buffer :func:`pack_penalty` made for ``state``, when
    ``state.gw`` is still its view; else None (a stale record is dropped)."""
    rec = state.packed
    if rec is None:
        return None
    base, gw = rec["buffer"], state.gw
    if gw is not None and gw.base is base and gw.shape == (base.shape[0], base.shape[1] - 1):
        return rec
    state.packed = None
    return None


def _gw_argument(state):
    """(buffer, stride) of Adagrad's sums of the linear weights for the
    training kernel, without the penalty factors: a packed state passes its
    buffer (stride n_outputs + 1), any other a C-contiguous array."""
    rec = _packed(state)
    if rec is not None:
        return rec["buffer"], rec["buffer"].shape[1]
    return _dense_gw(state), state.gw.shape[1]


def _dense_gw(state):
    """``state.gw`` as a C-contiguous array (a packed state gets a copy)."""
    if state.gw is None:
        return NULL
    if not state.gw.flags.c_contiguous:
        state.gw = cp.ascontiguousarray(state.gw)
    return state.gw


# --------------------------------------------------------------------------
# the in-order kernel's scratch
# --------------------------------------------------------------------------
class InOrderScratch:
    """The device buffers of ``cuwide_train_in_order``, one allocation
    (:func:`sklearn_cuwide._backends._tiles.in_order_scratch_sizes`).
    Zeroed before every launch: the kernel leaves the last step's copies
    dirty."""

    def __init__(self, sample_block, n_hot, n_factors):
        sizes = _tiles.in_order_scratch_sizes(sample_block, n_hot, n_factors)
        self.buffer = cp.empty(sum(sizes), dtype=cp.float32)
        ends = np.cumsum(sizes)
        starts = ends - np.asarray(sizes)
        parts = [self.buffer[a:b] for a, b in zip(starts, ends)]
        self.acc, self.hgrad, self.bacc = parts[0], parts[1], parts[3]
        self.touched, self.barrier = parts[2].view(cp.int32), parts[4].view(cp.uint32)

    def arguments(self):
        """The kernel's scratch arguments, zeroed."""
        self.buffer.fill(0)
        return (self.acc, self.hgrad, self.touched, self.bacc, self.barrier)


# --------------------------------------------------------------------------
# the kernel and its launcher
# --------------------------------------------------------------------------
def train_kernel(params, n_outputs, n_factors, cluster=1, variant=None):
    """The training kernel: ``cuwide_train``, or with ``cluster > 1`` the
    one whose workers are thread block clusters of that many blocks;
    ``variant`` (a key of :data:`VARIANTS`): the ablation kernel with that
    optimisation off (:func:`sklearn_cuwide._kernels.train_instantiation`)."""
    return _kernels.get_kernel(SOURCE, _kernels.train_instantiation(
        params.model, n_outputs, n_factors, params.solver, params.loss, cluster, variant))


def epoch_kernels(params, n_outputs, n_factors, chunk_batches, grid, ramp, *, cluster=None,
                  variant=None, ramp_done=0):
    """``{cluster: kernel}`` of every launch of an epoch, and of the epochs
    after a first one that warms up (see
    :func:`sklearn_cuwide._kernels.epoch_instantiations`), the ones not yet
    built compiled together."""
    names = _kernels.epoch_instantiations(
        params.model, n_outputs, n_factors, params.solver, params.loss,
        chunk_batches=chunk_batches, grid=grid, ramp=ramp, slots=full_grid(),
        cluster_sizes=cluster_sizes(), cluster=cluster, variant=variant, and_later=True,
        ramp_done=ramp_done)
    return dict(zip(names, _kernels.get_kernels(SOURCE, list(names.values()))))


def prepare_fit(X, params, n_outputs, n_factors, n_batches, workers, ramp, dtype, *,
                validation=False, fresh=True):
    """Start compiling, in the background, the kernels a mini-batch fit of
    ``X`` reaches first: the layout build's module (for ``X``'s dtypes and
    the layout's ``dtype``), the first epoch's training kernels (a
    resident layout of ``n_batches``, ``workers`` and the warm-up
    ``ramp``), a ``fresh`` FM's initial factors (of ``dtype``) and, where
    the fit scores held-out rows (``validation``: rows of ``X`` in its
    dtypes, the index pointer cast to the indices'), their prediction and
    loss.  CuPy's own kernels that the fit runs are started too
    (:func:`._warmup.warm_up`).
    Rule: what a fit compiles is started before the work that needs it.
    Why: NVRTC releases the GIL, so the compilations overlap the upload, the
    layout build and CuPy's own compilations instead of following them."""
    csr = getattr(X, "format", None) == "csr" and X.dtype in (np.float32, np.float64) \
        and X.indices.dtype in (np.int32, np.int64)
    if csr:
        _kernels.prefetch((_kernels.get_module_kernels, "cuwide_build.cu", list(
            _kernels.build_instantiations(X.indices.dtype, X.dtype, np.dtype(dtype)).values())))
        warm_up(X.dtype, X.indices.dtype, dtype, n_outputs, n_factors,
                params.solver == "adagrad", params.penalty_scaled)
    names = _kernels.epoch_instantiations(
        params.model, n_outputs, n_factors, params.solver, params.loss,
        chunk_batches=[int(n_batches)], grid=int(workers), ramp=ramp, slots=full_grid(),
        cluster_sizes=cluster_sizes(), and_later=True)
    _kernels.prefetch((_kernels.get_kernels, SOURCE, list(names.values())))
    later = []  # reached after the build: the initial state, each epoch's score
    if fresh and n_factors:
        later.append((_kernels.get_kernels, "cuwide_factors.cu",
                      [_kernels.factors_instantiation(np.dtype(dtype).name)]))
    if validation and csr:  # _solvers._validation_loss
        later.append((_kernels.get_kernels, "cuwide_predict.cu", [_kernels.predict_instantiation(
            X.indices.dtype, X.indices.dtype, X.dtype, "fm" if n_factors else "linear",
            n_outputs, n_factors)]))
        if params.loss != "multinomial":  # the multinomial's loss is CuPy's
            later.append((_kernels.get_kernels, "cuwide_loss.cu",
                          [_kernels.loss_instantiation(params.loss)]))
    if later:
        _kernels.prefetch(*later)


def run_epoch(layout, y, sw, batch_weight, state, params, batch_order, *, workers=None, ramp=0,
              ramp_done=0):
    """One pass over the mini-batches with the flow-based kernel.

    Parameters
    ----------
    layout : DeviceLayout
    y, sw : device float32 arrays, in the layout's row order
        Labels (class indices for multinomial) and sample weights.
    batch_weight : array (n_batches,)
        Each mini-batch's sum of sample weights (its step is the weighted mean).
    state : ModelState of device arrays, in the layout's feature order
        Updated in place.
    params : StepParams
    batch_order : array of mini-batch indices
        The order the mini-batches are taken in.
    workers : int or None
        Mini-batches trained at once (lock-free, Hogwild), each feature's
        step damped by the number of workers expected to update it at once
        (:func:`~sklearn_cuwide._backends._concurrency.default_staleness`).
        None: the default grid (every block the device runs at once, but at
        least MIN_BATCHES_PER_BLOCK mini-batches per worker); 1: one worker
        that applies the mini-batches strictly in ``batch_order``, the CPU
        backend's semantics.  A worker is a thread block cluster of
        :func:`~._runtime.cluster_for` blocks, which trains its mini-batches
        in order whatever its size.
    ramp : int
        The first epoch's warm-up: 1, 2, 4, ... workers before ``workers``,
        each stage taking ``ramp`` mini-batches per worker (the first steps
        move the model most, so they are taken from the freshest weights);
        0: none.
    ramp_done : int
        Mini-batches of that warm-up trained already: this call is a part
        of an epoch (an out-of-core window), which goes on from there.

    Returns
    -------
    float
        The sum of ``sample_weight * loss`` over the epoch (one sync).
    """
    return _epoch(layout, y, sw, batch_weight, state, params, batch_order,
                  workers=workers, ramp=ramp, ramp_done=ramp_done)


def _epoch(dl, y, sw, batch_weight, state, params, batch_order, *, workers=None, ramp=0,
           cluster=None, staleness="auto", variant=None, ramp_done=0):
    """The launcher behind :func:`run_epoch` and :mod:`._ablation`'s entry
    points: ``cluster`` forces the thread blocks per worker (1, 2, 4 or 8;
    None: :func:`cluster_for` the workers), ``staleness`` the step policy
    under concurrency (``"auto"``: the default one), ``variant`` an ablation
    kernel (a key of :data:`VARIANTS`; None: the estimators' kernel)."""
    D = state.n_outputs
    k = _n_factors(state)
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ValueError(f"workers must be None or an int >= 1, got {workers!r}")
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)} or None, got {variant!r}")
    for name, a in (("y", y), ("sw", sw)):
        # the kernel reads them as floats, by address
        if not (isinstance(a, cp.ndarray) and a.dtype == cp.float32 and a.flags.c_contiguous):
            raise TypeError(f"{name} must be a C-contiguous float32 cupy array")
    if staleness == "auto":
        staleness = _concurrency.default_staleness(params.model, params.solver)
    if cluster is not None and int(cluster) not in cluster_sizes():
        raise ValueError(
            f"cluster must be one of {cluster_sizes()} on this device (thread block "
            f"clusters need compute capability 9.0), got {cluster!r}")

    def cluster_of(g):
        return int(cluster) if cluster is not None else cluster_for(g)

    acc_global = variant == "global_accumulators"
    rs = _tiles.row_stride(params, D, k)
    hw = _tiles.hot_width(params, D, k)
    rep = 1 if variant == "no_replicas" else _tiles.replicas(params, D, k)
    sb = dl.sample_block
    smem = _tiles.smem_bytes(sb, dl.n_hot, rs, hw, rep, D, acc_in_smem=not acc_global)

    # a data set of under 2 * MIN_BATCHES_PER_BLOCK mini-batches
    # (_concurrency) is trained strictly in order
    grid = default_grid(dl.n_batches) if workers is None else int(workers)
    bw = dl.batch_weight_on_device(batch_weight)
    # the kernel gets contiguous buffers and the floats from one feature's
    # Adagrad sums (and penalty factor) to the next
    gw, gstride, pscale, pstride = None, 0, None, 1
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

    # the scalars every launch of the epoch shares
    step = np.zeros(1, dtype=_tiles.STEP_ARGS)
    step["sample_block"] = sb
    step["n_hot"] = dl.n_hot
    step["gstride"] = gstride
    step["pstride"] = pstride
    step["lr"] = params.learning_rate
    step["l2w"] = params.l2_w
    step["l2v"] = params.l2_v
    step["l1"] = params.l1
    step["eps"] = params.eps
    step["fit_intercept"] = int(params.fit_intercept)
    step["fit_linear"] = int(params.fit_linear)

    stream = cp.cuda.get_current_stream()
    batch_order = np.asarray(batch_order, dtype=np.int64)

    # the cap of a capped policy comes from the full grid and holds in the
    # warm-up stages too (their fewer workers are then damped less or not at all)
    cap = _concurrency.staleness_cap(staleness, grid, params.learning_rate)
    # what each chunk trains: batch_order's relative order kept inside a
    # chunk, the chunks visited in the order their first batch appears
    if dl.resident and dl.uploaded:
        parts = [batch_order]
    else:
        chunk_of = np.empty(dl.n_batches, dtype=np.int64)
        for c, (a, b) in enumerate(dl.chunks):
            chunk_of[a:b] = c
        ch = chunk_of[batch_order]
        first = {}
        for c in ch.tolist():
            first.setdefault(c, len(first))
        order_chunks = sorted(first, key=first.get)
        parts = [batch_order[ch == c] for c in order_chunks]
    # the launches (the warm-up stages first) and every kernel they run,
    # compiled together before the first
    plan = _kernels.launch_plan([p.size for p in parts], grid, ramp, ramp_done)
    kernels = epoch_kernels(params, D, k, [p.size for p in parts], grid, ramp,
                            cluster=cluster, variant=variant, ramp_done=ramp_done)

    def kernel_of(cl):
        # the plan names every launch's kernel; one it did not is built here
        kern = kernels.get(cl)
        if kern is None:
            kern = kernels[cl] = train_kernel(params, D, k, cl, variant=variant)
        if smem > kern.max_dynamic_shared_size_bytes:
            kern.max_dynamic_shared_size_bytes = smem
        return kern

    scratch = []  # the in-order kernel's, made at its first launch

    def launch_in_order(kargs):
        # the training kernel's arguments less the work counter and the
        # step scales (one worker: neither), the scratch before the scalars
        (feat, row, val, tp, srp, bsp, y_, sw_, bw_, order, _counter, w, V, b, gw_, gV, gb,
         _fscale, pscale_, loss_, a) = kargs
        if not scratch:
            scratch.append(InOrderScratch(sb, dl.n_hot, k))
        kern = kernels.get(_kernels.IN_ORDER)
        if kern is None:
            kern = kernels[_kernels.IN_ORDER] = _kernels.get_kernel(
                SOURCE, _kernels.in_order_instantiation(k, params.solver, params.loss))
        # every block takes part in every step (grid barriers): a cooperative
        # launch, which fails rather than starts a grid that cannot run at once
        kern.kernel((full_grid(),), (_tiles.THREADS,),
                    (feat, row, val, tp, srp, bsp, y_, sw_, bw_, order, w, V, b, gw_, gV, gb,
                     pscale_, loss_) + scratch[0].arguments() + (a,),
                    enable_cooperative_groups=True)

    def launch_one(order_np, arrays, base, g):
        n_work = int(order_np.size)
        order = cp.asarray(order_np.astype(np.int32))
        # one worker takes the mini-batches in order; more take them from a counter
        counter = None if g == 1 else cp.zeros(1, dtype=cp.int32)
        g = min(g, n_work)
        fscale, n_scaled, bscale = None, 0, 1.0
        if staleness and g > 1:
            if cap is not None:
                fscale, n_scaled, bscale = dl.concurrency_scale(g, cap=cap)
            else:
                power = 0.5 if staleness == "sqrt" else 1.0
                fscale, n_scaled, bscale = dl.concurrency_scale(g, power)
        a = step.copy()
        a["nnz_base"], a["n_work"] = base, n_work
        a["n_scaled"], a["bscale"] = n_scaled, bscale
        feat, row, val = arrays
        kargs = (
            feat, row, val, dl.tile_ptr, dl.sblock_row_ptr, dl.batch_sblock_ptr, y, sw, bw,
            order, counter, state.w, state.V, state.b, gw, state.gV, state.gb, fscale, pscale,
            loss, a,
        )
        if variant is not None:
            kargs += (acc_buf,)
        kargs = tuple(NULL if x is None else x for x in kargs)  # absent arrays: null pointers
        if _kernels.trains_in_order(params.model, g, cluster, variant):
            launch_in_order(kargs)
            return
        cl = cluster_of(g)
        kernel_of(cl)((g * cl,), (_tiles.THREADS,), kargs, shared_mem=smem)

    def launch(c, arrays, base):
        order_np = parts[c]
        for _, n, P in (x for x in plan if x[0] == c):
            launch_one(order_np[:n], arrays, base, P)
            order_np = order_np[n:]

    if dl.resident and dl.uploaded:
        launch(0, (dl.feat, dl.row, dl.val), 0)
    else:
        position = {c: i for i, c in enumerate(order_chunks)}
        for c, arrays, base in dl.stream_chunks(order_chunks, stream):
            launch(position[c], arrays, base)
    return float(loss.get()[0])
