"""Factorization machines (order 2): GPUFactorizationMachine (logistic loss)
and GPUFactorizationMachineRegressor (squared loss)."""

import inspect
from dataclasses import replace
from functools import partial
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from scipy.special import log_expit, logsumexp
from sklearn.base import ClassifierMixin, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from ._backends import _cpu
from ._base import (
    available_if_explained,
    _SHARED_PARAMETER_CONSTRAINTS,
    _check_fit_data,
    _CuWideEstimator,
    _fit_device,
    _plan_fit,
    _schedule,
    _WideClassifierMixin,
    check_weight_range,
    commit,
    model_words,
    refuse_balanced_partial_fit,
    releases_memory,
    restore_on_failure,
    warm_start_mismatch,
)
from ._minibatch import (
    BLOWUP_FACTOR,
    COMPUTE_DTYPE,
    constant_loss,
    auto_learning_rate,
    rows_nnz,
    step_reads_row_nonzeros,
    stored_zero_rows,
    fit_heads,
    fm_penalties,
    logit_prior,
    optimizer_arrays,
    restore_accumulators,
    unit_weights,
    validation_attrs,
)
from ._mcmc import AUTO_MCMC_MAX_NONZEROS, fit_mcmc, suits_mcmc
from ._mcmc import diverged as mcmc_diverged
from ._penalty_choice import (
    PENALTY_MULTIPLIERS,
    choice_seeds,
    choose_among_fits,
    choose_penalty_multiplier,
    penalty_choice_mode,
)
from ._solvers import _SCALE_HINT
from ._sparse import canonical_csr
from ._state import FitProgress, ModelState, StepParams, shared_draws
from ._warn import warn

__all__ = ["GPUFactorizationMachine", "GPUFactorizationMachineRegressor"]


def _choice_part(progress, m):
    """The log of the penalty choice's fit at multiplier ``m``: a part of
    the fit's own (its lines marked with ``m``), or silent without one."""
    return FitProgress(0) if progress is None else progress.part(f"[multiplier {m:g}] ")

_FM_PARAMS_DOC = """
    n_factors : int, default=8
        Length of each feature's factor vector (the rank of the pairwise
        interactions).
    alpha : "auto" or float, default="auto"
        L2 penalty on the linear weights.  ``"auto"``: ``1 / S`` on the full
        objective (``S`` the training rows' total sample weight), the
        penalty of scikit-learn's ``LogisticRegression(C=1)``: a fixed prior
        whose weight per row falls as the rows grow; a binary classifier of
        2,000 to 100,000 rows with ``early_stopping="auto"`` multiplies both
        "auto" penalties by 1, 3, 10 or 30, the one with the least held-out
        log loss: on a fifth of its rows held out below 10,000 rows (then the
        fit of all rows), else on early stopping's validation split, the
        best of the four fits kept (``penalty_multiplier_``); the regressor
        likewise, by the squared error.  A number:
        the penalty per mini-batch, on the features the mini-batch contains
        (see ``scale_penalty``).
    beta : "auto" or float, default="auto"
        L2 penalty on the factors.  ``"auto"``: ``m / S`` on the full
        objective, ``m`` the mean nonzeros of a training row: a factor's
        gradient sums over the row's other nonzeros, so rows with many
        fields (click logs) need more than user x item ratings, whose
        factors a stronger penalty holds at zero (the defaults study's
        choice, :doc:`/design/defaults`).  A number: per mini-batch, as
        ``alpha``.
    scale_penalty : "auto" or bool, default="auto"
        Multiply each present feature's ``alpha`` and ``beta`` by the epoch's
        mini-batches over the sample blocks holding the feature, so that
        over an epoch every feature is penalised as often as the full
        objective's stochastic gradient would penalise it, rare ones as
        frequent ones (logistic regression always does this for ``C``).
        ``"auto"``: on when ``alpha`` or ``beta`` is ``"auto"`` (their
        strengths are defined on the full objective), off when both are
        numbers (the lazy per-mini-batch penalty, libFM's form).  See the
        user guide and :doc:`/design/penalty_scaling`.
    fit_linear : bool, default=True
        Fit the linear term; when False ``coef_`` stays zero.
    fit_intercept : bool, default=True
        Fit an unregularised intercept.
    init_scale : float, default=0.01
        Standard deviation of the random normal initial factors.
    solver : %(solvers)s
        cuWide's mini-batch solvers over the tiled layout.%(mcmc)s
    batch_size : int, default=1024
        Rows per mini-batch.
    learning_rate : "auto" or float, default="auto"
        Step size.  ``"auto"``: for ``"adagrad"``, from 10,000 rows on
        the classifier's ``1 / m`` within [0.03, 0.1] and the regressor's
        0.03, ``m`` the mean nonzeros of a row; 0.03 in ``partial_fit``
        (whose rows are a part of the data); below 10,000 rows, where an
        epoch takes few steps, 0.1, and for the regressor ``0.2 / m``
        within [0.03, 0.1] (the defaults study's choices,
        :doc:`/design/defaults`); for ``"sgd"``,
        ``1 / L`` with ``L`` the Lipschitz constant of the linear part's
        full-batch gradient, estimated from ``X`` by power iterations, and at
        least the largest share of one row's ``|x|^2`` in its mini-batch.
    max_iter : int, default=100
        Most epochs (at least 1, as scikit-learn's SGDClassifier).
    tol : float or None, default=1e-4
        With early stopping, stop when the least validation loss of the
        last ``n_iter_no_change`` epochs is not ``tol`` below the least of
        the epochs before them; without, when the training loss has not
        improved by ``tol`` for ``n_iter_no_change`` epochs.  None runs
        ``max_iter`` epochs.
    early_stopping : "auto" or bool, default="auto"
        Hold out ``validation_fraction`` of the training data (stratified
        for the classifier), stop on its loss, and keep the model of the
        epoch of least validation loss (not the last epoch's).  ``"auto"``:
        on from 10,000 training rows, as scikit-learn's
        ``HistGradientBoostingClassifier``.  ``partial_fit`` ignores it.
    validation_fraction : float in (0, 1), default=0.1
        Share of the training data held out for early stopping.
    n_iter_no_change : int, default=5
        Epochs without improvement by ``tol`` before stopping.
    shuffle : bool, default=True
        Shuffle the rows once and the order of the mini-batches every epoch.
    warm_start : bool, default=False
        Start from the previous fit's model (and Adagrad's accumulators).
        Data of other features (or classes), or another ``n_factors``, raise
        a ``ValueError``, as scikit-learn's warm starts do.
    random_state : int, RandomState instance or None, default=None
        Seeds the factors' initialisation, the shuffling and the validation
        split.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where to fit: ``"auto"`` uses the first usable GPU, else the CPU;
        ``"cuda"`` without a usable GPU raises.
    concurrency : "auto", "max" or int, default="auto"
        Mini-batches trained at once on the GPU (workers updating the model
        without locks, Hogwild).  ``"auto"`` and ``1``: one at a time,
        strictly in order as the CPU does, each step on every thread block
        of the device; ``"max"``: every thread block the device runs at
        once, each on its own mini-batch, several times faster on millions
        of rows, at some cost in accuracy that depends on the data; an int
        ``P``: at most ``P`` mini-batches at once (each on a group of up to
        8 thread blocks).  The CPU always runs in order, whatever the value.
        See :ref:`reproducibility`.
    verbose : int, default=0
        Above 0, print one line per setup stage (input checks, the layout,
        the initial state, ...) with its time, then one per epoch: loss,
        validation loss, and the samples per second over the whole fit so
        far.  A fit that chooses its penalty multiplier prints a line for
        each multiplier's fit; from 2, also those fits' own stages and
        epochs, each line marked with its multiplier.
"""

_CLASS_WEIGHT_DOC = """    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` as
        :class:`GPULogisticRegression` (and scikit-learn) does: a class's
        weight is the same as that per-sample weight on its samples.
        ``partial_fit`` refuses ``"balanced"``.
"""


_MCMC_DOC = """
        ``"mcmc"``: Bayesian inference by Gibbs sampling (libFM's MCMC),
        which draws the strengths of the penalties (the priors' precisions)
        and the noise with the parameters: no step size or penalty to tune,
        so ``alpha``, ``beta``, ``scale_penalty``, ``batch_size``,
        ``learning_rate``, ``tol``, ``early_stopping``,
        ``validation_fraction``, ``n_iter_no_change``, ``shuffle``,
        ``warm_start`` and ``concurrency`` do not apply to it (one set to
        other than its default warns); ``max_iter``
        is its number of sweeps over the parameters (all run: 200 to 400 on
        MovieLens-100k), and the model kept is the mean of every sweep's
        draw. ``sample_weight`` counts rows (a weight of 2 is the row
        twice), so weights normalised to sum to 1 hold one row's evidence
        and the model may end no better than a constant (it warns below a
        mean weight of 0.1). It suits data whose rows outnumber the
        parameters; ``partial_fit`` does not take it. See the user guide.
        ``"auto"``: ``"mcmc"`` where the rows (of ``X``) at least equal the
        parameters of the features they hold (``n_factors + 1`` for each
        feature with a stored entry) and ``X`` holds at most 2**21 stored
        entries, as on ratings data, where it was 0.01 to 0.04 RMSE better
        than ``"adagrad"`` (and on far fewer rows fitted the noise); otherwise,
        when ``partial_fit`` or ``warm_start`` continues a fitted model, and
        when ``learning_rate``, ``alpha``, ``beta`` or ``scale_penalty`` is
        set or ``early_stopping=True`` (which only it reads), ``"adagrad"``.
        ``solver_`` says which ran."""


def _fm_doc(cls, solvers='{"sgd", "adagrad"}, default="adagrad"', mcmc=""):
    """Put the shared parameter docs into a class docstring (``solvers``
    and ``mcmc``: the class's solver set and the text of its extra one)."""
    if cls.__doc__:  # None under python -OO
        params = (_FM_PARAMS_DOC.lstrip("\n").replace("%(solvers)s", solvers)
                  .replace("%(mcmc)s", mcmc))
        cls.__doc__ = cls.__doc__.replace(
            "    %(fm_params)s\n", params
        ).replace("    %(class_weight)s\n", _CLASS_WEIGHT_DOC)
    return cls


class _BaseFM(_CuWideEstimator):
    """Shared machinery of the two factorization machines.

    The model of one output is::

        f(x) = b + <w, x> + sum_{j < k} <v_j, v_k> x_j x_k

    trained by mini-batch sgd or adagrad with the objective of
    :class:`~sklearn_cuwide._state.StepParams`.

    Each public class has its own ``__init__`` (so that an unknown keyword's
    error names it); :meth:`_set_fm_params` stores the parameters they share.
    """

    _parameter_constraints: dict = {
        **_SHARED_PARAMETER_CONSTRAINTS,
        # epochs: at least one, as scikit-learn's SGDClassifier
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_factors": [Interval(Integral, 1, None, closed="left")],
        "alpha": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "beta": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "scale_penalty": ["boolean", StrOptions({"auto"})],
        "fit_linear": ["boolean"],
        "init_scale": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"sgd", "adagrad"})],
        "tol": [Interval(Real, 0, None, closed="left"), None],
    }

    def _set_fm_params(self, params):
        """Store the constructor's parameters (its ``locals()``) as they are."""
        for name, value in params.items():
            if name not in ("self", "__class__"):
                setattr(self, name, value)

    # subclasses: the loss, the targets of the heads and the fitted shapes
    _loss = None

    def _warm_states(self, n_features, n_heads):
        """One ModelState per head from the fitted model, or None."""
        if not hasattr(self, "coef_"):
            return None
        heads = self._heads()
        if len(heads) != n_heads:
            return None
        saved = getattr(self, "_optimizer_state", None) or [None] * n_heads
        states = []
        for (w, b, V), acc in zip(heads, saved):
            if w.shape[0] != n_features or V.shape[1] != self.n_factors:
                return None
            # the fit's own copies of the model (nothing drawn to be overwritten)
            st = ModelState.zeros(
                n_features, 1, self.n_factors, adagrad=self._epoch_solver() == "adagrad",
                dtype=COMPUTE_DTYPE, draw=False,
            )
            st.w[:] = w
            st.b[:] = b
            st.V, st.factor_init = np.array(V, dtype=COMPUTE_DTYPE), None
            if st.gw is not None:
                st.gV = np.zeros_like(st.V)
            states.append(restore_accumulators(st, acc))
        return states

    def _continued_states(self, n_features, n_heads, classes=None):
        """A ``fit``'s starting states under ``warm_start``: None without it
        or before a first fit, else the fitted model's (:meth:`_warm_states`)
        when the data and parameters match it (features, models, factors, a
        classifier's ``classes``); otherwise
        :func:`~sklearn_cuwide._base.warm_start_mismatch` is raised."""
        if not self.warm_start or not hasattr(self, "coef_"):
            return None
        states = None
        if classes is None or np.array_equal(self.classes_, classes):
            states = self._warm_states(n_features, n_heads)
        if states is None:
            w, _, V = self._heads()[0]  # n_features_in_ is already this fit's
            raise warm_start_mismatch(
                model_words(w.shape[0], None if classes is None else self.classes_,
                            V.shape[1]),
                model_words(n_features, classes, self.n_factors))
        return states

    def _intercept_init(self, t, sw):  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_partial_fit_model(self, n_features):
        """``partial_fit`` continues the fitted model: its shape cannot change."""
        if not hasattr(self, "factors_"):
            return
        n_factors = self.factors_.shape[-1]
        if n_factors != self.n_factors:
            raise ValueError(
                f"n_factors={self.n_factors} differs from the {n_factors} factors of "
                "the fitted model, which partial_fit continues. Set n_factors back "
                f"to {n_factors}, or call fit to train a new model with "
                f"{self.n_factors} factors."
            )

    def _fit_heads(self, X, targets, sw, backend, warm, *, stratify, partial,
                   progress=None, multiplier=1.0, chosen=None, random_state=None,
                   scans=None):
        """Train one FM per target vector on a shared layout (a list of
        :class:`~sklearn_cuwide._minibatch.HeadResult`); ``multiplier``
        scales both "auto" penalties (:mod:`sklearn_cuwide._penalty_choice`;
        ``chosen``: the multiplier when this fit chose it); ``random_state``:
        instead of the estimator's (the choice's fits)."""
        n_rows, n_features = X.shape

        def make_params(X, sw_train, rows, left_out=None):
            n_train = X.shape[0] if rows is None else rows.shape[0]
            # the rows' nonzeros size "auto"'s beta and the classifier's
            # "auto" step: one pass over the values finds the stored zeros
            # for both
            auto_step = self.learning_rate == "auto"
            zeros = (stored_zero_rows(X, backend) if self.beta == "auto" or (
                auto_step and step_reads_row_nonzeros(self._epoch_solver(), "fm", self._loss,
                                                      n_rows, partial)) else None)
            mean_nnz = (rows_nnz(X, rows, backend, left_out, zeros) / max(n_train, 1)
                        if self.beta == "auto" else 1.0)
            # under unit weights the step's weighted mean row is beta's plain
            # one, the same float: not computed again from the row lengths
            row_nnz = (mean_nnz if self.beta == "auto" and n_train and unit_weights(sw_train)
                       else None)
            l2_w, l2_v, scaled = fm_penalties(self.alpha, self.beta, self.scale_penalty,
                                              float(np.sum(sw_train)), mean_nnz, multiplier)
            return StepParams(
                model="fm", loss=self._loss, solver=self._epoch_solver(),
                learning_rate=(float(self.learning_rate) if not auto_step
                               else auto_learning_rate(self._epoch_solver(), X, sw_train,
                                                       loss=self._loss, backend=backend,
                                                       fit_intercept=self.fit_intercept,
                                                       model="fm", n_samples=n_rows,
                                                       partial=partial,
                                                       batch_size=self.batch_size,
                                                       rows=rows, zeros=zeros,
                                                       row_nnz=row_nnz)),
                l2_w=l2_w, l2_v=l2_v,
                fit_intercept=self.fit_intercept, fit_linear=self.fit_linear,
                penalty_scaled=scaled,
            )

        def init_state(_, t, sw_train, seed):
            state = ModelState.zeros(
                n_features, 1, self.n_factors, adagrad=self._epoch_solver() == "adagrad",
                dtype=COMPUTE_DTYPE, init_scale=self.init_scale, random_state=seed,
                draw=False,  # drawn on the fit's device, in layout order
            )
            if self.fit_intercept:
                state.b[:] = self._intercept_init(t, sw_train)
            return state

        schedule = _schedule(self, partial=partial)
        if random_state is not None:
            schedule = replace(schedule, random_state=random_state)
        return fit_heads(
            X, targets, sw, backend=backend, schedule=schedule,
            n_outputs=1, n_factors=self.n_factors, make_params=make_params,
            init_state=init_state, warm=warm, stratify=stratify, progress=progress,
            partial=partial, advise_early_stopping=chosen is None, scans=scans,
        )

    def _penalty_choice(self, X, targets, sw, y_idx, warm, backend, *, partial=False,
                        progress=None, scans=None):
        """``(multiplier, chosen, results)`` of both "auto" penalties for a
        fit (``y_idx``: a classifier's class indices, None for the
        regressor): a continued model's own; a fresh one's chosen by held-out loss
        where :func:`~sklearn_cuwide._penalty_choice.penalty_choice_mode`
        says how (then ``chosen`` is it, else None; a stage of
        ``progress``); else 1.  ``results``: the chosen fit's heads when the
        choice trained them on the fit's own rows (early stopping's split
        scoring), else None (the fit is still to be made)."""
        if warm:
            return getattr(self, "penalty_multiplier_", 1.0), None, None
        mode = None if partial else penalty_choice_mode(
            self.alpha, self.beta, self.early_stopping, y_idx, len(targets), None,
            n_samples=X.shape[0])
        if mode is None:
            return 1.0, None, None
        if scans is not None:  # the choice's fits read rows of X
            scans.on_host()
        if progress is not None:
            what = ("each on four fifths of the rows, scored on the fifth left out, then "
                    "the fit of all rows with the best" if mode == "held_out" else
                    "scored on early stopping's validation split, the best kept")
            ms = ", ".join(f"{m:g}" for m in PENALTY_MULTIPLIERS)
            progress.note(f'Penalty choice: one fit per multiplier {ms} of the "auto" '
                          f"penalties, {what} (alpha and beta set to numbers skip it)")
        if mode == "held_out":
            m, results = self._choose_penalty(X, targets[0], sw, y_idx, backend, progress), None
        else:
            m, results = self._choose_penalty_by_validation(X, targets, sw, y_idx, backend,
                                                            progress)
        if progress is not None:
            progress.stage(f"penalty choice (multiplier {m:g})")
        return m, m, results

    def _chosen_fit(self, X, targets, sw, y_idx, warm, backend, progress, scans=None):
        """``(multiplier, results)`` of ``fit``: the penalty multiplier
        (:meth:`_penalty_choice`) and the heads fitted with it, the choice's
        own fit where it made one.  ``scans``: the input's
        :class:`~sklearn_cuwide._base.DeferredScans`, or None."""
        multiplier, chosen, results = self._penalty_choice(X, targets, sw, y_idx, warm,
                                                           backend, progress=progress,
                                                           scans=scans)
        if results is None:
            results = self._fit_heads(X, targets, sw, backend, warm, stratify=y_idx,
                                      partial=False, progress=progress,
                                      multiplier=multiplier, chosen=chosen,
                                      scans=None if chosen is not None else scans)
        return multiplier, results

    def _penalty_multiplier(self, X, targets, sw, y_idx, warm, backend, *, partial=False,
                            progress=None):
        """``(multiplier, chosen)`` of :meth:`_penalty_choice`."""
        m, chosen, _ = self._penalty_choice(X, targets, sw, y_idx, warm, backend,
                                            partial=partial, progress=progress)
        return m, chosen

    def _choice_seeds(self):
        """:func:`~sklearn_cuwide._penalty_choice.choice_seeds` of
        ``random_state``: the choice's fits differ by their penalty alone."""
        return choice_seeds(self.random_state)

    def _choose_penalty(self, X, target, sw, y_idx, backend, progress=None):
        """The multiplier of both "auto" penalties for a small fit
        (:func:`~sklearn_cuwide._penalty_choice.choose_penalty_multiplier`,
        with this estimator's fits, quiet, sharing one seed, scored by its
        loss; ``y_idx``: the classes to stratify on, None for the
        regressor); the held-out rows are scored on the host (a few
        thousand rows, whatever the model's width or the device's limit)."""
        split_seed, fit_seed = self._choice_seeds()

        def fit(Xs, t, s, strat, m):
            res = self._fit_heads(Xs, [t], s, backend, None, stratify=strat,
                                  partial=False, progress=_choice_part(progress, m),
                                  multiplier=m,
                                  random_state=fit_seed)
            # the model alone: nothing held on the device while the next fits run
            return replace(res[0].state, gw=None, gV=None, gb=None)

        def decision(Xs, st):
            Xs = Xs.get() if hasattr(Xs, "get") else Xs  # a cupyx matrix's rows
            return _cpu.decision_function(Xs, st.w, st.b, st.V, fit_linear=self.fit_linear)

        with shared_draws():  # one seed, one layout: the initial factors drawn once
            m, _ = choose_penalty_multiplier(fit, decision, X, np.asarray(target, np.float64),
                                             sw, y_idx, split_seed, backend, progress,
                                             loss=self._loss)
        return m

    def _choose_penalty_by_validation(self, X, targets, sw, y_idx, backend, progress=None):
        """``(m, results)``: this estimator's fit of all rows at each
        multiplier, with early stopping (one seed: the same split, layout and
        epochs), the one whose kept epoch has the least validation loss
        (:func:`~sklearn_cuwide._penalty_choice.choose_among_fits`)."""
        _, fit_seed = self._choice_seeds()

        def fit(m):
            res = self._fit_heads(X, targets, sw, backend, None, stratify=y_idx,
                                  partial=False, progress=_choice_part(progress, m),
                                  multiplier=m,
                                  chosen=m, random_state=fit_seed)
            if m != PENALTY_MULTIPLIERS[-1]:  # it may be held while the next fits run
                res = [r.on_host() for r in res]
            r = res[0]
            if not r.validation_curve:  # a split without weight on a side: none held out
                return res, float("inf"), "(no validation split: a side had no weight)"
            kept = r.best_iteration if r.best_iteration else len(r.validation_curve)
            return res, r.validation_curve[kept - 1], f"at epoch {kept} of {r.n_iter}"

        with shared_draws():
            m, results, _ = choose_among_fits(fit, progress)
        return m, results

    def _store(self, results, *, partial):
        """Set the fitted attributes from the heads' results, at once (the
        benchmarks' hook, ``_profiling``, calls it)."""
        commit(self, self._fitted_attrs(results, partial=partial))

    def _fitted_attrs(self, results, *, partial):
        """The fitted attributes from the heads' results (a dict; nothing is
        set).  ``partial`` counts the epochs on from the fitted model's."""
        # one head's arrays are taken as they are (the fit's own host copies):
        # a model of millions of features is not copied twice more
        W = _stacked([r.state.w[:, 0] for r in results])
        b = np.concatenate([np.asarray(r.state.b).ravel() for r in results])
        V = _stacked([r.state.V for r in results])
        if not self.fit_intercept:
            b = np.zeros_like(b)
        fitted = self._model_attrs(W, b.astype(COMPUTE_DTYPE), V)
        n_iter = max(r.n_iter for r in results)
        curves = [r.loss_curve for r in results if r.loss_curve]
        length = max((len(c) for c in curves), default=0)
        curve = [float(sum(c[min(e, len(c) - 1)] for c in curves)) for e in range(length)]
        if partial and hasattr(self, "n_iter_"):
            fitted["n_iter_"] = int(self.n_iter_) + n_iter
            fitted["loss_curve_"] = list(self.loss_curve_) + curve
        else:
            fitted["n_iter_"] = int(n_iter)
            fitted["loss_curve_"] = curve
        fitted.update(validation_attrs(results))
        fitted["_optimizer_state"] = (
            [optimizer_arrays(r.state) for r in results]
            if self._epoch_solver() == "adagrad"
            else None
        )
        return fitted

    def _public_arrays(self):
        return (self.coef_, self.intercept_, self.factors_)


@_fm_doc
class GPUFactorizationMachine(ClassifierMixin, _WideClassifierMixin, _BaseFM):
    """Factorization machine classifier (order 2, logistic loss).

    Models the log-odds of the positive class as::

        f(x) = intercept + <coef, x> + sum_{j < k} <factors_j, factors_k> x_j x_k

    trained by cuWide's mini-batch solvers on the GPU (on the CPU without
    one), in float32; float64 input is accepted, and the fitted arrays are
    float32.  The model is binary at
    its core: with more than two classes one FM per class is trained
    one-vs-rest (sharing one training layout), and ``predict_proba``
    normalises their probabilities so that each row sums to 1.

    A fit that diverges (a loss, a parameter or an Adagrad sum that is not
    finite) raises a ``ValueError`` saying what to do, and one whose loss
    ends far above a constant prediction's warns a ``ConvergenceWarning``.
    A fit that fails or is interrupted leaves the estimator as it was
    before.

    Parameters
    ----------
    %(fm_params)s
    %(class_weight)s

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features), float32
        Linear weights (one row for a binary problem, for ``classes_[1]``;
        one row per class one-vs-rest otherwise).
    intercept_ : ndarray of shape (1,) or (n_classes,), float32
        Intercepts.
    factors_ : ndarray of shape (n_features, n_factors) or \
(n_classes, n_features, n_factors), float32
        The factor vectors of the features (per class one-vs-rest when
        there are more than two classes).
    n_iter_ : int
        Epochs run (the most over the classes one-vs-rest), the epochs after
        the best one included.
    loss_curve_ : list of float
        Mean training loss of each epoch (one-vs-rest: the sum over the
        classes).
    validation_score_ : ndarray of shape (n_epochs,)
        With early stopping, the negative mean validation loss of each
        epoch run (higher is better, as scikit-learn's HistGradientBoosting
        records it; one-vs-rest: the sum over the classes); empty without
        it.
    best_iteration_ : int or None
        With early stopping, the epoch whose model was kept (the one of
        least validation loss; one-vs-rest: each class keeps its own, this
        is the latest); None without it.
    penalty_multiplier_ : float
        The factor both "auto" penalties were multiplied by: chosen among
        1, 3, 10 and 30 by a binary fit of 2,000 to 100,000 rows whose
        ``alpha``, ``beta`` and ``early_stopping`` are ``"auto"``, by the
        least held-out log loss: below 10,000 rows on a stratified fifth of
        its rows, each trained on the other four fifths, before the fit of
        all rows; from 10,000 rows on early stopping's validation split, the
        fit of least validation loss kept (:doc:`/design/defaults`). Kept by
        ``warm_start`` and ``partial_fit``; 1 otherwise.
    device_ : str
        The device the model was fitted on, ``"cpu"`` or ``"cuda:N"``.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of the features seen during fit (only when ``X`` has string
        column names).

    See Also
    --------
    GPUFactorizationMachineRegressor : The same model with squared loss.
    GPULogisticRegression : The linear model alone.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy import sparse
    >>> from sklearn_cuwide import GPUFactorizationMachine
    >>> rng = np.random.default_rng(0)
    >>> X = sparse.random(200, 20, density=0.2, format="csr", random_state=0)
    >>> y = rng.integers(0, 2, size=200)
    >>> fm = GPUFactorizationMachine(n_factors=4, max_iter=5, tol=None, random_state=0,
    ...                              device="cpu").fit(X, y)
    >>> fm.factors_.shape
    (20, 4)
    >>> fm.predict_proba(X[:3]).shape
    (3, 2)
    """

    _loss = "logistic"

    _parameter_constraints: dict = {
        **_BaseFM._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }

    def __init__(
        self,
        *,
        n_factors=8,
        alpha="auto",
        beta="auto",
        scale_penalty="auto",
        fit_linear=True,
        fit_intercept=True,
        init_scale=0.01,
        solver="adagrad",
        batch_size=1024,
        learning_rate="auto",
        max_iter=100,
        tol=1e-4,
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=5,
        shuffle=True,
        warm_start=False,
        random_state=None,
        device="auto",
        verbose=0,
        concurrency="auto",
        class_weight=None,
    ):
        self._set_fm_params(locals())

    def _intercept_init(self, t, sw):
        return logit_prior(t, sw)

    def _targets(self, y_idx, classes=None):
        K = (self.classes_ if classes is None else classes).size
        if K == 2:
            return [(y_idx == 1)]
        return [(y_idx == k) for k in range(K)]

    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def fit(self, X, y, sample_weight=None):
        """Fit the factorization machine.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data; CSR is used as it is.
        y : array-like of shape (n_samples,)
            Class labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the samples.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        progress = FitProgress(self.verbose)
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            X, y, sw, scans = _check_fit_data(self, X, y, sample_weight, reset=True,
                                              backend=backend, plan=False, defer_scans=True)
            classes, y_idx = self._fit_classes(y)
            _plan_fit(self, X, y, backend, True, n_classes=classes.size)
            sw = self._weights(classes, y, sw, sample_weight)
            progress.stage("input checks")
            n_heads = 1 if classes.size == 2 else classes.size
            warm = self._continued_states(X.shape[1], n_heads, classes)
            targets = self._targets(y_idx, classes)
            multiplier, results = self._chosen_fit(X, targets, sw, y_idx, warm, backend,
                                                   progress, scans)
            commit(self, {"classes_": classes, "device_": device_,
                          "penalty_multiplier_": float(multiplier),
                          **self._fitted_attrs(results, partial=False)})
            self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over ``X``, continuing from the current model.

        The classes, the number of features and ``n_factors`` cannot change
        between calls (a ``ValueError`` says so); ``class_weight="balanced"``
        is refused (a part of the data cannot balance the classes).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        classes : array-like of shape (n_classes,), default=None
            All the classes; required on the first call, whose rows' class
            rates start the intercept (at 0 where they lack a class).
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        progress = FitProgress(self.verbose)
        refuse_balanced_partial_fit(self.class_weight)
        first = not hasattr(self, "classes_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit.")
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            X, y, sw = _check_fit_data(self, X, y, sample_weight, reset=first,
                                       backend=backend)
            self._check_partial_fit_model(X.shape[1])
            # the first call sets classes_ here (restored if the fit fails)
            y_idx = self._partial_fit_classes(y, classes)
            classes = self.classes_
            sw = self._weights(classes, y, sw, sample_weight)
            progress.stage("input checks")
            n_heads = 1 if classes.size == 2 else classes.size
            warm = self._warm_states(X.shape[1], n_heads)
            targets = self._targets(y_idx, classes)
            multiplier, _ = self._penalty_multiplier(X, targets, sw, y_idx, warm, backend,
                                                     partial=True)
            results = self._fit_heads(
                X, targets, sw, backend, warm, stratify=y_idx,
                partial=True, progress=progress, multiplier=multiplier,
            )
            commit(self, {"device_": device_, "penalty_multiplier_": float(multiplier),
                          **self._fitted_attrs(results, partial=True)})
            self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    @staticmethod
    def _model_attrs(W, b, V):
        return {"coef_": W, "intercept_": b, "factors_": V[0] if V.shape[0] == 1 else V}

    def _heads(self):
        if self.factors_.ndim == 2:
            return [(self.coef_[0][:, None], self.intercept_[:1], self.factors_)]
        return [
            (self.coef_[k][:, None], self.intercept_[k : k + 1], self.factors_[k])
            for k in range(self.coef_.shape[0])
        ]


    @staticmethod
    def _multiclass_log_proba(Z):
        # one-vs-rest: each head's probability, normalised over the classes
        L = log_expit(Z)
        return L - logsumexp(L, axis=1, keepdims=True)


# the mini-batch parameters Gibbs sampling ignores
#: solver="mcmc" warns where the weights' mean is below this (see _fit_mcmc)
WEIGHTS_AS_ROWS_LOW = 0.1

_MCMC_UNUSED = ("alpha", "beta", "scale_penalty", "batch_size", "learning_rate", "tol",
                "early_stopping", "validation_fraction", "n_iter_no_change", "shuffle",
                "warm_start", "concurrency")


def _same_param(value, default):
    """Whether a parameter's value is its default (strings, numbers, bools)."""
    if isinstance(default, str) or isinstance(value, str):
        return isinstance(value, str) and value == default
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    return value == default


@partial(_fm_doc, solvers='{"auto", "sgd", "adagrad", "mcmc"}, default="auto"',
         mcmc=_MCMC_DOC)
class GPUFactorizationMachineRegressor(RegressorMixin, _BaseFM):
    """Factorization machine regressor (order 2, squared loss).

    Predicts::

        f(x) = intercept + <coef, x> + sum_{j < k} <factors_j, factors_k> x_j x_k

    trained by cuWide's mini-batch solvers, or by Gibbs sampling
    (``solver="mcmc"``; by default, ``solver="auto"``, where the rows
    outnumber the parameters), on the GPU (on the CPU without one), in
    float32; float64 input is accepted, and the fitted arrays are float32.

    The target is standardised inside the fit (its weighted mean and
    standard deviation; without an intercept, its root mean square alone),
    so that the model does not depend on the units of ``y``: fitting
    ``a * y + c`` predicts ``a`` times the predictions of fitting ``y``, plus
    ``c``.  The fitted attributes are in the units of ``y``.  ``fit`` (or the
    first ``partial_fit`` whose targets vary; parts of equal targets before
    it train on ``y`` as it is) fixes the standardisation; ``partial_fit``
    and a ``warm_start`` fit that continues the model keep it.  ``tol`` compares
    losses of the standardised target (a share of its variance), whatever
    the units of ``y``; ``verbose`` prints the losses in the units of ``y``,
    as ``loss_curve_`` and ``validation_score_`` give them.

    A fit that diverges (a loss, a parameter or an Adagrad sum that is not
    finite) raises a ``ValueError`` saying what to do, and one whose loss
    ends far above a constant prediction's warns a ``ConvergenceWarning``.
    A fit that fails or is interrupted leaves the estimator as it was
    before.

    Parameters
    ----------
    %(fm_params)s

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,), float32
        Linear weights.
    intercept_ : ndarray of shape (1,), float32
        Intercept.
    factors_ : ndarray of shape (n_features, n_factors), float32
        The factor vectors of the features.
    solver_ : str
        The solver that ran (``"auto"`` resolved) in the last ``fit`` or
        ``partial_fit``.
    n_iter_ : int
        Epochs run (``"mcmc"``: sweeps; ``partial_fit`` counts on, from 1
        after a sampled model, as ``loss_curve_`` starts again).
    loss_curve_ : list of float
        Mean training loss (half the squared error, in the units of ``y``
        squared) of each epoch (``"mcmc"``: of each sweep's draw, not of
        the mean model kept).
    validation_score_ : ndarray of shape (n_epochs,)
        With early stopping, the negative mean validation loss (half the
        squared error, in the units of ``y`` squared) of each epoch run
        (higher is better, as scikit-learn's HistGradientBoosting records
        it); empty without it.
    best_iteration_ : int or None
        With early stopping, the epoch whose model was kept (the one of
        least validation loss); None without it.
    penalty_multiplier_ : float
        The factor both "auto" penalties were multiplied by: with ``alpha``,
        ``beta`` and ``early_stopping`` all ``"auto"``, the one of 1, 3, 10
        and 30 with the least held-out squared error: from 2,000 to 10,000
        rows, of four fits of four fifths of the rows scored on the fifth
        left out (then the fit of all rows with it); from 10,000 to 100,000
        rows, of the fits of all rows on early stopping's split, the best
        fit kept; otherwise 1 (and with ``solver="mcmc"``, which has no
        penalties to scale).  ``warm_start`` and ``partial_fit`` keep the
        fitted model's.
    device_ : str
        The device the model was fitted on, ``"cpu"`` or ``"cuda:N"``.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of the features seen during fit (only when ``X`` has string
        column names).

    See Also
    --------
    GPUFactorizationMachine : The same model for classification.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy import sparse
    >>> from sklearn_cuwide import GPUFactorizationMachineRegressor
    >>> X = sparse.random(200, 20, density=0.2, format="csr", random_state=0)
    >>> y = np.asarray(X.sum(axis=1)).ravel()
    >>> fm = GPUFactorizationMachineRegressor(n_factors=4, max_iter=5, tol=None,
    ...                                       random_state=0, device="cpu")
    >>> fm.fit(X, y).predict(X[:3]).shape
    (3,)
    """

    _loss = "squared"
    _parameter_constraints: dict = {
        **_BaseFM._parameter_constraints,
        "solver": [StrOptions({"auto", "sgd", "adagrad", "mcmc"})],
    }

    def __init__(
        self,
        *,
        n_factors=8,
        alpha="auto",
        beta="auto",
        scale_penalty="auto",
        fit_linear=True,
        fit_intercept=True,
        init_scale=0.01,
        solver="auto",
        batch_size=1024,
        learning_rate="auto",
        max_iter=100,
        tol=1e-4,
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=5,
        shuffle=True,
        warm_start=False,
        random_state=None,
        device="auto",
        verbose=0,
        concurrency="auto",
    ):
        self._set_fm_params(locals())

    def _intercept_init(self, t, sw):
        return float(np.dot(sw, t) / sw.sum())

    def _auto_choice(self, X, backend):
        """``solver="auto"``'s ``(solver, why)`` for a ``fit`` of ``X``
        (checked): ``"mcmc"`` where :func:`~sklearn_cuwide._mcmc.suits_mcmc`,
        else ``"adagrad"``, as when ``warm_start`` continues the fitted model
        or a parameter only the mini-batch fit reads is set (``partial_fit``
        takes :meth:`_epoch_solver`'s); ``why`` in words, for ``verbose``."""
        if self.warm_start and hasattr(self, "coef_"):
            return "adagrad", "warm_start continues the fitted model"
        # a step, a penalty or early stopping set by hand asks for the
        # mini-batch fit, the one that reads them
        if self.early_stopping is True:
            return "adagrad", "early_stopping=True"
        for name in ("learning_rate", "alpha", "beta", "scale_penalty"):
            if not _same_param(getattr(self, name), "auto"):
                return "adagrad", f"{name} set"
        if sp.issparse(X) or backend.holds(X):
            nnz = int(X.nnz)
            if nnz > AUTO_MCMC_MAX_NONZEROS:  # no pass over the indices
                return "adagrad", f"{nnz:,} stored entries, over 2**21"
            if X.format == "csc":
                counts = np.diff(np.asarray(X.indptr))
            else:
                X = X.tocsr() if X.format != "csr" else X
                idx = np.asarray(backend.to_host(X.indices), dtype=np.intp)
                if idx.size and (idx.min() < 0 or idx.max() >= X.shape[1]):
                    # unchecked yet: the device's scans raise
                    return "adagrad", "indices out of range"
                counts = np.bincount(idx, minlength=X.shape[1])
        else:
            counts = np.count_nonzero(np.asarray(X), axis=0)
            nnz = int(counts.sum())
        present = int(np.count_nonzero(counts))
        ratio = X.shape[0] / max((self.n_factors + 1) * present, 1)
        why = f"{ratio:.2f} rows per parameter of the {present:,} features present"
        return ("mcmc" if suits_mcmc(X.shape[0], counts, nnz, self.n_factors)
                else "adagrad"), why

    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def fit(self, X, y, sample_weight=None):
        """Fit the factorization machine.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data; CSR is used as it is.
        y : array-like of shape (n_samples,)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the samples.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        progress = FitProgress(self.verbose)
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            # planned once the solver is known (the data choose "auto"'s)
            X, y, sw, scans = _check_fit_data(self, X, y, sample_weight, reset=True,
                                              y_numeric=True, backend=backend,
                                              plan=False, defer_scans=True)
            check_weight_range(sw)
            solver, why = ((self.solver, None) if self.solver != "auto"
                           else self._auto_choice(X, backend))
            _plan_fit(self, X, y, backend, True, solver=solver)
            progress.stage("input checks", why and f"solver {solver!r} ({why})")
            if solver == "mcmc":
                commit(self, {"device_": device_, "solver_": solver,
                              **self._fit_mcmc(X, y, sw, backend, progress, scans)})
                self._set_gpu_cache(backend)
            else:
                warm = self._continued_states(X.shape[1], 1)
                scaling = self._fit_target_scaling(y, sw, continued=warm is not None)
                progress.loss_unit = scaling[1] ** 2  # the lines' losses in y's units
                targets = [_standardise(y, scaling)]
                multiplier, results = self._chosen_fit(X, targets, sw, None, warm, backend,
                                                       progress, scans)
                commit(self, {"device_": device_, "_target_scale_fixed": True,
                              "solver_": solver, "penalty_multiplier_": float(multiplier),
                              **self._fitted_attrs(results, partial=False,
                                                   target_scaling=scaling)})
                self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    def _fit_mcmc(self, X, y, sw, backend, progress, scans):
        """The fitted attributes of ``solver="mcmc"``
        (:func:`~sklearn_cuwide._mcmc.fit_mcmc` on the backend, on the
        standardised target)."""
        # as scikit-learn's LogisticRegression warns of an l1_ratio its
        # penalty ignores: a setting that changes nothing is said once
        # "auto" continues a sampled model with Adagrad: warm_start is used then
        unused = [name for name in _MCMC_UNUSED
                  if not _same_param(getattr(self, name), _MCMC_UNUSED_DEFAULTS[name])
                  and not (name == "warm_start" and self.solver == "auto")]
        if unused:
            one = len(unused) == 1
            chosen = "solver='mcmc'" if self.solver == "mcmc" else (
                "solver='auto' chose 'mcmc', which")
            warn(f"{chosen} does not use {', '.join(unused)}: "
                 f"{'it is' if one else 'they are'} ignored (the mini-batch solvers "
                 f"'adagrad' and 'sgd' read {'it' if one else 'them'}).", UserWarning)
        # a row of weight c counts as c rows: weights normalised to sum to 1
        # leave the evidence of one row, and the priors decide the model
        n_rows = X.shape[0]
        total = float(np.sum(sw))
        if n_rows and total < WEIGHTS_AS_ROWS_LOW * n_rows:
            warn(f"sample_weight sums to {total:.4g} over {n_rows} rows: solver='mcmc' "
                 "counts a row of weight c as c rows, as scikit-learn's weights do, so "
                 f"these weights hold the evidence of {total:.4g} rows and the model may "
                 "end no better than a constant. If the weights are relative, scale "
                 "them to a mean of 1 (sample_weight * n_samples / sample_weight.sum()).",
                 UserWarning)
        if scans is not None:
            scans.on_host()
        scaling = _target_scaling(y, sw, fit_intercept=self.fit_intercept)
        progress.loss_unit = scaling[1] ** 2  # the lines' losses in y's units
        # the values in float32, as every solver takes them (float64 and
        # float32 input fit the same model); the draws are float64
        Xb = backend.put_csr(canonical_csr(X, dtype=COMPUTE_DTYPE))
        target = _standardise(y, scaling)
        t = backend.to_device(target)
        swb = backend.to_device(np.asarray(sw, dtype=np.float64))
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        res = fit_mcmc(backend.xp, Xb.indptr, Xb.indices, Xb.data, t, swb,
                       n_features=X.shape[1], n_factors=self.n_factors,
                       n_sweeps=self.max_iter, init_scale=self.init_scale,
                       fit_intercept=self.fit_intercept, fit_linear=self.fit_linear,
                       random_state=seed, progress=progress, to_host=backend.to_host,
                       block_draw=backend.mcmc_block_draw(
                           int(self.n_factors) + int(self.fit_linear)))
        del Xb, t, swb
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            coef, intercept, factors = _in_user_units(
                res.coef, np.array([res.intercept]), res.factors,
                (scaling[0] if self.fit_intercept else 0.0, scaling[1]))
        bad = [name for name, a in (("coefficients", coef), ("intercept", intercept),
                                    ("factors", factors)) if not np.all(np.isfinite(a))]
        if bad:  # beyond float32's range, in which the model is kept
            raise mcmc_diverged(f"the fitted {' and '.join(bad)} are not finite in float32")
        # worse than a constant without overflowing (a row of huge values):
        # the mini-batch fits' warning, with the mini-batch fits' rule
        base = constant_loss(target, sw, "squared", 1)
        if res.loss_curve and res.loss_curve[-1] > BLOWUP_FACTOR * max(base, 1.0):
            unit = scaling[1] ** 2
            why = ("the sample weights hold the evidence of few rows: scale them to a mean of 1"
                   if total < WEIGHTS_AS_ROWS_LOW * n_rows else
                   f"the features are large or unscaled: {_SCALE_HINT}")
            warn(f"The training loss of the last sweep ended at {res.loss_curve[-1] * unit:.4g}, "
                 f"far above the {base * unit:.4g} of a constant prediction: the model is "
                 f"worse than predicting a constant (solver='mcmc'), usually because {why}.",
                 ConvergenceWarning)
        curve = [c * scaling[1] ** 2 for c in res.loss_curve]
        return {"coef_": coef, "intercept_": intercept, "factors_": factors,
                "n_iter_": int(self.max_iter), "loss_curve_": curve,
                "validation_score_": np.zeros(0), "best_iteration_": None,
                "penalty_multiplier_": 1.0, "_optimizer_state": None,
                "_target_offset": float(scaling[0]), "_target_scale": float(scaling[1]),
                "_target_scale_fixed": True}

    def _partial_fit_available(self):
        # as scikit-learn's MLPRegressor(solver="lbfgs"): no partial_fit at all
        return self.solver != "mcmc"

    def _no_partial_fit(self):
        return (f"This {type(self).__name__} has no attribute 'partial_fit' with "
                "solver='mcmc', whose sweeps draw every parameter from all the rows at "
                "once. Call fit, or use solver='adagrad' or 'sgd' to train part by part "
                "(solver='auto' continues a sampled model with Adagrad).")

    @available_if_explained(_partial_fit_available, _no_partial_fit)
    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over ``X``, continuing from the current model.

        The number of features and ``n_factors`` cannot change between calls
        (a ``ValueError`` says so).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        progress = FitProgress(self.verbose)
        first = not hasattr(self, "coef_")
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            X, y, sw = _check_fit_data(self, X, y, sample_weight, reset=first,
                                       y_numeric=True, backend=backend)
            self._check_partial_fit_model(X.shape[1])
            check_weight_range(sw)
            progress.stage("input checks")
            varied = bool(np.ptp(np.asarray(y)) > 0)
            # the standardisation is fixed by fit, or by the first part whose
            # targets vary: parts of equal targets before it train on y as it is
            fixed = not first and getattr(self, "_target_scale_fixed", True)
            scaling = (self._stored_target_scaling() if fixed
                       else _target_scaling(y, sw, fit_intercept=self.fit_intercept))
            warm = None if first else self._warm_states(
                X.shape[1], 1, scaling=scaling, fresh_sums=not fixed and varied)
            progress.loss_unit = scaling[1] ** 2  # the lines' losses in y's units
            targets = [_standardise(y, scaling)]
            multiplier, _ = self._penalty_multiplier(X, targets, sw, None, warm, backend,
                                                     partial=True)
            results = self._fit_heads(
                X, targets, sw, backend, warm, stratify=None,
                partial=True, progress=progress, multiplier=multiplier,
            )
            # the epochs are counted on from a model the epochs fitted, from 1
            # after a sampled one (whose counts are sweeps)
            on = getattr(self, "solver_", None) != "mcmc"
            commit(self, {"device_": device_, "_target_scale_fixed": fixed or varied,
                          "solver_": self._epoch_solver(),
                          "penalty_multiplier_": float(multiplier),
                          **self._fitted_attrs(results, partial=on,
                                               target_scaling=scaling)})
            self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    @staticmethod
    def _model_attrs(W, b, V):
        return {"coef_": W[0], "intercept_": b, "factors_": V[0]}

    # The target is standardised: the fit trains on (y - offset) / scale and
    # the fitted attributes are in the user's units, so that the model does
    # not depend on the units of y (the steps and the penalties are sized for
    # targets of unit variance).  The offset and scale are fixed by fit (or
    # by the first partial_fit whose targets vary: parts of equal targets
    # before it train on y as it is) and kept while a model is continued.

    def _fit_target_scaling(self, y, sw, *, continued):
        """``(offset, scale)`` of this call: the fitted model's when the call
        continues it, else from ``y`` and ``sw``."""
        if continued:
            return self._stored_target_scaling()
        return _target_scaling(y, sw, fit_intercept=self.fit_intercept)

    def _stored_target_scaling(self):
        # a model fitted without them (the Dask fit) trained on y itself
        return (float(getattr(self, "_target_offset", 0.0)),
                float(getattr(self, "_target_scale", 1.0)))

    def _warm_states(self, n_features, n_heads, scaling=None, fresh_sums=False):
        """The fitted model in the standardised target's units (``scaling``:
        these, default the fitted model's own); ``fresh_sums``: Adagrad's
        sums start again (the units they were summed in are left)."""
        states = super()._warm_states(n_features, n_heads)
        if states is not None:
            offset, scale = self._stored_target_scaling() if scaling is None else scaling
            for st in states:
                st.w[:] = st.w / scale
                st.b[:] = (st.b - offset) / scale
                st.V[:] = st.V / np.sqrt(scale)
                if fresh_sums:
                    for a in (st.gw, st.gV, st.gb):
                        if a is not None:
                            a[...] = 0
        return states

    def _fitted_attrs(self, results, *, partial, target_scaling=(0.0, 1.0)):
        """The fitted attributes in the user's units: the intercept
        ``b * scale + offset``, the linear weights times ``scale``, the
        factors times ``sqrt(scale)`` (the pairwise term is quadratic in
        them); the losses (squared error) times ``scale ** 2``."""
        offset, scale = target_scaling
        n_old = len(self.loss_curve_) if partial and hasattr(self, "loss_curve_") else 0
        fitted = super()._fitted_attrs(results, partial=partial)
        fitted["coef_"], fitted["intercept_"], fitted["factors_"] = _in_user_units(
            fitted["coef_"], fitted["intercept_"], fitted["factors_"],
            (offset if self.fit_intercept else 0.0, scale))
        curve = fitted["loss_curve_"]
        fitted["loss_curve_"] = curve[:n_old] + [c * scale**2 for c in curve[n_old:]]
        fitted["validation_score_"] = fitted["validation_score_"] * scale**2
        fitted["_target_offset"], fitted["_target_scale"] = float(offset), float(scale)
        return fitted

    def _heads(self):
        return [(self.coef_[:, None], self.intercept_, self.factors_)]

    def _device_model_in_user_units(self, w, V):
        # in place: the fit's own arrays, the same float32 products as _in_user_units
        fw, fv = _unit_factors(self._stored_target_scaling()[1])
        w *= fw
        V *= fv
        return w, V

    def predict(self, X):
        """Predicted targets.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._decision(X)[:, 0]


def _stacked(arrays):
    """``np.stack(arrays)`` in float32; a view of the one array when there
    is one (and it is float32)."""
    if len(arrays) == 1:
        return arrays[0][None].astype(COMPUTE_DTYPE, copy=False)
    return np.stack(arrays).astype(COMPUTE_DTYPE, copy=False)


def _target_scaling(y, sw, *, fit_intercept):
    """``(offset, scale)`` that standardise the regressor's target: the
    weighted mean and standard deviation of ``y`` (without an intercept, no
    offset and the root mean square, so that the model keeps no intercept);
    a scale of 1 for a constant target."""
    y = np.asarray(y, dtype=np.float64)
    sw = np.asarray(sw, dtype=np.float64)
    total = float(sw.sum())
    if not total > 0:
        return 0.0, 1.0
    offset = float(np.dot(sw, y) / total) if fit_intercept else 0.0
    scale = float(np.sqrt(np.dot(sw, (y - offset) ** 2) / total))
    if not (np.isfinite(offset) and np.isfinite(scale) and scale > 0):
        return 0.0, 1.0
    return offset, scale


def _target_scaling_from_sums(total, sum_y, sum_y2, *, fit_intercept):
    """:func:`_target_scaling` from the weighted sums ``sum(sw)``,
    ``sum(sw * y)`` and ``sum(sw * y**2)`` (of a data set held in parts)."""
    if not total > 0:
        return 0.0, 1.0
    offset = sum_y / total if fit_intercept else 0.0
    var = max(sum_y2 / total - offset * offset, 0.0)
    scale = float(np.sqrt(var))
    if not (np.isfinite(offset) and np.isfinite(scale) and scale > 0):
        return 0.0, 1.0
    return float(offset), scale


def _in_user_units(w, b, V, scaling):
    """A model ``(w, b, V)`` of the standardised target in the units of ``y``
    (the compute dtype): ``w * scale``, ``b * scale + offset``, ``V *
    sqrt(scale)``; numpy or cupy arrays."""
    offset, scale = scaling
    fw, fv = _unit_factors(scale)
    return ((w * fw).astype(COMPUTE_DTYPE, copy=False),
            (b.astype(np.float64) * scale + offset).astype(COMPUTE_DTYPE),
            (V * fv).astype(COMPUTE_DTYPE, copy=False))


def _unit_factors(scale):
    """The compute-dtype factors that take ``w`` and ``V`` of the
    standardised target to the units of ``y``: ``scale`` and
    ``sqrt(scale)`` (the pairwise term is quadratic in ``V``)."""
    return COMPUTE_DTYPE(scale), COMPUTE_DTYPE(np.sqrt(scale))


def _standardise(y, scaling):
    offset, scale = scaling
    return (np.asarray(y, dtype=np.float64) - offset) / scale


# their defaults, the regressor's signature's
_MCMC_UNUSED_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(GPUFactorizationMachineRegressor.__init__).parameters.items()
    if name in _MCMC_UNUSED}
