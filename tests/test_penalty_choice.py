"""The choice of the factorization machine's penalty strength
(``_penalty_choice``) against a reference made of plain fits with the
penalties written out: below 10,000 rows the same split, the same four
fits, the least held-out log loss, then the fit of all rows with that
multiplier; from there the four fits with early stopping, the one of least
validation loss kept."""

import re
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils import check_random_state

from sklearn_cuwide import GPUFactorizationMachine
from sklearn_cuwide._minibatch import AUTO_ALPHA, AUTO_BETA, _validation_split
from sklearn_cuwide._penalty_choice import (
    CHOICE_FRACTION,
    MAX_ROWS,
    PENALTY_MULTIPLIERS,
    penalty_choice_applies,
    penalty_choice_mode,
)
from sklearn_cuwide.datasets import make_ctr_classification


def _data(n=2500, seed=3):
    X, y = make_ctr_classification(n, n_features=2**10, model="fm", random_state=seed)[:2]
    return X, y


def _explicit(est, X, sw, m):
    """``est`` with its "auto" penalties times ``m`` written out for the
    rows ``X`` of weights ``sw`` (what ``fm_penalties`` resolves them to)."""
    S = max(float(np.sum(sw)), 1e-12)
    mean_nnz = X.nnz / max(X.shape[0], 1)
    return clone(est).set_params(alpha=m * AUTO_ALPHA / S,
                                 beta=m * AUTO_BETA * max(mean_nnz, 1.0) / S,
                                 scale_penalty=True)


def _log_loss(y, z):
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def test_the_multiplier_is_the_least_held_out_loss_and_the_fit_uses_it():
    X, y = _data()
    est = GPUFactorizationMachine(n_factors=4, max_iter=8, random_state=0, device="cpu")
    fm = clone(est).fit(X, y)
    # the reference: the same stratified fifth, plain fits of the rest
    seed = check_random_state(0).randint(np.iinfo(np.int32).max)
    tr, va = _validation_split(y.shape[0], CHOICE_FRACTION, y, seed)
    losses = []
    for m in PENALTY_MULTIPLIERS:
        ref = _explicit(est, X[tr], np.ones(tr.size), m).fit(X[tr], y[tr])
        losses.append(_log_loss(y[va], ref.decision_function(X[va])))
    want = PENALTY_MULTIPLIERS[int(np.argmin(losses))]
    assert fm.penalty_multiplier_ == want
    assert len(set(np.round(losses, 6))) == len(losses)  # the choice is not a tie
    full = _explicit(est, X, np.ones(X.shape[0]), want).fit(X, y)
    for k in ("coef_", "intercept_", "factors_"):
        np.testing.assert_array_equal(getattr(fm, k), getattr(full, k), err_msg=k)


def test_the_choice_can_change_the_model_it_would_have_been():
    """On planted-FM data of a few thousand rows the fifth prefers a
    stronger penalty than the defaults' (the study's small sets did)."""
    X, y = _data(n=3000, seed=5)
    fm = GPUFactorizationMachine(n_factors=4, max_iter=8, random_state=0,
                                 device="cpu").fit(X, y)
    assert fm.penalty_multiplier_ > 1


@pytest.mark.parametrize("kw", [dict(alpha=1e-4), dict(beta=1e-3),
                                dict(early_stopping=False), dict(early_stopping=True)])
def test_no_choice_unless_every_setting_is_auto(kw):
    X, y = _data()
    fm = GPUFactorizationMachine(n_factors=4, max_iter=3, random_state=0, device="cpu",
                                 **kw).fit(X, y)
    assert fm.penalty_multiplier_ == 1.0


def test_when_the_choice_applies():
    y = np.r_[np.zeros(1000, int), np.ones(1000, int)]
    args = ("auto", "auto", "auto")
    assert penalty_choice_applies(*args, y, 1, None)
    assert not penalty_choice_applies(*args, y, 3, None)  # one-vs-rest heads
    assert not penalty_choice_applies(*args, y, 1, [object()])  # a continued model
    assert not penalty_choice_applies(*args, None, 1, None)  # no classes (regression)
    few = np.r_[np.zeros(1996, int), np.ones(4, int)]  # 4 rows of a class: too few
    assert not penalty_choice_applies(*args, few, 1, None)
    assert not penalty_choice_applies(*args, y[1:-1], 1, None)  # under 2,000 rows
    assert penalty_choice_mode(*args, y, 1, None) == "held_out"
    big = np.r_[np.zeros(5000, int), np.ones(5000, int)]  # early stopping's size
    assert penalty_choice_mode(*args, big, 1, None) == "validation"
    top = np.r_[np.zeros(MAX_ROWS // 2, int), np.ones(MAX_ROWS // 2 + 1, int)]
    assert penalty_choice_mode(*args, top[1:], 1, None) == "validation"  # 100,000 rows
    assert not penalty_choice_applies(*args, top, 1, None)  # the four fits cost too much
    assert not penalty_choice_applies("auto", "auto", False, y, 1, None)
    assert not penalty_choice_applies("auto", "auto", True, big, 1, None)
    # a regressor (no classes): its rows decide
    for n, mode in [(None, None), (1_999, None), (2_000, "held_out"), (9_999, "held_out"),
                    (10_000, "validation"), (MAX_ROWS, "validation"), (MAX_ROWS + 1, None)]:
        assert penalty_choice_mode(*args, None, 1, None, n_samples=n) == mode, n
    assert not penalty_choice_applies(*args, None, 1, [object()], n_samples=20_000)
    assert not penalty_choice_applies("auto", 1e-3, "auto", None, 1, None, n_samples=20_000)


def test_from_early_stoppings_size_the_best_validated_fit_is_kept():
    """From 10,000 rows: the fit at each multiplier with early stopping
    (the same split and seed), the one whose kept epoch has the least
    validation loss kept as it is, against plain fits with the penalties
    written out for the training part of early stopping's split."""
    X, y = _data(n=10_000, seed=4)
    est = GPUFactorizationMachine(n_factors=4, max_iter=6, random_state=0, device="cpu")
    _best_validated_fit_is_kept(est, X, y, stratify=y)


def _best_validated_fit_is_kept(est, X, y, stratify):
    """Assert that ``est``'s fit is the one of least validation loss among
    plain fits at each multiplier (the penalties written out for the
    training part of early stopping's split, stratified on ``stratify``)
    and return it."""
    from sklearn_cuwide._minibatch import _seeds

    fm = clone(est).fit(X, y)
    tr, _ = _validation_split(y.shape[0], est.validation_fraction, stratify, _seeds(0)[0])
    refs, losses = [], []
    for m in PENALTY_MULTIPLIERS:
        ref = _explicit(est, X[tr], np.ones(tr.size), m).fit(X, y)
        refs.append(ref)
        losses.append(-ref.validation_score_[ref.best_iteration_ - 1])
    k = int(np.argmin(losses))
    assert len(set(np.round(losses, 6))) == len(losses)  # the choice is not a tie
    assert fm.penalty_multiplier_ == PENALTY_MULTIPLIERS[k]
    for key in ("coef_", "intercept_", "factors_", "validation_score_", "best_iteration_"):
        np.testing.assert_array_equal(getattr(fm, key), getattr(refs[k], key), err_msg=key)
    return fm


def test_the_regressor_keeps_its_best_validated_fit_and_continues_with_it():
    """A regressor of 10,000 rows: the fit at each multiplier with early
    stopping (the same split and seed), the one of least validation loss
    (squared error of the standardised target) kept as it is, against plain
    fits with the penalties written out for the training part of the split;
    warm_start and partial_fit keep the multiplier."""
    from sklearn_cuwide import GPUFactorizationMachineRegressor
    from sklearn_cuwide.datasets import make_ctr_regression

    X, y = make_ctr_regression(10_000, n_features=2**12, n_fields=20, model="fm",
                               random_state=6)[:2]
    est = GPUFactorizationMachineRegressor(n_factors=4, max_iter=6, random_state=0,
                                           device="cpu")
    fm = _best_validated_fit_is_kept(est, X, y, stratify=None)
    m = fm.penalty_multiplier_
    assert m > 1  # a choice made
    fm.set_params(warm_start=True, max_iter=1).fit(X, y)  # continued: no new choice
    assert fm.penalty_multiplier_ == m
    fm.partial_fit(X[:500], y[:500])
    assert fm.penalty_multiplier_ == m
    small = clone(est).fit(X[:1_999], y[:1_999])  # too few rows to choose
    assert small.penalty_multiplier_ == 1.0


def test_a_small_regressor_chooses_on_a_fifth_and_the_fit_uses_it():
    """From 2,000 to 10,000 rows the regressor's multiplier is the one whose
    fit of four fifths of the rows has the least squared error on the
    random fifth left out, and the fit of all rows uses it.  Reference:
    plain fits with the penalties written out, of the target standardised
    as the estimator does it (the same split; the least loss by a clear
    margin), then the fit of all rows with that multiplier, bit for bit."""
    from sklearn_cuwide import GPUFactorizationMachineRegressor
    from sklearn_cuwide._fm import _standardise, _target_scaling
    from sklearn_cuwide.datasets import make_ctr_regression

    X, y = make_ctr_regression(4_000, n_features=2**12, n_fields=20, model="fm",
                               random_state=11)[:2]
    est = GPUFactorizationMachineRegressor(n_factors=4, max_iter=8, random_state=0,
                                           device="cpu")
    fm = clone(est).fit(X, y)
    seed = check_random_state(0).randint(np.iinfo(np.int32).max)
    tr, va = _validation_split(y.shape[0], CHOICE_FRACTION, None, seed)
    t = _standardise(y, _target_scaling(y, np.ones(y.size), fit_intercept=True))
    losses = []
    for m in PENALTY_MULTIPLIERS:
        ref = _explicit(est, X[tr], np.ones(tr.size), m).fit(X[tr], t[tr])
        losses.append(float(np.mean((ref.predict(X[va]) - t[va]) ** 2)))
    order = np.argsort(losses)
    # a choice no rounding could flip (the estimator's fits are these, bit
    # for bit: 1.7% apart on this data, row order and split)
    assert losses[order[1]] > 1.005 * losses[order[0]]
    assert fm.penalty_multiplier_ == PENALTY_MULTIPLIERS[order[0]] > 1
    full = _explicit(est, X, np.ones(X.shape[0]), fm.penalty_multiplier_).fit(X, y)
    for k in ("coef_", "intercept_", "factors_"):
        np.testing.assert_array_equal(getattr(fm, k), getattr(full, k), err_msg=k)


def test_the_validation_choice_logs_each_fit_and_warns_for_the_kept_one(capsys):
    """verbose: one line per multiplier (its validation loss and fit time)
    then the choice as a stage; the warnings are the kept fit's, once."""
    from sklearn.exceptions import ConvergenceWarning

    fm, lines, out, seen = _logged_choice(capsys, 2, n=10_000, seed=4)
    assert all("validation loss" in s and " of 2 (fit in" in s for s in lines)
    mine = [w for w in seen if issubclass(w.category, ConvergenceWarning)]
    assert len(mine) == 1
    # given again as the package gives its warnings: at the user's call, so
    # that a filter on the user's module applies
    assert mine[0].filename == __file__
    X, y = _data(n=10_000, seed=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=ConvergenceWarning,
                                module=re.escape(__name__))
        GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0,
                                device="cpu").fit(X, y)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert "scored on early stopping's validation split, the best kept" in out
    # the rows every fit's epochs processed: 9,000 training rows, 2 epochs, 4 fits
    assert "Fit: " in out and " 72,000 samples processed" in out


def _logged_choice(capsys, max_iter, **data):
    """A verbose fit with the defaults' choice on ``_data(**data)``: the
    model, its lines of the multipliers (checked: a line saying what the
    choice does and how to skip it, one line per multiplier in order, then
    the choice as a stage), its output and its warnings."""
    X, y = _data(**data)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fm = GPUFactorizationMachine(n_factors=4, max_iter=max_iter, random_state=0,
                                     device="cpu", verbose=1).fit(X, y)
    out = capsys.readouterr().out
    lines = [s for s in out.splitlines() if s.startswith("Penalty multiplier ")]
    assert [s.split()[2].rstrip(":") for s in lines] == [f"{m:g}" for m in PENALTY_MULTIPLIERS]
    assert "Penalty choice: one fit per multiplier 1, 3, 10, 30" in out
    assert "(alpha and beta set to numbers skip it)" in out
    assert f"Stage: penalty choice (multiplier {fm.penalty_multiplier_:g})" in out
    assert "[multiplier" not in out  # the fits' own lines from verbose=2
    return fm, lines, out, list(seen)


def test_multiclass_and_continued_fits_keep_their_multiplier():
    X, y = _data()
    y3 = y + (np.arange(y.size) % 3 == 0)  # three classes
    fm3 = GPUFactorizationMachine(n_factors=4, max_iter=3, random_state=0,
                                  device="cpu").fit(X, y3)
    assert fm3.penalty_multiplier_ == 1.0
    X, y = _data(n=3000, seed=5)
    fm = GPUFactorizationMachine(n_factors=4, max_iter=3, random_state=0, device="cpu",
                                 warm_start=True).fit(X, y)
    m = fm.penalty_multiplier_
    assert m > 1  # chosen, not the default
    fm.fit(X, y)  # continued: no new choice
    assert fm.penalty_multiplier_ == m
    fm.partial_fit(X, y)
    assert fm.penalty_multiplier_ == m


def test_the_log_shows_each_multiplier_and_max_iter_gives_no_warning(capsys):
    """verbose: one line per multiplier (its held-out loss and fit time),
    then the choice as a stage; reaching max_iter gives no
    ConvergenceWarning, since the penalty was chosen for these epochs (one
    would advise early stopping, which turns the choice off, or more
    epochs, which fit the training rows closer); a fit with a penalty set
    by the user still warns."""
    from sklearn.exceptions import ConvergenceWarning

    X, y = _data()
    fm, lines, _, seen = _logged_choice(capsys, 2)
    assert all("held-out log loss" in s and "rows in" in s for s in lines)
    assert fm.n_iter_ == 2  # ran out of epochs, the rule unmet
    assert not [w for w in seen if issubclass(w.category, ConvergenceWarning)]
    with pytest.warns(ConvergenceWarning, match="early_stopping=True"):  # not chosen
        GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0, device="cpu",
                                alpha=1e-4).fit(X, y)


def test_the_four_fits_share_one_seed_whatever_random_state_is(monkeypatch):
    """With random_state None or a RandomState instance the four fits of
    the choice still draw the same layout, epochs and initial factors (they
    differ by their penalty alone); an int is used as it is."""
    from sklearn_cuwide import _fm

    seen = []
    orig = _fm.fit_heads

    def spy(*a, schedule, **kw):
        seen.append(schedule.random_state)
        return orig(*a, schedule=schedule, **kw)

    monkeypatch.setattr(_fm, "fit_heads", spy)
    X, y = _data()
    for rs in (None, np.random.RandomState(7), 11):
        seen.clear()
        fm = GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=rs,
                                     device="cpu", tol=None).fit(X, y)
        choice = seen[: len(PENALTY_MULTIPLIERS)]
        assert len(seen) == len(PENALTY_MULTIPLIERS) + 1 and len(set(choice)) == 1
        assert choice[0] is not None and (choice[0] == 11) == (rs == 11)
        assert fm.penalty_multiplier_ in PENALTY_MULTIPLIERS


def test_the_choices_fits_draw_their_initial_factors_once(monkeypatch):
    """The four fits of a choice share one seed and one layout: the host
    draws their initial factors once (``shared_draws``), each fit training
    its own copy; the bits are those of a fit that drew them itself (the
    tests above compare the chosen models with plain fits)."""
    from sklearn_cuwide import _state

    calls = []
    orig = _state.draw_factors
    monkeypatch.setattr(_state, "draw_factors",
                        lambda *a, **k: calls.append(1) or orig(*a, **k))
    X, y = _data()
    GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0, device="cpu").fit(X, y)
    assert len(calls) == 2  # the choice's four fits, then the fit of all rows
    calls.clear()
    X, y = _data(n=10_000, seed=4)
    GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0, device="cpu").fit(X, y)
    assert len(calls) == 1  # the four fits on early stopping's split are the fit


def test_shared_draws_gives_copies_of_one_kept_draw():
    from sklearn_cuwide._backends import _cpu
    from sklearn_cuwide._state import ModelState, shared_draws

    order = np.random.default_rng(0).permutation(50)
    st = ModelState.zeros(50, 1, 3, adagrad=True, init_scale=0.1, random_state=5, draw=False)
    plain = st.put_in_layout_order(order, _cpu).V
    with shared_draws():
        a = st.put_in_layout_order(order, _cpu).V
        b = st.put_in_layout_order(order, _cpu).V
        other = st.put_in_layout_order(order[::-1], _cpu).V  # another order: drawn
        again = st.put_in_layout_order(order, _cpu).V  # one draw kept: drawn again
    for v in (a, b, again):
        np.testing.assert_array_equal(v.view(np.uint32), plain.view(np.uint32))
    assert a is not b and not np.shares_memory(a, b)
    np.testing.assert_array_equal(other, plain[::-1])
    a[...] = 0  # a fit trains its own copy
    np.testing.assert_array_equal(b, plain)


@pytest.mark.parametrize("fmt", ["coo", "csc", "lil"])
def test_the_choice_takes_any_sparse_format(fmt):
    """A matrix of another sparse format (``sp.hstack`` gives COO) in the
    held-out choice's range of rows: the CSR's model, bit for bit, for the
    classifier and the regressor."""
    import scipy.sparse as sp

    from sklearn_cuwide import GPUFactorizationMachineRegressor

    X, y = _data(n=2500)
    Z = X.asformat(fmt)
    args = dict(n_factors=4, max_iter=3, random_state=0, device="cpu")
    for est, target in ((GPUFactorizationMachine(**args), y),
                        (GPUFactorizationMachineRegressor(**args), y + 0.1 * X.sum(axis=1).A1)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a, b = clone(est).fit(X, target), clone(est).fit(Z, target)
        assert a.penalty_multiplier_ == b.penalty_multiplier_
        for k in ("coef_", "intercept_", "factors_"):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert isinstance(Z, (sp.coo_matrix, sp.csc_matrix, sp.lil_matrix))
