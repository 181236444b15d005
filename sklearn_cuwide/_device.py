"""Resolving the ``device`` parameter (``"auto"``, ``"cpu"``, ``"cuda"``,
``"cuda:N"``) into the device a fit runs on.

cupy is imported here only to ask whether a usable GPU exists; nothing is
compiled and no kernel is loaded.
"""

import re

__all__ = ["resolve_device", "cuda_device_count", "is_cupy_array", "VALID_DEVICES"]

VALID_DEVICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
#: oldest compute capability the kernels support (float atomics in shared
#: memory, opt-in shared memory above 48 KiB)
MIN_COMPUTE_CAPABILITY = 70


def cuda_device_count():
    """Number of usable CUDA devices (0 when cupy or a driver is missing)."""
    try:
        from cupy.cuda import runtime
    except Exception:
        return 0
    try:
        n = runtime.getDeviceCount()
    except Exception:
        return 0
    usable = 0
    for i in range(n):
        try:
            props = runtime.getDeviceProperties(i)
            cc = props["major"] * 10 + props["minor"]
        except Exception:
            continue
        if cc >= MIN_COMPUTE_CAPABILITY:
            usable += 1
    return usable


def _why_no_cuda():
    try:
        import cupy  # noqa: F401
    except Exception as exc:
        return (
            "cupy is not installed or failed to import "
            f"({type(exc).__name__}: {exc}); install sklearn-cuwide[cuda12] or "
            "sklearn-cuwide[cuda13]"
        )
    return "cupy found no CUDA device of compute capability 7.0 or newer"


def is_cupy_array(X):
    """True for cupy ndarrays and cupyx.scipy.sparse matrices (no import)."""
    mod = type(X).__module__ or ""
    return mod.startswith("cupy") or mod.startswith("cupyx")


def resolve_device(device, X=None):
    """Return ``"cpu"`` or ``"cuda:N"`` for a ``device`` parameter value.

    ``"auto"`` picks the first GPU when one is usable (or when ``X`` already
    lives on one), else the CPU.  An explicit ``"cuda"`` or ``"cuda:N"``
    without a usable GPU raises ``ValueError`` instead of falling back.
    """
    if not isinstance(device, str):
        raise ValueError(f"device must be {VALID_DEVICES}; got {device!r}")
    dev = device.strip().lower()
    if dev == "cpu":
        return "cpu"
    if dev == "auto":
        return "cuda:0" if cuda_device_count() > 0 else "cpu"
    m = _CUDA_RE.match(dev)
    if m is None:
        raise ValueError(f"device must be {VALID_DEVICES}; got {device!r}")
    idx = int(m.group(1) or 0)
    n = cuda_device_count()
    if n == 0:
        raise ValueError(
            f"device={device!r} was requested but no usable GPU is available: "
            f"{_why_no_cuda()}. Use device='cpu' or device='auto'."
        )
    if idx >= n:
        raise ValueError(
            f"device={device!r} was requested but only {n} usable CUDA "
            f"device(s) exist."
        )
    return f"cuda:{idx}"
