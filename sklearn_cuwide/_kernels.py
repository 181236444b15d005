"""Loading the CUDA C sources of ``cuda/`` through ``cupy.RawModule``.

Sources are compiled by NVRTC at first use (never at import), one template
instantiation at a time (``name_expressions``), and memoised per device.
The sources are looked up inside the installed package
(``sklearn_cuwide/cuda/``, where the wheel puts them) and then in the source
tree's top-level ``cuda/``.
"""

import threading
from pathlib import Path

__all__ = ["source_dir", "get_kernel", "kernel_name"]

_CACHE = {}
_LOCK = threading.Lock()
NVRTC_OPTIONS = ("-std=c++17",)


def source_dir():
    """Folder that holds the ``.cu`` / ``.cuh`` sources."""
    here = Path(__file__).resolve().parent
    for cand in (here / "cuda", here.parent / "cuda"):
        if (cand / "cuwide_common.cuh").is_file():
            return cand
    raise FileNotFoundError(
        "sklearn-cuwide's CUDA sources were not found (looked in "
        f"{here / 'cuda'} and {here.parent / 'cuda'}); the installation is "
        "incomplete"
    )


def kernel_name(name, *template_args):
    """``name<a, b, ...>`` as NVRTC's name_expressions want it."""
    if not template_args:
        return name
    return f"{name}<{', '.join(str(a) for a in template_args)}>"


def get_kernel(filename, name_expression):
    """The compiled ``cupy.RawKernel`` for one instantiation, on the current device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (dev, filename, name_expression)
    kern = _CACHE.get(key)
    if kern is not None:
        return kern
    with _LOCK:
        kern = _CACHE.get(key)
        if kern is None:
            d = source_dir()
            code = (d / filename).read_text()
            mod = cupy.RawModule(
                code=code,
                options=NVRTC_OPTIONS + (f"-I{d}",),
                name_expressions=[name_expression],
            )
            kern = mod.get_function(name_expression)
            _CACHE[key] = kern
    return kern
