"""The strength of a factorization machine's "auto" penalties, chosen
per fit by held-out loss (a binary classifier's and a regressor's).

How strongly the penalties must hold the factors is a property of the
data, not a constant: on the study's sets the best of the multipliers
below ranged from 1 to 30, and the test AUC by up to 0.05
(docs/design/defaults.rst).  So a binary
:class:`~sklearn_cuwide.GPUFactorizationMachine` whose ``alpha``, ``beta``
and ``early_stopping`` are all ``"auto"`` multiplies both penalties by the
``m`` of :data:`PENALTY_MULTIPLIERS` with the least held-out log loss, in
one of two ways (:func:`penalty_choice_mode`; a
:class:`~sklearn_cuwide.GPUFactorizationMachineRegressor` likewise, by the
squared error, the fifth drawn at random):

* ``"held_out"``, from :data:`MIN_ROWS` to
  :data:`~sklearn_cuwide._minibatch.EARLY_STOPPING_AUTO_MIN_SAMPLES`
  training rows, where early stopping holds nothing out: four fits of four
  fifths of the rows, scored on the stratified fifth left out
  (:func:`choose_penalty_multiplier`), then the fit of all rows with it;
* ``"validation"``, from there to :data:`MAX_ROWS`: the fit itself at each
  multiplier, early stopping's held-out tenth scoring each one's restored
  best epoch, and the best fit kept (:func:`choose_among_fits`): four
  fits, no fifth.

Rule: the choice is the estimator's own fits, through the function it is
given, with nothing of the estimator in here.  Why: the multiplier must
mean exactly what the final fit's does.
"""

import time
import warnings
from numbers import Integral

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from ._loss import pointwise_loss
from ._minibatch import EARLY_STOPPING_AUTO_MIN_SAMPLES, _take_rows, _validation_split
from ._sparse import canonical_csr
from ._warn import warn

__all__ = ["PENALTY_MULTIPLIERS", "C_CHOICES", "CHOICE_FRACTION", "MIN_ROWS", "MAX_ROWS",
           "penalty_choice_mode", "penalty_choice_applies", "c_choice_mode", "choice_seeds",
           "choose_penalty_multiplier", "choose_among_fits"]

#: the multipliers of both "auto" penalties a fit chooses among
PENALTY_MULTIPLIERS = (1.0, 3.0, 10.0, 30.0)
#: the ``C`` of a mini-batch logistic regression's ``C="auto"`` chooses
#: among, in the same two ways (half decades about scikit-learn's 1: the
#: defaults study's best ``C`` ranged from 0.03 to 100, docs/design/defaults.rst)
C_CHOICES = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
#: the share of the training rows held out to choose on
CHOICE_FRACTION = 0.2
#: rows of each class the choice needs (on both sides of its split)
MIN_CLASS_ROWS = 5
#: the fewest training rows that choose: a fifth of fewer (under 400 rows)
#: ranks the multipliers by noise (the study's one loss of the rule beyond
#: 0.004 was its 1,000-row set), and the four fits cost most where a fit is
#: fast anyway
MIN_ROWS = 2_000
#: the most training rows that choose: the choice costs four fits, and the
#: study's sets that gained from it reach 100,000 rows (above, the
#: defaults' penalty stands)
MAX_ROWS = 100_000


def penalty_choice_mode(alpha, beta, early_stopping, stratify, n_heads, warm,
                        n_samples=None):
    """How a fit chooses its penalty multiplier: ``"held_out"`` (a fifth
    of its rows held out) from :data:`MIN_ROWS` training rows to early
    stopping's threshold, ``"validation"`` (early stopping's split) from
    there to :data:`MAX_ROWS`, else None: one head, fresh, ``alpha``,
    ``beta`` and ``early_stopping`` all ``"auto"``; a binary classifier
    (``stratify`` its class indices) with every class of
    :data:`MIN_CLASS_ROWS` rows, or a regressor (``stratify`` None) of
    ``n_samples`` rows."""
    if not (alpha == "auto" and beta == "auto" and early_stopping == "auto"):
        return None
    if n_heads != 1 or warm is not None:
        return None
    n = n_samples if stratify is None else len(stratify)
    if n is None or not MIN_ROWS <= n <= MAX_ROWS:
        return None
    if stratify is not None:
        counts = np.bincount(np.asarray(stratify, dtype=np.intp))
        counts = counts[counts > 0]
        if counts.size != 2 or int(counts.min()) < MIN_CLASS_ROWS:
            return None
    return "held_out" if n < EARLY_STOPPING_AUTO_MIN_SAMPLES else "validation"


def c_choice_mode(C, solver, early_stopping, stratify, n_heads, warm):
    """How a logistic regression's ``C="auto"`` is chosen (the modes of
    :func:`penalty_choice_mode`, among :data:`C_CHOICES`), or None, where
    it is scikit-learn's 1: the L-BFGS solver (the drop-in's: its
    objective is scikit-learn's), a ``C`` given, or a fit the FM's rule
    would not choose for (one binary head, fresh, ``early_stopping="auto"``,
    :data:`MIN_ROWS` to :data:`MAX_ROWS` rows, each class of
    :data:`MIN_CLASS_ROWS`)."""
    if not (isinstance(C, str) and C == "auto") or solver == "lbfgs":
        return None
    return penalty_choice_mode("auto", "auto", early_stopping, stratify, n_heads, warm)


def penalty_choice_applies(alpha, beta, early_stopping, stratify, n_heads, warm,
                           n_samples=None):
    """Whether a fit chooses its penalty multiplier (:func:`penalty_choice_mode`)."""
    return penalty_choice_mode(alpha, beta, early_stopping, stratify, n_heads,
                               warm, n_samples) is not None


def choice_seeds(random_state):
    """``(split_seed, fit_seed)`` of a choice: its fits share ``fit_seed``
    (``random_state`` itself when it is an int, so that the fit kept is the
    one a given value would make), so that they differ by the candidate
    alone."""
    if isinstance(random_state, Integral):
        return check_random_state(random_state).randint(np.iinfo(np.int32).max), random_state
    gen = check_random_state(random_state)
    split_seed, fit_seed = (int(v) for v in gen.randint(np.iinfo(np.int32).max, size=2))
    return split_seed, fit_seed


def _held_out_loss(t, z, sw, loss="logistic"):
    """The weighted mean ``loss`` (the solvers' own,
    :func:`~sklearn_cuwide._loss.pointwise_loss`: ``"logistic"`` of 0/1
    targets, ``"squared"`` half the squared error) of decision values ``z``
    for targets ``t``, in float64."""
    z = np.asarray(z, dtype=np.float64).reshape(-1, 1)
    lo, _ = pointwise_loss(np, z, np.asarray(t, dtype=np.float64).ravel(), loss)
    return float(np.sum(sw * lo) / max(float(np.sum(sw)), 1e-300))


#: the words of each loss in the choice's log
_LOSS_WORDS = {"logistic": "log loss", "squared": "squared error"}


def choose_penalty_multiplier(fit, decision, X, target, sw, stratify, seed, backend,
                              progress=None, loss="logistic", values=PENALTY_MULTIPLIERS,
                              name="Penalty multiplier"):
    """``(m, losses)``: the multiplier of :data:`PENALTY_MULTIPLIERS` whose
    fit on four fifths of the rows has the least held-out ``loss`` (the
    first such), and each one's loss.  ``progress``: the fit's log, which
    gets one line per multiplier (its loss and its fit's time).

    ``fit(X, target, sw, stratify, m)``: the estimator's fit of those rows
    with multiplier ``m``, returning its state (numpy);
    ``decision(X, state)``: its decision values of ``X`` (host).  The split
    is stratified on ``stratify`` with ``seed`` (None: a plain random
    fifth); the fits' warnings (each trains to ``max_iter`` or the
    training-loss rule) are the final fit's to give, not theirs.
    ``values``, ``name``: the candidates (another parameter's, e.g.
    :data:`C_CHOICES`) and their name in the log."""
    X = canonical_csr(X)  # rows are taken of a CSR (a COO matrix has none)
    tr, va = _validation_split(target.shape[0], CHOICE_FRACTION, stratify, seed)
    Xt, Xv = _take_rows(X, tr, backend), _take_rows(X, va, backend)
    losses = []
    for m in values:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            state = fit(Xt, target[tr], sw[tr], None if stratify is None else stratify[tr], m)
        losses.append(_held_out_loss(target[va], decision(Xv, state), sw[va], loss))
        if progress is not None:
            progress.note(f"{name} {m:g}: held-out {_LOSS_WORDS[loss]} "
                          f"{progress.loss(losses[-1]):.6f} (fit of {tr.size:,} rows in "
                          f"{time.perf_counter() - t0:.3f} s)")
    return values[int(np.argmin(losses))], losses


def choose_among_fits(fit, progress=None, values=PENALTY_MULTIPLIERS,
                      name="Penalty multiplier"):
    """``(m, result, losses)``: the multiplier of :data:`PENALTY_MULTIPLIERS`
    whose fit has the least validation loss (the first such), that fit's
    result, and each one's loss.

    ``fit(m)``: the estimator's fit of all its rows with multiplier ``m``
    and early stopping, returning ``(result, loss, kept)``, ``loss`` the
    validation loss of the epoch it kept, ``kept`` the words for that
    epoch.  The ``ConvergenceWarning`` s of the fit kept are given again
    once it is known, attributed to the user's call as the package's
    warnings are (so that the user's filters apply); the others' are
    dropped; any other warning is given as it comes.  ``progress``: the
    fit's log, which gets one line per multiplier.  ``values``, ``name``: as
    :func:`choose_penalty_multiplier`'s."""
    best = None
    losses = []
    for m in values:
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result, loss, kept = fit(m)
        own = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                warn(w.message, w.category)
        losses.append(float(loss))
        if best is None or losses[-1] < best[2]:
            best = (m, result, losses[-1], own)
        result = caught = own = None  # only the best fit's model stays
        if progress is not None:
            progress.note(f"{name} {m:g}: validation loss "
                          f"{progress.loss(losses[-1]):.6f} "
                          f"{kept} (fit in {time.perf_counter() - t0:.3f} s)")
    m, result, _, own = best
    for w in own:
        warn(w.message, w.category)
    return m, result, losses
