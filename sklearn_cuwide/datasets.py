"""Built-in synthetic data: Criteo-like click-through-rate problems.

:func:`make_ctr_classification` and its regression twin
:func:`make_ctr_regression` draw sparse one-hot data shaped like the Criteo
display-advertising logs that cuWide was designed for, with a planted model
(logistic regression or an order-2 factorization machine) that gives the true
click probability or the noiseless target.

The feature space
-----------------
The first ``n_numeric`` feature ids are numeric features, present in every
row.  The remaining ``n_features - n_numeric`` ids are split into
``n_fields`` contiguous, disjoint ranges of (almost) equal size, one per
categorical field.  Every row has exactly one active id per field, with
value 1.0, drawn with Zipf-like popularity inside its field: a few ids are
very hot, most are a long tail.  A row therefore has exactly
``n_numeric + n_fields`` stored nonzeros (39 by default), and its column
indices are sorted because the ranges are laid out in field order.

The planted model
-----------------
Every feature gets a weight ``w_i ~ N(0, 1)`` and, for ``model="fm"``,
``n_factors`` latent factors ``v_i ~ N(0, 1)``; the model is

``f(x) = b + alpha * sum_i w_i x_i + beta * sum_{i<j} <v_i, v_j> x_i x_j``

where ``alpha`` and ``beta`` are set so that the linear and the pairwise
parts have fixed standard deviations over the data distribution, measured on
a fixed-size calibration sample drawn from the same ``random_state``.  For
classification ``P(y = 1 | x) = sigmoid(f(x))`` and the intercept ``b`` is
set so that the mean click-through rate is ``base_rate``; the logit's spread
gives a Bayes AUC of about 0.8.  The model depends on ``random_state`` and on
the shape parameters, never on ``n_samples``: with the same arguments, the
rows of a smaller draw are the first rows of a larger one.

Generation is vectorised per field (no Python loop over rows) and never
builds a dense ``(n_samples, n_features)`` array: memory is about
``n_samples * nnz_per_row * 8`` bytes for the CSR arrays, plus
``n_samples * n_factors * 4`` bytes for the factor sums of ``model="fm"``
and ``n_features / n_fields * (1 + n_factors)`` floats of planted model for
the field being drawn.
"""

import numbers

import numpy as np
import scipy.sparse as sp
from scipy.special import expit
from sklearn.utils import check_random_state

__all__ = ["make_ctr_classification", "make_ctr_regression"]

#: Rows of the calibration sample that fixes the model's scales and intercept.
_N_CALIBRATION = 1 << 15

#: Standard deviations of the linear and the pairwise part of the logit.
_LOGIT_STD = {"lr": (1.4, 0.0), "fm": (0.8, 1.3)}

# Stream tags for ``np.random.default_rng([seed, part, kind, index])``.
_MODEL, _CALIB, _DATA, _OUTCOME = 0, 1, 2, 3
_CATEGORICAL, _NUMERIC = 0, 1


# --------------------------------------------------------------------------
# parameter checks
# --------------------------------------------------------------------------
def _check_int(name, value, low):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}.")
    return int(value)


def _check_real(name, value, low, high=np.inf, low_open=False, high_open=False):
    """``value`` as a finite float in the range ``low`` to ``high`` (an
    infinite end, never reached, is an open one, as the message says)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}.")
    value = float(value)
    low_open, high_open = low_open or np.isinf(low), high_open or np.isinf(high)
    bad_low = value <= low if low_open else value < low
    bad_high = value >= high if high_open else value > high
    if not np.isfinite(value) or bad_low or bad_high:
        raise ValueError(
            f"{name} must be a finite number in the range {'(' if low_open else '['}"
            f"{low:g}, {high:g}{')' if high_open else ']'}, got {value!r}."
        )
    return value


def _check_common(
    n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors, dtype
):
    n_samples = _check_int("n_samples", n_samples, 1)
    n_fields = _check_int("n_fields", n_fields, 0)
    n_numeric = _check_int("n_numeric", n_numeric, 0)
    if n_fields + n_numeric == 0:
        raise ValueError("n_fields + n_numeric must be at least 1, got 0.")
    n_features = _check_int("n_features", n_features, 1)
    if n_features < n_fields + n_numeric:
        raise ValueError(
            f"n_features={n_features} is too small: it must be at least "
            f"n_fields + n_numeric = {n_fields + n_numeric}, so that every "
            "categorical field owns at least one feature id."
        )
    if n_features > np.iinfo(np.int32).max:
        raise ValueError(
            f"n_features must be < 2**31 (int32 column indices), got {n_features}."
        )
    zipf_a = _check_real("zipf_a", zipf_a, 0.0)
    if model not in ("lr", "fm"):
        raise ValueError(f"model must be 'lr' or 'fm', got {model!r}.")
    n_factors = _check_int("n_factors", n_factors, 1)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    return n_samples, n_features, n_fields, n_numeric, zipf_a, n_factors, dtype


def _seed_from(random_state):
    """One integer seed from an int, a RandomState, a Generator or None."""
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int32).max))
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


# --------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------
def _field_boundaries(n_features, n_fields, n_numeric):
    """First feature id of every categorical field, and the end of the last.

    Numeric features are ``0 .. n_numeric - 1``; field ``f`` owns the ids
    ``bounds[f] .. bounds[f + 1] - 1``.
    """
    n_cat = n_features - n_numeric
    if n_fields == 0:
        return np.array([n_numeric], dtype=np.int64)
    return n_numeric + (np.arange(n_fields + 1, dtype=np.int64) * n_cat) // n_fields


def _zipf_ranks(rng, n, cardinality, a):
    """Popularity ranks in ``[0, cardinality)``, hot ranks first.

    Inverse CDF of the power-law density ``x ** -a`` on ``[1, cardinality +
    1)``, floored: rank ``r`` has probability ``F(r + 2) - F(r + 1)``, which is
    close to Zipf's ``(r + 1) ** -a / H``.  O(1) per draw, vectorised.
    """
    x = rng.random(n)
    top = cardinality + 1.0
    if abs(a - 1.0) < 1e-12:
        x *= np.log(top)
        np.exp(x, out=x)
    else:
        e = 1.0 - a
        x *= top**e - 1.0
        x += 1.0
        np.power(x, 1.0 / e, out=x)
    ranks = x.astype(np.int64)
    ranks -= 1
    np.clip(ranks, 0, cardinality - 1, out=ranks)
    return ranks


def _numeric_values(rng, n, mu, sigma):
    """``log1p`` of a heavy-tailed (log-normal) count, scaled to about [0, 1].

    Strictly positive, so every numeric feature is a stored nonzero.
    """
    z = rng.standard_normal(n)
    z *= sigma
    z += mu
    np.exp(z, out=z)
    count = np.floor(z, out=z)
    count += 1.0
    v = np.log1p(count, out=count)
    v /= np.log1p(1.0 + np.exp(mu + 2.0 * sigma))
    return v


class _Terms:
    """Running linear part, factor sums and squared norms of one sample."""

    def __init__(self, n, n_factors):
        self.lin = np.zeros(n)
        self.S = np.zeros((n, n_factors), dtype=np.float32) if n_factors else None
        self.Q = np.zeros(n) if n_factors else None

    def add(self, w, V, sqnorm, x=None):
        """Add one feature per row: weight ``w``, factors ``V`` (rows gathered)."""
        if x is None:
            self.lin += w
            if self.S is not None:
                self.S += V
                self.Q += sqnorm
        else:
            self.lin += w * x
            if self.S is not None:
                self.S += V * x[:, None].astype(np.float32)
                self.Q += sqnorm * (x * x)

    def pairwise(self):
        """``sum_{i<j} <v_i, v_j> x_i x_j`` per row."""
        s2 = np.einsum("ij,ij->i", self.S, self.S, dtype=np.float64)
        return 0.5 * (s2 - self.Q)


def _draw(n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors,
          dtype, seed):
    """X (as CSR) and the unscaled model terms of the data and the calibration."""
    k = n_factors if model == "fm" else 0
    n_cols = n_numeric + n_fields
    bounds = _field_boundaries(n_features, n_fields, n_numeric)

    indices = np.empty((n_samples, n_cols), dtype=np.int32)
    values = np.empty((n_samples, n_cols), dtype=dtype)
    terms = {_CALIB: _Terms(_N_CALIBRATION, k), _DATA: _Terms(n_samples, k)}
    sizes = {_CALIB: _N_CALIBRATION, _DATA: n_samples}

    # numeric features: ids 0 .. n_numeric - 1, a value in every row
    if n_numeric:
        mrng = np.random.default_rng([seed, _MODEL, _NUMERIC])
        w = mrng.standard_normal(n_numeric)
        V = mrng.standard_normal((n_numeric, k), dtype=np.float32)
        sqnorm = np.einsum("ij,ij->i", V, V, dtype=np.float64)
        mu = mrng.uniform(0.0, 3.0, n_numeric)
        sigma = mrng.uniform(0.5, 2.0, n_numeric)
        for j in range(n_numeric):
            for part, t in terms.items():
                rng = np.random.default_rng([seed, part, _NUMERIC, j])
                x = _numeric_values(rng, sizes[part], mu[j], sigma[j])
                t.add(w[j], V[j][None, :] if k else None, sqnorm[j], x)
                if part == _DATA:
                    indices[:, j] = j
                    values[:, j] = x

    # categorical fields: one Zipf-popular id per field, value 1
    for f in range(n_fields):
        card = int(bounds[f + 1] - bounds[f])
        mrng = np.random.default_rng([seed, _MODEL, _CATEGORICAL, f])
        local_of_rank = mrng.permutation(card)  # the hot ids are scattered
        w = mrng.standard_normal(card)
        V = mrng.standard_normal((card, k), dtype=np.float32)
        sqnorm = np.einsum("ij,ij->i", V, V, dtype=np.float64)
        for part, t in terms.items():
            rng = np.random.default_rng([seed, part, _CATEGORICAL, f])
            local = local_of_rank[_zipf_ranks(rng, sizes[part], card, zipf_a)]
            if k:
                t.add(w[local], V[local], sqnorm[local])
            else:
                t.add(w[local], None, None)
            if part == _DATA:
                local += bounds[f]
                indices[:, n_numeric + f] = local
                values[:, n_numeric + f] = 1.0
            del local

    nnz = n_samples * n_cols
    index_dtype = np.int32 if nnz <= np.iinfo(np.int32).max else np.int64
    indptr = np.arange(0, nnz + 1, n_cols, dtype=index_dtype)
    X = sp.csr_matrix(
        (values.reshape(-1), indices.reshape(-1), indptr),
        shape=(n_samples, n_features),
        copy=False,
    )
    X.has_sorted_indices = True
    return X, terms[_CALIB], terms[_DATA]


def _combine(calib, data, model, total_std):
    """The centred planted value ``f(x) - b`` of the data and the calibration.

    The linear and pairwise parts are scaled to the standard deviations of
    ``_LOGIT_STD[model]`` times ``total_std / norm`` over the calibration
    sample, and centred on its means.
    """
    s_lin, s_int = _LOGIT_STD[model]
    factor = 1.0 if total_std is None else total_std / np.hypot(s_lin, s_int)
    parts = [("lin", s_lin)] + ([("pairwise", s_int)] if model == "fm" else [])
    f_cal = np.zeros(calib.lin.shape)
    f_dat = np.zeros(data.lin.shape)
    for name, target in parts:
        c = calib.lin if name == "lin" else calib.pairwise()
        d = data.lin if name == "lin" else data.pairwise()
        std = c.std()
        scale = factor * target / std if std > 0 else 0.0
        f_cal += (c - c.mean()) * scale
        d = d - c.mean()
        d *= scale
        f_dat += d
    return f_cal, f_dat


def _intercept_for_rate(f, base_rate):
    """Solve ``mean(sigmoid(f + b)) = base_rate`` for ``b`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if expit(f + mid).mean() < base_rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------
# public
# --------------------------------------------------------------------------
def make_ctr_classification(
    n_samples=100_000,
    n_features=2**20,
    *,
    n_fields=26,
    n_numeric=13,
    zipf_a=1.2,
    model="lr",
    n_factors=8,
    base_rate=0.25,
    return_proba=False,
    dtype=np.float32,
    random_state=None,
):
    """Generate a Criteo-like sparse click-through-rate classification problem.

    Each row has ``n_numeric`` numeric features (``log1p`` of a heavy-tailed
    count, scaled to about unit range) and one active id with value 1.0 in
    each of ``n_fields`` categorical fields, drawn with Zipf-like popularity.
    The label is a Bernoulli draw from the probability of a planted logistic
    regression (``model="lr"``) or order-2 factorization machine
    (``model="fm"``).  See the module documentation for the exact layout.

    Parameters
    ----------
    n_samples : int, default=100_000
        Number of rows.
    n_features : int, default=2**20
        Number of columns: ``n_numeric`` numeric ids first, then the
        categorical ids split evenly among the fields.
    n_fields : int, default=26
        Number of categorical fields (one active id per row and field).
    n_numeric : int, default=13
        Number of numeric features (present in every row).
    zipf_a : float, default=1.2
        Exponent of the power-law popularity of the ids inside a field;
        0 is uniform, larger is more skewed.
    model : {"lr", "fm"}, default="lr"
        The planted model: logistic regression, or an order-2 factorization
        machine with a linear part and strong pairwise interactions (a
        factorization machine then beats logistic regression clearly).
    n_factors : int, default=8
        Rank of the planted factorization machine (``model="fm"`` only).
    base_rate : float, default=0.25
        Target mean click-through rate; the intercept is set to reach it.
    return_proba : bool, default=False
        Also return the true click probability of every row.
    dtype : {np.float32, np.float64}, default=np.float32
        Dtype of ``X``'s values.
    random_state : int, RandomState instance, Generator or None, default=None
        Determines the planted model and the data.  Pass an int for
        reproducible output.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_samples, n_features)
        Sorted column indices, ``n_fields + n_numeric`` nonzeros per row,
        int32 index arrays (int64 ``indptr`` only beyond 2**31 nonzeros).
    y : ndarray of shape (n_samples,), dtype int64
        The 0/1 labels.
    proba : ndarray of shape (n_samples,), dtype float64
        ``P(y = 1 | x)`` under the planted model; only with
        ``return_proba=True``.

    See Also
    --------
    make_ctr_regression : The same features with a real-valued target.

    Notes
    -----
    The planted model is drawn from ``random_state`` and does not depend on
    ``n_samples``; draw train and test rows in one call and split them (two
    calls with different seeds have different models).

    Examples
    --------
    >>> from sklearn_cuwide.datasets import make_ctr_classification
    >>> X, y, p = make_ctr_classification(
    ...     n_samples=1000, n_features=2**12, return_proba=True, random_state=0
    ... )
    >>> X.shape, X.nnz
    ((1000, 4096), 39000)
    >>> sorted(set(y.tolist()))
    [0, 1]
    >>> bool(abs(p.mean() - 0.25) < 0.05)
    True
    """
    n_samples, n_features, n_fields, n_numeric, zipf_a, n_factors, dtype = (
        _check_common(
            n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors,
            dtype,
        )
    )
    base_rate = _check_real("base_rate", base_rate, 0.0, 1.0, low_open=True, high_open=True)
    seed = _seed_from(random_state)

    X, calib, data = _draw(
        n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors,
        dtype, seed,
    )
    f_cal, logit = _combine(calib, data, model, total_std=None)
    del calib, data
    logit += _intercept_for_rate(f_cal, base_rate)
    proba = expit(logit, out=logit)
    u = np.random.default_rng([seed, _OUTCOME]).random(n_samples)
    y = (u < proba).astype(np.int64)
    if return_proba:
        return X, y, proba
    return X, y


def make_ctr_regression(
    n_samples=100_000,
    n_features=2**20,
    *,
    n_fields=26,
    n_numeric=13,
    zipf_a=1.2,
    model="lr",
    n_factors=8,
    bias=0.0,
    noise=0.5,
    return_mean=False,
    dtype=np.float32,
    random_state=None,
):
    """Generate a Criteo-like sparse regression problem.

    The features are those of :func:`make_ctr_classification` (same layout,
    same draws for the same arguments); the target is the value of a planted
    linear model (``model="lr"``) or order-2 factorization machine
    (``model="fm"``), with standard deviation about 1 over the data and mean
    about ``bias``, plus Gaussian noise of standard deviation ``noise``.

    Parameters
    ----------
    n_samples : int, default=100_000
        Number of rows.
    n_features : int, default=2**20
        Number of columns: ``n_numeric`` numeric ids first, then the
        categorical ids split evenly among the fields.
    n_fields : int, default=26
        Number of categorical fields (one active id per row and field).
    n_numeric : int, default=13
        Number of numeric features (present in every row).
    zipf_a : float, default=1.2
        Exponent of the power-law popularity of the ids inside a field.
    model : {"lr", "fm"}, default="lr"
        The planted model: linear, or an order-2 factorization machine with
        strong pairwise interactions.
    n_factors : int, default=8
        Rank of the planted factorization machine (``model="fm"`` only).
    bias : float, default=0.0
        Mean of the noiseless target (the planted intercept).
    noise : float, default=0.5
        Standard deviation of the Gaussian noise added to the target.
    return_mean : bool, default=False
        Also return the noiseless target ``E[y | x]``.
    dtype : {np.float32, np.float64}, default=np.float32
        Dtype of ``X``'s values.
    random_state : int, RandomState instance, Generator or None, default=None
        Determines the planted model, the data and the noise.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_samples, n_features)
        Sorted column indices, ``n_fields + n_numeric`` nonzeros per row.
    y : ndarray of shape (n_samples,), dtype float64
        The noisy target.
    mean : ndarray of shape (n_samples,), dtype float64
        The noiseless target; only with ``return_mean=True``.

    See Also
    --------
    make_ctr_classification : The same features with a click label.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_cuwide.datasets import make_ctr_regression
    >>> X, y, mean = make_ctr_regression(
    ...     n_samples=2000, n_features=2**12, model="fm", noise=0.5,
    ...     return_mean=True, random_state=0,
    ... )
    >>> X.shape, X.nnz
    ((2000, 4096), 78000)
    >>> bool(abs(np.std(y - mean) - 0.5) < 0.05)
    True
    """
    n_samples, n_features, n_fields, n_numeric, zipf_a, n_factors, dtype = (
        _check_common(
            n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors,
            dtype,
        )
    )
    bias = _check_real("bias", bias, -np.inf)
    noise = _check_real("noise", noise, 0.0)
    seed = _seed_from(random_state)

    X, calib, data = _draw(
        n_samples, n_features, n_fields, n_numeric, zipf_a, model, n_factors,
        dtype, seed,
    )
    _, mean = _combine(calib, data, model, total_std=1.0)
    del calib, data
    mean += bias
    y = mean + noise * np.random.default_rng([seed, _OUTCOME]).standard_normal(
        n_samples
    )
    if return_mean:
        return X, y, mean
    return X, y
