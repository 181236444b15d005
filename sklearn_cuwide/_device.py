"""Resolving the ``device`` parameter (``"auto"``, ``"cpu"``, ``"cuda"``,
``"cuda:N"``) into the device a fit runs on.

cupy is imported here only to ask whether a usable GPU exists and to start
a device's context; nothing is compiled and no kernel is loaded.
"""

import functools
import os
import re
import threading

__all__ = ["resolve_device", "cuda_device_count", "usable_devices", "is_cupy_array",
           "start_context", "VALID_DEVICES"]

VALID_DEVICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
#: oldest compute capability the kernels support (float atomics in shared
#: memory, opt-in shared memory above 48 KiB)
MIN_COMPUTE_CAPABILITY = 70


def usable_devices():
    """Indices of the CUDA devices the kernels run on (compute capability
    7.0 or newer); empty when cupy or a driver is missing."""
    return list(_usable_devices())


@functools.lru_cache(maxsize=1)
def _usable_devices():
    # asked once per process: every fit and prediction resolves its device,
    # and reading a device's properties is slow
    try:
        from cupy.cuda import runtime
    except Exception:
        return ()
    try:
        n = runtime.getDeviceCount()
    except Exception:
        return ()
    usable = []
    for i in range(n):
        try:
            props = runtime.getDeviceProperties(i)
            cc = props["major"] * 10 + props["minor"]
        except Exception:
            continue
        if cc >= MIN_COMPUTE_CAPABILITY:
            usable.append(i)
    return tuple(usable)


def cuda_device_count():
    """Number of usable CUDA devices (0 when cupy or a driver is missing)."""
    return len(usable_devices())


def start_context(index):
    """Start creating CUDA device ``index``'s primary context on a thread of
    its own, once per process and device; return that thread.

    Rule: ``_backends.get_backend`` calls it before it imports the CUDA
    backend, so every fit and prediction on a GPU does.  Why: the context takes a tenth of a second
    or more to create, and ``cudaFree(0)`` creates it without the GIL, so it
    overlaps the backend's imports, which the first fit of a process waits
    for anyway (docs/design/startup.rst).  Selecting a device other than 0
    creates the context under the GIL (CuPy's ``setDevice``): nothing is
    gained there, and nothing lost.
    """
    return _context_thread(int(index))


@functools.lru_cache(maxsize=None)
def _context_thread(index):
    def create():
        try:
            from cupy.cuda import runtime

            if index != 0:  # a new thread's current device is 0
                runtime.setDevice(index)
            runtime.free(0)  # creates the primary context, the GIL released
        except Exception:  # the fit's own first CUDA call reports it
            pass

    thread = threading.Thread(target=create, name=f"cuwide-context-{index}", daemon=True)
    thread.start()
    return thread


def _forget_context_threads_in_child():
    # a forked child has no CUDA context: it starts its own when it needs one
    _context_thread.cache_clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_context_threads_in_child)


def _device_of(X):
    """The CUDA device index of a cupy array or cupyx matrix, else None."""
    if X is None or not is_cupy_array(X):
        return None
    try:
        dev = X.device
    except (AttributeError, NotImplementedError):  # cupyx matrices raise the latter
        dev = getattr(getattr(X, "data", None), "device", None)
    return None if dev is None else int(dev.id)


def _why_no_cuda():
    try:
        from cupy.cuda import runtime
    except Exception as exc:
        return (
            "cupy is not installed or failed to import "
            f"({type(exc).__name__}: {exc}); install the cupy of your CUDA "
            "version (pip install cupy-cuda12x or cupy-cuda13x; from a checkout "
            "of sklearn-cuwide, its extras: pip install '.[cuda12]' or '.[cuda13]')"
        )
    try:
        n = runtime.getDeviceCount()
    except Exception as exc:  # no driver, or no device it can see
        return f"cupy finds no CUDA device ({type(exc).__name__}: {exc})"
    if n == 0:
        return "cupy finds no CUDA device"
    return (f"cupy finds {n} CUDA device(s), none of compute capability 7.0 or "
            "newer, which the kernels need")


def is_cupy_array(X):
    """True for cupy ndarrays and cupyx.scipy.sparse matrices (no import)."""
    mod = type(X).__module__ or ""
    return mod.startswith("cupy") or mod.startswith("cupyx")


def resolve_device(device, X=None):
    """Return ``"cpu"`` or ``"cuda:N"`` for a ``device`` parameter value.

    ``"auto"`` picks the GPU ``X`` lives on when it is a usable one, else
    the first usable GPU (compute capability 7.0 or newer, whatever its
    index), else the CPU.  An explicit ``"cuda"`` or ``"cuda:N"`` without a
    usable GPU of that index raises ``ValueError`` instead of falling back.
    """
    if not isinstance(device, str):
        raise ValueError(f"device must be {VALID_DEVICES}; got {device!r}")
    dev = device.strip().lower()
    if dev == "cpu":
        return "cpu"
    if dev == "auto":
        usable = usable_devices()
        where = _device_of(X)
        if where in usable:
            return f"cuda:{where}"
        return f"cuda:{usable[0]}" if usable else "cpu"
    m = _CUDA_RE.match(dev)
    if m is None:
        raise ValueError(f"device must be {VALID_DEVICES}; got {device!r}")
    usable = usable_devices()
    idx = int(m.group(1)) if m.group(1) is not None else (usable[0] if usable else 0)
    n = len(usable)
    if n == 0:
        raise ValueError(
            f"device={device!r} was requested but no usable GPU is available: "
            f"{_why_no_cuda()}. Use device='cpu' or device='auto'."
        )
    if idx not in usable:
        raise ValueError(
            f"device={device!r} was requested but it is not a usable CUDA device; "
            f"the usable ones (compute capability 7.0 or newer) are "
            f"{', '.join(f'cuda:{i}' for i in usable)}."
        )
    return f"cuda:{idx}"
