"""Memory planned before it is taken: what a fit or a prediction needs, where
it is available, and the decision (layout resident, layout streamed, or a
clear refusal) made before anything is allocated.

Plain functions of the problem's numbers (rows, features, nonzeros, the
model's shape, the itemsizes), no estimator and no backend: the estimators'
shared code (:mod:`sklearn_cuwide._base`) turns an estimator and its data into
a :class:`FitShape` or a :class:`PredictShape`; :func:`plan_fit` and
:func:`plan_predict` compare the needs with what is available; the CUDA
backend reads the active plan (:func:`active_plan`) to decide where the
training layout is built and whether it stays resident.

Each ``*_bytes`` function counts the arrays that the code it names allocates
(the docstrings say which code); the layout's and the model state's counts
are exact (``tests/test_memory_plan.py`` compares them with built arrays),
the temporaries' are upper bounds from the sequence of live arrays.

Rule: the refusal is :class:`InsufficientMemoryError`, a ``MemoryError``
(a resource limit, not a wrong parameter: code that catches ``MemoryError``
catches it, and catches cupy's out-of-memory error, also a ``MemoryError``,
which the backends turn into it as well), raised before the first
allocation, naming the need, what is available and what would fit.
"""

import math
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

from ._backends._tiles import MAX_HOT, in_order_scratch_sizes
from ._layout import MAX_SAMPLE_BLOCK
from ._mcmc import CHUNK_VALUES
from ._out_of_core import (
    PIECE_ROWS, SLOT_FRACTION, WINDOW_BYTES_PER_NNZ, state_row_bytes, window_nnz,
)

__all__ = [
    "InsufficientMemoryError", "FitShape", "PredictShape", "MemoryPlan", "plan_fit",
    "plan_predict", "fit_needs", "predict_needs", "layout_blocks", "layout_bytes", "layout_index_bytes", "csr_bytes",
    "state_bytes", "chunk_bounds", "tiling_bytes", "layout_plan_bytes", "lbfgs_bytes",
    "host_available_bytes", "device_budget", "limit_for_budget", "plan_scope", "set_plan", "active_plan",
    "out_of_memory_error", "release_frames", "format_bytes",
]

#: bytes per stored nonzero of the training layout besides its value: the
#: feature id (int32) and the row in its sample block (uint16)
LAYOUT_INDEX_BYTES_PER_NNZ = 4 + 2
#: the layout's values and the model state: float32 (``COMPUTE_DTYPE``)
COMPUTE_ITEMSIZE = 4
#: ``device_memory_limit=None``: this fraction of the device's free memory
DEFAULT_FREE_FRACTION = 0.8
#: nonzeros sorted at a time by the layout build (``_layout.build_layout``)
HOST_CHUNK_NNZ = 1 << 24
DEVICE_CHUNK_NNZ = 1 << 23
#: bytes of nonzeros per chunk of a streamed layout (``DeviceLayout``)
STREAM_CHUNK_BYTES = 64 << 20
#: the solvers that keep the whole data on the backend as a matrix (no
#: tiled layout, no mini-batches)
WHOLE_DATA_SOLVERS = ("lbfgs", "mcmc")
#: L-BFGS's stored correction pairs (``minimize_lbfgs``'s ``m``)
LBFGS_PAIRS = 10
#: most rows of one run of an out-of-core prediction
#: (:func:`sklearn_cuwide._out_of_core.predict_chunks`)
PREDICT_RUN_ROWS = 1 << 16


class InsufficientMemoryError(MemoryError):
    """A fit or a prediction needs more memory than is available.

    Raised before anything is allocated, when the plan of the work (the
    training layout, the model and its optimiser state, the temporaries)
    exceeds the device's budget (``device_memory_limit`` of
    :func:`sklearn_cuwide.config_context`) or the host's available memory;
    and when the GPU runs out of memory during the work all the same
    (memory taken by other processes meanwhile), chained to cupy's error,
    after the work's device memory was freed. The estimator is then as it
    was before the call. The message names what was needed, what was
    available and the settings that would fit.
    """

    # the public name in tracebacks and reprs, not the private module
    __module__ = "sklearn_cuwide"


def format_bytes(n):
    """``n`` bytes in the largest binary unit that keeps it above 1."""
    n = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024


# --------------------------------------------------------------------------
# what the arrays take
# --------------------------------------------------------------------------
def layout_blocks(n_rows, batch_size, sample_block):
    """``(n_batches, n_sblocks)`` of a layout (``_layout.plan_layout``)."""
    n_rows, batch_size = int(n_rows), int(batch_size)
    sb = int(min(sample_block, batch_size, MAX_SAMPLE_BLOCK))
    full, last = divmod(n_rows, batch_size)
    n_batches = full + (1 if last else 0)
    n_sblocks = full * -(-batch_size // sb) + (-(-last // sb) if last else 0)
    return n_batches, n_sblocks


def in_order_scratch_bytes(sample_block, n_hot, n_factors):
    """Bytes of an FM's in-order training kernel's scratch
    (``_cuda._train.InOrderScratch``: :func:`~._backends._tiles.in_order_scratch_sizes`)."""
    return 4 * sum(in_order_scratch_sizes(sample_block, n_hot, n_factors))


def layout_index_bytes(n_rows, batch_size, sample_block):
    """Bytes of a layout's three int64 index arrays (``tile_ptr``,
    ``sblock_row_ptr``, ``batch_sblock_ptr``)."""
    n_batches, n_sblocks = layout_blocks(n_rows, batch_size, sample_block)
    return 8 * ((2 * n_sblocks + 1) + (n_sblocks + 1) + (n_batches + 1))


def layout_bytes(nnz, n_rows, batch_size, sample_block, value_itemsize=COMPUTE_ITEMSIZE):
    """``TileLayout.nbytes`` of a layout of ``nnz`` stored nonzeros: the
    nonzeros' three arrays and the index arrays."""
    per_nnz = LAYOUT_INDEX_BYTES_PER_NNZ + int(value_itemsize)
    return int(nnz) * per_nnz + layout_index_bytes(n_rows, batch_size, sample_block)


def csr_bytes(nnz, n_rows, index_itemsize, value_itemsize, indptr_itemsize=8):
    """Bytes of a CSR matrix (indices, data and ``n_rows + 1`` pointers)."""
    return (int(nnz) * (int(index_itemsize) + int(value_itemsize))
            + (int(n_rows) + 1) * int(indptr_itemsize))


def state_bytes(n_features, n_outputs=1, n_factors=0, adagrad=False,
                itemsize=COMPUTE_ITEMSIZE):
    """Bytes of a :class:`~sklearn_cuwide._state.ModelState` (``w``, ``V``
    and ``b``, twice with Adagrad's accumulators ``gw``, ``gV``, ``gb``)."""
    per_copy = (int(n_features) * (int(n_outputs) + int(n_factors)) + int(n_outputs))
    return per_copy * int(itemsize) * (2 if adagrad else 1)


def chunk_bounds(nnz, n_rows, batch_size, max_row_nnz, chunk_nnz):
    """``(nonzeros, rows, chunks)``: bounds of one chunk of the layout build
    and the number of chunks.  A chunk is whole mini-batches cut at the first
    batch boundary past each multiple of ``chunk_nnz``
    (``_layout.plan_layout``), so it holds fewer than ``chunk_nnz`` plus one
    mini-batch's nonzeros (at most ``batch_size * max_row_nnz``)."""
    nnz, n_rows = int(nnz), int(n_rows)
    batch_nnz = int(batch_size) * int(max_row_nnz)
    c_nnz = min(nnz, int(chunk_nnz) + batch_nnz)
    mean = nnz / max(n_rows, 1)
    c_rows = n_rows if mean <= 0 else min(n_rows, int(math.ceil(c_nnz / mean)) + int(batch_size))
    n_chunks = max(1, -(-nnz // int(chunk_nnz))) if nnz else 0
    return c_nnz, c_rows, n_chunks


def tiling_bytes(chunk_nnz, device=False, chunk_sblocks=0):
    """Temporaries of ``LayoutTiler.sort`` and ``store`` for one chunk of
    ``chunk_nnz`` (canonical) nonzeros, beyond its input and the layout.

    The live int64 arrays of ``sort``, in its order: the local row, batch,
    position, sample block and row-in-block (with a temporary: 6 x 8 bytes
    per nonzero); then the sample block, row-in-block, renumbered feature,
    the sort key and its permutation (5 x 8), the key gathered (6 x 8) and
    the sample block, feature and row gathered while their sources live
    (7 x 8 + the duplicate flags): 57 bytes per nonzero.  On a GPU, cupy's
    argsort copies the key and thrust's radix sort double-buffers keys and
    indices (3 x 8 more while the four arrays before live: 64).  ``store``
    (canonical input: nothing to merge) holds less: the sorted arrays and
    the tile ids (46), and the counts of the chunk's tiles (two int64 per
    sample block of the chunk, ``chunk_sblocks``, and their sum), plus 4 KiB
    for the arrays' headers (1 KiB measured).
    """
    per = 64 if device else 57
    return int(chunk_nnz) * per + 16 * int(chunk_sblocks) + 4096


def layout_plan_bytes(n_rows, n_features, n_batches, n_sblocks):
    """Host bytes of ``_layout.plan_layout``: the row order (int64 per row),
    the feature ranking (order, rank and counts: 3 int64 per feature) and
    the block arrays, kept with the layout; plus its peak of temporaries
    (the ranking's sort: 3 int64 per feature; the row lengths and their
    cumulative sum: 3 per row)."""
    n_rows, n_features = int(n_rows), int(n_features)
    kept = 8 * n_rows + 24 * n_features + 8 * (n_batches + 1)
    temporary = max(24 * n_features, 24 * n_rows + 40 * n_sblocks)
    return kept + temporary


def lbfgs_bytes(n_rows, n_features, n_outputs, fit_intercept=True):
    """Bytes of ``minimize_lbfgs``'s vectors (float64, ``n_par`` each): the
    stored pairs (``2 m``) and eight more (the iterate, the gradient, the
    direction, the trial point and its gradient, and the line search's
    temporaries); and the per-row float64 vectors of ``fit_lbfgs_linear``
    (targets, weights, normalised weights)."""
    n_par = int(n_features) * int(n_outputs) + (int(n_outputs) if fit_intercept else 0)
    return (2 * LBFGS_PAIRS + 8) * 8 * n_par + 3 * 8 * int(n_rows)


# --------------------------------------------------------------------------
# what is available
# --------------------------------------------------------------------------
def host_available_bytes():
    """Bytes the host can give without swapping: ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else the available physical pages
    (``os.sysconf``), else None (unknown: not checked)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


#: under a ``device_memory_limit``, the share of it a plan leaves free, at
#: most :data:`LIMIT_RESERVE_MAX`: the device takes more than CuPy's pool
#: counts (the driver maps memory in 2 MiB pages, libraries keep
#: workspaces: 16 MB under 2 GB and 100 MB under 8 GB on the H200), and a
#: limit is kept as nvidia-smi sees it
LIMIT_RESERVE_FRACTION = 1 / 16
LIMIT_RESERVE_MAX = 256 << 20


def device_budget(limit, free, total):
    """``(bytes, how)``: what a fit may plan to take on a device that has
    ``free`` of ``total`` bytes, under ``device_memory_limit=limit``
    (:func:`sklearn_cuwide.set_config`; less its reserve,
    :data:`LIMIT_RESERVE_FRACTION`), and the words that say why."""
    free, total = int(free), int(total)
    if limit is None:
        return int(DEFAULT_FREE_FRACTION * free), (
            f"{DEFAULT_FREE_FRACTION:.0%} of the {format_bytes(free)} free on the device "
            "(device_memory_limit=None)")
    if isinstance(limit, int):
        # an int is bytes: a tiny one is often meant as the whole device (1.0)
        hint = ("; an int is a number of bytes, a float in (0, 1] a fraction of the "
                "device" if limit < 1 << 20 else "")
        cap, what = limit, f"device_memory_limit={limit} ({format_bytes(limit)}{hint})"
    else:
        cap = int(limit * total)
        what = (f"device_memory_limit={limit} ({format_bytes(cap)} of the device's "
                f"{format_bytes(total)})")
    reserve = min(LIMIT_RESERVE_MAX, int(cap * LIMIT_RESERVE_FRACTION))
    if reserve:
        cap -= reserve
        what += f" less {format_bytes(reserve)} kept for what the device takes beside the plan"
    if cap <= free:
        return cap, what
    return free, f"the {format_bytes(free)} free on the device (below {what})"


def limit_for_budget(budget):
    """The least ``device_memory_limit`` (bytes) whose :func:`device_budget`
    is at least ``budget`` on a device with room: the inverse of its
    reserve, for the words that suggest a limit."""
    budget = int(budget)
    limit = budget
    while True:  # the budget grows by at most 1 a byte of limit: few steps
        got = device_budget(limit, limit, limit)[0]
        if got >= budget:
            return limit
        limit += budget - got


# --------------------------------------------------------------------------
# the shapes of the work
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class FitShape:
    """The numbers a fit's memory depends on.

    ``n_outputs`` is one model's (classes for multinomial logistic
    regression, else 1) and ``n_heads`` the models trained one after another
    (one-vs-rest factorization machines); ``sample_block`` the layout's rows
    per sample block (``backend.tile_shape``); ``index_itemsize`` and
    ``value_itemsize`` are ``X``'s; ``on_device`` is True for cupy input;
    ``solver`` "sgd", "adagrad", "lbfgs" or "mcmc"; ``validation_fraction`` None
    without early stopping; ``model_rows`` the feature rows of the model on
    the device (None: all of them; fewer: trained out of core,
    :mod:`sklearn_cuwide._out_of_core`).
    """

    n_rows: int
    n_features: int
    nnz: int
    max_row_nnz: int
    index_itemsize: int
    value_itemsize: int
    n_outputs: int = 1
    n_heads: int = 1
    n_factors: int = 0
    solver: str = "adagrad"
    batch_size: int = 1024
    sample_block: int = 1024
    penalty_scaled: bool = False
    validation_fraction: object = None
    fit_intercept: bool = True
    on_device: bool = False
    model_rows: object = None
    #: mini-batches trained concurrently (more than one worker): the
    #: step scales' per-feature frequencies are computed on the device
    concurrent: bool = True
    #: the fit continues a fitted model (``warm_start``, ``partial_fit``):
    #: its starting state is a whole copy of the model
    warm: bool = True

    @property
    def adagrad(self):
        return self.solver == "adagrad"


@dataclass(frozen=True)
class PredictShape:
    """The numbers a prediction's memory depends on: ``X``'s, and the
    model's (``n_heads`` models of ``n_outputs`` each, ``n_factors``)."""

    n_rows: int
    n_features: int
    nnz: int
    index_itemsize: int
    value_itemsize: int
    n_outputs: int = 1
    n_heads: int = 1
    n_factors: int = 0
    on_device: bool = False
    heads_on_device: bool = False
    max_row_nnz: int = 0
    model_rows: object = None


# --------------------------------------------------------------------------
# the needs
# --------------------------------------------------------------------------
def _validation_parts(s, where, staged=False):
    """The early-stopping split's copies (``_minibatch.fit_heads``): the
    held-out rows, copied from ``X`` where it lives, and gathered once more
    by the layout's plan for the training rows' feature counts (the training
    rows are laid out from ``X`` itself); the held-out rows in the layout's
    feature order (a host copy), then on the backend with their targets,
    weights and decision values.  ``staged``: the host part of a fit whose
    layout the CUDA backend builds from the whole upload of a host matrix,
    which gathers the held-out rows on the device from that upload (the
    host keeps the split's marks alone)."""
    if s.validation_fraction is None:
        return {}
    n_val = int(math.ceil(s.validation_fraction * s.n_rows))
    nnz_val = int(math.ceil(s.validation_fraction * s.nnz))
    held = csr_bytes(nnz_val, n_val, s.index_itemsize, s.value_itemsize)
    scores = n_val * s.n_outputs * (4 + 8 + 3 * 8) + 2 * 8 * n_val
    parts = {}
    if staged:
        parts["the early-stopping split's marks"] = s.n_rows
    elif (where == "device") == s.on_device:
        parts["the early-stopping split's copies of the held-out rows"] = 2 * held + s.n_rows
    if where == "host" and not staged:
        parts["the held-out rows in the layout's feature order"] = held
    parts["the held-out rows' scores"] = scores
    if where == "device":  # copied in, then in the layout's feature order
        parts["the held-out rows on the device"] = 2 * held
    return parts


def _minibatch_parts(s, where, layout, build_chunk_nnz=None, csr_whole=False):
    """``{phase: {part: bytes}}`` of a mini-batch fit on ``where`` ("host" for
    the CPU backend; "device" and "host" for the CUDA backend); ``layout``:
    "host" (CPU backend), "device" (built and resident on the GPU),
    "uploaded" (built on the host, resident on the GPU) or "streamed";
    ``build_chunk_nnz``: a streamed layout tiled on the GPU into pinned host
    memory, this many nonzeros at a time (None: built on the host);
    ``csr_whole``: a "device" layout of host input built from its CSR
    uploaded whole (else planned on the host, its chunks uploaded)."""
    n_batches, n_sblocks = layout_blocks(s.n_rows, s.batch_size, s.sample_block)
    lay = layout_bytes(s.nnz, s.n_rows, s.batch_size, s.sample_block)
    state = state_bytes(s.n_features, s.n_outputs, s.n_factors, s.adagrad)
    d, n = s.n_features, s.n_rows
    # a fresh fit's layout built from the whole upload of a host matrix: its
    # held-out rows are gathered from that upload (``StagedInput.hold_out``)
    staged = (where == "host" and layout == "device" and csr_whole and not s.on_device
              and not s.warm)
    val = _validation_parts(s, where, staged)
    host_built = layout in ("host", "uploaded", "streamed")
    phases = {}
    if where == "host":
        plan = layout_plan_bytes(n, d, n_batches, n_sblocks)
        base = {"the layout's plan (row order, feature ranking)": plan, **val}
        if s.on_device and host_built:
            base["X copied to the host"] = csr_bytes(s.nnz, n, s.index_itemsize,
                                                     s.value_itemsize)
        if build_chunk_nnz is not None:  # tiled on the GPU into pinned memory
            c_nnz, c_rows, _ = chunk_bounds(s.nnz, n, s.batch_size, s.max_row_nnz,
                                            build_chunk_nnz)
            phases["layout build"] = {
                **base, "the training layout (pinned)": lay,
                "two chunks' rows, gathered into pinned slots": 2 * csr_bytes(
                    c_nnz, c_rows, s.index_itemsize, s.value_itemsize),
            }
        elif host_built:
            c_nnz, c_rows, _ = chunk_bounds(s.nnz, n, s.batch_size, s.max_row_nnz,
                                            HOST_CHUNK_NNZ)
            phases["layout build"] = {
                **base, "the training layout": lay,
                "one chunk's rows, gathered": csr_bytes(c_nnz, c_rows, s.index_itemsize,
                                                        s.value_itemsize),
                "one chunk's sort": tiling_bytes(c_nnz, chunk_sblocks=n_sblocks),
            }
        train = dict(base)
        if layout != "device":
            train["the training layout"] = lay if host_built else 0
        # a model's starting state, its copy in layout order (the CPU's
        # working state; the GPU's on its way there and back) and the fitted
        # state in the user's order; the other one-vs-rest models' fitted
        # states, and the fitted attributes stacked from them (no accumulators).
        # A fresh model starts as its weights and their sums (zeros): its
        # factors are drawn where it trains, in layout order
        start = state if s.warm else state_bytes(d, s.n_outputs, 0, s.adagrad)
        train["a model's starting, working and fitted states"] = start + 2 * state
        others = ("the other models' fitted states and the fitted attributes"
                  if s.n_heads > 1 else "the fitted attributes")
        train[others] = ((s.n_heads - 1) * state
                         + s.n_heads * state_bytes(s.n_features, s.n_outputs, s.n_factors))
        train["targets and sample weights in layout order"] = 4 * 8 * n
        # early stopping keeps the best epoch's state: on the host for the
        # CPU backend and for a model out of core
        if s.validation_fraction is not None and (
                layout == "host" or (s.model_rows is not None and s.model_rows < d)):
            train["the best epoch's copy of the model state"] = state
        # a layout in pinned memory is read where it is; an out-of-core
        # window's layout is a pageable copy, staged again
        out_of_core = s.model_rows is not None and s.model_rows < d
        if layout == "streamed" and (build_chunk_nnz is None or out_of_core):
            train["two pinned staging chunks"] = 2 * STREAM_CHUNK_BYTES
        elif layout == "uploaded":
            train["two pinned staging chunks"] = 2 * min(lay, STREAM_CHUNK_BYTES)
        if layout == "host" and s.penalty_scaled:
            train["per-feature penalty factors"] = 12 * d
        if out_of_core:
            rows = int(s.model_rows)
            win = window_nnz(s.nnz, rows, state_row_bytes(s.n_outputs, s.n_factors,
                                                          adagrad=s.adagrad))
            # the cold sets (int64 keys of mini-batch and feature, at most one
            # a nonzero: two while they are found), the whole layout's counts
            # in layout order (8 a feature), the marks that cut the windows
            # (4), the windows cut ahead and the current one (their cold ids,
            # at most the slots each), and with scaled penalties the whole
            # layout's factors (float64 and float32)
            train["the out-of-core bookkeeping"] = (
                16 * s.nnz + 12 * d + 3 * 8 * int(rows * SLOT_FRACTION)
                + (12 * d if s.penalty_scaled else 0))
            if layout != "device":  # a window's layout is made where the layout is
                train["a window's layout, or the cold sets of a run of mini-batches"] = (
                    WINDOW_BYTES_PER_NNZ * win)
        phases["training"] = train
        return phases
    # the device (CUDA backend)
    base = dict(val)
    # a layout planned on the device keeps its frequency ranking there (the
    # counts, the order and the rank, int64): through the build and the epochs
    ranked_on_device = layout == "device" and (s.on_device or csr_whole)
    if layout == "device":
        c_nnz, c_rows, n_chunks = chunk_bounds(s.nnz, n, s.batch_size, s.max_row_nnz,
                                               DEVICE_CHUNK_NNZ)
        # X on the device (cupy input, or host input uploaded whole): the
        # chunk's rows gathered in the layout's row order, with the gather's
        # int64 positions; host input planned on the host: the chunk
        # uploaded (two staged at once when they overlap the sorts)
        whole = s.on_device or csr_whole
        staged = 1 if (whole or n_chunks < 2) else 2
        chunk = csr_bytes(c_nnz, c_rows, s.index_itemsize, s.value_itemsize)
        phases["layout build"] = {
            **base, "the training layout": lay,
            "X uploaded whole": (csr_bytes(s.nnz, n, s.index_itemsize, s.value_itemsize)
                                 if csr_whole and not s.on_device else 0),
            "the feature ranking and block pointers": ((24 if ranked_on_device else 8) * d
                                                       + 8 * (n_batches + 1)),
            "chunks of X being sorted": staged * chunk + (3 * 8 * c_nnz if whole else 0),
            # the fused kernels read X's rows where they lie, through the
            # source row of every layout row (int64), gathered through the
            # row order drawn there (kept for the targets' gather)
            "the rows' order and their source rows": 16 * n if whole else 0,
            "one chunk's sort": tiling_bytes(c_nnz, device=True, chunk_sblocks=n_sblocks),
        }
    elif layout == "streamed" and build_chunk_nnz is not None:
        c_nnz, c_rows, n_chunks = chunk_bounds(s.nnz, n, s.batch_size, s.max_row_nnz,
                                               build_chunk_nnz)
        phases["layout build"] = {
            **base, "feature ranks and block pointers": 8 * d + 8 * (n_batches + 1),
            "chunks of X being sorted": (2 if n_chunks > 1 else 1) * csr_bytes(
                c_nnz, c_rows, s.index_itemsize, s.value_itemsize),
            "one chunk's sort": tiling_bytes(c_nnz, device=True, chunk_sblocks=n_sblocks),
        }
    train = dict(base)
    if layout == "streamed":
        per_nnz = LAYOUT_INDEX_BYTES_PER_NNZ + COMPUTE_ITEMSIZE
        c_nnz, _, _ = chunk_bounds(s.nnz, n, s.batch_size, s.max_row_nnz,
                                   STREAM_CHUNK_BYTES // per_nnz)
        train["the training layout's index arrays"] = layout_index_bytes(
            n, s.batch_size, s.sample_block)
        train["two streamed chunks of the layout"] = 2 * c_nnz * per_nnz
    else:
        train["the training layout"] = lay
    if ranked_on_device:
        train["the layout's feature ranking"] = 24 * d
        # a layout shuffled on the device keeps its row order there
        train["the layout's row order"] = 8 * n
    rows = d if s.model_rows is None else min(int(s.model_rows), d)
    dev_state = state_bytes(rows, s.n_outputs, s.n_factors, s.adagrad)
    if rows < d and s.penalty_scaled and layout == "device":
        # out of core, the whole layout's penalty factors are computed where
        # its nonzeros are, before the model's rows take the device (then
        # kept on the host)
        phases["out-of-core setup"] = {
            **train, "the penalty factors' computation": 28 * d,
            "targets, sample weights and batch order": 8 * n + 8 * n_batches}
    train["the model state"] = dev_state
    if rows == d:
        # its feature order changed where it trains (a continued state into
        # the layout's, every state back): one array at a time, with the
        # order's int64 copy
        train["the model state's permutation"] = (
            COMPUTE_ITEMSIZE * d * max(s.n_outputs, s.n_factors) + 8 * d)
    if s.validation_fraction is not None and rows == d:  # early stopping's best epoch
        train["the best epoch's copy of the model state"] = dev_state
    if rows < d:  # out of core: a window's layout, the rows on their way
        # the cold sets are found (before the epochs) in runs of nonzeros
        # whose temporaries take at most a window's bytes: never both at once
        train["a window's layout, or the cold sets of a run of mini-batches"] = (
            WINDOW_BYTES_PER_NNZ * window_nnz(
                s.nnz, rows, state_row_bytes(s.n_outputs, s.n_factors, adagrad=s.adagrad)))
        # a window's cold ids, and where the host rows are not page-locked
        # a bounded piece of one row array at a time
        train["the cold rows in transit"] = 8 * rows + min(rows, PIECE_ROWS) * (
            COMPUTE_ITEMSIZE * max(s.n_outputs, s.n_factors))
    # the penalty factors (with their computation's int64 and float64
    # temporaries; out of core a window's, taken from the whole layout's on
    # the host and kept on the device, WindowStats), their copy
    # beside Adagrad's sums, and the step scales of concurrent workers: the
    # counts and the feature order uploaded with the float32 shares of
    # mini-batches they give in one pass (20 bytes; a ranking on the device
    # already is not uploaded: counted twice then, on the safe side), then
    # the shares kept
    # with a level's scales and their temporaries (17); out of core, again
    # for every window
    penalty = 0
    if s.penalty_scaled:
        penalty = (28 * d if rows == d else 4 * rows) + (4 * rows if s.adagrad else 0)
    if rows == d:
        train["per-feature step factors"] = penalty + (20 if s.concurrent else 12) * rows
    else:
        # out of core the windows' counts and identity order stay on the
        # device for the fit (16 bytes a row; the penalty factors are
        # counted above), the shares then a level's scales and their
        # temporaries (17) made beside them for every window
        train["per-feature step factors"] = penalty + (33 if s.concurrent else 16) * rows
    train["targets, sample weights and batch order"] = 8 * n + 8 * n_batches
    if s.n_factors and not s.concurrent:
        train["the in-order kernel's scratch"] = in_order_scratch_bytes(
            s.sample_block, min(d, MAX_HOT), s.n_factors)
    phases["training"] = train
    return phases


def _lbfgs_parts(s, where, device_backend):
    """``{phase: {part: bytes}}`` of an L-BFGS fit (``fit_lbfgs_linear``)."""
    n, d, D = s.n_rows, s.n_features, s.n_outputs
    x32 = csr_bytes(s.nnz, n, s.index_itemsize, 4)
    parts = {}
    if where == "host":
        if not s.on_device and s.value_itemsize != 4:
            parts["X as float32 CSR"] = x32
        parts["the fitted coefficients"] = 3 * 8 * (d * D + D)
        if not device_backend:
            parts["X as float64 CSR"] = csr_bytes(s.nnz, n, s.index_itemsize, 8)
            parts["L-BFGS's vectors"] = lbfgs_bytes(n, d, D, s.fit_intercept)
            parts["one evaluation's scores and gradients"] = 4 * 8 * n * D + 2 * 8 * d * D
        return {"training": parts}
    parts["X as float32 CSR on the device"] = x32
    if D == 1:  # the fused kernels: X.T as CSR (and its transposition's buffer)
        pieces = d + s.nnz // 512 + 1
        parts["X's transpose and its transposition buffer"] = 2 * csr_bytes(
            s.nnz, d, s.index_itemsize, 4)
        parts["the gradient's pieces"] = 24 * d + 20 * pieces + 8 * n
    else:
        parts["X as float64 CSR on the device"] = csr_bytes(s.nnz, n, s.index_itemsize, 8)
        parts["one evaluation's scores and gradients"] = 4 * 8 * n * D + 2 * 8 * d * D
    parts["L-BFGS's vectors"] = lbfgs_bytes(n, d, D, s.fit_intercept)
    return {"training": parts}


def _mcmc_parts(s, where, device_backend):
    """``{phase: {part: bytes}}`` of an MCMC fit (``_mcmc.fit_mcmc``, float64
    throughout): on the backend the matrix, its nonzeros by block (row,
    feature's place, value) with the blocks' build, the rows' residuals,
    factor sums and a block's temporaries, the model with its running sums;
    on the host of a GPU fit, the fitted model coming back."""
    n, d, k = s.n_rows, s.n_features, s.n_factors
    model = 8 * (1 + k) * d
    parts = {}
    if where == "host":
        parts["the fitted model (float64, then float32)"] = model + 4 * (1 + k) * d
        if device_backend:
            return {"training": parts}
    on = " on the device" if where == "device" else ""
    parts["X as CSR" + on] = csr_bytes(s.nnz, n, s.index_itemsize, s.value_itemsize)
    parts["the blocks' nonzeros and their build"] = 64 * s.nnz
    # a chunk's products of parameter pairs with their running sums, and its
    # precisions with their Cholesky factors (_mcmc.CHUNK_VALUES bounds them)
    p = k + 1
    chunk = min(CHUNK_VALUES["device" if where == "device" else "host"],
                max(n * p * (p + 1) // 2, d * p * p))
    parts["residuals, factor sums and a block's temporaries"] = (
        (16 + 8 * k) * n + (32 * p + 48) * n + 5 * 8 * chunk)
    parts["the model, its running sums and the blocks' features"] = 2 * model + 16 * d
    return {"training": parts}


def fit_needs(shape, backend, layout=None, build_chunk_nnz=None, csr_whole=False):
    """``{"host": phases, "device": phases}`` of a fit (``device`` only for
    the CUDA backend), each ``{phase: {part: bytes}}``.  ``backend``: "cpu"
    or "cuda"; ``layout``: for the CUDA backend's mini-batch fits, "device",
    "uploaded" or "streamed", with ``build_chunk_nnz`` for a streamed
    layout tiled on the GPU, ``csr_whole`` for a "device" layout built from
    host input uploaded whole (:func:`_minibatch_parts`)."""
    if shape.solver == "lbfgs":
        out = {"host": _lbfgs_parts(shape, "host", backend == "cuda")}
        if backend == "cuda":
            out["device"] = _lbfgs_parts(shape, "device", True)
        return out
    if shape.solver == "mcmc":
        out = {"host": _mcmc_parts(shape, "host", backend == "cuda")}
        if backend == "cuda":
            out["device"] = _mcmc_parts(shape, "device", True)
        return out
    if backend == "cpu":
        return {"host": _minibatch_parts(shape, "host", "host")}
    return {"host": _minibatch_parts(shape, "host", layout, build_chunk_nnz, csr_whole),
            "device": _minibatch_parts(shape, "device", layout, build_chunk_nnz, csr_whole)}


def predict_needs(shape, backend):
    """``{"host": phases, "device": phases}`` of a prediction
    (``_base._decision_values``: the backend's ``decision_function`` per
    model, stacked on the host)."""
    s = shape
    n, d, D, H, k = s.n_rows, s.n_features, s.n_outputs, s.n_heads, s.n_factors
    x = csr_bytes(s.nnz, n, s.index_itemsize, s.value_itemsize)
    host = {"the decision values and their stack": 2 * 8 * n * D * H}
    if backend == "cpu":
        host["the products of one model"] = 2 * 8 * n * D + 8 * d * D
        if k:  # X * X, X @ V and its square, V and V * V in float64
            host["the factorization terms of one model"] = (x + 2 * 8 * n * k
                                                           + 2 * 8 * d * k)
        return {"host": {"prediction": host}}
    dev = {}
    if s.model_rows is not None:  # out of core: a run of rows and its model rows
        rows = min(n, PREDICT_RUN_ROWS)
        dev["a run of X on the device"] = csr_bytes(rows * max(s.max_row_nnz, 1), rows,
                                                    s.index_itemsize, s.value_itemsize)
        dev["the run's model rows"] = 4 * (int(s.model_rows) * (D + k) + D)
        dev["the run's decision values"] = rows * D * (4 + 8)
        host["a run's model rows, gathered"] = 4 * int(s.model_rows) * (D + k)
        return {"host": {"prediction": host}, "device": {"prediction": dev}}
    if not s.on_device:
        dev["X on the device"] = x
    if not s.heads_on_device:
        dev["the models on the device"] = H * 4 * (d * (D + k) + D)
    dev["one model's decision values"] = n * D * (4 + 8)
    return {"host": {"prediction": host}, "device": {"prediction": dev}}


def _peak(phases):
    """``(bytes, phase, parts)`` of the largest phase."""
    best = (0, None, {})
    for name, parts in phases.items():
        total = sum(parts.values())
        if total >= best[0]:
            best = (total, name, parts)
    return best


# --------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPlan:
    """What a fit or a prediction will take, decided before it starts.

    Attributes
    ----------
    what : str
        "fit" or "prediction", for the messages.
    backend : str
        "cpu" or "cuda".
    layout : str or None
        For the CUDA backend's mini-batch fits: "device" (the layout built
        on the GPU and resident), "uploaded" (built on the host, copied to
        the GPU once, resident), "streamed" (built on the host, streamed every
        epoch); "host" on the CPU backend; None for L-BFGS and predictions.
    needs : dict
        ``{"host" | "device": {phase: {part: bytes}}}``.
    available : dict
        ``{"host" | "device": bytes or None}`` (None: unknown, unchecked).
    how : dict
        ``{"host" | "device": words}``: where the available figure comes from.
    fits : bool
        Whether every need is within what is available.
    suggestions : tuple of str
        Settings that would fit (when it does not).
    model_rows : int or None
        The model's feature rows on the device when it trains out of core
        (its parameters and optimiser state do not fit beside the layout),
        else None.
    build_chunk_nnz : int or None
        A "streamed" layout tiled on the GPU into page-locked host memory,
        this many nonzeros at a time (:func:`_streamed_build`); None:
        built on the host.
    csr_whole : bool
        A "device" layout of host input built from its CSR uploaded whole
        (the fastest build; it holds the CSR beside the layout while it
        runs), else planned on the host and its chunks uploaded.
    """

    what: str
    backend: str
    layout: object
    needs: dict
    available: dict
    how: dict
    fits: bool
    suggestions: tuple = ()
    model_rows: object = None
    build_chunk_nnz: object = None
    csr_whole: bool = False

    def peak(self, where):
        """The largest phase's bytes on ``where`` ("host" or "device")."""
        return _peak(self.needs.get(where, {}))[0]

    @property
    def layout_resident(self):
        return self.layout in ("device", "uploaded", "host")

    def check(self):
        """Raise :class:`InsufficientMemoryError` unless the plan fits."""
        if not self.fits:
            raise InsufficientMemoryError(self.message())

    def short(self, where):
        """One sentence: the need and what is available on ``where``."""
        need, phase, _ = _peak(self.needs.get(where, {}))
        avail = self.available.get(where)
        place = "the GPU" if where == "device" else "the host"
        text = f"{format_bytes(need)} on {place} (during the {phase})"
        if avail is not None:
            text += f", of {format_bytes(avail)} available: {self.how[where]}"
        return text

    def message(self):
        """The refusal's words: the need, what is available, what would fit."""
        lines = []
        for where in ("device", "host"):
            if where not in self.needs:
                continue
            need, phase, parts = _peak(self.needs[where])
            avail = self.available.get(where)
            if avail is None or need <= avail:
                continue
            place = "GPU" if where == "device" else "host"
            big = sorted(((b, p) for p, b in parts.items() if b), reverse=True)[:4]
            detail = ", ".join(f"{p} {format_bytes(b)}" for b, p in big)
            lines.append(
                f"This {self.what} needs {format_bytes(need)} of {place} memory "
                f"(during the {phase}: {detail}), more than the "
                f"{format_bytes(avail)} available ({self.how[where]}).")
        text = " ".join(lines) or f"This {self.what} does not fit in memory."
        if self.suggestions:
            text += " What would fit: " + "; ".join(self.suggestions) + "."
        return text


def _within(needs, available):
    for where, phases in needs.items():
        a = available.get(where)
        if a is not None and _peak(phases)[0] > a:
            return False
    return True


def plan_fit(shape, backend, available, how):
    """The :class:`MemoryPlan` of a fit.

    Parameters
    ----------
    shape : FitShape
    backend : {"cpu", "cuda"}
    available : dict
        ``{"host": bytes or None, "device": bytes or None}`` (the device's
        from :func:`device_budget`).
    how : dict
        The words that say where each figure comes from.

    The CUDA backend's mini-batch fits take the first layout that fits:
    built on the GPU and resident ("device"), built on the host and resident
    ("uploaded", the GPU build's temporaries did not fit), or streamed every
    epoch ("streamed", the layout itself did not fit; tiled on the GPU into
    pinned host memory where a chunk's sort fits, else on the host).
    Nothing fits: the plan says so (``fits`` False) with the settings that
    would fit.
    """
    if backend == "cuda" and shape.solver not in WHOLE_DATA_SOLVERS:
        if not shape.on_device:  # the CSR uploaded whole, when it fits beside the build
            needs = fit_needs(shape, backend, "device", csr_whole=True)
            if _within(needs, available):
                return MemoryPlan("fit", backend, "device", needs, dict(available),
                                  dict(how), True, csr_whole=True)
        for layout in ("device", "uploaded", "streamed"):
            needs = fit_needs(shape, backend, layout)
            if _within(needs, available):
                chunk, needs = _streamed_build(shape, layout, available, needs)
                return MemoryPlan("fit", backend, layout, needs, dict(available), dict(how),
                                  True, build_chunk_nnz=chunk)
        for layout in ("device", "uploaded", "streamed"):
            rows = _model_rows(shape, layout, available)
            if rows is not None:
                part = replace(shape, model_rows=rows)
                chunk, needs = _streamed_build(part, layout, available,
                                               fit_needs(part, backend, layout))
                return MemoryPlan("fit", backend, layout, needs, dict(available), dict(how),
                                  True, model_rows=rows, build_chunk_nnz=chunk)
        needs = fit_needs(shape, backend, "streamed")
    else:
        layout = "host" if backend == "cpu" and shape.solver not in WHOLE_DATA_SOLVERS else None
        needs = fit_needs(shape, backend, layout)
        if _within(needs, available):
            return MemoryPlan("fit", backend, layout, needs, dict(available), dict(how), True)
    return MemoryPlan("fit", backend, layout, needs, dict(available), dict(how), False,
                      _fit_suggestions(shape, backend, available, needs))


#: chunks a streamed layout's GPU build is tried with, largest first
STREAM_BUILD_CHUNKS = tuple(DEVICE_CHUNK_NNZ >> j for j in range(6))


def _streamed_build(shape, layout, available, needs):
    """``(build_chunk_nnz, needs)``: a host matrix's streamed layout is
    tiled on the GPU into pinned host memory, in the largest chunk of
    :data:`STREAM_BUILD_CHUNKS` whose sort fits beside nothing else (the
    build ends before training starts); none fits, or another layout:
    ``(None, needs)`` (built on the host).

    Rule: the GPU build wherever its phase fits.  Why: the host build is
    numpy on one thread over every nonzero; the GPU's is the same layout,
    bit for bit."""
    if layout != "streamed" or shape.on_device:
        return None, needs
    for chunk in STREAM_BUILD_CHUNKS:
        with_build = fit_needs(shape, "cuda", layout, build_chunk_nnz=chunk)
        if _within(with_build, available):
            return chunk, with_build
    return None, needs


def least_model_rows(shape):
    """The fewest feature rows an out-of-core model is planned with: every
    feature of one mini-batch (:func:`sklearn_cuwide._out_of_core.plan_residency`
    then checks the actual hot and cold sets of the layout)."""
    return min(int(shape.n_features), int(shape.batch_size) * max(int(shape.max_row_nnz), 1))


def _model_rows(shape, layout, available):
    """The most feature rows of the model that fit the device beside
    ``layout`` (fewer than all: out of core), or None when not even
    :func:`least_model_rows` fit."""
    lo, hi = least_model_rows(shape), int(shape.n_features) - 1
    if lo > hi or not _within(fit_needs(replace(shape, model_rows=lo), "cuda", layout),
                              available):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _within(fit_needs(replace(shape, model_rows=mid), "cuda", layout), available):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fits(shape, backend, available):
    if backend == "cuda" and shape.solver not in WHOLE_DATA_SOLVERS:
        return any(_within(fit_needs(shape, backend, lay), available)
                   or _model_rows(shape, lay, available) is not None
                   for lay in ("device", "uploaded", "streamed"))
    lay = "host" if backend == "cpu" and shape.solver not in WHOLE_DATA_SOLVERS else None
    return _within(fit_needs(shape, backend, lay), available)


def _fit_suggestions(s, backend, available, needs):
    """Settings that would fit, each checked with the same arithmetic."""
    out = []
    if s.n_factors > 1:
        lo, hi = 0, s.n_factors - 1  # the largest k < n_factors that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _fits(replace(s, n_factors=mid), backend, available):
                lo = mid
            else:
                hi = mid - 1
        if lo >= 1 and _fits(replace(s, n_factors=lo), backend, available):
            out.append(f"n_factors={lo} (at most)")
    if s.solver == "adagrad" and _fits(replace(s, solver="sgd"), backend, available):
        out.append("solver='sgd' (no Adagrad accumulators)")
    if s.solver == "lbfgs" and _fits(replace(s, solver="adagrad"), backend, available):
        out.append("solver='adagrad' (no L-BFGS vectors)")
    if s.validation_fraction is not None and _fits(
            replace(s, validation_fraction=None), backend, available):
        out.append("early_stopping=False (no copies of the held-out rows)")
    if s.batch_size > 256 and _fits(replace(s, batch_size=256), backend, available):
        out.append("batch_size=256")
    if "device" in needs:
        layouts = ("device", "uploaded", "streamed") if s.solver not in WHOLE_DATA_SOLVERS \
            else (None,)
        least = (replace(s, model_rows=least_model_rows(s))
                 if s.solver not in WHOLE_DATA_SOLVERS else s)
        device_need = min(_peak(fit_needs(least, backend, lay)["device"])[0]
                          for lay in layouts)
        out.append(
            f"a device_memory_limit (sklearn_cuwide.config_context) of at least "
            f"{format_bytes(limit_for_budget(device_need))}, on a GPU with that much free")
        host_ok = _within(fit_needs(s, "cpu", "host"), {"host": available.get("host")})
        if host_ok:
            out.append("device='cpu' (the host has room)")
    else:
        # a GPU fit holds the fitted model on the host too: suggested only
        # where the host has room for what such a fit keeps there
        layouts = ("device", "uploaded", "streamed") if s.solver not in WHOLE_DATA_SOLVERS \
            else (None,)
        least = (replace(s, model_rows=least_model_rows(s))
                 if s.solver not in WHOLE_DATA_SOLVERS else s)
        gpu_host = min(_peak(fit_needs(least, "cuda", lay)["host"])[0] for lay in layouts)
        host = available.get("host")
        if host is None or gpu_host <= host:
            out.append("a machine with more memory, or a GPU (device='cuda')")
        else:
            out.append(f"a machine with more memory (a fit on a GPU, too, needs "
                       f"{format_bytes(gpu_host)} of host memory)")
    out.append("fewer features (e.g. a smaller FeatureHasher n_features)")
    return tuple(out)


def plan_predict(shape, backend, available, how):
    """The :class:`MemoryPlan` of a prediction; when it does not fit, the
    suggestion is the number of rows per call that would."""
    needs = predict_needs(shape, backend)
    if _within(needs, available):
        return MemoryPlan("prediction", backend, None, needs, dict(available), dict(how),
                          True)
    if backend == "cuda":  # the model's rows a run of rows at a time
        least = min(int(shape.n_features), max(int(shape.max_row_nnz), 1))
        lo, hi = least, int(shape.n_features)

        def fits(rows):
            return _within(predict_needs(replace(shape, model_rows=rows), backend), available)

        if fits(lo):
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
            part = replace(shape, model_rows=lo)
            return MemoryPlan("prediction", backend, None, predict_needs(part, backend),
                              dict(available), dict(how), True, model_rows=lo)
    rows, found = shape.n_rows, False
    while rows > 1 and not found:
        rows //= 2
        part = replace(shape, n_rows=rows,
                       nnz=int(math.ceil(shape.nnz * rows / max(shape.n_rows, 1))))
        found = _within(predict_needs(part, backend), available)
    hint = (f"predicting at most {rows} rows per call (e.g. in a loop over "
            f"X[i:i + {rows}])" if found else
            "a larger device_memory_limit, or the prediction on the CPU "
            "(set_params(device='cpu')): the model alone exceeds the GPU's budget"
            if backend == "cuda" else "a machine with more memory")
    return MemoryPlan("prediction", backend, None, needs, dict(available), dict(how),
                      False, (hint,))


# --------------------------------------------------------------------------
# the active plan of this thread's fit or prediction
# --------------------------------------------------------------------------
_ACTIVE = ContextVar("sklearn_cuwide_memory_plan", default=None)


@contextmanager
def plan_scope():
    """A ``with`` block (one fit or prediction) whose plan :func:`set_plan`
    records and :func:`active_plan` returns, in the calling thread only."""
    token = _ACTIVE.set([None])
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def set_plan(plan):
    """Record ``plan`` as the current block's (no-op outside a block)."""
    slot = _ACTIVE.get()
    if slot is not None:
        slot[0] = plan


def active_plan():
    """The plan of the calling thread's current fit or prediction, or None."""
    slot = _ACTIVE.get()
    return None if slot is None else slot[0]


# --------------------------------------------------------------------------
# out of memory all the same
# --------------------------------------------------------------------------
def release_frames(exc):
    """Drop the local variables of the finished frames of ``exc``'s
    traceback (the arrays of the work that failed), so that their memory can
    be freed while the exception is still being handled; the frames still
    running (the caller's) are left alone."""
    import traceback

    tb = exc.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)


def out_of_memory_error(exc, where):
    """The :class:`InsufficientMemoryError` for a ``MemoryError`` (cupy's
    out-of-memory error, numpy's) raised during a fit or a prediction whose
    plan fitted: what was planned, and what to do."""
    plan = active_plan()
    place = "the GPU" if where == "device" else "the host"
    what = "the work" if plan is None else f"the {plan.what}"
    text = f"{place[0].upper()}{place[1:]} ran out of memory during {what} ({exc})."
    if plan is not None and where in plan.needs:
        text += f" It was planned to need {plan.short(where)}."
    text += (" Other processes or threads may be using the memory meanwhile; "
             "retry with less running beside it")
    if where == "device":
        text += (", or a smaller device_memory_limit (sklearn_cuwide.config_context), "
                 "which makes the plan stream the training layout sooner")
    text += (". The memory the call took was released and the estimator is as it "
             "was before the call.")
    return InsufficientMemoryError(text)
