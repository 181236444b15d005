"""What runs on a worker: one partition of the data, kept in the worker's
memory for the whole fit, and the steps of the fit over it.

A :class:`Shard` is made once per worker from that worker's chunks
(:func:`check_chunk`, :func:`make_shard`: checked and concatenated), held by
a Dask future; each stage of the fit derives a new one from it
(:func:`with_targets`; :func:`with_objective`, the partition on the worker's
device for L-BFGS; :func:`with_layout`, its tile layout for the mini-batch
solvers), and every task reads a shard without changing it.
The functions here take plain arrays and parameters, never an estimator.
"""

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import _check_sample_weight, _check_y, check_array

from .. import _device
from .._backends import get_backend
from .._base import DTYPES, check_weight_range
from .._minibatch import COMPUTE_DTYPE, mean_row_nonzeros, rows_nnz
from .._solvers import _linear_objective, batch_weights
from .._sparse import canonical_csr
from .._state import ModelState
from .._validation import check_sparse_structure

__all__ = ["Shard", "check_chunk", "make_shard", "summary", "with_targets",
           "lbfgs_evaluate", "with_layout", "train_round"]


@dataclass
class Shard:
    """One worker's partition and what the fit built from it."""

    X: object  # canonical CSR (numpy host arrays)
    y: np.ndarray  # labels or targets, as given
    sw: np.ndarray  # float64 sample weights (times the class weights, later)
    device: str = "cpu"
    t: np.ndarray = None  # class indices (classifiers) or targets, float64
    cache: dict = field(default_factory=dict)  # backend objects of this shard

    @property
    def backend(self):
        return get_backend(self.device)


def check_chunk(X, y, sw, *, index, y_numeric):
    """One chunk's ``(X, y, sample_weight)`` checked as ``fit`` checks them:
    CSR (anything else is refused, with what to do), its structure, float32
    or float64, ``y`` and the weights of the same length."""
    if not (sp.issparse(X) and X.format == "csr"):
        what = type(X).__name__ + (f" ({X.format})" if sp.issparse(X) else "")
        raise TypeError(
            f"The chunks of X must be scipy.sparse CSR matrices; chunk {index} is a "
            f"{what}. Convert them with X.map_blocks(scipy.sparse.csr_matrix)."
        )
    check_sparse_structure(X)
    X = check_array(X, accept_sparse="csr", dtype=DTYPES, accept_large_sparse=True,
                    input_name="X")
    y = _check_y(np.asarray(y), y_numeric=y_numeric)
    if y.shape[0] != X.shape[0]:
        raise ValueError(
            f"Chunk {index} of X has {X.shape[0]} rows but its chunk of y has "
            f"{y.shape[0]}: y (and sample_weight) must be chunked like X's rows."
        )
    sw = _check_sample_weight(sw, X, dtype=np.float64, ensure_non_negative=True)
    return X, y, np.array(sw, dtype=np.float64)


def make_shard(device, *chunks):
    """A worker's chunks (``(X, y, sw)`` each, checked) as one partition.

    ``device``: the estimators' ``device`` parameter, resolved here, on the
    worker (``"auto"`` takes the worker's GPU when it has one)."""
    Xs, ys, sws = zip(*chunks)
    X = canonical_csr(Xs[0] if len(Xs) == 1 else sp.vstack(Xs, format="csr"))
    return Shard(X=X, y=np.concatenate(ys), sw=np.concatenate(sws),
                 device=_device.resolve_device(device, X))


def summary(shard, labels):
    """What the client needs to know about a partition: rows, device, the
    total weight, and with ``labels`` (classifiers) the labels present."""
    classes = np.unique(shard.y) if labels else None
    return {
        "n_rows": int(shard.X.shape[0]),
        "nnz": rows_nnz(shard.X, None, None),  # its nonzeros: stored zeros not counted
        "device": shard.device,
        "total_weight": float(shard.sw.sum()),
        "classes": classes,
    }


def with_targets(shard, classes, class_weight_of_class, regressor, row_nonzeros=False):
    """A new shard whose ``t`` are class indices into ``classes`` (or the
    float targets of a regressor) and whose weights are times the class
    weights; returns ``(shard, statistics)``: per-class total weight, and for
    a regressor the weighted sums of ``t`` and ``t**2`` (and with
    ``row_nonzeros`` of the rows' nonzeros, which the regressor's small-data
    ``"auto"`` step reads)."""
    if regressor:
        t = np.asarray(shard.y, dtype=np.float64)
        sw = shard.sw
        stats = {"sum_t": float(np.dot(sw, t)), "sum_t2": float(np.dot(sw, t * t))}
        if row_nonzeros:  # the shard's X is a host (scipy) matrix
            stats["row_nonzeros"] = mean_row_nonzeros(shard.X, None, sw, None) * float(
                sw.sum())
    else:
        t = np.searchsorted(classes, shard.y).astype(np.float64)
        sw = shard.sw
        if class_weight_of_class is not None:
            sw = sw * class_weight_of_class[t.astype(np.intp)]
        stats = {"class_weight": np.bincount(t.astype(np.intp), weights=sw,
                                             minlength=classes.size)}
    if sw.size:
        check_weight_range(sw)
    stats["total_weight"] = float(sw.sum())
    stats["max_weight"] = float(sw.max()) if sw.size else 0.0
    return Shard(X=shard.X, y=shard.y, sw=sw, device=shard.device, t=t), stats


def with_standardised_targets(shard, offset, scale):
    """A new shard whose regression targets are ``(t - offset) / scale``
    (the single-process regressor's standardisation, ``_fm._target_scaling``)."""
    t = (np.asarray(shard.t, dtype=np.float64) - offset) / scale
    return Shard(X=shard.X, y=shard.y, sw=shard.sw, device=shard.device, t=t)


def sample_rows(shard, n, seed):
    """``n`` of the partition's rows drawn without replacement (all of them
    when ``n`` is at least its size), in order: ``(X, sw)``."""
    m = shard.X.shape[0]
    if n >= m:
        return shard.X, shard.sw
    rows = np.sort(np.random.default_rng(seed).choice(m, size=n, replace=False))
    return shard.X[rows], shard.sw[rows]


# --------------------------------------------------------------------------
# L-BFGS: the data term of the objective on this partition
# --------------------------------------------------------------------------
def with_objective(shard, *, loss, n_outputs, total_weight, fit_intercept):
    """A new shard holding its partition on its device and the data term's
    ``fun_grad`` there: the backend's fused objective when it has one, else
    the generic sparse products (the single-process fit's choice).  The
    weights are divided by the *global* total, so the partitions' terms sum
    to the whole objective's; the penalty is added once, by the client."""
    be = shard.backend
    X = be.put_csr(canonical_csr(shard.X, COMPUTE_DTYPE))
    y = be.xp.asarray(be.to_device(shard.t), dtype=be.xp.float64)
    ws = be.xp.asarray(be.to_device(shard.sw / total_weight), dtype=be.xp.float64)
    kw = dict(loss=loss, n_outputs=n_outputs, lam=0.0, fit_intercept=fit_intercept)
    fun_grad = be.fused_objective(X, y, ws, **kw)
    if fun_grad is None:
        fun_grad = _linear_objective(be, X, y, ws, **kw)
    out = Shard(X=shard.X, y=shard.y, sw=shard.sw, device=shard.device, t=shard.t)
    out.cache["fun_grad"] = fun_grad
    return out


def lbfgs_evaluate(shard, x, comm, rank):
    """``[f, g...]`` of this partition's data term at ``x``, reduced by
    ``comm`` (what the task returns to the client)."""
    be = shard.backend
    xp = be.xp
    f, g = shard.cache["fun_grad"](xp.asarray(be.to_device(x)))
    buf = xp.concatenate([xp.asarray(f, dtype=xp.float64).reshape(1), g])
    return comm.reduce_local(rank, buf)


# --------------------------------------------------------------------------
# mini-batch solvers: one epoch of this partition from the global model
# --------------------------------------------------------------------------
def with_layout(shard, params, heads, *, batch_size, n_outputs, n_factors, shuffle,
                seed, concurrency):
    """A new shard holding its tile layout, built once and put where
    ``run_epoch`` walks it (on its GPU when it fits), each head's targets
    and the weights in the layout's row order, and the epochs' workers for
    ``concurrency`` (the estimators' parameter): what
    :func:`sklearn_cuwide._solvers.fit_minibatch` prepares once per fit."""
    be = shard.backend
    # the tiles are cut for the epochs' workers (in order or not)
    n_batches = -(-int(shard.X.shape[0]) // int(batch_size))
    workers = be.concurrent_blocks(concurrency, params, n_batches)
    sample_block, n_hot_max = be.tile_shape(params, n_outputs, n_factors, batch_size, workers)
    layout = be.build_layout(
        shard.X, batch_size=batch_size, sample_block=sample_block,
        n_hot_max=n_hot_max, shuffle=shuffle, random_state=seed, dtype=COMPUTE_DTYPE,
    )
    ro = layout.row_order
    sw_l = np.ascontiguousarray(np.asarray(shard.sw, dtype=np.float64)[ro])
    out = Shard(X=shard.X, y=shard.y, sw=shard.sw, device=shard.device, t=shard.t)
    out.cache.update(
        layout=layout,
        device_layout=be.put_layout(layout),
        y=[be.to_device(np.ascontiguousarray(_head_target(shard, h)[ro])
                        .astype(COMPUTE_DTYPE)) for h in heads],
        sw=be.to_device(sw_l.astype(COMPUTE_DTYPE)),
        batch_weight=batch_weights(layout, sw_l),
        workers=workers,
    )
    return out


def n_batches(shard):
    return int(shard.cache["layout"].n_batches)


def pack_states(states):
    """The heads' states as one float64 buffer (w, b, V, then Adagrad's
    accumulators where present), and the layout to unpack it."""
    parts, spec = [], []
    for st in states:
        for name in ("w", "b", "V", "gw", "gb", "gV"):
            a = getattr(st, name)
            if a is not None:
                parts.append(np.asarray(a, dtype=np.float64).ravel())
                spec.append((name, a.shape))
    return np.concatenate(parts) if parts else np.zeros(0), spec


def unpack_states(buf, spec, n_heads, dtype=COMPUTE_DTYPE):
    """The inverse of :func:`pack_states` (arrays of ``dtype``)."""
    states, pos = [], 0
    per_head = len(spec) // n_heads
    for h in range(n_heads):
        arrays = {}
        for name, shape in spec[h * per_head:(h + 1) * per_head]:
            size = int(np.prod(shape))
            arrays[name] = buf[pos:pos + size].reshape(shape).astype(dtype)
            pos += size
        states.append(ModelState(**arrays))
    return states


def train_round(shard, states, params, heads, rng_states, comm, rank, *, shuffle,
                ramp, round_, n_rounds):
    """Round ``round_`` of ``n_rounds`` of an epoch of this partition, for
    each of ``heads`` (indices into the shard's targets), each from its state
    in ``states`` (the global model, numpy, user feature order): the
    mini-batches ``[round_ * n / n_rounds, (round_ + 1) * n / n_rounds)`` of
    the epoch's order, drawn from the head's generator as
    :func:`~sklearn_cuwide._solvers.fit_minibatch` draws it (one round: the
    whole epoch, that function's epoch exactly).

    Returns ``(reduced, rng_states)``: ``comm``'s reduction of the buffer
    ``[n_rows * packed states..., n_rows, sum of s_i * loss_i per head...]``
    (the client divides by the summed rows: the row-weighted average), and
    the generators' states after the epoch's draw.
    """
    be = shard.backend
    layout, cache = shard.cache["layout"], shard.cache
    n = float(layout.n_rows)
    nb = int(layout.n_batches)
    lo, hi = round_ * nb // n_rounds, (round_ + 1) * nb // n_rounds
    outs, losses, new_rng = [], [], []
    for h, st, rs in zip(heads, states, rng_states):
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = rs
        order = rng.permutation(nb) if shuffle else np.arange(nb)
        # put_in_layout_order copies the feature rows but shares the
        # intercepts, which run_epoch updates in place: the global model's
        # intercepts, which the other partitions start from, are copied
        st = replace(st, b=np.array(st.b), gb=None if st.gb is None else np.array(st.gb))
        dstate = st.put_in_layout_order(layout.feature_order, be)
        lsum = be.run_epoch(cache["device_layout"], cache["y"][h], cache["sw"],
                            cache["batch_weight"], dstate, params, order[lo:hi],
                            workers=cache["workers"], ramp=ramp)
        # back to the user's order where the state is (the layout's ranking
        # is where it was planned), then one copy
        outs.append(be.get_state(dstate.take_features(
            be.to_device(layout.feature_rank), be.xp)))
        losses.append(float(lsum))
        new_rng.append(rng.bit_generator.state)
    buf, _ = pack_states(outs)
    buf = np.concatenate([n * buf, [n], losses])
    return comm.reduce_local(rank, buf), new_rng


def _head_target(shard, head):
    """The targets of head ``head``: 0/1 of class ``head`` one-vs-rest (an
    FM classifier of several classes), else the shard's targets (class
    indices, 0/1 or real values)."""
    if head is None:
        return shard.t
    return (shard.t == head).astype(np.float64)
