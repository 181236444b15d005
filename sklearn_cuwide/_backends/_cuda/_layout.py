"""The training layout on the device: built there from the user's matrix
(:func:`build_layout`), or copied from a host-built one with its nonzeros
streamed in (:class:`DeviceLayout`).

:func:`put_layout` copies the small index arrays of a host
:class:`~sklearn_cuwide._layout.TileLayout` at once and leaves the nonzeros
(``feat``, ``row``, ``val``: nearly all the bytes) on the host.  They stream
in during the first epoch, chunks of whole mini-batches through the pinned
double buffer of :mod:`._upload` while the kernel trains on the previous
chunk.  If the layout fits the device-memory budget, the chunks are copied
into resident device arrays and later epochs run from device memory; if
not, every epoch streams the chunks through the uploader's two device
buffers.

Rule: the layout's plan and tiling come from :mod:`sklearn_cuwide._layout`;
this module decides where a layout is built and holds it on the device, and
every host -> device copy of nonzeros goes through :mod:`._upload` (one
uploader, one set of ordering rules).
"""

import itertools

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from ... import _layout, _memory
from ..._config import get_config
from . import _reduce, _upload, _warmup
from ._build import CudaBuildKernels, rows_of_arrays
from ._runtime import csr_of_arrays, device_memory

#: a fresh token for each penalty-scale array a layout computes
_TOKENS = itertools.count(1)

#: each feature's share of mini-batches, ``1 - exp(-count * batch_size /
#: n_rows)`` clipped to [0, 1], in float64 then stored as float32, its count
#: taken through the layout's feature order.  One fused pass: the device
#: holds the counts and the order uploaded and the float32 shares, no float64
#: temporaries (an out-of-core fit does it again for every window)
_BATCH_SHARE = cp.ElementwiseKernel(
    "raw C counts, int64 order, float64 c", "float32 q",
    "q = (float)fmin(fmax(-expm1((double)counts[order] * c), 0.0), 1.0)",
    "cuwide_batch_share")


def _budget(memory_budget):
    """Device bytes a layout may plan to take: ``memory_budget``, or the
    budget of ``device_memory_limit`` (:func:`sklearn_cuwide.set_config`)."""
    if memory_budget is not None:
        return int(memory_budget)
    return _memory.device_budget(get_config()["device_memory_limit"], *device_memory())[0]


def stage_layout_input(X, n_rows, read_first=False):
    """Begin the upload of a host CSR that the fit's memory plan builds its
    layout from whole on the device ("device" and ``csr_whole``): a
    :class:`._upload.StagedInput` for :func:`build_layout`, or None for any
    other input or plan."""
    if (cpsp.issparse(X) or getattr(X, "format", None) != "csr"
            or _planned_site(_memory.active_plan(), on_device=False) != "device"):
        return None
    if read_first:  # what reads the copy before the build compiles beside the upload
        _warmup.warm_up_input(X.dtype, X.indices.dtype)
    return _upload.StagedInput(X, cp, n_rows, gather=rows_of_arrays, matrix=csr_of_arrays)


def _planned_site(plan, on_device):
    """Where the fit's memory plan builds the layout: "device" (from the
    whole CSR there), "host_plan" (planned on the host, its chunks
    uploaded), "host", or None without a plan that says."""
    if plan is None or plan.layout is None:
        return None
    if plan.layout != "device":
        return "host"
    return "device" if on_device or plan.csr_whole else "host_plan"


def build_layout(X, memory_budget=None, staged=None, **kw):
    """Build the training layout on the GPU (cupy sorts, chunk by chunk).

    ``kw``: the keywords of :func:`sklearn_cuwide._layout.build_layout`.
    Inside a fit, the memory plan says whether the layout is built on the
    GPU (:func:`sklearn_cuwide._memory.active_plan`: "device") or on the
    host, then copied in or streamed every epoch (:class:`DeviceLayout`).
    On the GPU, the plan says how (``csr_whole``: "device" below, else
    "host_plan"); outside a fit :func:`._upload.build_site` chooses, for
    ``memory_budget`` (default the budget of ``device_memory_limit``):

    * ``"device"``: a host matrix's CSR is uploaded as it is and planned,
      shuffled and tiled on the device (:func:`._upload.build_on_device`);
      a cupyx matrix is used where it is;
    * ``"host_plan"``: a host matrix is planned on the host and its chunks'
      gathers and copies overlap the sorts (:func:`._upload.build_from_host`);
    * ``"host"``: built on the host and streamed in every epoch; when the
      plan gives a ``build_chunk_nnz`` (a chunk's sort fits the device),
      tiled on the GPU chunk by chunk into page-locked host memory
      (:func:`._upload.build_from_host` with ``host_out``), which the
      epochs' copies then read where it is.

    ``staged``: :func:`stage_layout_input`'s handle of ``X``, whose upload
    the "device" build uses (the caller closes it).
    """
    if X.format != "csr":
        X = X.tocsr()
    on_device = bool(cpsp.issparse(X))
    plan = _memory.active_plan()
    site = _planned_site(plan, on_device) if memory_budget is None else None
    if site == "host":
        if plan.build_chunk_nnz is not None and not on_device:
            # streamed: tiled on the GPU a chunk at a time into pinned memory
            kw["chunk_nnz"] = plan.build_chunk_nnz
            kw["kernels"] = CudaBuildKernels(kw.get("dtype", np.float32))
            return _upload.build_from_host(X, cp, host_out=True, **kw)
    elif site is None:  # no plan: where it fits the budget
        site = _upload.build_site(int(X.nnz), X.shape[0], X.indices.dtype.itemsize,
                                  X.data.dtype.itemsize, _budget(memory_budget),
                                  on_device=on_device)
    if site == "host":
        if on_device:  # streamed from the host every epoch anyway
            X = X.get()
        return _layout.build_layout(X, xp=np, **kw)
    kw.setdefault("chunk_nnz", _memory.DEVICE_CHUNK_NNZ)
    kw["kernels"] = CudaBuildKernels(kw.get("dtype", np.float32))
    if on_device:  # on the device already: nothing to upload
        return _layout.build_layout(X, xp=cp, **kw)
    if site == "device":
        return _upload.build_on_device(X, cp, staged=staged, **kw)
    return _upload.build_from_host(X, cp, **kw)


class DeviceLayout:
    """A TileLayout whose index arrays are on the device; nonzeros stream in.

    Parameters
    ----------
    layout : TileLayout (host)
    memory_budget : int or None
        Device bytes the nonzeros may take to stay resident; ``None``: as the
        fit's memory plan says (resident unless "streamed"), or without a
        plan the budget of ``device_memory_limit``.
    chunk_bytes : int or None
        Bytes of nonzeros per streamed chunk; ``None``:
        :data:`sklearn_cuwide._memory.STREAM_CHUNK_BYTES` (what the plan counts).
    """

    def __init__(self, layout, memory_budget=None, chunk_bytes=None):
        if chunk_bytes is None:
            chunk_bytes = _memory.STREAM_CHUNK_BYTES
        self.host = layout
        self.n_hot = layout.n_hot
        self.sample_block = layout.sample_block
        self.n_batches = layout.n_batches
        self.n_rows = layout.n_rows
        self.tile_ptr = cp.asarray(layout.tile_ptr)
        self.sblock_row_ptr = cp.asarray(layout.sblock_row_ptr)
        self.batch_sblock_ptr = cp.asarray(layout.batch_sblock_ptr)
        self.bytes_per_nnz = (
            layout.feat.itemsize + layout.row.itemsize + layout.val.itemsize
        )
        self._uploader = None  # made by the first stream_chunks
        self._copied = set()  # chunks already in the resident arrays
        self._scale = self._q = self._pscale = None
        if isinstance(layout.feat, cp.ndarray):  # built on the device
            self.resident = self.uploaded = True
            self.feat, self.row, self.val = layout.feat, layout.row, layout.val
            self.chunks = [(0, layout.n_batches)]
            self.chunk_nnz = [(0, layout.nnz)]
            self.max_chunk = layout.nnz
            return
        nnz_bytes = layout.nnz * self.bytes_per_nnz
        plan = _memory.active_plan()
        if memory_budget is None and plan is not None and plan.layout is not None:
            self.resident = plan.layout_resident
        else:
            self.resident = nnz_bytes <= _budget(memory_budget)
        # chunks: contiguous runs of mini-batches of about chunk_bytes
        bstart = layout.tile_ptr[2 * layout.batch_sblock_ptr]  # nnz start per batch
        per_chunk = max(1, int(chunk_bytes // self.bytes_per_nnz))
        bounds = [0]
        if layout.n_batches:
            targets = np.arange(per_chunk, layout.nnz, per_chunk)
            cut = np.unique(np.searchsorted(bstart[:-1], targets, side="left"))
            bounds += [int(c) for c in cut if 0 < c < layout.n_batches]
            bounds.append(layout.n_batches)
        self.chunks = list(zip(bounds[:-1], bounds[1:]))
        self.chunk_nnz = [
            (int(bstart[a]), int(bstart[b])) for a, b in self.chunks
        ]
        self.max_chunk = max((b - a for a, b in self.chunk_nnz), default=0)
        self.uploaded = False
        if self.resident:
            self.feat = cp.empty(layout.nnz, dtype=layout.feat.dtype)
            self.row = cp.empty(layout.nnz, dtype=layout.row.dtype)
            self.val = cp.empty(layout.nnz, dtype=layout.val.dtype)

    def batch_weight_on_device(self, batch_weight):
        """The per-batch weights as a device array (uploaded once)."""
        cached = getattr(self, "_bw", None)
        if cached is not None and cached[0] is batch_weight:
            return cached[1]
        dev = cp.asarray(np.asarray(batch_weight, dtype=np.float32))
        self._bw = (batch_weight, dev)
        return dev

    def concurrency_scale(self, n_concurrent, power=1.0, cap=None):
        """Per-feature step scale for ``n_concurrent`` blocks in flight.

        A feature present in a fraction ``q`` of the mini-batches is updated
        by about ``1 + (P - 1) q`` blocks from the same stale weights; its
        step is divided by that (staleness-aware asynchronous SGD).  Returns
        (device array in layout order, the number of leading features that
        it damps, scale of the intercept): every feature from that index on
        has a scale of 1, so the kernel reads no scale for it (with a cap,
        these are the cold features, which few blocks update at once).
        """
        P = int(n_concurrent)
        key = (P, float(power), cap)
        if self._scale is None or self._scale[0] != key:
            if self._q is None:  # each feature's share of mini-batches, on the device
                h = self.host
                rows = self.n_rows if h.count_rows is None else h.count_rows
                self._q = _BATCH_SHARE(cp.asarray(h.feature_counts), cp.asarray(h.feature_order),
                                       -h.batch_size / max(rows, 1))
            self._scale = None  # the previous level's scales go before this one's
            updaters = 1.0 + (P - 1) * self._q
            if cap is not None:  # undamped up to `cap` concurrent updaters
                s, sb = cp.minimum(1.0, cap / updaters), min(1.0, cap / P)
            else:
                s, sb = updaters ** (-power), float(P) ** -power
            del updaters
            # features from the last damped one on have a scale of 1
            damped = (s < 1.0)[::-1]
            n_scaled = (s.size - int(cp.argmax(damped))
                        if bool(_reduce.reduce_all(cp, damped, "any")) else 0)
            del damped
            # one level kept: 4 bytes per feature, not 4 per level of the ramp
            self._scale = (key, (s.astype(cp.float32, copy=False), n_scaled, sb))
        return self._scale[1]

    def penalty_scale(self):
        """:func:`sklearn_cuwide._layout.penalty_scale` on the device (float32,
        layout order), computed once: where the nonzeros are (on the device
        when built there, else on the host)."""
        if self._pscale is None:
            if self.host.penalty_factors is not None:  # a window's: given
                self._pscale = cp.asarray(self.host.penalty_factors, dtype=cp.float32)
            elif isinstance(self.host.feat, cp.ndarray):
                self._pscale = CudaBuildKernels().penalty_scale(
                    self.feat, self.tile_ptr, self.host.n_features, self.n_batches)
            else:
                self._pscale = cp.asarray(_layout.penalty_scale(self.host, np))
            self._pscale_token = next(_TOKENS)
        return self._pscale

    @property
    def nbytes(self):
        """Device bytes this layout holds."""
        small = self.tile_ptr.nbytes + self.sblock_row_ptr.nbytes
        small += self.batch_sblock_ptr.nbytes
        if self.resident:
            return small + self.host.nnz * self.bytes_per_nnz
        return small + 2 * self.max_chunk * self.bytes_per_nnz

    def stream_chunks(self, order_chunks, compute_stream):
        """Yield ``(chunk, (feat, row, val), nnz_base)`` for each chunk of
        ``order_chunks``, after making ``compute_stream`` wait for its copy
        (:func:`._upload.stream_chunks`).  The caller enqueues the chunk's
        kernel before asking for the next chunk, whose copy then overlaps
        that kernel.  A resident layout is ``uploaded`` once every chunk was
        copied; its pinned buffers are then freed."""
        h = self.host
        resident = (self.feat, self.row, self.val) if self.resident else None
        pinned = all(_upload.is_pinned(cp, a) for a in (h.feat, h.row, h.val))
        if self._uploader is None:  # pinned (and, streaming, device) buffers
            specs = [(self.max_chunk, a.dtype) for a in (h.feat, h.row, h.val)]
            self._uploader = _upload.PinnedUploader(
                cp, specs, device_buffers=resident is None, host_buffers=not pinned)
        chunks = _upload.stream_chunks(
            self._uploader, (h.feat, h.row, h.val), self.chunk_nnz, order_chunks,
            compute_stream, resident=resident, pinned=pinned,
        )
        try:
            for k, arrays, base in chunks:
                yield k, arrays, base
                self._copied.add(k)
        finally:  # interrupted: the uploader's copies end before its buffers can go
            chunks.close()
        if self.resident and len(self._copied) == len(self.chunks):
            self.uploaded = True
            self._uploader.close()
            self._uploader = None


def put_layout(layout, memory_budget=None, chunk_bytes=None):
    return DeviceLayout(layout, memory_budget=memory_budget, chunk_bytes=chunk_bytes)
