"""Backends: ``_cpu`` (numpy/scipy) and ``_cuda`` (CuPy + CUDA C kernels).

Both are modules with the same functions (``tile_shape``, ``put_layout``,
``put_state``, ``get_state``, ``run_epoch``, ``decision_function``,
``matmul``, ``rmatmul``, ...).  Only ``_cuda`` imports cupy, and only when
it is asked for.
"""

__all__ = ["get_backend"]


def get_backend(device):
    """The backend module for a resolved device (``"cpu"`` or ``"cuda:N"``)."""
    if device == "cpu":
        from . import _cpu

        return _cpu
    if device.startswith("cuda"):
        from . import _cuda

        _cuda.use_device(int(device.split(":")[1]) if ":" in device else 0)
        return _cuda
    raise ValueError(f"unknown device {device!r}")
