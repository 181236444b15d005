"""Backends: where a fit's arrays live and its steps run.

Two modules satisfy :class:`Backend`: :mod:`._cpu` (numpy/scipy, the
correctness reference) and :mod:`._cuda` (CuPy and the CUDA C kernels of
``cuda/``; the only package that imports cupy, and only when it is asked
for).  The solvers and the estimators call a backend through this interface
alone, never by its name.
"""

from typing import Protocol, runtime_checkable

__all__ = ["Backend", "get_backend"]


@runtime_checkable
class Backend(Protocol):
    """What a backend module provides.

    Arrays "on the backend" are numpy arrays for the CPU and cupy arrays for
    the CUDA backend; ``to_device`` / ``to_host`` move them (no-ops on the
    CPU).  Models are :class:`~sklearn_cuwide._state.ModelState` objects,
    layouts :class:`~sklearn_cuwide._layout.TileLayout` objects (or what
    ``put_layout`` makes of them), step hyperparameters
    :class:`~sklearn_cuwide._state.StepParams`.
    """

    #: ``"cpu"`` or ``"cuda"``, for messages and ``device_``
    name: str
    #: the array module of the backend's arrays (numpy or cupy)
    xp: object
    #: ``verbose``'s names of the stages that copy between the host and the
    #: backend (``"upload"``, ``"model back"``, ``"coefficients back"``) where
    #: this backend's differ: the CPU copies nothing, so its stages say what
    #: they do (None: no stage of its own, its time joins the next one's)
    stage_names: dict

    # -- placement -----------------------------------------------------------
    def holds(self, X) -> bool:
        """True when ``X`` already lives on this backend's device (a cupy
        array or cupyx matrix for the CUDA backend; never for the CPU)."""

    def validate_input(self, X, estimator_name=None):
        """``X`` held by this backend, checked as scikit-learn's
        ``check_array`` does (same messages), as a canonical CSR matrix."""

    def to_device(self, a):
        """A host array on the backend."""

    def to_host(self, a, out=None):
        """A backend array as numpy; written into ``out`` (a C-contiguous
        numpy array of its shape and dtype) when given."""

    def all_finite(self, a) -> bool:
        """Whether every value of array ``a`` (on the backend) is finite."""

    def holds_zero(self, a) -> bool:
        """Whether array ``a`` (on the backend) holds a value equal to 0."""

    def synchronize(self):
        """Wait for the backend's queued work."""

    def device_memory(self):
        """``(free, total)`` bytes of the current device (free counting the
        memory pool's unused blocks, within the pool's limit), or None for
        the CPU, whose host memory the planner checks for every backend."""

    def release_cached(self):
        """Give the current device's memory pool's unused blocks back (a fit
        does between its phases: the blocks one phase freed need not fit the
        next one's, and the device would hold both); on the CPU, nothing."""

    def device_scope(self, device):
        """A context manager: the scope of one fit or prediction on
        ``device`` (``"cpu"`` or ``"cuda:N"``).  The device is the calling
        thread's current one inside it (and the previous one again after),
        and a ``MemoryError`` raised inside (cupy's out-of-memory error)
        leaves as :class:`~sklearn_cuwide._memory.InsufficientMemoryError`,
        chained, once the memory of the work's finished frames is freed."""

    def put_csr(self, X, dtype=None):
        """A sparse or dense matrix as the backend's canonical CSR."""

    def take_rows(self, X, rows):
        """Rows ``rows`` (sorted integer indices, numpy) of a canonical CSR
        on the backend (``put_csr``'s, or a cupyx matrix the user gave):
        canonical, on the backend."""

    def csr_in_layout_order(self, X, feature_order, feature_rank):
        """``X`` (``put_csr``'s) with its columns in a layout's feature order
        (``X[:, feature_order]``; ``feature_rank`` its inverse, both arrays
        of the layout: numpy, or this backend's device arrays),
        for ``decision_function`` alone: its rows may be left unsorted."""

    # -- mini-batch training -------------------------------------------------
    def tile_shape(self, params, n_outputs, n_factors, batch_size):
        """``(sample_block, n_hot_max)`` of the training layout."""

    def concurrent_blocks(self, concurrency, params, n_batches):
        """Workers (mini-batches trained at once) for the estimators'
        ``concurrency`` parameter; 1 trains in order."""

    def prepare_fit(self, X, params, n_outputs, n_factors, n_batches, workers, ramp, dtype, *,
                    validation=False, fresh=True):
        """Start, in the background, what a mini-batch fit of ``X`` will
        need first (the CUDA backend compiles its kernels: the layout
        build's for ``X``'s dtypes, the first epoch's for ``n_batches``,
        ``workers`` and the warm-up ``ramp``, the held-out rows' prediction
        and loss where ``validation``, a ``fresh`` FM's initial factors);
        returns at once."""

    def stage_layout_input(self, X, n_rows, read_first=False):
        """Start, in the background, what :meth:`build_layout` of ``X`` reads
        first (``n_rows`` rows laid out), so that the fit's host work
        overlaps it: the CUDA backend copies a host CSR it will build from
        whole to the device.  Returns a
        handle for ``build_layout``'s ``staged`` (whose ``close`` waits for
        the work, and whose ``hold_out(rows)`` returns a handle whose
        ``result()``, once ``build_layout`` has run, is the rows ``rows`` of
        ``X`` on the backend, gathered from the staged copy, and whose
        ``matrix()`` is the staged copy), or None when nothing was started.
        ``read_first``: the fit reads the copy before the build (the
        input's deferred checks, the step parameters)."""

    def build_layout(self, X, staged=None, **kw):
        """:func:`sklearn_cuwide._layout.build_layout`, where it is fastest;
        ``staged``: ``stage_layout_input``'s handle for ``X`` and these rows."""

    def put_layout(self, layout):
        """A layout as ``run_epoch`` walks it."""

    def put_state(self, state):
        """A model state on the backend."""

    def get_state(self, state, lazy=()):
        """A backend model state as numpy; the arrays named in ``lazy`` may
        stay where they are, as objects that become numpy arrays when
        converted (``np.asarray``) or pickled."""

    def run_epoch(self, layout, y, sw, batch_weight, state, params, batch_order, *,
                  workers=None, ramp=0, ramp_done=0) -> float:
        """One pass over the mini-batches in ``batch_order``; returns the sum
        of ``sample_weight * loss``.  ``workers=1`` trains strictly in order;
        ``ramp`` warms the concurrency up (the first epoch of a fresh fit),
        ``ramp_done`` of its mini-batches trained already (an out-of-core
        window, a part of an epoch)."""

    # -- models wider than the device (:mod:`sklearn_cuwide._out_of_core`) --
    def host_rows(self, a):
        """A numpy array of model rows kept in host memory as
        ``gather_rows`` and ``scatter_rows`` move them fastest (page-locked
        memory for the CUDA backend, when the system grants it; ``a``
        itself, or a copy; ``a`` itself when it is such memory already)."""

    def empty_host_rows(self, shape, dtype):
        """An uninitialised numpy array of model rows in the memory
        ``host_rows`` keeps them in (its rows then written in place, with no
        second copy of the model made on the host)."""

    def gather_rows(self, host, ids, out):
        """``out[i] = host[ids[i]]``: ``host`` from ``host_rows``, ``ids``
        (int64) and ``out`` on the backend."""

    def scatter_rows(self, dev, ids, host):
        """``host[ids[i]] = dev[i]`` (``ids`` distinct), arguments as
        ``gather_rows``'s; the host rows are written once the backend's
        queued work is done (``synchronize``)."""

    # -- prediction and full-batch products -------------------------------
    def decision_function(self, X, w, b, V=None, fit_linear=True):
        """Decision values (n_samples, n_outputs) of a CSR matrix."""

    def matmul(self, X, W):
        """``X @ W`` for a backend CSR ``X`` and a dense ``W``."""

    def rmatmul(self, X, E):
        """``X.T @ E`` for a backend CSR ``X`` and a dense ``E``."""

    def fused_objective(self, X, y, ws, *, loss, n_outputs, lam, fit_intercept):
        """The L-BFGS objective's ``fun_grad`` in fused kernels, or None."""

    def weighted_loss(self, Z, y, w, loss):
        """``sum(w * pointwise_loss(Z, y)) / sum(w)`` (a float) of decision
        values ``Z`` and float64 targets and weights on the backend: early
        stopping's validation loss."""

    def draw_factors(self, seed, scale, features, n_factors, dtype):
        """:func:`~sklearn_cuwide._state.draw_factors` of ``features`` (an
        int64 array on the backend), the same bits on every backend."""

    def lbfgs_memory_ops(self):
        """L-BFGS's products with its stored pairs, or None for numpy's."""

    def mcmc_block_draw(self, n_parameters):
        """Gibbs sampling's joint draw of a block of features of
        ``n_parameters`` parameters each (``fit_mcmc``'s ``block_draw``), or
        None for :func:`sklearn_cuwide._mcmc._draw_block`'s array operations."""


def get_backend(device):
    """The backend module for a resolved device (``"cpu"`` or ``"cuda:N"``)."""
    if device == "cpu":
        from . import _cpu

        return _cpu
    if device.startswith("cuda"):
        # its context is created while the backend is imported (the first
        # time; _device.start_context); the device is chosen per fit and
        # thread by ``device_scope``, not here
        from .. import _device

        _device.start_context(int(device.partition(":")[2] or 0))
        from . import _cuda

        return _cuda
    raise ValueError(f"unknown device {device!r}")
