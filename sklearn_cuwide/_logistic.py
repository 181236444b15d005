"""GPULogisticRegression: a drop-in for scikit-learn's LogisticRegression."""

import math
from dataclasses import replace
from numbers import Integral, Real

import numpy as np
from scipy.special import log_softmax
from sklearn.base import ClassifierMixin, _fit_context
from sklearn.utils._param_validation import Hidden, Interval, InvalidParameterError, StrOptions

from ._base import (
    available_if_explained,
    _SHARED_PARAMETER_CONSTRAINTS,
    _check_fit_data,
    _CuWideEstimator,
    _fit_device,
    _plan_fit,
    _schedule,
    _WideClassifierMixin,
    commit,
    dense_enough,
    model_words,
    refuse_balanced_partial_fit,
    releases_memory,
    restore_on_failure,
    warm_start_mismatch,
)
from ._minibatch import (
    COMPUTE_DTYPE,
    auto_learning_rate,
    fit_heads,
    logit_prior,
    optimizer_arrays,
    restore_accumulators,
    validation_attrs,
)
from ._penalty_choice import C_CHOICES, c_choice_mode, choice_seeds, choose_among_fits
from ._penalty_choice import choose_penalty_multiplier
from ._solvers import fit_lbfgs_linear
from ._sparse import canonical_csr
from ._state import FitProgress, ModelState, StepParams
from ._warn import warn

__all__ = ["GPULogisticRegression"]

def _choice_part(progress, c):
    """The log of the ``C`` choice's fit at ``c``: a part of the fit's own
    (its lines marked with ``c``), or silent without one."""
    return FitProgress(0) if progress is None else progress.part(f"[C {c:g}] ")


def _is_minibatch(est):
    return est.solver != "lbfgs"


#: scikit-learn's LogisticRegression solvers that have no namesake here,
#: and what they are there
_SKLEARN_ONLY_SOLVERS = {
    "liblinear": "coordinate descent (LIBLINEAR)",
    "saga": "incremental stochastic gradient (SAGA)",
    "sag": "incremental stochastic gradient (SAG)",
    "newton-cg": "Newton conjugate gradient",
    "newton-cholesky": "Newton with Cholesky solves",
}


def _partial_fit_needs_minibatch(est):
    return (
        f"This {type(est).__name__} has no attribute 'partial_fit' with "
        f"solver={est.solver!r}: lbfgs fits the whole data at once. partial_fit "
        "trains one epoch at a time with the mini-batch solvers: set "
        "solver='sgd' or solver='adagrad' (e.g. "
        f"{type(est).__name__}(solver='adagrad'))."
    )


class GPULogisticRegression(ClassifierMixin, _WideClassifierMixin, _CuWideEstimator):
    """Logistic regression on sparse data, on a GPU when there is one.

    A drop-in for :class:`sklearn.linear_model.LogisticRegression`: the same
    objective, parameter names and fitted attributes, plus cuWide's
    mini-batch solvers.  Binary problems fit one logistic model; multiclass
    problems a multinomial (softmax) model, as scikit-learn does.

    The model minimises, with ``s`` the sample weights (times the class
    weights) and ``S = sum(s)``::

        1 / S * sum_i s_i * loss(y_i, X_i W + b)
            + (1 - l1_ratio) / (2 C S) * ||W||_2^2 + l1_ratio / (C S) * ||W||_1

    Computation is in float32 (what the GPU runs; ``"lbfgs"`` accumulates in
    float64); float64 input is accepted.  The fitted arrays (``coef_``,
    ``intercept_``) are float32 whatever the solver.

    A fit that diverges (a loss, a coefficient or an Adagrad sum that is
    not finite) raises a ``ValueError`` saying what to do; a mini-batch fit
    whose loss ends far above a constant prediction's, or an L-BFGS fit
    that stops short of ``tol``, warns a ``ConvergenceWarning``.  A fit
    that fails or is interrupted leaves the estimator as it was before.

    Parameters
    ----------
    penalty : {"l1", "l2", "elasticnet"} or None, default="deprecated"
        Deprecated in scikit-learn 1.8 and accepted here the way it is there:
        leave it alone and use ``l1_ratio`` and ``C`` (``C=np.inf`` for no
        penalty).  When given it wins over ``l1_ratio`` (``"elasticnet"``
        uses ``l1_ratio``) and a ``FutureWarning`` is issued.
    C : float or "auto", default="auto"
        Inverse of the regularisation strength; ``np.inf`` for none.
        ``"auto"``: scikit-learn's 1.0 for ``"lbfgs"`` (the same objective as
        scikit-learn's ``LogisticRegression()``); for the mini-batch solvers,
        a binary fit of 2,000 to 100,000 rows with ``early_stopping="auto"``
        chooses it among 0.03, 0.1, 0.3, 1, 3, 10 and 30 by held-out log
        loss, as the factorization machine chooses its penalty: on a fifth
        of its rows held out below 10,000 rows (then the fit of all rows),
        else on early stopping's validation split, the best of the seven fits
        kept; other mini-batch fits take 1.0 (the defaults study,
        :doc:`/design/defaults`).  ``C_`` is the value used.
    l1_ratio : float in [0, 1], default=0.0
        Elastic-net mixing: 0 is L2, 1 is L1.  The L1 part needs a mini-batch
        solver (proximal steps); ``"lbfgs"`` raises a ``ValueError`` as
        scikit-learn's does.
    fit_intercept : bool, default=True
        Fit an unregularised intercept.
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` as
        scikit-learn's LogisticRegression does.
    tol : float or None, default=1e-4
        ``"lbfgs"``: stop when the largest gradient entry is at most ``tol``.
        Mini-batch solvers: with early stopping, stop when the least
        validation loss of the last ``n_iter_no_change`` epochs is not
        ``tol`` below the least of the epochs before them; without, when
        the training loss has not improved by ``tol`` for
        ``n_iter_no_change`` epochs.  ``None``: no such rule;
        ``max_iter`` epochs, or for L-BFGS at most ``max_iter`` iterations
        (it also ends where the objective no longer decreases: a relative
        decrease below 64 machine epsilons, or a line search that finds no
        lower point), without a ``ConvergenceWarning`` for reaching
        ``max_iter``.
    max_iter : int, default=100
        Most L-BFGS iterations, or most epochs of a mini-batch solver: at
        least 1 for them (as scikit-learn's SGDClassifier); ``"lbfgs"``
        accepts 0 as scikit-learn's LogisticRegression does (the starting
        model, with a ``ConvergenceWarning``).
    warm_start : bool, default=False
        Start from the previous fit's coefficients (and Adagrad's
        accumulators). Data of other features or classes raise a
        ``ValueError``, as scikit-learn's warm starts do.
    random_state : int, RandomState instance or None, default=None
        Seeds the row shuffling, the epoch order and the validation split of
        the mini-batch solvers (``"lbfgs"`` is deterministic).
    verbose : int, default=0
        Above 0, print one line per setup stage (input checks, the layout,
        the initial state, ...) with its time, then one per epoch (loss,
        validation loss) or per L-BFGS iteration, with the samples per second
        over the whole fit so far.
    solver : {"lbfgs", "sgd", "adagrad"}, default="lbfgs"
        ``"lbfgs"``: full batch, the same optimum as scikit-learn's
        LogisticRegression for the same ``C``.  ``"sgd"`` and ``"adagrad"``:
        cuWide's mini-batch solvers over the tiled layout.
    batch_size : int, default=1024
        Rows per mini-batch (mini-batch solvers).
    learning_rate : "auto" or float, default="auto"
        Step size of the mini-batch solvers.  ``"auto"``: 0.1 for
        ``"adagrad"``; for ``"sgd"``, ``1 / L`` with ``L`` the Lipschitz
        constant of the full-batch gradient, estimated from ``X`` by a few
        power iterations (large steps on one-hot click data, small ones on
        dense correlated data), and at least the largest share of one row's
        ``|x|^2`` in its mini-batch, so that no long row alone makes a step
        diverge.
    shuffle : bool, default=True
        Shuffle the rows once and the order of the mini-batches every epoch.
    early_stopping : "auto" or bool, default="auto"
        Mini-batch solvers: hold out ``validation_fraction`` of the training
        data (stratified), stop when its loss stops improving, and keep the
        model of the epoch of least validation loss (not the last epoch's).
        ``"auto"``: on from 10,000 training rows (as scikit-learn's
        ``HistGradientBoostingClassifier``), and off with ``"lbfgs"``, for
        which ``True`` raises a ``ValueError``.  ``partial_fit`` ignores it.
    validation_fraction : float in (0, 1), default=0.1
        Share of the training data held out for early stopping.
    n_iter_no_change : int, default=5
        Epochs without improvement by ``tol`` before stopping (mini-batch
        solvers).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where to fit: ``"auto"`` uses the first usable GPU, else the CPU;
        ``"cuda"`` without a usable GPU raises.
    concurrency : "auto", "max" or int, default="auto"
        Mini-batches trained at once on the GPU (workers updating the model
        without locks, Hogwild; few workers are clusters of up to 8 thread
        blocks each).  ``"auto"``: as many as converge as
        well as the sequential order for this solver, as measured (the full
        grid for ``"adagrad"``, whose steps on the features that many
        workers update at once are damped, 1 for ``"sgd"``); ``"max"``: every thread
        block the device runs at once (fastest; ``"sgd"`` then loses
        accuracy); an int ``P``: at most ``P``, and ``1`` applies the
        mini-batches strictly in order as the CPU does.  The CPU always runs
        in order; ``"lbfgs"`` ignores it.  See :ref:`reproducibility`.
    dual : bool, default=False
        scikit-learn's ``LogisticRegression`` parameter, accepted so that its
        code runs unchanged: the dual formulation belongs to its
        ``"liblinear"`` solver; every solver here solves the primal problem
        (the same model), and ``True`` raises a ``ValueError``.
    intercept_scaling : float, default=1.0
        scikit-learn's parameter, accepted as it is there and, as there with
        every solver but ``"liblinear"``, without effect: the intercept is
        not penalised.
    n_jobs : int or None, default=None
        scikit-learn's parameter, accepted, without effect as there (since
        scikit-learn 1.8): the work runs on the device, or on the CPU
        backend's BLAS threads.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features), float32
        Coefficients (one row for a binary problem, for ``classes_[1]``).
    intercept_ : ndarray of shape (1,) or (n_classes,), float32
        Intercepts (zeros when ``fit_intercept=False``).
    C_ : float
        The ``C`` the fit used (``C`` itself, or the one ``"auto"`` gave).
    n_iter_ : ndarray of shape (1,)
        L-BFGS iterations, or epochs run by a mini-batch solver.
    loss_curve_ : list of float
        The objective after each L-BFGS iteration, or the mean training loss
        of each epoch.
    validation_score_ : ndarray of shape (n_epochs,)
        With early stopping, the negative mean validation loss of each
        epoch run (higher is better, as scikit-learn's HistGradientBoosting
        records it); empty without it.
    best_iteration_ : int or None
        With early stopping, the epoch whose model was kept (the one of
        least validation loss); None without it.
    device_ : str
        The device the model was fitted on, ``"cpu"`` or ``"cuda:N"``.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of the features seen during fit (only when ``X`` has string
        column names).

    See Also
    --------
    sklearn.linear_model.LogisticRegression : The CPU reference.
    GPUFactorizationMachine : Adds pairwise interactions of the features.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy import sparse
    >>> from sklearn_cuwide import GPULogisticRegression
    >>> X = sparse.csr_matrix(np.array([[1., 0.], [0., 1.], [1., 1.], [0., 0.]]))
    >>> y = np.array([1, 0, 1, 0])
    >>> clf = GPULogisticRegression(C=10.0, device="cpu").fit(X, y)
    >>> clf.predict(X)
    array([1, 0, 1, 0])
    >>> clf.predict_proba(X).shape
    (4, 2)
    """

    _parameter_constraints: dict = {
        "penalty": [
            StrOptions({"l1", "l2", "elasticnet"}),
            None,
            Hidden(StrOptions({"deprecated"})),
        ],
        "C": [Interval(Real, 0, None, closed="right"), StrOptions({"auto"})],
        "l1_ratio": [Interval(Real, 0, 1, closed="both"), None],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "tol": [Interval(Real, 0, None, closed="left"), None],
        # scikit-learn's other solvers pass here so that the fit can say
        # which of ours does their work
        "solver": [StrOptions({"lbfgs", "sgd", "adagrad"}),
                   Hidden(StrOptions(set(_SKLEARN_ONLY_SOLVERS)))],
        "dual": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "n_jobs": [Integral, None],
        **_SHARED_PARAMETER_CONSTRAINTS,
    }

    def __init__(
        self,
        penalty="deprecated",
        *,
        C="auto",
        l1_ratio=0.0,
        fit_intercept=True,
        class_weight=None,
        tol=1e-4,
        max_iter=100,
        warm_start=False,
        random_state=None,
        verbose=0,
        solver="lbfgs",
        batch_size=1024,
        learning_rate="auto",
        shuffle=True,
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=5,
        device="auto",
        concurrency="auto",
        dual=False,
        intercept_scaling=1.0,
        n_jobs=None,
    ):
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.class_weight = class_weight
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose
        self.solver = solver
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.device = device
        self.concurrency = concurrency
        self.dual = dual
        self.intercept_scaling = intercept_scaling
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------
    # parameters
    # ------------------------------------------------------------------
    def _regularization(self):
        """``(C, l1_ratio)`` after resolving ``penalty`` as scikit-learn does
        (``C="auto"`` as 1.0: :meth:`_chosen_minibatch_attrs` may choose
        another)."""
        C = 1.0 if isinstance(self.C, str) else float(self.C)
        l1_ratio = self.l1_ratio
        if self.penalty == "deprecated":
            if l1_ratio is None:
                warn(
                    "'l1_ratio=None' is deprecated (as in scikit-learn 1.8); use "
                    "0 <= l1_ratio <= 1 instead. Using l1_ratio=0.",
                    FutureWarning,
                )
                l1_ratio = 0.0
            return C, float(l1_ratio)
        warn(
            "'penalty' is deprecated (as in scikit-learn 1.8). Leave it at its "
            "default and use l1_ratio=0 instead of penalty='l2', l1_ratio=1 "
            "instead of penalty='l1', 0 < l1_ratio < 1 instead of "
            "penalty='elasticnet', and C=np.inf instead of penalty=None.",
            FutureWarning,
        )
        if self.penalty is None:
            return math.inf, 0.0
        if self.penalty == "l2":
            return C, 0.0
        if self.penalty == "l1":
            return C, 1.0
        if l1_ratio is None:
            raise ValueError("l1_ratio must be specified when penalty is elasticnet.")
        return C, float(l1_ratio)

    # ------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def fit(self, X, y, sample_weight=None):
        """Fit the model on training data.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data; CSR is used as it is (CSC and COO are converted).
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
        C, l1_ratio = self._regularization()
        self._check_solver_options(C, l1_ratio)
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            X, y, sw, scans = _check_fit_data(self, X, y, sample_weight, reset=True,
                                              backend=backend, plan=False, defer_scans=True)
            classes, y_idx = self._fit_classes(y)
            _plan_fit(self, X, y, backend, True, n_classes=classes.size)
            sw = self._weights(classes, y, sw, sample_weight)
            progress.stage("input checks")
            warm = self._warm_arrays(X.shape[1], classes)
            C = self._continued_c(C, warm)
            if self.solver == "lbfgs":
                fitted = self._lbfgs_attrs(X, y_idx, sw, C, backend, warm, classes,
                                           progress, scans)
                fitted["C_"], results = C, None
            else:
                fitted, results = self._chosen_minibatch_attrs(
                    X, y_idx, sw, C, l1_ratio, backend, warm, classes, progress, scans)
            commit(self, {"classes_": classes, "device_": device_, **fitted})
            self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    def _continued_c(self, C, warm):
        """``C``, or where ``C="auto"`` continues a fitted model (``warm``:
        ``warm_start`` or ``partial_fit``) the ``C_`` it was fitted with: a
        continued fit keeps its objective."""
        if warm is not None and isinstance(self.C, str) and hasattr(self, "C_"):
            return float(self.C_)
        return C

    def _chosen_minibatch_attrs(self, X, y_idx, sw, C, l1_ratio, backend, warm, classes,
                                progress, scans=None):
        """``(fitted, results)`` of a mini-batch ``fit``, ``C_`` among them:
        at ``C``, or at the ``C`` that ``C="auto"`` chooses
        (:func:`~sklearn_cuwide._penalty_choice.c_choice_mode`), by the fits
        of :meth:`_minibatch_attrs`, which share one seed.  ``scans``: the
        input's :class:`~sklearn_cuwide._base.DeferredScans`, or None."""
        D = 1 if classes.size == 2 else classes.size
        mode = None
        if math.isfinite(C):  # penalty=None (C = inf) has nothing to choose
            mode = c_choice_mode(self.C, self.solver, self.early_stopping, y_idx, D, warm)
        if mode is None:
            fitted, results = self._minibatch_attrs(X, y_idx, sw, C, l1_ratio, backend, warm,
                                                    classes, partial=False,
                                                    progress=progress, scans=scans)
            fitted["C_"] = C
            return fitted, results
        if scans is not None:  # the choice's fits read rows of X
            scans.on_host()
        split_seed, fit_seed = choice_seeds(self.random_state)

        def fit(Xs, yi, s, c, part=True):
            return self._minibatch_attrs(
                Xs, yi, s, c, l1_ratio, backend, None, classes, partial=False,
                progress=_choice_part(progress, c) if part else progress,
                random_state=fit_seed)

        if mode == "held_out":
            def fit_part(Xs, t, s, strat, c):
                fitted, _ = fit(Xs, np.asarray(t, dtype=np.intp), s, c)
                return fitted

            def decision(Xs, fitted):
                Xs = Xs.get() if hasattr(Xs, "get") else Xs  # a cupyx matrix's rows
                return Xs @ fitted["coef_"][0].astype(np.float64) + fitted["intercept_"][0]

            C, _ = choose_penalty_multiplier(
                fit_part, decision, X, np.asarray(y_idx, dtype=np.float64), sw, y_idx,
                split_seed, backend, progress, loss="logistic", values=C_CHOICES, name="C")
            fitted, results = fit(X, y_idx, sw, C, part=False)
        else:
            def fit_all(c):
                fitted, results = fit(X, y_idx, sw, c)
                r = results[0]
                if not r.validation_curve:  # a split without weight on a side
                    return (fitted, results), float("inf"), "(no validation split)"
                kept = r.best_iteration if r.best_iteration else len(r.validation_curve)
                if c != C_CHOICES[-1]:  # it may be held while the next fits run
                    results = [q.on_host() for q in results]
                return ((fitted, results), r.validation_curve[kept - 1],
                        f"at epoch {kept} of {r.n_iter}")

            C, (fitted, results), _ = choose_among_fits(fit_all, progress, values=C_CHOICES,
                                                         name="C")
        if progress is not None:
            progress.stage(f"C choice (C {C:g})")
        fitted["C_"] = C
        return fitted, results

    def _check_solver_options(self, C, l1_ratio):
        """The parameters the chosen solver cannot honour: an error that says
        which solver can."""
        if self.solver in _SKLEARN_ONLY_SOLVERS:
            raise InvalidParameterError(
                f"The 'solver' parameter of {type(self).__name__} must be a str among "
                f"{{'lbfgs', 'sgd', 'adagrad'}}. Got {self.solver!r}: scikit-learn's "
                f"{_SKLEARN_ONLY_SOLVERS[self.solver]}. Use solver='lbfgs' for the same "
                "optimum of an L2 (or no) penalty, or solver='adagrad' for an L1 or "
                "elastic-net penalty (l1_ratio > 0) and for mini-batches."
            )
        if self.dual:
            raise ValueError(
                "dual=True is the dual formulation of scikit-learn's 'liblinear' "
                f"solver; {type(self).__name__} solves the primal problem (the same "
                "model) with every solver. Leave dual=False."
            )
        if self.solver == "lbfgs" and l1_ratio > 0 and math.isfinite(C):
            penalty = "l1" if l1_ratio == 1 else "elasticnet"
            raise ValueError(
                f"Solver lbfgs supports only 'l2' or None penalties, got {penalty} "
                "penalty (l1_ratio > 0). Use solver='sgd' or solver='adagrad' "
                "for an L1 or elastic-net penalty."
            )
        if self.solver == "lbfgs" and self.early_stopping is True:
            raise ValueError(
                "early_stopping=True needs a mini-batch solver: lbfgs minimises "
                "the objective over the whole data and stops at tol. Set "
                "solver='sgd' or solver='adagrad' to stop on a held-out part, or "
                "early_stopping=False."
            )
        if self.solver != "lbfgs" and self.max_iter < 1:
            raise InvalidParameterError(
                f"The 'max_iter' parameter of {type(self).__name__} must be an int "
                f"in the range [1, inf) with solver={self.solver!r} (the epochs, "
                f"as scikit-learn's SGDClassifier); got {self.max_iter!r}. Only "
                "solver='lbfgs' accepts max_iter=0."
            )

    @available_if_explained(_is_minibatch, _partial_fit_needs_minibatch)
    @_fit_context(prefer_skip_nested_validation=True)
    @releases_memory
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch of the mini-batch solver over ``X`` (``"sgd"``, ``"adagrad"``).

        Continues from the current model (and Adagrad's accumulators).  The
        regularisation of this call uses the total sample weight of ``X``.
        Only with ``solver="sgd"`` or ``"adagrad"``: with ``"lbfgs"`` the
        estimator has no ``partial_fit`` (an ``AttributeError`` says so).
        The classes and the number of features cannot change between calls.

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
        C, l1_ratio = self._regularization()
        first = not hasattr(self, "classes_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit.")
        with restore_on_failure(self):
            device_, backend = _fit_device(self.device, X)
            X, y, sw = _check_fit_data(self, X, y, sample_weight, reset=first,
                                       backend=backend)
            # the first call sets classes_ here (restored if the fit fails)
            y_idx = self._partial_fit_classes(y, classes)
            classes = self.classes_
            sw = self._weights(classes, y, sw, sample_weight)
            progress.stage("input checks")
            warm = self._warm_arrays(X.shape[1], classes, force=True)
            C = self._continued_c(C, warm)
            fitted, results = self._minibatch_attrs(X, y_idx, sw, C, l1_ratio, backend, warm,
                                                    classes, partial=True, progress=progress)
            fitted["C_"] = C
            commit(self, {"device_": device_, **fitted})
            self._set_gpu_cache(backend, results)
        progress.finish(device=self.device_)
        return self

    def _warm_arrays(self, n_features, classes, force=False):
        """``(coef, intercept, accumulators)`` to start from, or None: with
        ``warm_start`` (or ``force``, ``partial_fit``'s, whose data were
        checked against the model) and a fitted model.  A ``warm_start`` fit
        whose features or classes differ from the model's raises
        (:func:`~sklearn_cuwide._base.warm_start_mismatch`)."""
        if not (self.warm_start or force) or not hasattr(self, "coef_"):
            return None
        n_out = 1 if classes.size == 2 else classes.size
        if self.coef_.shape != (n_out, n_features) or not np.array_equal(
            self.classes_, classes
        ):
            if force:
                return None
            raise warm_start_mismatch(model_words(self.coef_.shape[1], self.classes_),
                                      model_words(n_features, classes))
        return self.coef_, self.intercept_, getattr(self, "_optimizer_state", None)

    def _lbfgs_attrs(self, X, y_idx, sw, C, backend, warm, classes, progress, scans=None):
        """The fitted attributes of an L-BFGS fit (a dict; nothing is set);
        ``scans``: the input's :class:`~sklearn_cuwide._base.DeferredScans`,
        made on its device copy, or None."""
        n_classes = classes.size
        D = 1 if n_classes == 2 else n_classes
        if backend.name == "cpu" and dense_enough(X):
            # the CPU's products of a mostly nonzero dense X: BLAS, not CSR
            Xc = np.asarray(X, dtype=COMPUTE_DTYPE)
        else:
            Xc = backend.put_csr(canonical_csr(X, COMPUTE_DTYPE))
        if scans is not None:
            scans.on_device(backend, Xc.indices, Xc.data)
        coef, intercept, n_iter, curve = fit_lbfgs_linear(
            Xc,
            y_idx.astype(np.float64),
            sw,
            loss="logistic" if D == 1 else "multinomial",
            n_outputs=D,
            C=C,
            fit_intercept=self.fit_intercept,
            max_iter=self.max_iter,
            tol=self.tol,
            backend=backend,
            coef_init=None if warm is None else warm[0],
            intercept_init=None if warm is None else warm[1],
            verbose=self.verbose,
            progress=progress,
        )
        return {
            "coef_": np.asarray(coef, dtype=COMPUTE_DTYPE),
            "intercept_": np.asarray(intercept, dtype=COMPUTE_DTYPE),
            "n_iter_": np.array([n_iter], dtype=np.int32),
            "loss_curve_": [float(v) for v in curve],
            "_optimizer_state": None,
            **validation_attrs([]),
        }

    def _minibatch_attrs(self, X, y_idx, sw, C, l1_ratio, backend, warm, classes, *,
                         partial, progress=None, random_state=None, scans=None):
        """``(fitted, results)``: the fitted attributes of a mini-batch fit (a
        dict; nothing is set) and its :class:`~sklearn_cuwide._minibatch.HeadResult` list.
        ``scans``: the input's :class:`~sklearn_cuwide._base.DeferredScans`, or None.
        ``random_state``: in place of the estimator's (a choice's shared seed)."""
        n_features = X.shape[1]
        D = 1 if classes.size == 2 else classes.size
        loss = "logistic" if D == 1 else "multinomial"
        adagrad = self.solver == "adagrad"

        def make_params(X, sw_train, rows, left_out=None):
            S = float(sw_train.sum())
            l2_w, l1 = 0.0, 0.0
            if math.isfinite(C):
                l2_w, l1 = (1.0 - l1_ratio) / (C * S), l1_ratio / (C * S)
            return StepParams(
                model="linear", loss=loss, solver=self.solver,
                learning_rate=(float(self.learning_rate) if self.learning_rate != "auto"
                               else auto_learning_rate(self.solver, X, sw_train,
                                                       loss=loss, backend=backend,
                                                       fit_intercept=self.fit_intercept,
                                                       batch_size=self.batch_size,
                                                       rows=rows)),
                l2_w=l2_w, l1=l1, fit_intercept=self.fit_intercept,
                # C defines scikit-learn's full objective: every feature is
                # penalised per epoch as its stochastic gradient would be
                penalty_scaled=True,
            )

        def init_state(_, t, sw_train, seed):
            state = ModelState.zeros(n_features, D, adagrad=adagrad, dtype=COMPUTE_DTYPE)
            if self.fit_intercept:
                state.b[:] = _intercept_prior(t, sw_train, D)
            return state

        warm_states = None
        if warm is not None:
            state = ModelState.zeros(n_features, D, adagrad=adagrad, dtype=COMPUTE_DTYPE)
            state.w[:] = np.asarray(warm[0]).T
            state.b[:] = warm[1]
            warm_states = [restore_accumulators(state, warm[2])]
        schedule = _schedule(self, partial=partial)
        if random_state is not None:
            schedule = replace(schedule, random_state=random_state)
        (res,) = fit_heads(
            X, [y_idx], sw, backend=backend, schedule=schedule,
            n_outputs=D, n_factors=0, make_params=make_params, init_state=init_state,
            warm=warm_states, stratify=y_idx, progress=progress, partial=partial,
            scans=scans,
        )
        fitted = {
            "coef_": np.ascontiguousarray(res.state.w.T, dtype=COMPUTE_DTYPE),
            "intercept_": (np.array(res.state.b, dtype=COMPUTE_DTYPE)
                           if self.fit_intercept else np.zeros(D, dtype=COMPUTE_DTYPE)),
            "_optimizer_state": optimizer_arrays(res.state) if adagrad else None,
        }
        if partial and hasattr(self, "n_iter_"):
            fitted["n_iter_"] = self.n_iter_ + res.n_iter
            fitted["loss_curve_"] = list(self.loss_curve_) + res.loss_curve
        else:
            fitted["n_iter_"] = np.array([res.n_iter], dtype=np.int32)
            fitted["loss_curve_"] = res.loss_curve
        fitted.update(validation_attrs([res]))
        return fitted, [res]

    # ------------------------------------------------------------------
    # predict
    # ------------------------------------------------------------------
    def _public_arrays(self):
        return (self.coef_, self.intercept_)

    def _heads(self):
        return [(self.coef_.T, self.intercept_, None)]

    @staticmethod
    def _multiclass_log_proba(Z):
        return log_softmax(Z, axis=1)  # multinomial



def _intercept_prior(y_idx, sw, n_outputs):
    """Intercepts of the weighted class prior (the model with zero weights);
    a class with no weight in the rows starts at the present classes' mean
    log-rate (:func:`logit_prior`'s rule: no rate, no prior; a
    ``partial_fit`` call's rows may lack a class); ``y_idx``: class
    indices, integers or floats."""
    if n_outputs == 1:  # the positives' and the negatives' weights: two products
        return logit_prior(y_idx, sw)
    # each class's weight in one pass
    w = np.bincount(np.asarray(y_idx, dtype=np.intp), weights=sw, minlength=n_outputs)
    present = w > 0
    lp = np.zeros(n_outputs)
    lp[present] = np.log(np.clip(w[present] / w.sum(), 1e-6, None))
    lp[~present] = lp[present].mean()
    return lp - lp.mean()
