"""The mini-batch driver the three estimators share.

An estimator hands :func:`fit_heads` its data, one target vector per model
("head": one for logistic regression and the regressor, one per class
one-vs-rest for a multiclass FM), and two small functions: its step
parameters for the training rows, and a head's starting state.  The driver
does the rest the same way for all of them: the early-stopping split, one
training layout shared by the heads, the concurrency, and the solver
(:func:`sklearn_cuwide._solvers.fit_minibatch`) per head.
"""

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from . import _device, _host, _layout, _memory
from ._backends import _concurrency
from ._out_of_core import state_row_bytes
from ._solvers import _SCALE_HINT, fit_minibatch
from ._sparse import canonical_csr, held_columns, with_columns
from ._state import FitProgress, ModelState
from ._warn import warn

__all__ = ["Schedule", "HeadResult", "fit_heads", "auto_learning_rate", "uses_validation",
           "validation_attrs", "EARLY_STOPPING_AUTO_MIN_SAMPLES",
           "optimizer_arrays", "restore_accumulators", "logit_prior", "logit_prior_of",
           "COMPUTE_DTYPE",
           "fm_penalties", "penalty_is_scaled", "AUTO_ALPHA", "AUTO_BETA",
           "BLOWUP_FACTOR", "constant_loss"]

#: the dtype of the model state and of the training layout's values, and of
#: every fitted array (``coef_``, ``intercept_``, ``factors_``) whatever the
#: solver
COMPUTE_DTYPE = np.float32


@dataclass(frozen=True)
class Schedule:
    """How the mini-batches are cut and visited, and when training stops:
    the estimators' shared parameters, resolved for one call."""

    batch_size: int
    max_iter: int
    #: stop when the monitored loss gains less than ``tol`` for
    #: ``n_iter_no_change`` epochs; None never stops early
    tol: object
    n_iter_no_change: int
    shuffle: bool
    #: the held-out share of early stopping, or None without it
    validation_fraction: object
    concurrency: object
    verbose: int
    random_state: object
    #: the estimator's ``early_stopping``: with ``"auto"`` the split above is
    #: made only from :data:`EARLY_STOPPING_AUTO_MIN_SAMPLES` rows on
    early_stopping: object = True
    #: the estimator's ``validation_fraction`` even without early stopping
    #: (what a warning's advice to turn it on would hold out)
    holdout_fraction: object = 0.1


#: ``early_stopping="auto"`` holds out a validation split from this many
#: training rows on (scikit-learn's HistGradientBoosting threshold): below
#: it a tenth of the rows is too few to rank epochs by (docs/design/defaults.rst)
EARLY_STOPPING_AUTO_MIN_SAMPLES = 10_000


def uses_validation(early_stopping, n_samples):
    """Whether a fit of ``n_samples`` rows holds out a validation split."""
    if early_stopping == "auto":
        return n_samples >= EARLY_STOPPING_AUTO_MIN_SAMPLES
    return bool(early_stopping)


@dataclass
class HeadResult:
    """One head's fitted state (numpy, user feature order), epochs and
    curves.  With early stopping the state is the best epoch's, number
    ``best_iteration`` (1-based) of the ``n_iter`` run; ``validation_curve``
    holds each epoch's mean validation loss (empty without it).
    ``device_model``: the fit's own ``(w, V)`` on the device, or None
    (:func:`~sklearn_cuwide._solvers.fit_minibatch`); a GPU fit's state
    leaves Adagrad's sums there too, until read."""

    state: object
    n_iter: int
    loss_curve: list
    validation_curve: list = None
    best_iteration: object = None
    device_model: tuple = None

    def on_host(self):
        """This result with nothing left on the device (kept while other
        fits run: their memory plans count their own arrays only)."""
        state = ModelState(**{k: np.asarray(a) for k, a in self.state.arrays().items()},
                           factor_init=self.state.factor_init)
        return replace(self, state=state, device_model=None)


def fit_heads(X, targets, sample_weight, *, backend, schedule, n_outputs, n_factors,
              make_params, init_state, warm=None, stratify=None, progress=None,
              partial=False, advise_early_stopping=True, scans=None):
    """Train one model per target vector on one shared training layout.

    A head whose last epoch's training loss ends far above the loss of a
    constant prediction (the steps blew up without overflowing) warns a
    ``ConvergenceWarning`` (not for ``partial``: one part of the data may
    legitimately disagree with the model of the parts before); a loss or a
    model that is not finite raises (:func:`~sklearn_cuwide._solvers.fit_minibatch`).

    Parameters
    ----------
    X : sparse matrix (n_samples, n_features), scipy or held by ``backend``
    targets : list of arrays (n_samples,)
        One per head: 0/1, class indices or real targets.
    sample_weight : ndarray (n_samples,), float64
    backend : a :class:`~sklearn_cuwide._backends.Backend`
    schedule : Schedule
    n_outputs, n_factors : int
        The shape of one head's model (they size the layout's tiles).
    make_params : callable ``(X, sw_train, rows, left_out) -> StepParams``
        The step hyperparameters for the training rows ``rows`` of ``X``
        (None: all of them; ``sw_train`` their weights; ``left_out`` the
        other rows, or None: see :func:`rows_nnz`).
    init_state : callable ``(head, t_train, sw_train, seed) -> ModelState``
        A head's fresh starting state (numpy, user feature order).
    warm : list of ModelState or None
        States to continue from instead (one per head; the fit's own copies,
        which it may change); the concurrency is then not warmed up again.
    stratify : ndarray (n_samples,) or None
        Class indices to stratify the early-stopping split on.
    progress : FitProgress or None
        The fit's log (its setup stages and epochs); None makes one from
        ``schedule.verbose``.
    partial : bool
        One epoch of ``partial_fit`` (no comparison with a constant model).
    advise_early_stopping : bool
        Whether a ``max_iter`` warning may advise early stopping (False
        where the fit chose its penalty on held-out rows: early stopping
        would turn that choice off).
    scans : DeferredScans or None
        The checks of ``X``'s indices and values still to make
        (:class:`~sklearn_cuwide._base.DeferredScans`): on the copy the
        layout's build uploads, once it is there and before the step
        parameters read ``X``, else on the host at once.

    Returns
    -------
    list of HeadResult
    """
    progress = FitProgress(schedule.verbose) if progress is None else progress
    seed_split, seed_layout, seed_epochs, seed_init = _seeds(schedule.random_state)
    X = canonical_csr(X)
    tr = va = None
    split = False
    if schedule.validation_fraction is not None and uses_validation(
            schedule.early_stopping, X.shape[0]):
        # the classes' sizes, counted once for the check and the split
        counts = None if stratify is None else np.bincount(np.asarray(stratify, np.intp))
        split = _can_stratify(schedule.early_stopping, stratify, counts)
    if split and not float(np.min(sample_weight)) > 0:
        # rows of weight 0: the split is drawn first, to check that each side
        # holds weight (the rows it lays out decide what is staged)
        tr, va = _validation_split(X.shape[0], schedule.validation_fraction, stratify,
                                   seed_split, counts)
        if not _weighted_sides(schedule.early_stopping, schedule.validation_fraction,
                               sample_weight, tr, va):
            split, tr, va = False, None, None
    n_laid = X.shape[0] - (_validation_size(X.shape[0], schedule.validation_fraction)
                           if split else 0)
    # the layout's input crosses to the device while the rows are split and
    # the step parameters set, which need none of it
    # a large host matrix whose checks the device makes (``scans``) is read
    # there before the build; a small one on the host, as fast, without
    # the kernels a cold process would compile for it
    staged = (backend.stage_layout_input(X, n_laid, read_first=scans is not None)
              if warm is None and n_laid else None)
    if scans is not None and staged is None:  # no copy: checked here, read here
        scans.on_host()
        scans = None
    try:
        if split and va is None:
            tr, va = _validation_split(X.shape[0], schedule.validation_fraction, stratify,
                                       seed_split, counts)
        if va is not None:
            # the held-out rows are copied (from the staged copy where there is
            # one); the training rows are laid out from X where it is
            # (build_layout's rows), never copied on their own
            Xv, swv = _held_out_rows(X, va, backend, staged), sample_weight[va]
            sample_weight = sample_weight[tr]
            progress.stage("validation split")
        if scans is not None:  # the staged copy is checked, then read by the step
            # parameters: their passes (stored zeros, row lengths) on the device
            scans.on_device(backend, *staged.uploaded()[1:])
        params = make_params(X if scans is None else staged.matrix(), sample_weight, tr, va)
        # a continued model's epoch over a part of the data (partial_fit) trains
        # the features the part holds: the other rows of the model are copied
        # over, not laid out, moved or permuted (O(part), not O(n_features));
        # the step parameters are those of the whole matrix (sgd's auto step)
        used = _features_used(X, warm) if warm is not None and va is None else None
        if used is not None:
            full, warm = warm, [st.permute_features(used) for st in warm]
            X = with_columns(X, used)
        progress.stage("step parameters", params.summary())
        # a fresh model's first steps move it most: they are taken from the
        # freshest weights, with the workers added in stages
        ramp = _concurrency.default_ramp(params.model) if warm is None else 0
        n_batches = -(-n_laid // schedule.batch_size)
        # the layout's tiles are cut for the epochs' workers (in order or not)
        workers = backend.concurrent_blocks(schedule.concurrency, params, n_batches)
        sample_block, n_hot_max = backend.tile_shape(params, n_outputs, n_factors,
                                                     schedule.batch_size, workers)
        if n_batches:
            backend.prepare_fit(X, params, n_outputs, n_factors, n_batches, workers,
                                ramp, COMPUTE_DTYPE, validation=va is not None,
                                fresh=warm is None)
        layout = backend.build_layout(
            X, batch_size=schedule.batch_size, sample_block=sample_block,
            n_hot_max=n_hot_max, shuffle=schedule.shuffle, random_state=seed_layout,
            dtype=COMPUTE_DTYPE, rows=tr, staged=staged,
        )
        plan = _memory.active_plan()  # the model's rows on the device (None: all)
        model_rows = None if plan is None else plan.model_rows
        backend.release_cached()  # the build's freed blocks, before the training's
    finally:
        if staged is not None:  # interrupted: its copies end before its arrays go
            staged.close()
    progress.stage("layout")
    if va is not None:
        Xv = Xv.result()
    results, blown_up = [], []
    for k, t in enumerate(targets):
        t = np.asarray(t, dtype=np.float64)
        validation = None
        if va is not None:
            validation = (Xv, t[va], swv)
            t = t[tr]
        state = warm[k] if warm is not None else init_state(k, t, sample_weight,
                                                           seed_init + k)
        prefix = "" if len(targets) == 1 else f"model {k + 1} of {len(targets)}, "
        progress.stage(f"{prefix}initial state")
        out, n_iter, curve, vcurve, device_model = fit_minibatch(
            layout, t.astype(COMPUTE_DTYPE), sample_weight, state, params,
            backend=backend, max_iter=schedule.max_iter, tol=schedule.tol,
            n_iter_no_change=schedule.n_iter_no_change, shuffle=schedule.shuffle,
            random_state=seed_epochs + k, validation=validation,
            verbose=schedule.verbose, workers=workers, ramp=ramp,
            progress=progress, log_prefix=prefix, model_rows=model_rows,
        )
        curve = [float(v) for v in curve]
        vcurve = [float(v) for v in vcurve]
        best = int(np.argmin(vcurve)) + 1 if vcurve else None
        base = constant_loss(t, sample_weight, params.loss, n_outputs)
        if not partial and curve and curve[-1] > BLOWUP_FACTOR * max(base, 1.0):
            blown_up.append((prefix, curve[-1], base))
        if used is not None:  # the warm states are the fit's own copies
            out, device_model = full[k].put_features(used, out), None
        results.append(HeadResult(out, n_iter, curve, vcurve, best, device_model))
    if blown_up:
        _warn_blown_up(blown_up, params)
    elif not partial:  # a blown-up fit's warning says enough
        _warn_max_iter(results, schedule.tol, schedule.max_iter,
                       early_stopping_advice=lambda: advise_early_stopping and va is None
                       and _early_stopping_possible(X.shape[0], schedule.holdout_fraction,
                                                    stratify),
                       chosen_at_max_iter=not advise_early_stopping and va is None)
    return results


#: a continued fit trains the features its data hold alone when they are at
#: most this share of the model's
COMPACT_SHARE = 0.5


def _features_used(X, warm):
    """The features (sorted) that a host CSR ``X`` holds, when a continued
    fit from the states ``warm`` trains those alone; else None (and None for
    a matrix on a device).

    Rule: compact where the model's rows outweigh the part's column ids, and
    the part holds at most :data:`COMPACT_SHARE` of the features.  Why: the
    compaction is passes over the part's ids (the columns held, then
    renamed); without it the call permutes, moves and ranks every row of
    the model: both are memory-bound, so their bytes decide.
    """
    if not sp.issparse(X) or X.shape[1] == 0:
        return None
    model = X.shape[1] * sum(
        state_row_bytes(st.n_outputs, st.n_factors, adagrad=st.gw is not None,
                        itemsize=st.w.dtype.itemsize) for st in warm)
    if model <= X.nnz * X.indices.itemsize:
        return None
    used = held_columns(X)
    return used if used.size <= COMPACT_SHARE * X.shape[1] else None


def validation_attrs(results):
    """``validation_score_`` and ``best_iteration_`` of a fit's heads.

    ``validation_score_``: each epoch's negative mean validation loss
    (higher is better, as scikit-learn's HistGradientBoosting records it with
    ``scoring="loss"``), summed over the heads as ``loss_curve_`` is; empty
    without early stopping.  ``best_iteration_``: the epoch whose model was
    kept (the latest of the heads'), None without early stopping.
    """
    curves = [r.validation_curve for r in results if r.validation_curve]
    if not curves:
        return {"validation_score_": np.zeros(0), "best_iteration_": None}
    length = max(len(c) for c in curves)
    score = -np.array([sum(c[min(e, len(c) - 1)] for c in curves)
                       for e in range(length)], dtype=np.float64)
    best = max(r.best_iteration for r in results if r.best_iteration is not None)
    return {"validation_score_": score, "best_iteration_": int(best)}


# --------------------------------------------------------------------------
# the pieces
# --------------------------------------------------------------------------
#: a head whose last epoch's mean training loss ends above this many times
#: the larger of 1 and the loss of a constant prediction has blown up: a
#: ConvergenceWarning (far enough that no sound fit, however noisy, does)
BLOWUP_FACTOR = 4.0


def constant_loss(t, sw, loss, n_outputs):
    """The mean loss of the zero prediction: ``log 2`` (logistic), ``log K``
    (multinomial), half the weighted mean square of the targets (squared).

    No model a sound fit ends with is worse than it by much: with an
    intercept the fit starts from the best constant (where its rows hold
    every outcome, :func:`logit_prior`), which is better still.
    """
    if loss == "logistic":
        return math.log(2.0)
    if loss == "multinomial":
        return math.log(max(int(n_outputs), 2))
    t = np.asarray(t, dtype=np.float64)
    return 0.5 * float(np.dot(sw, t * t) / sw.sum())


def _warn_blown_up(blown_up, params):
    """One ConvergenceWarning for the heads whose last epoch's mean training
    loss ended far above a constant prediction's: large steps made the model
    worse than no model, without overflowing.  ``blown_up``: ``(prefix,
    loss, constant loss)`` of each."""
    prefix, last, base = blown_up[0]
    which = f" ({prefix.rstrip(', ')})" if prefix else ""
    more = f", and {len(blown_up) - 1} other model(s) too" if len(blown_up) > 1 else ""
    warn(_blown_up_message(which, last, base, more, params), ConvergenceWarning)


def _blown_up_message(which, last, base, more, params):
    # the loss stayed finite (a non-finite one raises "diverged"): say how far
    # it ended from a constant prediction's, and the two causes, the first
    # for the solver: adagrad's steps are the rate whatever X's scale, sgd's
    # scale with X
    lower = (f"lower learning_rate (e.g. learning_rate={params.learning_rate / 3:.2g}) "
             "or run more epochs (the first epochs of a fit with few mini-batches "
             "overshoot most)")
    scale = f"if the features are large or unscaled, {_SCALE_HINT}"
    causes = (f"its steps are too large for these data: {lower}; or, {scale}"
              if params.solver == "adagrad" else
              f"usually because the features are large or unscaled: {_SCALE_HINT}; "
              f"or {lower}")
    return (
        f"The training loss of the last epoch{which} ended at {last:.4g}, far "
        f"above the {base:.4g} of a constant prediction{more}: the model is worse "
        f"than predicting a constant (solver={params.solver!r}, learning_rate="
        f"{params.learning_rate:.3g}): {causes}."
    )


def _seeds(random_state, n=4):
    """``n`` independent integer seeds drawn from ``random_state``: the
    early-stopping split, the layout's row order, the epochs' batch order
    and the initial factors."""
    rs = check_random_state(random_state)
    return [int(s) for s in rs.randint(0, np.iinfo(np.int32).max, size=n)]


#: classes up to which the stratified split finds a run's rows of each class
#: by a comparison per class (linear), beyond by one stable sort of the run
_SPLIT_CLASS_PASSES = 16


def _validation_size(n_samples, validation_fraction):
    """Rows early stopping holds out: ``ceil(validation_fraction * n_samples)``."""
    return int(np.ceil(validation_fraction * n_samples))


def _validation_split(n_samples, validation_fraction, stratify, seed, counts=None):
    """Indices ``(train, validation)`` for early stopping (each sorted),
    stratified on ``stratify`` (class indices) for classifiers;
    ``counts``: their bincount when the caller has it.

    ``ceil(validation_fraction * n_samples)`` rows are held out, as
    scikit-learn's ``StratifiedShuffleSplit`` holds them out; each class
    gives its share of them, rounded by largest remainders.  Class ``c``'s
    held-out rows are those whose rank among its rows (in row order) is one
    of the first ``take[c]`` values of a keyed permutation of its count
    (:func:`~sklearn_cuwide._layout.keyed_permutation`, seeded by ``seed``
    and ``c``): a random subset of its rows.  Linear in the rows, with no
    sort of them, and cut into runs of rows on the host's threads (each run
    counts its classes, then marks its held-out rows from the ranks, then
    writes its indices): the split is the host's only per-row pass of an
    early-stopped fit besides the row gathers, and is on its critical path.
    The result does not depend on the number of threads.
    """
    n_val = _validation_size(n_samples, validation_fraction)
    labels = None if stratify is None else np.asarray(stratify, dtype=np.intp)
    if labels is not None and counts is None:
        counts = np.bincount(labels)
    n_classes = 1 if counts is None else int(np.count_nonzero(counts))
    if n_val < n_classes or n_samples - n_val < n_classes:
        raise ValueError(
            f"The validation set of early stopping (validation_fraction="
            f"{validation_fraction}) would have {n_val} of {n_samples} samples; "
            f"both it and the training set need at least {n_classes} sample(s). "
            f"{_fraction_advice(n_val < n_classes)}, or set early_stopping=False."
        )
    runs = _host.row_runs(n_samples, 24 * n_samples)  # labels, marks, indices
    held = np.zeros(n_samples, dtype=bool)
    if counts is None:
        held[_layout.keyed_permutation(n_samples, [seed, 0], n_val)] = True
    else:
        share = counts * (n_val / n_samples)
        take = np.floor(share).astype(np.int64)
        short = n_val - int(take.sum())
        if short:  # the largest remainders get one more
            take[np.argsort(take - share, kind="stable")[:short]] += 1
        _mark_held_out(labels, counts, take, seed, runs, held)
    return _host.split_flags(held, runs)


def _mark_held_out(labels, counts, take, seed, runs, held):
    """:func:`_validation_split`'s stratified marks: ``held[i]`` for the
    rows whose rank in their class is drawn, run by run: each run finds its
    rows of each class (a comparison per class, or a stable sort of the run
    for many classes), then marks those whose rank (the class's rows in the
    runs before, plus their place in the run) was drawn."""
    classes = np.flatnonzero(take)
    by_compare = counts.shape[0] <= _SPLIT_CLASS_PASSES

    def find(a, b):
        lab = labels[a:b]
        if by_compare:
            return [np.flatnonzero(lab == c) for c in classes]
        order = np.argsort(lab, kind="stable")
        sizes = np.bincount(lab, minlength=counts.shape[0])
        ends = np.cumsum(sizes)
        return [order[ends[c] - sizes[c]:ends[c]] for c in classes]

    found = _host.each_of(runs, find)
    drawn = []
    for c in classes:
        d = np.zeros(int(counts[c]), dtype=bool)
        d[_layout.keyed_permutation(int(counts[c]), [seed, int(c) + 1], int(take[c]))] = True
        drawn.append(d)
    # each run's first rank of each class: the class's rows in the runs before
    sizes = np.array([[p.shape[0] for p in f] for f in found], dtype=np.int64)
    first = np.cumsum(sizes, axis=0) - sizes

    def mark(r, a, b):
        for j, pos in enumerate(found[r]):
            o = int(first[r, j])
            held[a + pos] = drawn[j][o:o + pos.shape[0]]

    _host.each_of(runs, mark, with_index=True)


def _early_stopping_possible(n_samples, validation_fraction, stratify):
    """Whether ``early_stopping=True`` could split these rows (what a
    warning may advise): every class with a sample on both sides."""
    if validation_fraction is None:
        return False
    n_val = int(np.ceil(validation_fraction * n_samples))
    if stratify is None:
        return 1 <= n_val < n_samples
    counts = np.bincount(np.asarray(stratify, dtype=np.intp))
    counts = counts[counts > 0]
    return (counts.size > 0 and int(counts.min()) >= 2
            and counts.size <= n_val <= n_samples - counts.size)


def _fraction_advice(validation_too_small):
    # the side of the split that is too small says which way to move
    if validation_too_small:
        return "Increase validation_fraction"
    return "Decrease validation_fraction"


def _can_stratify(early_stopping, stratify, counts=None):
    """Whether the classes (``stratify``, class indices; None for a
    regressor) can be split into a stratified validation split: every class
    needs a sample on both sides.  A class with a single sample cannot:
    ``early_stopping="auto"`` then fits without early stopping (every row
    trains, the lone sample included), and ``early_stopping=True`` raises.
    ``counts``: the classes' bincount when the caller has it."""
    if stratify is None:
        return True
    if counts is None:
        counts = np.bincount(np.asarray(stratify, dtype=np.intp))
    counts = counts[counts > 0]
    if counts.size == 0 or counts.min() >= 2:
        return True
    if early_stopping == "auto":
        return False
    raise ValueError(
        f"early_stopping=True holds out a validation split stratified by class, "
        f"and the least populated class has only {int(counts.min())} sample: a "
        f"class needs at least 2, one on each side of the split. Set "
        f"early_stopping=False, or give every class at least 2 samples."
    )


def _weighted_sides(early_stopping, validation_fraction, sample_weight, tr, va):
    """Whether both sides of early stopping's split (``tr``, ``va``) hold
    sample weight.  Rule: a side whose rows all weigh 0 makes
    ``early_stopping="auto"`` fit without early stopping (every row trains),
    and ``early_stopping=True`` raise.  Why: the validation loss is a
    weighted mean (0 / 0 without weight: a NaN that reads as a diverged
    fit), and a training side without weight trains nothing."""
    for side, rows, small in (("validation", va, True), ("training", tr, False)):
        if float(np.sum(sample_weight[rows])) > 0:
            continue
        if early_stopping == "auto":
            return False
        raise ValueError(
            f"early_stopping=True holds out a validation split (validation_fraction="
            f"{validation_fraction}), and every one of the {rows.shape[0]} samples of its "
            f"{side} side has sample_weight 0: that side's loss is undefined. Set "
            f"early_stopping=False, or {_fraction_advice(small).lower()}, or give "
            f"weight to more samples."
        )
    return True


def _warn_max_iter(results, tol, max_iter, early_stopping_advice=False,
                   chosen_at_max_iter=False):
    """A ConvergenceWarning, as scikit-learn's SGDClassifier warns, when a
    stopping rule was active (``tol`` not None) and a head ran all
    ``max_iter`` epochs without it being met.

    ``early_stopping_advice``: true when the rule watched the training loss
    (no validation split) where early stopping is available; a bool, or a
    callable that gives it, asked only when the warning is given (it may
    count the classes: a pass over the labels).  A training loss
    still falling after ``max_iter`` epochs is as often a model fitting its
    training rows ever closer (an FM on a few thousand rows) as one short of
    its optimum: the warning then names early stopping first, since more
    epochs would only fit them closer.  ``chosen_at_max_iter``: the rule
    watched the training loss of a fit whose penalty was chosen on held-out
    rows at this ``max_iter`` (early stopping would turn the choice off):
    no warning.  Why: the choice compared the penalties' held-out losses
    after these very epochs, so ``max_iter`` is part of what was validated,
    and more epochs would fit the training rows closer, not predict better
    (a warning there was noise in every small default fit of a search)."""
    if tol is None or chosen_at_max_iter:
        return
    ran_out = [r for r in results if r.n_iter >= max_iter]
    if ran_out:
        # said only of what the curves show: a last epoch below every one before
        if any(_still_falling(r.loss_curve, tol) for r in ran_out):
            lead = "The training loss was still falling"
        else:
            lead = "The training loss had not settled (its last epoch did not lower it)"
        if early_stopping_advice() if callable(early_stopping_advice) \
                else early_stopping_advice:
            advice = (
                f"{lead}: set early_stopping=True to "
                "stop on the loss of a held-out part of the data (and keep its "
                "best epoch), which also tells a model that overfits from one "
                "that needs more epochs; or increase max_iter to fit the "
                "training data closer, or set tol=None to run max_iter epochs "
                "without this warning.")
        else:
            advice = ("Consider increasing max_iter to improve the fit, or set "
                      "tol=None to run max_iter epochs without this warning.")
        warn(f"Maximum number of iteration reached before convergence "
             f"(max_iter={max_iter}). {advice}", ConvergenceWarning)


def _still_falling(curve, tol):
    """Whether a loss curve's last epoch lowered it by more than ``tol``
    below every epoch before it (the stopping rule's improvement)."""
    return len(curve) >= 2 and curve[-1] < min(curve[:-1]) - tol


def rows_nnz(X, rows, backend, left_out=None, zeros=None):
    """Nonzeros of the rows ``rows`` of the CSR ``X`` (None: all): its
    stored entries less those whose value is 0.  Rule: a stored zero counts
    for nothing.  Why: the layout drops it (no occurrence of its feature),
    so the same matrix with or without stored zeros trains the same model,
    its ``"auto"`` penalties included.  ``left_out``: the other rows of
    ``X`` (early stopping's held-out rows), whose stored entries are
    counted instead where they are fewer (the whole matrix's less
    theirs).  ``zeros``: :func:`stored_zero_rows` of ``X``, when the caller
    has it (None: found here)."""
    xp, zero_rows = stored_zero_rows(X, backend) if zeros is None else zeros
    total = int(X.nnz) - (0 if zero_rows is None else int(zero_rows.shape[0]))
    if rows is None:
        return total
    if zero_rows is None and left_out is not None and left_out.shape[0] < rows.shape[0]:
        return total - _stored(X, left_out, xp, backend)
    held = _stored(X, rows, xp, backend)
    if zero_rows is None:
        return held
    r = backend.to_device(rows) if xp is not np else rows
    chosen = xp.zeros(X.shape[0], dtype=bool)
    chosen[r] = True
    return held - int(chosen[zero_rows].sum())


def _stored(X, rows, xp, backend):
    """Stored entries of the rows ``rows`` (numpy) of the CSR ``X``."""
    r = backend.to_device(rows) if xp is not np else rows
    return int((X.indptr[r + 1] - X.indptr[r]).sum())


def stored_zero_rows(X, backend):
    """``(xp, rows)``: the array module of the CSR ``X`` (scipy, or on the
    backend's device) and the row of each of its stored zeros, or None when
    it has none.  One count over the values first (on the host's threads,
    or the device's): the zeros are located only when there are any."""
    if _device.is_cupy_array(X):
        xp = backend.xp
        none = not backend.holds_zero(X.data)
    else:
        xp = np
        none = not _host.holds_zero(X.data)
    if none:
        return xp, None
    return xp, xp.searchsorted(X.indptr, xp.flatnonzero(X.data == 0), side="right") - 1


def _held_out_rows(X, rows, backend, staged=None):
    """A future of :func:`_take_rows`: gathered on the device from the
    backend's staged copy of a host matrix (``staged``, the layout's input:
    neither gathered nor copied again on the host), a host matrix's rows
    otherwise on a thread of their own, a device matrix's at once.  Why:
    only the epochs read them, and scipy's gather releases the GIL, so it
    runs while the step parameters and the layout are made.  A thread per
    fit (not a process-wide pool, whose thread a forked child would lack)."""
    if staged is not None:
        return staged.hold_out(rows)
    if _device.is_cupy_array(X):
        done = Future()
        done.set_result(_take_rows(X, rows, backend))
        return done
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuwide-held-out")
    try:
        return worker.submit(_take_rows, X, rows, backend)
    finally:
        worker.shutdown(wait=False)  # its thread ends with the gather


def _take_rows(X, rows, backend):
    """Rows ``rows`` (a sorted numpy index array) of a canonical CSR matrix;
    a matrix on the device gathers them there."""
    if _device.is_cupy_array(X):
        return backend.take_rows(X, rows)
    return X[rows]


def optimizer_arrays(state):
    """The optimiser's accumulators of a state (numpy), for warm starts."""
    return {k: getattr(state, k) for k in ("gw", "gV", "gb")}


def restore_accumulators(state, saved):
    """Put saved Adagrad accumulators into ``state`` where shapes match."""
    if not saved:
        return state
    for k in ("gw", "gV", "gb"):
        cur = getattr(state, k)
        old = saved.get(k)
        if cur is not None and old is not None and old.shape == cur.shape:
            setattr(state, k, np.array(old, dtype=cur.dtype))
    return state


def logit_prior(y01, sw):
    """log(p / (1 - p)) of the weighted positive rate (clipped), the
    intercept a fresh model starts from; 0 where the rows hold one outcome
    only.  Rule: no rate, no prior.  Why: a ``partial_fit`` call's rows
    may lack a class that the stream holds (``classes`` names it), and an
    intercept started at the clip (-13.8) takes Adagrad's decaying steps
    many chunks to leave."""
    y01 = np.asarray(y01, dtype=np.float64)
    return logit_prior_of(float(np.dot(sw, y01)), float(np.dot(sw, 1.0 - y01)))


def logit_prior_of(pos, neg):
    """:func:`logit_prior` of the positive and negative rows' weight sums."""
    if not (pos > 0 and neg > 0):  # exact: a rate from one sum would round near 1
        return 0.0
    p = min(max(pos / (pos + neg), 1e-6), 1 - 1e-6)
    return np.log(p / (1 - p))


#: curvature bound of each loss (the largest second derivative per unit of
#: ``||x||^2``): the full-batch gradient is Lipschitz with constant
#: ``curvature * lambda_max(X' diag(s) X / S)``
_CURVATURE = {"logistic": 0.25, "multinomial": 0.5, "squared": 1.0}

#: ``learning_rate="auto"`` of adagrad (sgd's comes from the data): the step
#: of least mean test regret over the defaults study's choosing half
#: (docs/design/defaults.rst)
ADAGRAD_AUTO_LEARNING_RATE = 0.1
#: the factorization machines' from EARLY_STOPPING_AUTO_MIN_SAMPLES rows on,
#: and for every ``partial_fit`` call (its rows are a part of the data, not
#: its size: chunks of 500 to 2,000 rows at the small data's 0.1 lost 0.02
#: AUC and 0.1 to 0.3 R2 against a fit, docs/design/out_of_core.rst): their factors
#: overfit at the larger step; below, where an epoch takes a few steps, the
#: two tie in the study and the smaller one underfits in ``max_iter``
#: epochs, so the larger stays
ADAGRAD_AUTO_LEARNING_RATE_FM = 0.03
#: the FM regressor's below EARLY_STOPPING_AUTO_MIN_SAMPLES rows, ``m`` the
#: mean nonzeros of a training row: ``REGRESSOR_STEP_NNZ / m`` within
#: [ADAGRAD_AUTO_LEARNING_RATE_FM, ADAGRAD_AUTO_LEARNING_RATE].  Why: a step
#: moves the prediction through every pair of a row's nonzeros and Adagrad's
#: first steps move each coordinate by the step whatever its gradient; the
#: squared loss, unlike the logistic, does not bound the gradient that
#: follows, and at 0.1 fits of a few thousand rows of 26 to 39 nonzeros
#: jumped 50 to 300 times in their first epochs, while user x item rows (2
#: nonzeros) underfit at 0.03 (docs/design/defaults.rst)
REGRESSOR_STEP_NNZ = 0.2
#: the FM classifier's from EARLY_STOPPING_AUTO_MIN_SAMPLES rows on (``fit``,
#: not ``partial_fit``): ``CLASSIFIER_STEP_NNZ / m`` within
#: [ADAGRAD_AUTO_LEARNING_RATE_FM, ADAGRAD_AUTO_LEARNING_RATE], ``m`` the mean
#: nonzeros of a training row.  Why: a step moves the margin through every
#: pair of a row's nonzeros; rows of 39 nonzeros lost up to 0.037 AUC at
#: steps above 0.03, rows of 10 to 16 gained up to 0.011 at 0.1, and no set
#: of the defaults study lost at this rule (docs/design/defaults.rst)
CLASSIFIER_STEP_NNZ = 1.0


def auto_learning_rate(solver, X, sw, *, loss, fit_intercept, backend, model="linear",
                       n_samples=None, batch_size=None, rows=None, partial=False,
                       row_nnz=None, zeros=None):
    """``learning_rate="auto"``: Adagrad's constant, or for sgd ``1 / L``
    with ``L`` a bound on the Lipschitz constant of a mini-batch's mean
    loss gradient (of the linear part for an FM; ``batch_size`` rows, None:
    the full batch).  For ``model="fm"`` Adagrad's constant depends on
    ``n_samples``, the rows of the call (before any validation split;
    default ``X``'s), except for a ``partial_fit`` call (``partial``), which
    takes the larger data's constant; the classifier's from
    EARLY_STOPPING_AUTO_MIN_SAMPLES rows (:data:`CLASSIFIER_STEP_NNZ`) and
    the regressor's (``loss="squared"``) below them
    (:data:`REGRESSOR_STEP_NNZ`) fall with the weighted mean nonzeros of a
    training row (``row_nnz``, else :func:`mean_row_nonzeros` of ``X``).
    ``rows``: the training rows of ``X`` (None: all; ``sw`` their
    weights); ``zeros``: :func:`stored_zero_rows` of ``X`` when the caller
    has it (one pass over the values for the step and the penalties)."""
    if solver == "sgd":
        return _sgd_learning_rate(X, sw, loss=loss, fit_intercept=fit_intercept,
                                  backend=backend, batch_size=batch_size, rows=rows)
    n = X.shape[0] if n_samples is None else n_samples
    large = partial or n >= EARLY_STOPPING_AUTO_MIN_SAMPLES
    if step_reads_row_nonzeros(solver, model, loss, n, partial):
        if row_nnz is None and X is not None:
            row_nnz = mean_row_nonzeros(X, rows, sw, backend, zeros)
        if row_nnz:
            per = REGRESSOR_STEP_NNZ if loss == "squared" else CLASSIFIER_STEP_NNZ
            return min(ADAGRAD_AUTO_LEARNING_RATE, max(ADAGRAD_AUTO_LEARNING_RATE_FM,
                                                       per / row_nnz))
    if model == "fm" and large:
        return ADAGRAD_AUTO_LEARNING_RATE_FM
    return ADAGRAD_AUTO_LEARNING_RATE


def step_reads_row_nonzeros(solver, model, loss, n_samples, partial=False):
    """Whether Adagrad's ``"auto"`` step of a fit of ``n_samples`` rows
    depends on the rows' mean nonzeros (the FM regressor's below
    EARLY_STOPPING_AUTO_MIN_SAMPLES rows, :data:`REGRESSOR_STEP_NNZ`; the
    FM classifier's from them on, :data:`CLASSIFIER_STEP_NNZ`; never a
    ``partial_fit`` call's)."""
    if solver != "adagrad" or model != "fm" or partial:
        return False
    small = n_samples < EARLY_STOPPING_AUTO_MIN_SAMPLES
    return small if loss == "squared" else not small


def unit_weights(sw):
    """Whether every weight of the numpy array ``sw`` is 1 (none: False)."""
    return sw.shape[0] > 0 and float(np.min(sw)) == 1.0 == float(np.max(sw))


def mean_row_nonzeros(X, rows, sw, backend, zeros=None):
    """The mean nonzeros of a training row of the CSR ``X`` (scipy or on
    the backend's device), weighted by ``sw`` (the rows' ``rows`` of ``X``;
    None: all): stored zeros are not counted, and an integer weight counts
    as that many copies of its row.  (The ``"auto"`` factor penalty's ``m``
    is the plain mean, :func:`rows_nnz`.)  ``zeros``: as :func:`rows_nnz`
    takes it."""
    xp, zero_rows = stored_zero_rows(X, backend) if zeros is None else zeros
    per_row = xp.diff(X.indptr).astype(xp.int64)
    if zero_rows is not None:
        per_row -= xp.bincount(zero_rows, minlength=per_row.shape[0]).astype(xp.int64)
    sw = np.asarray(sw, dtype=np.float64)
    total = float(sw.sum())
    if not total > 0:
        return 0.0
    # where the row lengths are: a device's rows and weights cross to it
    # (their two copies, not the lengths' copy back and the host passes)
    put = np.asarray if xp is np else backend.to_device
    if rows is not None:
        per_row = per_row[put(rows)]
    return float(xp.dot(per_row.astype(xp.float64), put(sw))) / total


#: ``alpha="auto"`` of the factorization machines: ``AUTO_ALPHA / S`` on the
#: full objective (``S`` the training rows' total sample weight), the linear
#: weights' penalty of scikit-learn's ``LogisticRegression(C=1)``: a fixed
#: prior, whose weight per row falls as the rows grow
AUTO_ALPHA = 1.0
#: ``beta="auto"``: ``AUTO_BETA * m / S`` on the factors, ``m`` the mean
#: nonzeros of a training row: a factor's gradient sums over the row's other
#: nonzeros, so the interactions' pull on it grows with ``m``; a penalty that
#: does not (30 / S, best on the study's click sets) holds the factors of
#: two- or three-field user x item data at zero (docs/design/defaults.rst)
AUTO_BETA = 1.0


def penalty_is_scaled(alpha, beta, scale_penalty):
    """Whether an FM's penalties act on the full objective (scaled per
    feature, :func:`~sklearn_cuwide._layout.penalty_scale`).
    ``scale_penalty="auto"``: when ``alpha`` or ``beta`` is ``"auto"`` (the
    strengths are defined on the full objective); two numbers keep the lazy,
    per-mini-batch form they have always had."""
    if scale_penalty == "auto":
        return alpha == "auto" or beta == "auto"
    return bool(scale_penalty)


def fm_penalties(alpha, beta, scale_penalty, total_weight, mean_nnz, multiplier=1.0):
    """``(l2_w, l2_v, scaled)`` of an FM's step from its ``alpha``,
    ``beta`` and ``scale_penalty``, the training rows' total sample weight
    and their mean nonzeros per row (``"auto"`` resolved:
    :data:`AUTO_ALPHA` and :data:`AUTO_BETA`, times ``multiplier``: the
    small-data choice of :mod:`sklearn_cuwide._penalty_choice`)."""
    S = max(float(total_weight), 1e-12)
    m = float(multiplier)
    l2_w = m * AUTO_ALPHA / S if alpha == "auto" else float(alpha)
    l2_v = (m * AUTO_BETA * max(float(mean_nnz), 1.0) / S if beta == "auto"
            else float(beta))
    return l2_w, l2_v, penalty_is_scaled(alpha, beta, scale_penalty)


def _sgd_learning_rate(X, sw, *, loss, fit_intercept, backend, batch_size=None, rows=None,
                       n_iter=30, max_rows=100_000, seed=0):
    """``1 / L`` from ``lambda_max`` of the weighted second-moment matrix of
    ``X`` (with a column of ones for the intercept): a few power iterations
    on at most ``max_rows`` rows.  On one-hot click data it is small (the
    features hardly overlap) and the step large; on dense correlated data it
    is large and the step small, so plain sgd is stable on both.

    A mini-batch of ``batch_size`` rows weighs each of its rows by about
    ``w / (batch_size * mean(w))``, not ``w / S``: one row much longer than
    the rest (a few in a small data set) then dominates its batch's
    curvature although it hardly moves the full batch's.  ``L`` is at least
    the largest such row share of ``|x|^2`` (at most ``|x|^2`` itself, a
    row's weight being at most its batch's), so that no row alone makes a
    step diverge; at the usual batch sizes the full batch's ``lambda_max``
    is the larger.

    The iterations run on the backend's device, in float64 (a host
    matrix's rows chosen on the host, then copied): only the norm of each
    iterate reaches the host.  Why: each iteration reads a vector of a
    value per feature at random, which the host's one core does in tens of
    milliseconds at millions of features.
    """
    X = canonical_csr(X)
    sw = np.asarray(sw, dtype=np.float64)
    rng = np.random.default_rng(seed)
    n = X.shape[0] if rows is None else int(rows.shape[0])
    if n > max_rows:
        pick = np.sort(_layout.keyed_permutation(n, [seed, 1], max_rows))
        X, sw = _take_rows(X, pick if rows is None else rows[pick], backend), sw[pick]
    elif rows is not None:
        X = _take_rows(X, rows, backend)
    X = backend.put_csr(X)
    on_device = backend.holds(X)
    xp = backend.xp if on_device else np
    S = sw.sum()
    d = X.shape[1]
    v = rng.standard_normal(d + 1)
    if not fit_intercept:
        v[d] = 0.0
    ws = sw / S
    if on_device:
        X = X.astype(np.float64)
        v, ws = backend.to_device(v), backend.to_device(ws)
    lam = 0.0
    for _ in range(n_iter):
        u = X @ v[:d] + v[d]
        u *= ws
        g = xp.empty_like(v)
        g[:d] = X.T @ u
        g[d] = u.sum() if fit_intercept else 0.0
        lam = float(xp.linalg.norm(g))
        if not lam > 0:
            break
        v = g / lam
    if batch_size is not None and X.shape[0]:
        # each row's squared norm (the intercept's 1 included) by prefix sums
        sums = xp.concatenate([xp.zeros(1), xp.cumsum(X.data.astype(np.float64) ** 2)])
        norms = sums[X.indptr[1:]] - sums[X.indptr[:-1]] + float(bool(fit_intercept))
        share = xp.minimum(1.0, ws * X.shape[0] / min(int(batch_size), X.shape[0]))
        lam = max(lam, float((norms * share).max()))
    lam = max(lam, 1e-12)
    return 1.0 / (_CURVATURE[loss] * lam)
