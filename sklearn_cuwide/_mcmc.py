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


def _blocks(xp, row_of, indices, data, sample_weight, block_of, n_blocks):
    """Per block ``(features, rows, local, values, weights, curvature)``:
    its features (sorted); for each of its nonzeros the row, the feature's
    place among the block's features, the value (float64) and the row's
    weight; and per feature the weighted sum of its values' squares (the
    linear weights' conditional precision over the noise's, the same every
    sweep).  ``indices``: int64."""
    nz_block = block_of[indices]
    out = []
    for b in range(n_blocks):
        feats = xp.flatnonzero(block_of == b)
        nz = xp.flatnonzero(nz_block == b)
        rows, x = row_of[nz], data[nz].astype(xp.float64)
        local, sr = xp.searchsorted(feats, indices[nz]), sample_weight[rows]
        out.append((feats, rows, local, x, sr,
                    xp.bincount(local, sr * x * x, minlength=int(feats.shape[0]))))
    return out


def _draw(xp, normal, prec, num):
    """Draws of ``N(num / prec, 1 / prec)``."""
    return num / prec + normal(prec.shape[0]) / xp.sqrt(prec)


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
             priors=MCMCPriors(), progress=None, to_host=np.asarray):
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
    blocks = _blocks(xp, row_of, indices, data, sample_weight, block_of, n_blocks)
    del row_of
    absent = xp.flatnonzero(block_of < 0)
    if absent.size:  # no rows: drawn from their priors, as libFM draws them
        none, zero = xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=xp.float64)
        blocks.append((absent, none, none, zero, zero, zero))
    if progress is not None:
        progress.stage("feature blocks", f"{n_blocks} blocks of features that share no row")
    k = int(n_factors)
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
    for feats, rows, local, x, _, _ in blocks:
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
        for feats, rows, local, x, sr, curvature in blocks:
            m = int(feats.shape[0])
            if not rows.size:  # features of no row: their priors
                if fit_linear:
                    w[feats] = mu_w + normal(m) / np.sqrt(lam_w)
                for f in range(k):
                    V[feats, f] = mu_v[f] + normal(m) / np.sqrt(lam_v[f])
                continue
            er = e[rows]
            if fit_linear:
                old = w[feats]
                prec = alpha * curvature + lam_w
                num = (alpha * xp.bincount(local, sr * x * (er + old[local] * x), minlength=m)
                       + mu_w * lam_w)
                new = _draw(xp, normal, prec, num)
                er -= (new - old)[local] * x
                w[feats] = new
            for f in range(k):
                old = V[feats, f]
                qf = q[rows, f]
                h = x * (qf - old[local] * x)
                prec = alpha * xp.bincount(local, sr * h * h, minlength=m) + lam_v[f]
                num = (alpha * xp.bincount(local, sr * h * (er + old[local] * h), minlength=m)
                       + mu_v[f] * lam_v[f])
                new = _draw(xp, normal, prec, num)
                d = (new - old)[local]
                er -= d * h
                q[rows, f] = qf + d * x
                V[feats, f] = new
            e[rows] = er
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
