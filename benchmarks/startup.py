"""Start-up: the first ``fit`` of a fresh process, with CuPy's kernel cache
empty (cold) and then filled by that run (warm).

Each measurement is a child process (``python -m benchmarks.startup``) with
its own ``CUPY_CACHE_DIR``, so nothing compiled by the harness or by an
earlier measurement is reused unless it is meant to be.  The child times the
import of the package, then the first ``fit`` (the CUDA context, the
kernels' compilation or their load from the cache, and the fit itself),
then a second ``fit`` of a fresh estimator with the same parameters (the
warm fit, nothing left to compile).  It fits with ``verbose=1`` and keeps
the lines: where the first fit's time went, stage by stage, the kernels'
share included.  With ``CUPY_CACHE_SAVE_CUDA_SOURCE=1`` CuPy writes each
compiled source beside its module in the cache: the parent counts the
modules compiled, ours (the sources of ``cuda/``) and CuPy's own (its
elementwise and reduction kernels), from those files.

Targets (issue: start-up): the cold first fit at most
:data:`COLD_TARGET_S`; the warm-cache first fit at most
:data:`WARM_OVER_TARGET_S` over the warm fit.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .stages import verbose_fit

ROOT = Path(__file__).resolve().parents[1]

#: the cold first fit's target, seconds (compilation included)
COLD_TARGET_S = 3.0
#: the warm-cache first fit's target over the warm fit, seconds
WARM_OVER_TARGET_S = 0.5

#: the models measured: (id, label, estimator parameters)
MODELS = (
    ("lr", "GPULogisticRegression(solver='adagrad')",
     {"kind": "lr", "solver": "adagrad", "max_iter": 3, "tol": 1e-4}),
    ("fm16", "GPUFactorizationMachine(n_factors=16)",
     {"kind": "fm", "n_factors": 16, "max_iter": 3, "tol": None}),
)


# --------------------------------------------------------------------------
# the child
# --------------------------------------------------------------------------
def _estimator(spec, device):
    from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression

    kw = {k: v for k, v in spec.items() if k != "kind"}
    cls = GPULogisticRegression if spec["kind"] == "lr" else GPUFactorizationMachine
    return cls(random_state=0, device=device, verbose=1, **kw)


def _timed_fit(spec, device, X, y):
    """Seconds of one fit, and the lines its ``verbose=1`` printed."""
    return verbose_fit(_estimator(spec, device), X, y)


def child(spec, rows, device):
    """What one fresh process measures (a JSON-able dict)."""
    import importlib

    t0 = time.perf_counter()
    importlib.import_module("sklearn_cuwide")  # the import is what is timed
    from sklearn_cuwide.datasets import make_ctr_classification

    import_s = time.perf_counter() - t0
    X, y = make_ctr_classification(n_samples=rows, n_features=2**20, random_state=0)[:2]
    first_s, first_lines = _timed_fit(spec, device, X, y)
    second_s, second_lines = _timed_fit(spec, device, X, y)
    return {"import_s": import_s, "first_fit_s": first_s, "second_fit_s": second_s,
            "first_fit_lines": first_lines, "second_fit_lines": second_lines,
            "kernels_s": _kernel_seconds(first_lines)}


def _kernel_seconds(lines):
    """The kernels' seconds a fit's ``verbose=1`` lines report."""
    import re

    return sum(float(m.group(1)) for ln in lines
               for m in re.finditer(r"\(kernels (\d+\.\d+) s\)", ln))


# --------------------------------------------------------------------------
# the parent
# --------------------------------------------------------------------------
def count_modules(cache_dir):
    """Modules CuPy compiled into ``cache_dir`` (their sources saved beside
    them): ``{"ours": n, "cupy": n}``."""
    counts = {"ours": 0, "cupy": 0}
    for src in Path(cache_dir).glob("*.cu"):
        text = src.read_text(errors="replace")
        counts["ours" if "namespace cuwide" in text else "cupy"] += 1
    return counts


def run_child(model_id, rows, device, cache_dir, timeout=300):
    """One fresh process's measurement, with ``cache_dir`` as CuPy's cache."""
    spec = dict(next(m for m in MODELS if m[0] == model_id)[2])
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache_dir), CUPY_CACHE_SAVE_CUDA_SOURCE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", "--child", json.dumps(spec),
         "--rows", str(rows), "--device", device],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the start-up child failed (exit {proc.returncode}): "
                           + (proc.stderr.strip().splitlines() or ["?"])[-1][:200])
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_s"] = wall
    return rec


def summarize(cold, warm):
    """The figures of a model from its cold and its warm-cache process."""
    out = {
        "cold_first_fit_s": cold["first_fit_s"],
        "warm_cache_first_fit_s": warm["first_fit_s"],
        "warm_fit_s": warm["second_fit_s"],
        "cold_kernels_s": cold["kernels_s"],
        "warm_cache_kernels_s": warm["kernels_s"],
        "import_s": warm["import_s"],
    }
    out["warm_cache_over_warm_s"] = out["warm_cache_first_fit_s"] - out["warm_fit_s"]
    out["cold_ok"] = out["cold_first_fit_s"] <= COLD_TARGET_S
    out["warm_cache_ok"] = out["warm_cache_over_warm_s"] <= WARM_OVER_TARGET_S
    return out


def measure(model_id, rows, device, timeout=300):
    """A model's cold and warm-cache start-up, each in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="cuwide-kernel-cache-") as cache:
        cold = run_child(model_id, rows, device, cache, timeout)
        compiled = count_modules(cache)
        warm = run_child(model_id, rows, device, cache, timeout)
        recompiled = count_modules(cache)
    rec = summarize(cold, warm)
    rec.update(rows=rows, device=device, modules_compiled_cold=compiled,
               modules_compiled_warm={k: recompiled[k] - compiled[k] for k in compiled},
               cold=cold, warm=warm)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup",
                                 description="The first fit of a fresh process.")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child), args.rows, args.device)), flush=True)
        return 0
    for mid in args.models.split(","):
        rec = measure(mid.strip(), args.rows, args.device)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("cold", "warm")}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
