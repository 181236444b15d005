"""Plain containers handed from the estimators to the solvers and backends.

Nothing here knows about estimators: a solver gets a :class:`ModelState` (the
model's arrays and the optimiser's accumulators) and a :class:`StepParams`
(the hyperparameters of one mini-batch step) and returns arrays;
:class:`FitProgress` is the ``verbose`` log a fit hands down to them.
"""

import contextvars
import hashlib
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from . import _host
from ._loss import LOSSES

__all__ = ["StepParams", "ModelState", "FitProgress", "LOSSES", "MODELS", "SOLVERS",
           "counter_bits", "counter_normal", "draw_factors", "factor_seed", "shared_draws",
           "quantile_table", "seed_mix"]

#: inside :func:`shared_draws`: the last host draw of initial factors, by
#: what determines it (None outside)
_SHARED_DRAWS = contextvars.ContextVar("sklearn_cuwide_shared_draws", default=None)


@contextmanager
def shared_draws():
    """Inside, a host draw of initial factors (:meth:`ModelState.put_in_layout_order`
    on a numpy backend) is kept, and a later draw of the same seed, scale,
    rank, dtype and feature order gets a copy of it instead of drawing
    again: the penalty choice's fits share one seed and, on the same rows,
    one layout.  Rule: one draw kept, only inside.  Why: a model's factors
    can be gigabytes, and a draw held past its fits would be a leak."""
    token = _SHARED_DRAWS.set({})
    try:
        yield
    finally:
        _SHARED_DRAWS.reset(token)


def _all_zero(a, head=4096):
    """Whether every value of ``a`` is 0, its first ``head`` rows looked
    at first: a trained state is nonzero there almost always, and is then
    told without a pass over all its rows."""
    return not a[:head].any() and not a.any()


def _host_draw(seed, scale, order, k, dtype):
    """:func:`draw_factors` of the features ``order`` on the host, taken
    from :func:`shared_draws`' kept draw when it is the same one."""
    order = np.ascontiguousarray(order, dtype=np.int64)
    kept = _SHARED_DRAWS.get()
    if kept is None:
        return draw_factors(np, seed, scale, order, k, dtype=dtype)
    key = (int(seed), float(scale), int(k), np.dtype(dtype).str, order.shape[0],
           hashlib.blake2b(order.tobytes(), digest_size=16).digest())
    if key not in kept:
        kept.clear()
        kept[key] = draw_factors(np, seed, scale, order, k, dtype=dtype)
    return kept[key].copy()  # the fit trains its own in place

MODELS = ("linear", "fm")
SOLVERS = ("sgd", "adagrad")


@dataclass(frozen=True)
class StepParams:
    """Hyperparameters of one mini-batch step (shared by every backend).

    The objective of a mini-batch ``B`` of total sample weight ``W_B`` is::

        (1 / W_B) * sum_{i in B} s_i * loss(y_i, f(x_i))
            + l2_w / 2 * ||w_F||^2 + l2_v / 2 * ||V_F||^2 + l1 * ||w_F||_1

    where ``F`` are the features present in the mini-batch (lazy
    regularisation, as libFM, xLearn and sparse PyTorch optimisers do).  The
    intercept is never regularised.  ``l1`` is applied by a proximal step.

    ``penalty_scaled=True`` multiplies each present feature's ``l2_w``,
    ``l2_v`` and ``l1`` by its :func:`~sklearn_cuwide._layout.penalty_scale`
    (``n_batches`` over the sample blocks holding it), so that over an epoch
    every feature is penalised as the full objective's stochastic gradient
    penalises it (logistic regression sets it: scikit-learn's objective for
    ``C``; the factorization machines keep libFM's per-step penalty).

    Every step ``t`` (sgd's ``learning_rate``, Adagrad's per-coordinate step)
    is taken as ``t / (1 + t * l2)`` with ``l2`` the feature's (scaled) L2
    coefficient: the step of the L2 term's proximal form, stable however
    large ``t * l2`` grows.
    """

    model: str = "linear"  # "linear" or "fm"
    loss: str = "logistic"  # "logistic", "multinomial" or "squared"
    solver: str = "adagrad"  # "sgd" or "adagrad"
    learning_rate: float = 0.1
    l2_w: float = 0.0
    l2_v: float = 0.0
    l1: float = 0.0
    eps: float = 1e-7
    fit_intercept: bool = True
    fit_linear: bool = True
    penalty_scaled: bool = False

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}")
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown solver {self.solver!r}")
        if self.model == "fm" and self.loss == "multinomial":
            raise ValueError("the FM is binary or regression only")

    def replace(self, **kw):
        return replace(self, **kw)

    def summary(self):
        """What a fit's ``verbose`` log says of its step: the step size, and
        the penalties of an FM (its ``alpha`` and ``beta`` as resolved)."""
        text = f"learning_rate {self.learning_rate:.4g}"
        if self.model == "fm":
            text += f", alpha {self.l2_w:.3g}, beta {self.l2_v:.3g}"
        return text


# --------------------------------------------------------------------------
# the initial factors: one generator for every device
# --------------------------------------------------------------------------
_MASK64 = (1 << 64) - 1
#: splitmix64's increment and multipliers
_GAMMA, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
#: the normal's quantile table: 2**_CELL_BITS cells, uniform in probability
_CELL_BITS = 16
#: random bits of the position inside a cell (below the cell's bits)
_FRAC_BITS = 37
_QUANTILES = None


def _splitmix64_int(z):
    """splitmix64's finaliser of a Python int (the seed's mix, on the host)."""
    z = (z ^ (z >> 30)) * _MUL1 & _MASK64
    z = (z ^ (z >> 27)) * _MUL2 & _MASK64
    return z ^ (z >> 31)


def factor_seed(random_state):
    """The integer seed of :func:`counter_normal` for ``random_state`` (an
    int is used as it is; None or a Generator draw one)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state) & _MASK64
    return int(np.random.default_rng(random_state).integers(0, 2**63))


def counter_bits(xp, seed, counter):
    """64 random bits for each entry of ``counter`` (an integer array of
    ``xp``): splitmix64 of the ``counter + 1``-th step from ``seed``.

    Rule: integer operations only (wrapping uint64 multiply, xor, shifts).
    Why: numpy and cupy then give the same bits, by construction.
    """
    u = xp.uint64
    z = counter.astype(u)  # a new array: the steps below work in place
    z += u(1)
    z *= u(_GAMMA)
    z += u(seed_mix(seed))
    t = z >> u(30)
    z ^= t
    z *= u(_MUL1)
    xp.right_shift(z, u(27), out=t)
    z ^= t
    z *= u(_MUL2)
    xp.right_shift(z, u(31), out=t)
    z ^= t
    return z


def seed_mix(seed):
    """The seed's splitmix64 step that :func:`counter_bits` adds to every
    counter (an int below ``2**64``)."""
    return _splitmix64_int(int(seed) & _MASK64)


def quantile_table():
    """``Phi^-1`` at the ``2**16 + 1`` cell edges ``i / 2**16`` (float64,
    host), the infinite ends replaced by ``Phi^-1(2**-18)`` and its
    negative; symmetric bit for bit.  Computed once."""
    global _QUANTILES
    if _QUANTILES is None:
        from scipy.special import ndtri

        n = 1 << _CELL_BITS
        half = ndtri(np.arange(n // 2 + 1, dtype=np.float64) / n)
        half[0] = ndtri(2.0**-18)
        half[-1] = 0.0
        _QUANTILES = np.concatenate([half, -half[-2::-1]])
    return _QUANTILES


def counter_normal(xp, seed, counter, table=None):
    """Standard normal draws (float64, ``xp``), one per entry of ``counter``,
    the same bits on every device.

    Inverse transform sampling: the top 16 of :func:`counter_bits` pick one
    of 65536 cells of equal probability, the next 37 a point inside it,
    interpolated linearly between the cell's quantiles.  The draws follow
    the normal to within its extreme tails (the two outer cells, of
    probability ``2**-16`` each, stop at 4.48 standard deviations).  Only
    exactly rounded operations (integer conversions below ``2**53``, one
    multiply, one subtraction, one add, the table gathered) touch them, so
    numpy and cupy agree bit for bit; ``log``/``cos`` (Box-Muller) would not.
    ``table``: :func:`quantile_table` already on ``xp``'s device.
    """
    if table is None:
        table = xp.asarray(quantile_table())
    bits = counter_bits(xp, seed, counter)
    u = xp.uint64
    cell = (bits >> u(64 - _CELL_BITS)).astype(xp.int64)
    bits >>= u(64 - _CELL_BITS - _FRAC_BITS)
    bits &= u((1 << _FRAC_BITS) - 1)
    frac = bits.astype(xp.float64)
    del bits
    frac *= 2.0**-_FRAC_BITS
    lo = table[cell]
    cell += 1
    hi = table[cell]
    hi -= lo
    hi *= frac
    hi += lo
    return hi


def draw_factors(xp, seed, scale, features, n_factors, dtype=np.float32,
                 chunk=1 << 22):
    """The initial factors of the features ``features`` (user ids, an int64
    array of ``xp``), row ``i`` for feature ``features[i]``:
    ``V[j, k] = scale * counter_normal(seed, j * n_factors + k)``.

    Any order of the rows draws the same values for a feature: a fit draws
    them in its layout's feature order, on its device, and gets the rows of
    the user-order draw (``features = arange(n_features)``) permuted.  About
    ``chunk`` values at a time bound the temporary memory.
    """
    n, k = int(features.shape[0]), int(n_factors)
    V = xp.empty((n, k), dtype=dtype)
    table = xp.asarray(quantile_table())
    ks = xp.arange(k, dtype=xp.int64)
    # on the host the rows are drawn in runs on every core, the chunk
    # shared among them (the temporaries stay within ``chunk`` values)
    threads = _host.run_count(n, V.nbytes) if xp is np else 1
    step = max(1, int(chunk) // max(k, 1) // threads)

    def draw(a0, a1):
        for a in range(a0, a1, step):
            b = min(a1, a + step)
            counter = features[a:b, None].astype(xp.int64) * k + ks[None, :]
            V[a:b] = (counter_normal(xp, seed, counter, table) * float(scale)).astype(dtype)

    if xp is np:
        _host.each_run(n, V.nbytes, draw)
    else:
        draw(0, n)
    return V


@dataclass
class ModelState:
    """The model's arrays, in *layout* feature order during a fit.

    ``w``: (n_features, n_outputs) linear weights; ``V``: (n_features,
    n_factors) factors or None; ``b``: (n_outputs,) intercepts.  ``gw``, ``gV``
    and ``gb`` are Adagrad's sums of squared gradients (None for sgd).
    Arrays are numpy on the CPU backend and cupy on the CUDA backend.

    ``factor_init``: ``(seed, init_scale, n_factors)`` of factors not drawn
    yet (``V`` and ``gV`` are then None): :meth:`put_in_layout_order` draws
    them on the backend's device, in the layout's order (see
    :meth:`zeros`).
    """

    w: object
    b: object
    V: object = None
    gw: object = None
    gV: object = None
    gb: object = None
    factor_init: tuple = None

    @property
    def n_outputs(self):
        return int(self.w.shape[1])

    @property
    def n_factors(self):
        if self.V is None:
            return 0 if self.factor_init is None else int(self.factor_init[2])
        return int(self.V.shape[1])

    def arrays(self):
        return {
            k: getattr(self, k)
            for k in ("w", "b", "V", "gw", "gV", "gb")
            if getattr(self, k) is not None
        }

    @classmethod
    def zeros(
        cls,
        n_features,
        n_outputs=1,
        n_factors=0,
        *,
        adagrad=False,
        dtype=np.float32,
        init_scale=0.0,
        random_state=None,
        draw=True,
    ):
        """A fresh state (numpy): zero weights, factors ~ N(0, init_scale^2).

        The factors come from :func:`draw_factors` (a counter-based
        generator: the same values on every device).  ``draw=False`` leaves
        them to :meth:`put_in_layout_order` (``factor_init``), which draws
        them on the device where the fit runs, in its layout's order: no
        host pass over ``n_features x n_factors``, the same values.
        """
        w = np.zeros((n_features, n_outputs), dtype=dtype)
        b = np.zeros(n_outputs, dtype=dtype)
        V = init = None
        if n_factors:
            seed = factor_seed(random_state)
            if draw:
                V = draw_factors(np, seed, init_scale,
                                 np.arange(n_features, dtype=np.int64), n_factors, dtype)
            else:
                init = (seed, float(init_scale), int(n_factors))
        st = cls(w=w, b=b, V=V, factor_init=init)
        if adagrad:
            st.gw = np.zeros_like(w)
            st.gb = np.zeros_like(b)
            st.gV = None if V is None else np.zeros_like(V)
        return st

    def permute_features(self, index, xp=np, empty=None):
        """A new state whose feature ``j`` is this state's ``index[j]``
        (factors not drawn yet stay so); on the host, into arrays from
        ``empty(shape, dtype)`` when given."""
        out = ModelState(w=None, b=None, factor_init=self.factor_init)
        for k in ("w", "V", "gw", "gV"):
            a = getattr(self, k)
            if a is None:
                setattr(out, k, None)
            elif xp is np:  # on the host: the rows taken on every core
                dst = None if empty is None else empty((len(index),) + a.shape[1:], a.dtype)
                setattr(out, k, _host.take_rows(a, index, out=dst))
            else:
                setattr(out, k, xp.ascontiguousarray(a[index]))
        out.b = self.b
        out.gb = self.gb
        return out

    def take_features(self, index, xp=np):
        """:meth:`permute_features` that gives this state's arrays up as it
        goes (each set to None once permuted): at most one array's copy is
        held beside the state.  Rule: a state permuted where it trains is
        taken, not copied.  Why: the memory plan counts one array and the
        index beside the model, not a second model.  A backend's bookkeeping
        that holds the arrays too (a device state's ``packed`` buffers,
        which hold Adagrad's sums) is dropped first."""
        if getattr(self, "packed", None) is not None:
            self.packed = None
        out = ModelState(w=None, b=None, factor_init=self.factor_init)
        for k in ("w", "V", "gw", "gV"):
            a = getattr(self, k)
            setattr(self, k, None)
            if a is not None:
                setattr(out, k, _host.take_rows(a, index) if xp is np
                        else xp.ascontiguousarray(a[index]))
            del a
        out.b, out.gb = self.b, self.gb
        return out

    def put_features(self, index, sub):
        """Write ``sub``'s features into this state's features ``index``
        (feature ``index[j]`` becomes ``sub``'s ``j``; numpy, in place), and
        take ``sub``'s intercepts and their sums: the inverse of
        ``permute_features(index)`` for the features it took.  Returns
        this state."""
        for k in ("w", "V", "gw", "gV"):
            a = getattr(self, k)
            if a is not None:
                a[index] = getattr(sub, k)
        self.b, self.gb = sub.b, sub.gb
        return self

    def put_in_layout_order(self, order, backend, draw_with=None, draw_rows=1 << 20,
                            empty=None):
        """This state (user feature order) on ``backend``'s device in the
        layout's feature order ``order`` (``order[new] = old``; numpy, or
        an array of ``backend``'s device for a layout planned there, but
        numpy with ``draw_with``): the arrays permuted where ``backend``
        computes, and factors not drawn yet (``factor_init``) drawn there,
        directly in that order (Adagrad's sums of them zero).  Arrays of
        zeros (a fresh fit's weights and sums) are made there instead:
        permuting and copying zeros is a host pass and a transfer for
        nothing.

        ``draw_with``: another backend that draws the factors, ``draw_rows``
        features at a time, each part copied to ``backend`` (the host state of
        a model wider than the device is drawn by the device: the same values,
        by construction, much sooner).  ``empty``: for a host ``backend``,
        ``empty(shape, dtype)`` makes the feature-sized arrays: the permuted
        ones, the zeros and the factors that ``draw_with`` draws (the
        page-locked rows of a model wider than the device, written in place:
        no second host copy of the model); factors the host draws itself
        come in an array of their own."""
        zero = {k: getattr(self, k) for k in ("w", "V", "gw", "gV")
                if getattr(self, k) is not None and _all_zero(getattr(self, k))}
        if empty is None:
            def zeros(shape, dtype):
                return backend.xp.zeros(shape, dtype=dtype)

            def blank(shape, dtype):
                return backend.xp.empty(shape, dtype=dtype)
        else:
            def zeros(shape, dtype):
                return _host.fill_rows(empty(shape, dtype), 0)

            blank = empty
        kept = replace(self, **dict.fromkeys(zero))
        xp, index = backend.xp, None

        def device_order():  # ``order`` on the device, made once
            nonlocal index
            if index is None:
                index = xp.asarray(backend.to_device(order)).astype(xp.int64, copy=False)
            return index

        if xp is np:
            dev = backend.put_state(kept.permute_features(order, empty=empty))
        else:
            # copied in the user's order, then permuted where the fit runs
            # (``order`` may be the device's already), one array at a time:
            # no host pass over the model's rows, and a continued fit's
            # state crosses once
            dev = backend.put_state(kept)
            for k in ("w", "V", "gw", "gV"):
                if getattr(dev, k) is not None:
                    setattr(dev, k, xp.ascontiguousarray(getattr(dev, k)[device_order()]))
        for k, a in zero.items():
            setattr(dev, k, zeros(a.shape, a.dtype))
        if self.factor_init is None:
            return dev
        seed, scale, k = self.factor_init
        if (draw_with is None or draw_with is backend) and xp is np:
            dev.V = _host_draw(seed, scale, order, k, self.w.dtype)
        elif draw_with is None or draw_with is backend:
            dev.V = backend.draw_factors(seed, scale, device_order(), k, self.w.dtype)
        else:
            order = np.asarray(order, dtype=np.int64)
            dev.V = blank((order.shape[0], k), self.w.dtype)
            step = max(1, int(draw_rows))
            for a in range(0, order.shape[0], step):
                f = draw_with.xp.asarray(draw_with.to_device(order[a : a + step]))
                part = draw_with.draw_factors(seed, scale, f, k, self.w.dtype)
                if xp is np:  # onto the host: straight into the rows
                    draw_with.to_host(part, out=dev.V[a : a + step])
                else:
                    dev.V[a : a + step] = backend.to_device(draw_with.to_host(part))
        dev.factor_init = None
        if self.gw is not None:  # Adagrad: the factors' sums start at zero
            dev.gV = zeros(dev.V.shape, dev.V.dtype)
        return dev


class FitProgress:
    """The ``verbose`` log of one fit, and its clock.

    Made when a fit starts (before its input checks) and handed down to the
    driver and the solvers, it prints one line per stage, each with its own
    wall-clock time, in the order the fit goes through them:

    * ``Stage: <name> in <t> s`` -- a stage that ends (:meth:`stage`): the
      input checks, the early-stopping split, the step parameters (with the
      step size and penalties they resolved to: ``"auto"`` depends on the
      data), the layout, each model's initial state and its upload to the
      device, and after the epochs the model back on the host and the
      fitted attributes;
    * ``Epoch <k> in <t> s: <detail>, <r> samples/s, <T> s since the fit
      began`` -- an epoch (:meth:`step`), with the samples per second over
      the wall-clock of the whole fit so far, setup included: the rate the
      user waited for;
    * ``Iterations <a>-<b> in <t> s: ...`` -- L-BFGS iterations
      (:meth:`iteration`), one line per :attr:`every` of them (every one
      from ``verbose=2``);
    * ``Fit: <T> s on <device>, <n> samples processed (rows times passes over
      them), <r> samples/s`` -- the last line
      (:meth:`finish`), the whole fit.

    A line whose span compiled kernels (or loaded them from CuPy's cache)
    says how long that took: ``in <t> s (kernels <c> s)``.  With
    ``verbose=0`` nothing is printed.
    """

    #: L-BFGS iterations per line at ``verbose=1``
    ITERATIONS_PER_LINE = 10

    def __init__(self, verbose=0):
        self.verbose = int(verbose or 0)
        self.start = time.perf_counter()
        self._mark = self.start
        self._kernels = _kernel_seconds()
        #: rows processed by the epochs (or objective evaluations) so far
        self.samples = 0
        #: L-BFGS iterations per printed line
        self.every = 1 if self.verbose >= 2 else self.ITERATIONS_PER_LINE
        self._pending = None  # iterations not printed yet: [first, last, detail]
        #: what a printed loss is multiplied by: the regressor trains on a
        #: standardised target and prints its losses in the units of y, as
        #: ``loss_curve_`` and ``validation_score_`` give them
        self.loss_unit = 1.0

    def loss(self, value):
        """A loss as the lines print it (in the units of the fitted
        attributes: :attr:`loss_unit`)."""
        return float(value) * self.loss_unit

    def elapsed(self):
        """Seconds since the fit started."""
        return time.perf_counter() - self.start

    def _span(self):
        """Seconds since the last line, with the kernels' share; starts the next span."""
        now = time.perf_counter()
        k = _kernel_seconds()
        span, compiled = now - self._mark, k - self._kernels
        self._mark, self._kernels = now, k
        text = f"{span:.3f} s"
        if compiled >= 0.0005:  # shown only where it rounds to a time
            text += f" (kernels {compiled:.3f} s)"
        return now, text

    def _print(self, line):
        if self.verbose:
            print(line, flush=True)

    def _rate(self, now):
        total = now - self.start
        rate = self.samples / total if total > 0 else math.inf
        return f"{rate:,.0f} samples/s, {total:.2f} s since the fit began"

    def note(self, line):
        """Print ``line`` as it is (no time: the span goes on)."""
        self._flush_iterations()
        self._print(line)

    def stage(self, name, detail=None):
        """End the stage ``name`` (it began where the last line's span ended),
        with what it resolved (``detail``, after a colon); None prints nothing
        and leaves the span to the next line."""
        if name is None:
            return
        self._flush_iterations()
        _, span = self._span()
        self._print(f"Stage: {name} in {span}" + (f": {detail}" if detail else ""))

    def step(self, label, detail, n_samples):
        """Count ``n_samples`` rows processed and print ``label in <t> s:
        detail`` with the fit's samples per second so far (an epoch)."""
        self._flush_iterations()
        self.samples += int(n_samples)
        now, span = self._span()
        self._print(f"{label} in {span}: {detail}, {self._rate(now)}")

    def iteration(self, it, detail, n_samples):
        """Count L-BFGS iteration ``it`` (``n_samples`` rows evaluated);
        print a line for the iterations since the last one every
        :attr:`every` iterations (and for the first)."""
        self.samples += int(n_samples)
        first = it if self._pending is None else self._pending[0]
        self._pending = [first, it, detail]
        if it == 1 or it % self.every == 0:
            self._flush_iterations()

    def _flush_iterations(self):
        if self._pending is None:
            return
        a, b, detail = self._pending
        self._pending = None
        now, span = self._span()
        what = f"Iteration {b}" if a == b else f"Iterations {a}-{b}"
        self._print(f"{what} in {span}: {detail}, {self._rate(now)}")

    def finish(self, name="attributes", device=None):
        """End the last stage (``name``: setting the fitted attributes) and
        print the whole fit's wall-clock (on ``device``, when given) and
        samples per second."""
        self.stage(name)
        total = self.elapsed()
        rate = self.samples / total if total > 0 else math.inf
        where = "" if device is None else f" on {device}"
        self._print(f"Fit: {total:.3f} s{where}, {self.samples:,} samples processed "
                    f"(rows times passes over them), {rate:,.0f} samples/s")

    def part(self, prefix):
        """A progress for a part of this fit (each fit of the penalty
        choice): its lines start with ``prefix`` and print from
        ``verbose=2`` (at 1 the caller sums the part up in a line of its
        own), its rows count in this fit's samples and its rates are this
        fit's."""
        return _PartProgress(self, prefix)


class _PartProgress(FitProgress):
    """:meth:`FitProgress.part`'s progress."""

    def __init__(self, parent, prefix):
        super().__init__(parent.verbose if parent.verbose >= 2 else 0)
        self.parent, self.prefix = parent, prefix
        self.loss_unit = parent.loss_unit

    def _print(self, line):
        if self.verbose:
            print(self.prefix + line, flush=True)

    def _rate(self, now):
        return self.parent._rate(now)

    def step(self, label, detail, n_samples):
        self.parent.samples += int(n_samples)
        super().step(label, detail, 0)

    def iteration(self, it, detail, n_samples):
        self.parent.samples += int(n_samples)
        super().iteration(it, detail, 0)


def _kernel_seconds():
    """Seconds this process spent getting kernel modules so far (0 without
    the CUDA backend's kernels: nothing imports cupy here)."""
    from ._kernels import compile_seconds

    return compile_seconds()[0]
