"""CPU backend: the cuWide mini-batch step in vectorised numpy/scipy.

This is the correctness reference for the CUDA kernels: it walks the same
:class:`~sklearn_cuwide._layout.TileLayout` tiles in the same order and
applies the same update rules, one sample block at a time:

1. aggregate (feature -> sample): per-sample margins from the block's
   feature-major nonzeros;
2. loss (per sample): the loss and its derivative, scaled by
   ``sample_weight / W_batch``;
3. apply (sample -> feature): the gradient of every feature present in the
   block, summed along its (contiguous) segment, then the sgd/adagrad update,
   the L2 term and the L1 proximal step, fused.

A mini-batch of several sample blocks applies the blocks one after another,
each with its share of the mini-batch gradient (normalised by the
mini-batch's total weight); this is also what the CUDA kernels do.
"""

from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

from .. import _host, _memory
from .._layout import penalty_scale
from .._loss import pointwise_loss, weighted_loss as _weighted_loss
from .._state import draw_factors as _draw_factors
from .._sparse import canonical_csr, held_columns, with_columns
from .._validation import check_sparse_structure

name = "cpu"
xp = np
#: the fit's arrays are host arrays already: its "upload" puts the model in
#: the layout's feature order, its "model back" returns it to the user's
stage_names = {"upload": "model in layout order", "model back": "model in feature order",
               "coefficients back": None}

#: Shared memory per multiprocessor the CPU backend assumes when it sizes
#: tiles, so that the CPU reference walks the same tiles as the kernels on an
#: H200 (228 KiB per SM).
NOMINAL_SHARED_PER_SM = 233472


def all_finite(a):
    """Whether every value of ``a`` is finite (on every core)."""
    return _host.all_finite(a)


def holds_zero(a):
    """Whether ``a`` holds a value equal to 0 (on every core)."""
    return _host.holds_zero(a)


def tile_shape(params, n_outputs, n_factors, batch_size, workers=None):
    """Sample-block rows and most hot features for a model (see _tiles):
    the CPU trains in order, whatever ``workers``, so its layout is the
    CUDA backend's in-order one."""
    from ._tiles import tile_shape as _ts

    return _ts(NOMINAL_SHARED_PER_SM, params, n_outputs, n_factors, batch_size,
               in_order=True)


def concurrent_blocks(concurrency, params, n_batches):
    """Workers of an epoch: the CPU trains the mini-batches in order."""
    return 1


# --------------------------------------------------------------------------
# placement (the host is the CPU's device: no-ops)
# --------------------------------------------------------------------------
def device_memory():
    """No device: the host's memory, which the planner checks for every
    fit, is the CPU backend's (:mod:`sklearn_cuwide._memory`)."""
    return None


@contextmanager
def device_scope(device="cpu"):
    """The scope of one fit or prediction on the host: a ``MemoryError``
    (numpy's, when other processes took the memory the plan counted on)
    becomes :class:`~sklearn_cuwide._memory.InsufficientMemoryError`, after
    the arrays of the work's finished frames are dropped."""
    try:
        yield
    except MemoryError as exc:
        if isinstance(exc, _memory.InsufficientMemoryError):
            raise
        _memory.release_frames(exc)
        raise _memory.out_of_memory_error(exc, "host") from exc


def holds(X):
    """Nothing lives on a device of the CPU backend: input is validated on
    the host as scikit-learn does."""
    return False


def validate_input(X, estimator_name=None):
    """``X`` checked as scikit-learn's ``check_array`` does, as a canonical
    CSR matrix of float32 or float64.

    A sparse ``X``'s structure is checked first
    (:func:`sklearn_cuwide._validation.check_sparse_structure`: ``indptr``
    and every index in range), before scipy reads it."""
    from sklearn.utils import check_array

    check_sparse_structure(X)
    X = check_array(X, accept_sparse=["csr", "csc", "coo"],
                    dtype=[np.float32, np.float64], accept_large_sparse=True,
                    estimator=estimator_name, input_name="X")
    return canonical_csr(sp.csr_matrix(X) if not sp.issparse(X) else X)


def to_device(a):
    return a


def to_host(a, out=None):
    if out is not None:  # as strict as CuPy's get(out=): same shape and dtype
        if out.shape != a.shape or out.dtype != a.dtype:
            raise ValueError(f"out is {out.shape} {out.dtype}, the array {a.shape} {a.dtype}")
        np.copyto(out, a, casting="no")
        return out
    return a


def prepare_fit(X, params, n_outputs, n_factors, n_batches, workers, ramp, dtype, *,
                validation=False, fresh=True):
    """Nothing to start on the CPU (nothing compiles)."""


def stage_layout_input(X, n_rows, read_first=False):
    """Nothing to stage: the CPU builds the layout from ``X`` where it is."""
    return None


def build_layout(X, staged=None, **kw):
    """Build the training layout (numpy, on the host)."""
    from .._layout import build_layout as _build

    return _build(X, xp=np, **kw)


def put_layout(layout):
    return layout


def put_state(state):
    return state


def get_state(state, lazy=()):
    return state


def put_csr(X, dtype=None):
    """The matrix as the backend computes with it: canonical CSR."""
    return canonical_csr(X, dtype)


def take_rows(X, rows):
    """Rows ``rows`` (sorted integer indices) of a canonical CSR, canonical."""
    return X[np.asarray(rows)]


def csr_in_layout_order(X, feature_order, feature_rank):
    """``X[:, feature_order]``, canonical."""
    return canonical_csr(X[:, np.asarray(feature_order)])


def synchronize():
    pass


def release_cached():
    pass


def host_rows(a):
    """A model's rows held in host memory: ``a`` itself (the CPU's model
    is there already)."""
    return a


def empty_host_rows(shape, dtype):
    """An uninitialised array for a model's rows in host memory."""
    return np.empty(shape, dtype=dtype)


def gather_rows(host, ids, out):
    """``out[i] = host[ids[i]]``."""
    out[...] = host[ids]
    return out


def scatter_rows(dev, ids, host):
    """``host[ids[i]] = dev[i]`` (``ids`` distinct)."""
    host[ids] = dev
    return host


# --------------------------------------------------------------------------
# the mini-batch step
# --------------------------------------------------------------------------
def _update(P, G, F, g, params, l1, l2):
    """Fused sgd/adagrad update (+ L1 prox) of rows F of P (F unique).

    ``g`` includes the L2 term; ``l2`` (a scalar or a column, one value per
    row of ``F``) damps the step to its proximal form ``t / (1 + t * l2)``;
    ``l1`` (likewise) is the soft threshold's coefficient.
    """
    lr = params.learning_rate
    if params.solver == "sgd":
        step = lr
    else:
        acc = G[F] + g * g
        G[F] = acc
        step = lr / (np.sqrt(acc) + params.eps)
    step = step / (1.0 + step * l2)
    new = P[F] - step * g
    if np.any(l1 > 0):
        new = np.sign(new) * np.maximum(np.abs(new) - step * l1, 0.0)
    P[F] = new


def _penalty_scale(layout, params):
    """Per-feature penalty factor (layout order) when ``params`` scales the
    penalties, else None; computed once per layout (a window's are given:
    ``layout.penalty_factors``)."""
    if not params.penalty_scaled:
        return None
    cached = layout.__dict__.get("_penalty_scale")
    if cached is None:
        given = layout.penalty_factors
        cached = (penalty_scale(layout) if given is None else given).astype(np.float64)
        layout.__dict__["_penalty_scale"] = cached
    return cached


def sblock_step(layout, g, y, sw, w_batch, state, params):
    """One sample block: aggregate, loss, apply. Returns sum of s_i*loss_i."""
    pscale = _penalty_scale(layout, params)
    r0, r1 = int(layout.sblock_row_ptr[g]), int(layout.sblock_row_ptr[g + 1])
    m = r1 - r0
    sl = layout.sblock_slice(g)
    f = layout.feat[sl].astype(np.intp)
    r = layout.row[sl].astype(np.intp)
    x = layout.val[sl].astype(np.float64)
    yb = y[r0:r1]
    sb = sw[r0:r1].astype(np.float64)
    dt = state.w.dtype
    D = state.w.shape[1]

    # the block's nonzeros run feature by feature: each feature's run starts
    # at a head.  The sums over them are sparse products (scipy's loops in C)
    # with one row of weights or factors per feature, not per nonzero
    heads = np.flatnonzero(np.concatenate(([True], f[1:] != f[:-1]))) if f.size else f
    F = f[heads]
    run_ptr = np.append(heads, f.size)
    # a linear model of one output sums a number per nonzero: bincount does
    sparse = params.model == "fm" or D > 1
    if sparse:
        At = sp.csr_matrix((x, r, run_ptr), shape=(F.size, m))  # features x rows: the values
        A = At.T.tocsr()  # rows x features: each row's entries in the block's order

    # ---- aggregate: feature -> sample ----
    margin = np.zeros((m, D))
    if params.fit_linear:
        if sparse:
            margin += A @ state.w[F].astype(np.float64)
        else:
            margin[:, 0] = np.bincount(r, weights=state.w[f, 0] * x, minlength=m)
    if params.model == "fm":
        VF = state.V[F].astype(np.float64)  # (features, k)
        s = A @ VF  # per row: the sum of x_i v_i
        A.data *= A.data  # x_i^2, for the sum of (x_i v_i)^2
        q = A @ np.einsum("ij,ij->i", VF, VF)
        margin[:, 0] += 0.5 * ((s * s).sum(1) - q)
    if params.fit_intercept:
        margin += state.b

    # ---- loss: per sample ----
    lo, d = pointwise_loss(np, margin, yb, params.loss)
    e = d * (sb / w_batch)[:, None]  # (m, D)
    loss_sum = float(np.dot(sb, lo))

    # ---- apply: sample -> feature ----
    if f.size:
        ps = 1.0 if pscale is None else pscale[F][:, None]  # a column: per feature
        if params.fit_linear:
            l2 = params.l2_w * ps
            # per feature: the sum of x e(row)
            gw = At @ e if sparse else np.add.reduceat(e[r] * x[:, None], heads, axis=0)
            gw += l2 * state.w[F]
            _update(state.w, state.gw, F, _cast(gw, dt), params, params.l1 * ps, l2)
        if params.model == "fm":
            l2 = params.l2_v * ps
            ex = e[r, 0] * x
            # per feature: the sum of e x s(row), less its factors times the sum of e x^2
            B = sp.csr_matrix((ex, r, run_ptr), shape=(F.size, m))
            gV = B @ s - VF * np.add.reduceat(ex * x, heads)[:, None]
            gV += l2 * state.V[F]
            _update(state.V, state.gV, F, _cast(gV, dt), params, 0.0, l2)
    if params.fit_intercept:
        gb = _cast(e.sum(0), dt)
        _update(state.b, state.gb, slice(None), gb, params, 0.0, 0.0)
    return loss_sum


def _cast(g, dt):
    """``g`` in the model's dtype.  A gradient beyond float32's range becomes
    inf there without numpy's overflow warning: the fit's finiteness check
    reports it (the error "The fit diverged"), saying what to do."""
    with np.errstate(over="ignore", invalid="ignore"):
        return g.astype(dt)


def run_epoch(layout, y, sw, batch_weight, state, params, batch_order, *,
              workers=None, ramp=0, ramp_done=0):
    """One pass over the mini-batches in ``batch_order``, strictly in order.

    ``workers`` must be None or 1 (the CPU has no concurrent workers);
    ``ramp`` and ``ramp_done``, a warm-up of the concurrency, have nothing
    to warm up here.
    Returns the sum over samples of ``sample_weight * loss`` (each computed
    with the weights before its own block's update).
    """
    if workers not in (None, 1):
        raise ValueError(
            f"the CPU backend trains the mini-batches in order: workers must be "
            f"None or 1, got {workers!r}"
        )
    total = 0.0
    bsp = layout.batch_sblock_ptr
    # a diverging model's inf and nan go without numpy's warnings: the fit's
    # finiteness check reports them ("The fit diverged"), saying what to do
    with np.errstate(over="ignore", invalid="ignore"):
        for bt in batch_order:
            wb = float(batch_weight[bt])
            if wb <= 0:
                continue
            for g in range(int(bsp[bt]), int(bsp[bt + 1])):
                total += sblock_step(layout, g, y, sw, wb, state, params)
    return total


# --------------------------------------------------------------------------
# prediction and full-batch gradients (scipy sparse)
# --------------------------------------------------------------------------
def decision_function(X, w, b, V=None, fit_linear=True):
    """Decision values (n_samples, n_outputs), float64, of X (user order).

    A sparse ``X`` whose rows use few of the model's features is computed on
    those features' rows of ``w`` and ``V`` alone: a few rows scored against a
    wide model cost what they hold, not the model's size (the float64 copies
    of ``w`` and ``V`` would be most of it)."""
    X = canonical_csr(X) if sp.issparse(X) else np.asarray(X)
    if sp.issparse(X) and 4 * X.nnz < X.shape[1]:
        cols = held_columns(X)
        X = with_columns(X, cols)
        w = w[cols]
        V = None if V is None else V[cols]
    if V is not None and X.dtype != np.float64:  # the squares in float64 too
        X = X.astype(np.float64)
    out = np.zeros((X.shape[0], w.shape[1]))
    if fit_linear:
        out += np.asarray(X @ w.astype(np.float64))
    if V is not None:
        V64 = V.astype(np.float64)
        XV = np.asarray(X @ V64)
        if sp.issparse(X):
            X2 = X.multiply(X)
        else:
            X2 = X * X
        out[:, 0] += 0.5 * ((XV * XV).sum(1) - np.asarray(X2 @ (V64 * V64)).sum(1))
    out += np.asarray(b, dtype=np.float64)
    return out


def matmul(X, W):
    """X @ W for a sparse X and a dense 2-D W (float64)."""
    return np.asarray(X @ W)


def rmatmul(X, E):
    """X.T @ E for a sparse X and a dense 2-D E (float64)."""
    return np.asarray(X.T @ E)


def fused_objective(X, y, ws, *, loss, n_outputs, lam, fit_intercept):
    """No fused L-BFGS objective on the CPU: the solver's generic one (scipy
    sparse products) is already one pass per product."""
    return None


def lbfgs_memory_ops():
    """L-BFGS's products with its stored pairs: numpy's (BLAS) are the best."""
    return None


def weighted_loss(Z, y, w, loss):
    """``sum(w * loss(Z, y)) / sum(w)``: :func:`sklearn_cuwide._loss.weighted_loss`
    in numpy."""
    return _weighted_loss(np, Z, y, w, loss)


def mcmc_block_draw(n_parameters):
    """Gibbs sampling's joint draw of a block: None, numpy's array
    operations (:func:`sklearn_cuwide._mcmc._draw_block`) draw on the host."""
    return None


def draw_factors(seed, scale, features, n_factors, dtype=np.float32):
    """:func:`sklearn_cuwide._state.draw_factors` with numpy (on the
    host's threads)."""
    return _draw_factors(np, seed, scale, features, n_factors, dtype=dtype)
