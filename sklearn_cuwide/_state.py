"""Plain containers handed from the estimators to the solvers and backends.

Nothing here knows about estimators: a solver gets a :class:`ModelState` (the
model's arrays and the optimiser's accumulators) and a :class:`StepParams`
(the hyperparameters of one mini-batch step) and returns arrays;
:class:`FitProgress` is the ``verbose`` log a fit hands down to them.
"""

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from ._loss import LOSSES

__all__ = ["StepParams", "ModelState", "FitProgress", "LOSSES", "MODELS", "SOLVERS"]

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


@dataclass
class ModelState:
    """The model's arrays, in *layout* feature order during a fit.

    ``w``: (n_features, n_outputs) linear weights; ``V``: (n_features,
    n_factors) factors or None; ``b``: (n_outputs,) intercepts.  ``gw``, ``gV``
    and ``gb`` are Adagrad's sums of squared gradients (None for sgd).
    Arrays are numpy on the CPU backend and cupy on the CUDA backend.
    """

    w: object
    b: object
    V: object = None
    gw: object = None
    gV: object = None
    gb: object = None

    @property
    def n_outputs(self):
        return int(self.w.shape[1])

    @property
    def n_factors(self):
        return 0 if self.V is None else int(self.V.shape[1])

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
    ):
        """A fresh state (numpy): zero weights, factors ~ N(0, init_scale^2)."""
        w = np.zeros((n_features, n_outputs), dtype=dtype)
        b = np.zeros(n_outputs, dtype=dtype)
        V = None
        if n_factors:
            rng = np.random.default_rng(random_state)
            V = (rng.standard_normal((n_features, n_factors)) * init_scale).astype(
                dtype
            )
        st = cls(w=w, b=b, V=V)
        if adagrad:
            st.gw = np.zeros_like(w)
            st.gb = np.zeros_like(b)
            st.gV = None if V is None else np.zeros_like(V)
        return st

    def permute_features(self, index, xp=np):
        """A new state whose feature ``j`` is this state's ``index[j]``."""
        out = ModelState(w=None, b=None)
        for k in ("w", "V", "gw", "gV"):
            a = getattr(self, k)
            setattr(out, k, None if a is None else xp.ascontiguousarray(a[index]))
        out.b = self.b
        out.gb = self.gb
        return out


class FitProgress:
    """The ``verbose`` log of one fit, and its clock.

    Made when a fit starts (before its input checks) and handed down to the
    driver and the solvers, it prints one line per stage, each with its own
    wall-clock time, in the order the fit goes through them:

    * ``Stage: <name> in <t> s`` -- a stage that ends (:meth:`stage`): the
      input checks, the early-stopping split, the step parameters, the
      layout, each model's initial state and its upload to the device, and
      after the epochs the model back on the host and the fitted attributes;
    * ``Epoch <k> in <t> s: <detail>, <r> samples/s, <T> s since the fit
      began`` -- an epoch (:meth:`step`), with the samples per second over
      the wall-clock of the whole fit so far, setup included: the rate the
      user waited for;
    * ``Iterations <a>-<b> in <t> s: ...`` -- L-BFGS iterations
      (:meth:`iteration`), one line per :attr:`every` of them (every one
      from ``verbose=2``);
    * ``Fit: <T> s, <n> samples, <r> samples/s`` -- the last line
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
        if compiled > 0:
            text += f" (kernels {compiled:.3f} s)"
        return now, text

    def _print(self, line):
        if self.verbose:
            print(line, flush=True)

    def _rate(self, now):
        total = now - self.start
        rate = self.samples / total if total > 0 else math.inf
        return f"{rate:,.0f} samples/s, {total:.2f} s since the fit began"

    def stage(self, name):
        """End the stage ``name`` (it began where the last line's span ended)."""
        self._flush_iterations()
        _, span = self._span()
        self._print(f"Stage: {name} in {span}")

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

    def finish(self, name="attributes"):
        """End the last stage (``name``: setting the fitted attributes) and
        print the whole fit's wall-clock and samples per second."""
        self.stage(name)
        total = self.elapsed()
        rate = self.samples / total if total > 0 else math.inf
        self._print(f"Fit: {total:.3f} s, {self.samples:,} samples, {rate:,.0f} samples/s")


def _kernel_seconds():
    """Seconds this process spent getting kernel modules so far (0 without
    the CUDA backend's kernels: nothing imports cupy here)."""
    from ._kernels import compile_seconds

    return compile_seconds()[0]
