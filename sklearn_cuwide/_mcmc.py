"""Bayesian factorization machine regression by Gibbs sampling (MCMC).

The solver of :class:`~sklearn_cuwide.GPUFactorizationMachineRegressor`
with ``solver="mcmc"``: libFM's MCMC (Freudenthaler, Schmidt-Thieme and
Rendle, "Bayesian factorization machines", 2011; Rendle, "Factorization
machines with libFM", 2012).  Every weight and factor is drawn from its
Gaussian conditional given the others and the residuals; the noise
precision and, per factor column and for the weights, a Normal-Gamma prior's
mean and precision are drawn too, so there is no step size and no penalty
to choose.  The estimator hands plain arrays to :func:`fit_mcmc`; the
arrays live on the fit's backend and the same code runs on both (``xp``:
numpy or cupy).

Rule: the features that share no row are drawn together, as one *block*
(:func:`feature_blocks`).  Why: given the other features, their
conditionals are independent, so a sweep over the blocks is exact Gibbs
sampling, and each block's draws are a few array passes over its nonzeros
where libFM loops over the features one at a time.  The one-hot fields of
rating and click data make one block a field.

Rule: on the GPU a feature's weight and factors are drawn jointly, from
their ``(1 + n_factors)``-variate Gaussian conditional (:func:`_draw_block`);
on the host one parameter at a time, as libFM draws them
(:func:`_draw_block_single`).  Why: on the GPU a block then costs a fixed
count of array operations whatever the factors (launches were the sweep's
cost) and its sums are in one order on every run; on the host the joint
draws' products of parameter pairs cost three times the passes of a
parameter at a time.  Both sample the same posterior, as well
(docs/design/defaults.rst).  Where the backend has a kernel for it
(``block_draw``: ``cuda/cuwide_mcmc.cu``, features of up to 33
parameters), a block's joint draws are one launch, a warp per feature.

Rule: the fitted model is the mean of the parameters' draws over all the
sweeps (libFM averages all its sweeps' predictions).  Why: a model like
the other solvers' (``coef_``, ``factors_``) predicts with no draws kept;
on MovieLens-100k it scored within 0.002 of the mean of the draws'
predictions (docs/design/defaults.rst).

Rule: the regressor's ``solver="auto"`` samples (:func:`suits_mcmc`) where
the rows at least equal the parameters of the features they hold and the
data are small.  Why: there MCMC beat the default Adagrad fit on
ratings and planted FMs by 0.01 to 0.04 RMSE (and lost at most about 0.005
on planted linear models); with a fifth of a row per parameter or fewer it
fitted the noise (docs/design/defaults.rst).
"""

from dataclasses import dataclass

import numpy as np

from ._solvers import _SCALE_HINT, _TARGET_NOTE

__all__ = ["MCMCPriors", "MCMCResult", "diverged", "feature_blocks", "fit_mcmc", "suits_mcmc",
           "AUTO_MCMC_MAX_NONZEROS"]

# solver="auto" samples data of at most this many stored entries: 100
# sweeps of them take seconds, where the mini-batch fit's epochs on more
# rows converge as well
AUTO_MCMC_MAX_NONZEROS = 1 << 21


def suits_mcmc(n_rows, feature_counts, nnz, n_factors):
    """Whether ``solver="auto"`` samples: at most
    :data:`AUTO_MCMC_MAX_NONZEROS` stored entries and at least one row
    (``n_rows``, those of ``X``) per parameter of the features present
    (``feature_counts``: each feature's stored entries; ``n_factors + 1``
    parameters each)."""
    if nnz > AUTO_MCMC_MAX_NONZEROS:
        return False
    present = int(np.count_nonzero(feature_counts))
    return present > 0 and n_rows >= (int(n_factors) + 1) * present


@dataclass(frozen=True)
class MCMCPriors:
    """The hyperpriors, libFM's: the noise precision ``alpha ~ Gamma(a0,
    b0)`` (shape, rate); each group of parameters (the weights; each factor
    column) ``N(mu, 1 / lambda)`` with ``lambda ~ Gamma(a_lambda,
    b_lambda)`` and ``mu ~ N(mu0, 1 / (gamma0 lambda))``; the intercept a
    flat prior.  Vague: the fit learns the precisions from the data."""

    a0: float = 1.0
    b0: float = 1.0
    a_lambda: float = 1.0
    b_lambda: float = 1.0
    mu0: float = 0.0
    gamma0: float = 1.0


@dataclass
class MCMCResult:
    """:func:`fit_mcmc`'s model (host float64, the target's units as given):
    the means of the draws, the training loss of each sweep's draw (half
    the weighted mean squared residual), the blocks' count (features with
    no nonzero, drawn from their priors, not counted)."""

    intercept: float
    coef: np.ndarray
    factors: np.ndarray
    loss_curve: list
    n_blocks: int


def _row_of(xp, indptr):
    """The row of each nonzero of a CSR with pointers ``indptr``."""
    nnz = int(indptr[-1])
    return xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1


def feature_blocks(xp, indptr, indices, n_features, row_of=None):
    """The block of each feature (an int64 array of ``n_features``, -1 for
    a feature with no nonzero) and the blocks' count: no two features of a
    block share a row (``indptr``, ``indices``: a canonical CSR's, on the
    backend of ``xp``).

    Greedy: a block takes, while any is left, the features that come first
    (smallest index) in every row they hold among the features still
    eligible, then makes every feature of their rows ineligible; the next
    block starts over with the features left.  The smallest eligible
    feature is first in all its rows, so every pass takes one at least;
    one-hot fields whose columns are ranges, in order, are taken a field a
    block.  Each pass reads the nonzeros left once.  ``row_of``: each
    nonzero's row, when the caller has it."""
    n_rows = indptr.shape[0] - 1
    nnz = indices.shape[0]
    indices = indices.astype(xp.int64, copy=False)
    if row_of is None:
        row_of = _row_of(xp, indptr)
    block_of = xp.full(n_features, -1, dtype=xp.int64)
    left = xp.ones(nnz, dtype=bool)  # nonzeros of the features in no block yet
    n_blocks = 0
    while True:
        idx = xp.flatnonzero(left)
        if idx.size == 0:
            break
        rows, feats = row_of[idx], indices[idx]
        taken = xp.zeros(n_features, dtype=bool)
        live = xp.ones(idx.size, dtype=bool)
        while True:
            at = xp.flatnonzero(live)
            if at.size == 0:
                break
            r, f = rows[at], feats[at]
            first = xp.ones(at.size, dtype=bool)  # the first live nonzero of its row
            first[1:] = r[1:] != r[:-1]
            later = xp.zeros(n_features, dtype=bool)
            later[f[~first]] = True
            chosen = xp.zeros(n_features, dtype=bool)
            chosen[f[first]] = True
            chosen &= ~later
            taken |= chosen
            busy = xp.zeros(n_rows, dtype=bool)  # the rows of the chosen features
            busy[r[chosen[f]]] = True
            out = xp.zeros(n_features, dtype=bool)  # every feature of those rows
            out[f[busy[r]]] = True
            live[at] = ~out[f]
        block_of[taken] = n_blocks
        n_blocks += 1
        left[idx] = ~taken[feats]
    return block_of, n_blocks


#: the most float64 values of a chunk's products of its parameters (the
#: largest of a draw's temporaries; twice that with their running sums),
#: whatever the rows, features and factors: on the host a size that stays in
#: the CPU's caches, on the GPU 128 MiB, for few launches
CHUNK_VALUES = {"host": 1 << 17, "device": 1 << 24}
#: the share of its diagonal added to a conditional's precision (see _draw_block)
JITTER = 1e-12


def _blocks(xp, row_of, indices, data, sample_weight, block_of, n_blocks, by_feature):
    """Per block ``(features, rows, local, values, weights)``: its features
    (sorted); for each of its nonzeros the row, the feature's place among
    the block's features, the value (float64) and the row's weight.  The
    nonzeros come in row order, or ordered by feature, then row, where
    ``by_feature`` (the joint draws' running sums read each feature's
    nonzeros together).  ``indices``: int64."""
    n_rows = int(row_of[-1]) + 1 if row_of.shape[0] else 0
    nz_block = block_of[indices]
    out = []
    for b in range(n_blocks):
        feats = xp.flatnonzero(block_of == b)
        nz = xp.flatnonzero(nz_block == b)
        local = xp.searchsorted(feats, indices[nz])
        if by_feature:
            order = xp.argsort(local * n_rows + row_of[nz])  # unique keys: one order
            nz, local = nz[order], local[order]
        rows, x = row_of[nz], data[nz].astype(xp.float64)
        out.append((feats, rows, local, x, sample_weight[rows]))
    return out


def _chunks(ends, per_nonzero, per_feature, most):
    """``(first feature, last + 1, first nonzero, last + 1)`` of contiguous
    features of a block whose nonzeros (``ends``: each feature's cumulative
    count, host) times ``per_nonzero`` and count times ``per_feature`` stay
    within ``most`` values (at least one feature each)."""
    out, f0, n_feats = [], 0, len(ends)
    while f0 < n_feats:
        a = int(ends[f0 - 1]) if f0 else 0
        by_nz = np.searchsorted(ends, a + max(most // max(per_nonzero, 1), 1), side="right")
        f1 = min(max(int(by_nz), f0 + 1), n_feats, f0 + max(most // max(per_feature, 1), 1))
        out.append((f0, f1, a, int(ends[f1 - 1])))
        f0 = f1
    return out


def _feature_sums(xp, A, ends):
    """Each feature's sums of the columns of ``A`` (a row per quantity, a
    column per nonzero in feature order; ``ends``: the features' cumulative
    counts from 1, on the backend, every feature holding a nonzero), one
    column per feature.  Rule: differences of a running sum.  Why: one
    order of additions on every run, where the GPU's atomic sums
    (``bincount``) change with the threads' timing."""
    c = xp.cumsum(A, axis=1)
    out = c[:, ends - 1]
    out[:, 1:] -= c[:, ends[:-1] - 1]
    return out


def _draw_block(xp, block, z, w, V, q, e, *, alpha, mu, lam, lin):
    """Draw every feature of one block from its conditional given the other
    blocks' parameters, and update the residuals ``e`` and factor sums
    ``q`` of its rows.  A feature's parameters ``theta = (w_j, V_j)`` (``w_j``
    where ``lin``) enter its rows' predictions linearly, ``h_i . theta``
    with ``h_i = (x_ij, x_ij (q_i - V_j x_ij))``, so their conditional is
    ``N(P^-1 b, P^-1)`` with ``P = alpha sum_i s_i h_i h_i' + diag(lam)``
    and ``b = alpha sum_i s_i h_i r_i + lam * mu`` (``r_i``: the residual
    without the feature).  ``z``: the block's standard normal draws
    (features x parameters).  The block comes in chunks of features
    (:func:`_chunks`), each with its pairs of parameters in groups
    (:func:`_pair_groups`), to bound the temporaries (:data:`CHUNK_VALUES`)."""
    feats, rows, local, x, sr, chunks, _ = block
    p = lin + V.shape[1]
    diag = xp.arange(p)
    for f0, f1, a, b, ends, pairs in chunks:
        fc, rc, lc, xc = feats[f0:f1], rows[a:b], local[a:b] - f0, x[a:b]
        Vc = V[fc]
        theta = xp.concatenate([w[fc][:, None], Vc], axis=1) if lin else Vc
        # h and its weighted copy a row per parameter: the products below
        # read whole rows
        h = xp.empty((p, b - a), dtype=xp.float64)
        if lin:
            h[0] = xc
        h[lin:] = (xc[:, None] * (q[rc] - Vc[lc] * xc[:, None])).T
        r = e[rc] + (h * theta[lc].T).sum(axis=0)
        sh = h * sr[a:b]
        num = alpha * _feature_sums(xp, sh * r, ends).T + lam * mu
        prec = xp.empty((f1 - f0, p, p), dtype=xp.float64)
        for i, j in pairs:
            sums = _feature_sums(xp, sh[i] * h[j], ends).T
            prec[:, i, j] = sums
            prec[:, j, i] = sums
        prec *= alpha
        # Rule: the Cholesky factor of P plus 1e-12 of its diagonal.  Why:
        # rounding leaves P indefinite where a feature's values dwarf the
        # prior's precision (1e8 times the others'); on scaled data it is
        # far below the prior's precision
        prec[:, diag, diag] *= 1.0 + JITTER
        prec[:, diag, diag] += lam
        # N(P^-1 b, P^-1) as L^-T (L^-1 b + z), P = L L'
        chol = xp.linalg.cholesky(prec)
        t = xp.linalg.solve(chol, num[:, :, None])[:, :, 0] + z[f0:f1]
        new = xp.linalg.solve(chol.transpose(0, 2, 1), t[:, :, None])[:, :, 0]
        e[rc] = r - (h * new[lc].T).sum(axis=0)
        q[rc] += xc[:, None] * (new[:, lin:] - Vc)[lc]
        if lin:
            w[fc] = new[:, 0]
        V[fc] = new[:, lin:]


def _draw_block_single(xp, block, normal, w, V, q, e, *, alpha, mu_w, lam_w, mu_v, lam_v,
                       fit_linear):
    """Draw one block's features a parameter at a time, as libFM does: the
    weights, then each factor column, each from its Gaussian conditional
    given the others (``draws="single"``; ``normal``: the block's standard
    normal draws, one call per parameter column)."""
    feats, rows, local, x, sr, _, curvature = block
    m = int(feats.shape[0])
    er = e[rows]
    if fit_linear:
        old = w[feats]
        prec = alpha * curvature + lam_w
        num = (alpha * xp.bincount(local, sr * x * (er + old[local] * x), minlength=m)
               + mu_w * lam_w)
        new = num / prec + normal(m) / xp.sqrt(prec)
        er -= (new - old)[local] * x
        w[feats] = new
    for f in range(V.shape[1]):
        old = V[feats, f]
        qf = q[rows, f]
        h = x * (qf - old[local] * x)
        prec = alpha * xp.bincount(local, sr * h * h, minlength=m) + lam_v[f]
        num = (alpha * xp.bincount(local, sr * h * (er + old[local] * h), minlength=m)
               + mu_v[f] * lam_v[f])
        new = num / prec + normal(m) / xp.sqrt(prec)
        d = (new - old)[local]
        er -= d * h
        q[rows, f] = qf + d * x
        V[feats, f] = new
    e[rows] = er


def _pair_groups(xp, p, n_values, most):
    """The upper triangle's ``(rows, columns)`` of a ``p x p`` matrix in
    groups whose products of ``n_values`` nonzeros stay within ``most``
    values (a pair at least), on the backend."""
    ii, jj = np.triu_indices(p)
    step = max(1, most // max(n_values, 1))
    return [(xp.asarray(ii[c:c + step]), xp.asarray(jj[c:c + step]))
            for c in range(0, len(ii), step)]


def _normal_gamma(rng, p, total, squares, lam, priors):
    """One draw of a group's ``(mu, lambda)`` given its ``p`` parameters'
    sum ``total`` and sum of squares ``squares`` (host floats), the mean
    first, as libFM draws them."""
    g = priors.gamma0
    mu = rng.normal((total + g * priors.mu0) / (p + g), 1.0 / np.sqrt((p + g) * lam))
    spread = max(squares - 2.0 * mu * total + p * mu * mu, 0.0)  # sum of (theta - mu)^2
    rate = (priors.b_lambda + g * (mu - priors.mu0) ** 2 + spread) / 2
    lam = rng.gamma((priors.a_lambda + p + 1) / 2, 1.0 / rate)
    return mu, lam


def diverged(what):
    """The error of an MCMC fit whose draws left float64's range (values
    of X far too large): what happened, and what to do."""
    return ValueError(f"The fit diverged: {what} (solver='mcmc'). "
                      f"{_SCALE_HINT[0].upper()}{_SCALE_HINT[1:]}{_TARGET_NOTE}.")


# the draws' overflows raise diverged() once a sweep ends, not numpy's warnings
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def fit_mcmc(xp, indptr, indices, data, y, sample_weight, *, n_features, n_factors,
             n_sweeps, init_scale, fit_intercept=True, fit_linear=True, random_state=0,
             priors=MCMCPriors(), progress=None, to_host=np.asarray, draws=None,
             block_draw=None):
    """Gibbs sampling of an order-2 factorization machine with squared loss.

    Parameters
    ----------
    xp : module
        numpy or cupy: where ``indptr``, ``indices``, ``data``, ``y`` and
        ``sample_weight`` live (a canonical CSR's arrays; float64 targets
        and weights).
    n_features, n_factors : int
    n_sweeps : int
        Sweeps over every parameter; the model is the mean of all of them.
    init_scale : float
        Standard deviation of the initial factors' normal draw.
    fit_intercept, fit_linear : bool
        Draw the intercept (a flat prior) and the weights; else they stay 0.
    random_state : int
        Seeds the draws (the device's and the host's).
    priors : MCMCPriors
    progress : FitProgress or None
        Its ``step`` is called once per sweep.
    to_host : callable
        Moves a backend array to numpy.
    draws : {"joint", "single"} or None
        A feature's weight and factors drawn together (one Gaussian of
        ``1 + n_factors`` dimensions) or one parameter at a time; None: joint
        on the GPU, single on the host (see the module's rules).
    block_draw : callable or None
        The backend's joint draw of a block (its kernel:
        ``Backend.mcmc_block_draw``), in place of :func:`_draw_block`'s
        array operations; None: those.

    Returns
    -------
    MCMCResult
    """
    n = int(y.shape[0])
    seeds = np.random.SeedSequence(int(random_state)).generate_state(2)
    rng = np.random.default_rng(seeds[0])  # the hyperparameters' scalars
    device_rng = xp.random.RandomState(int(seeds[1]))

    def normal(size):
        return device_rng.standard_normal(size)

    indices = indices.astype(xp.int64, copy=False)
    row_of = _row_of(xp, indptr)
    block_of, n_blocks = feature_blocks(xp, indptr, indices, n_features, row_of)
    k = int(n_factors)
    lin = 1 if fit_linear else 0
    p = lin + k
    if draws is None:
        draws = "single" if xp is np else "joint"
    most = CHUNK_VALUES["host" if xp is np else "device"]
    blocks, groups = [], {}
    kernel = block_draw is not None and draws == "joint" and p > 0
    for feats, rows, local, x, sr in _blocks(xp, row_of, indices, data, sample_weight,
                                             block_of, n_blocks, draws == "joint"):
        chunks, curvature = [], None
        m = int(feats.shape[0])
        if kernel:  # the kernel's arrays: each feature's end, the rows as int64
            chunks = (xp.cumsum(xp.bincount(local, minlength=m)), rows.astype(xp.int64))
        elif draws == "joint":
            ends = to_host(xp.cumsum(xp.bincount(local, minlength=m)))
            for f0, f1, a, b in _chunks(ends, p * (p + 1) // 2, p * p, most):
                if b - a not in groups:
                    groups[b - a] = _pair_groups(xp, p, b - a, most)
                chunks.append((f0, f1, a, b, xp.asarray(ends[f0:f1] - a), groups[b - a]))
        else:  # the weights' conditional precision over the noise's, every sweep's
            curvature = xp.bincount(local, sr * x * x, minlength=m)
        blocks.append((feats, rows, local, x, sr, chunks, curvature))
    del row_of
    absent = xp.flatnonzero(block_of < 0)
    if progress is not None:
        progress.stage("feature blocks", f"{n_blocks} blocks of features that share no row")
    s = sample_weight
    # a row of weight c is c rows: the noise precision's shape counts the
    # weights, as the residuals' squares are weighted
    s_total = float(s.sum())

    w0 = float(xp.dot(s, y) / s_total) if fit_intercept else 0.0
    w = xp.zeros(n_features, dtype=xp.float64)
    V = xp.zeros((n_features, k), dtype=xp.float64)
    if k:
        V[...] = init_scale * normal((n_features, k)).reshape(n_features, k)
    # the residuals and each row's factor sums q[i, f] = sum_j V[j, f] x_ij
    q = xp.zeros((n, k), dtype=xp.float64)
    squares = xp.zeros(n, dtype=xp.float64)
    for feats, rows, local, x, _, _, _ in blocks:
        Vb = V[feats][local] * x[:, None]
        q[rows] += Vb  # a block holds each row once
        squares[rows] += (Vb * Vb).sum(axis=1)
    e = y - w0 - 0.5 * ((q * q).sum(axis=1) - squares)
    del squares

    alpha = 1.0
    mu_w, lam_w = 0.0, 1.0
    mu_v, lam_v = np.zeros(k), np.ones(k)
    sum_w0, sum_w, sum_V = 0.0, xp.zeros_like(w), xp.zeros_like(V)
    curve = []
    for sweep in range(1, int(n_sweeps) + 1):
        if fit_intercept:  # a flat prior: the weighted mean residual's draw
            prec = alpha * s_total
            new = w0 + float(xp.dot(s, e)) * alpha / prec + rng.normal() / np.sqrt(prec)
            e -= new - w0
            w0 = new
        if p and draws == "single":
            for block in blocks:
                _draw_block_single(xp, block, normal, w, V, q, e, alpha=alpha, mu_w=mu_w,
                                   lam_w=lam_w, mu_v=mu_v, lam_v=lam_v, fit_linear=fit_linear)
        elif p:
            mu = xp.asarray(np.concatenate([[mu_w] * lin, mu_v]))
            lam = xp.asarray(np.concatenate([[lam_w] * lin, lam_v]))
            for block in blocks:
                m = int(block[0].shape[0])
                z = normal(m * p).reshape(m, p)
                if kernel:
                    feats, _, _, x, sr, (ends, rows), _ = block
                    block_draw(feats, ends, rows, x, sr, z, w, V, q, e, alpha=alpha, mu=mu,
                               lam=lam, lin=lin, jitter=JITTER)
                    continue
                try:
                    _draw_block(xp, block, z, w, V, q, e, alpha=alpha, mu=mu, lam=lam,
                                lin=lin)
                except np.linalg.LinAlgError:  # numpy's Cholesky: see JITTER
                    raise diverged(f"the conditional distributions of sweep {sweep} are "
                                   "beyond float64's precision") from None
        a = int(absent.shape[0])
        if a:  # features with no rows: their priors, as libFM draws them
            if fit_linear:
                w[absent] = mu_w + normal(a) / np.sqrt(lam_w)
            for f in range(k):
                V[absent, f] = mu_v[f] + normal(a) / np.sqrt(lam_v[f])
        sq = float(xp.dot(s, e * e))
        if not np.isfinite(sq):
            raise diverged(f"the training loss of sweep {sweep} is {0.5 * sq / s_total:.4g}")
        alpha = rng.gamma(priors.a0 + s_total / 2, 1.0 / (priors.b0 + sq / 2))
        # the groups' sums on the backend, a few numbers to the host
        if fit_linear and n_features:
            mu_w, lam_w = _normal_gamma(rng, n_features, float(w.sum()), float(xp.dot(w, w)),
                                        lam_w, priors)
        if k and n_features:
            totals, squares = to_host(V.sum(axis=0)), to_host((V * V).sum(axis=0))
            for f in range(k):
                mu_v[f], lam_v[f] = _normal_gamma(rng, n_features, float(totals[f]),
                                                  float(squares[f]), lam_v[f], priors)
        sum_w0 += w0
        sum_w += w
        sum_V += V
        loss = 0.5 * sq / s_total
        curve.append(loss)
        if progress is not None:
            progress.step(f"Sweep {sweep}/{int(n_sweeps)}",
                          f"training loss {progress.loss(loss):.6f}, noise precision "
                          f"{alpha:.4g}", n)
    t = float(max(int(n_sweeps), 1))
    return MCMCResult(intercept=sum_w0 / t, coef=to_host(sum_w / t),
                      factors=to_host(sum_V / t), loss_curve=curve, n_blocks=n_blocks)
