"""Which kernel instantiations a fit runs, and loading them from the CUDA C
sources of ``cuda/`` through ``cupy.RawModule``.

Two halves:

* **names** (plain Python, no cupy): the template instantiation a launch
  needs, as a ``name_expression``, derived from the fit's parameters (the
  model, its outputs and factors, the solver, the loss) and, for the training
  kernel, the thread blocks per worker of each launch of an epoch
  (:func:`launch_plan`, :func:`epoch_instantiations`).  The CPU tests check
  these names against the sources.
* **modules** (cupy, imported only when a kernel is asked for): every
  instantiation is its own ``RawModule`` holding that one name expression,
  compiled by NVRTC at first use (never at import) and memoised per device
  and per instantiation; :func:`get_kernels` compiles the ones an epoch
  will launch together, in threads (NVRTC releases the GIL).  CuPy's
  on-disk cache keeps the compiled modules between processes; the source
  handed to it has its ``cuda/`` headers inlined, so that the cache's key
  (the source text and the options) changes when a header does.

The sources are looked up inside the installed package
(``sklearn_cuwide/cuda/``, where the wheel puts them) and then in the source
tree's top-level ``cuda/``.
"""

import re
import threading
import time
from pathlib import Path

from ._backends import _concurrency

__all__ = [
    "source_dir", "source_text", "kernel_name", "get_kernel", "get_kernels",
    "get_module_kernels", "memoised_module", "prefetch", "train_instantiation",
    "launch_plan", "epoch_instantiations", "predict_instantiation", "build_instantiations",
    "factors_instantiation", "loss_instantiation", "lbfgs_instantiations", "lbfgs_row_lanes",
    "lbfgs_memory_instantiation", "classic_instantiation",
    "compile_seconds", "MODEL", "LOSS", "SOLVER", "VARIANTS",
]

NVRTC_OPTIONS = ("-std=c++17",)

# --------------------------------------------------------------------------
# names (no cupy)
# --------------------------------------------------------------------------
#: the enums of ``cuda/cuwide_common.cuh`` the templates take
MODEL = {"linear": "cuwide::LINEAR", "fm": "cuwide::FM"}
LOSS = {
    "logistic": "cuwide::LOGISTIC",
    "multinomial": "cuwide::MULTINOMIAL",
    "squared": "cuwide::SQUARED",
}
SOLVER = {"sgd": "cuwide::SGD", "adagrad": "cuwide::ADAGRAD"}
#: the ablation variants of the training kernel (``cuwide::Variant``): None
#: is the estimators' kernel
VARIANTS = {
    "no_replicas": "cuwide::NO_REPLICAS",
    "global_accumulators": "cuwide::GLOBAL_ACCUMULATORS",
}
#: the C type of a numpy dtype's name, for the kernels' type arguments
CTYPE = {"int32": "int", "int64": "long long", "float32": "float", "float64": "double"}


def kernel_name(name, *template_args):
    """``name<a, b, ...>`` as NVRTC's name_expressions want it."""
    if not template_args:
        return name
    return f"{name}<{', '.join(str(a) for a in template_args)}>"


def train_instantiation(model, n_outputs, n_factors, solver, loss, cluster=1, variant=None):
    """The training kernel's name expression (``cuda/cuwide_train.cu``).

    ``cuwide_train<MODEL, NOUT, NF, SOLVER, LOSS>`` with one thread block
    per worker, ``cuwide_train_cluster<..., CL>`` with clusters of
    ``cluster`` blocks; ``variant`` (a key of :data:`VARIANTS`) the
    ablation's ``cuwide_train_ablation[_cluster]``.  An FM has one output
    and ``n_factors`` factors, logistic regression ``n_outputs`` outputs and
    no factors.
    """
    if model not in MODEL or solver not in SOLVER or loss not in LOSS:
        raise ValueError(f"no training kernel for model={model!r}, solver={solver!r}, "
                         f"loss={loss!r}")
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)} or None, got {variant!r}")
    args = [MODEL[model], 1 if model == "fm" else int(n_outputs),
            int(n_factors) if model == "fm" else 0, SOLVER[solver], LOSS[loss]]
    name = "cuwide_train" if variant is None else "cuwide_train_ablation"
    if int(cluster) > 1:
        name, args = name + "_cluster", args + [int(cluster)]
    if variant is not None:
        args.append(VARIANTS[variant])
    return kernel_name(name, *args)


#: the key of :func:`epoch_instantiations` for the kernel that trains in
#: order on the whole grid (the other keys are thread blocks per worker)
IN_ORDER = "in_order"


def in_order_instantiation(n_factors, solver, loss):
    """The name expression of ``cuwide_train_in_order<NF, SOLVER, LOSS>``
    (``cuda/cuwide_train.cu``): an FM's mini-batches in order, each step on
    the whole grid."""
    if solver not in SOLVER or loss not in LOSS or loss == "multinomial":
        raise ValueError(f"no in-order FM kernel for solver={solver!r}, loss={loss!r}")
    return kernel_name("cuwide_train_in_order", int(n_factors), SOLVER[solver], LOSS[loss])


def trains_in_order(model, workers, cluster=None, variant=None):
    """Whether an epoch's launch of ``workers`` runs the in-order kernel:
    an FM's one worker, unless a cluster size or an ablation is forced.
    Rule: one FM worker trains on the whole grid.  Why: the same order,
    every multiprocessor busy (a cluster of 8 blocks uses 8 of them)."""
    return model == "fm" and int(workers) == 1 and cluster is None and variant is None


def launch_plan(chunk_batches, grid, ramp, ramp_done=0):
    """The launches of one epoch: ``[(chunk, n_batches, workers), ...]`` in
    order.

    ``chunk_batches``: the mini-batches the epoch trains from each chunk of
    the layout, in the order the chunks are visited (one entry for a
    resident layout); ``grid``: the epoch's workers; ``ramp``: the first
    epoch's warm-up (:func:`~sklearn_cuwide._backends._concurrency.ramp_stages`),
    whose stages are consumed by the first launches, across chunks;
    ``ramp_done``: its mini-batches trained already (this epoch is a part of
    one, as an out-of-core window is).  A launch runs ``min(workers,
    n_batches)`` workers.
    """
    stages = _concurrency.ramp_stages(ramp, grid)
    done = int(ramp_done)
    while stages and done:  # the warm-up's part before this one
        P, cnt = stages[0]
        if done >= cnt:
            stages.pop(0)
            done -= cnt
        else:
            stages[0] = (P, cnt - done)
            done = 0
    plan = []
    for c, n in enumerate(chunk_batches):
        n = int(n)
        while stages and n:
            P, cnt = stages[0]
            take = min(cnt, n)
            plan.append((c, take, P))
            n -= take
            if take == cnt:
                stages.pop(0)
            else:
                stages[0] = (P, cnt - take)
        if n:
            plan.append((c, n, int(grid)))
    return plan


def epoch_instantiations(model, n_outputs, n_factors, solver, loss, *, chunk_batches, grid,
                         ramp, slots, cluster_sizes, cluster=None, variant=None,
                         and_later=False, ramp_done=0):
    """The training kernels one epoch launches, by thread blocks per worker:
    ``{cluster: name_expression}`` (the in-order kernel under the key
    :data:`IN_ORDER`).

    Each launch of :func:`launch_plan` runs ``min(workers, n_batches)``
    workers of ``cluster`` blocks (None:
    :func:`~sklearn_cuwide._backends._concurrency.cluster_for` them on a
    device that runs ``slots`` blocks at once, with ``cluster_sizes``).
    ``and_later``: with them, those of the same epoch without the warm-up
    (the epochs after a first one that warms up); ``ramp_done``: as
    :func:`launch_plan` takes it.
    """
    out = {}
    plan = launch_plan(chunk_batches, grid, ramp, ramp_done)
    if and_later and ramp:
        plan += launch_plan(chunk_batches, grid, 0)
    for _, n, P in plan:
        g = min(int(P), int(n))
        if trains_in_order(model, g, cluster, variant):
            out[IN_ORDER] = in_order_instantiation(n_factors, solver, loss)
            continue
        cl = int(cluster) if cluster is not None else _concurrency.cluster_for(
            g, slots, cluster_sizes)
        if cl not in out:
            out[cl] = train_instantiation(model, n_outputs, n_factors, solver, loss, cl,
                                          variant)
    return out


def predict_instantiation(indptr_dtype, indices_dtype, data_dtype, model, n_outputs,
                          n_factors):
    """The predict kernel's name expression (``cuda/cuwide_predict.cu``):
    ``cuwide_predict<IPT, IDX, T, MODEL, NOUT, NF>`` (dtypes by name, e.g.
    ``"int32"``; an FM has one output)."""
    return kernel_name(
        "cuwide_predict", CTYPE[str(indptr_dtype)], CTYPE[str(indices_dtype)],
        CTYPE[str(data_dtype)], MODEL[model], 1 if model == "fm" else int(n_outputs),
        int(n_factors) if model == "fm" else 0)


#: lanes per row of the L-BFGS forward pass it may use
LBFGS_ROW_LANES = (4, 8, 16, 32)


def lbfgs_row_lanes(nnz, n_rows):
    """Lanes per row of the L-BFGS forward pass: the fewest of
    :data:`LBFGS_ROW_LANES` that leave a lane at most 8 nonzeros of a mean
    row (a lane's loads are a chain; short rows waste a whole warp's)."""
    mean = nnz / max(int(n_rows), 1)
    for lanes in LBFGS_ROW_LANES:
        if mean <= 8 * lanes:
            return lanes
    return LBFGS_ROW_LANES[-1]


def lbfgs_instantiations(indices_dtype, data_dtype, row_lanes=32):
    """The fused L-BFGS objective's two kernels (``cuda/cuwide_lbfgs.cu``):
    ``(forward, backward)`` name expressions for a CSR of these dtypes, the
    forward pass with ``row_lanes`` lanes per row."""
    if row_lanes not in LBFGS_ROW_LANES:
        raise ValueError(f"row_lanes must be one of {LBFGS_ROW_LANES}, got {row_lanes!r}")
    targs = (CTYPE[str(indices_dtype)], CTYPE[str(data_dtype)])
    return (kernel_name("cuwide_lbfgs_logistic_forward", *targs, int(row_lanes)),
            kernel_name("cuwide_lbfgs_logistic_backward", *targs))


def lbfgs_memory_instantiation(name, n_rows):
    """``cuwide_lbfgs_gram<NB>`` or ``cuwide_lbfgs_direction<NB>`` for the
    ``n_rows`` stored vectors of L-BFGS (``2 m``: one value per fit)."""
    if name not in ("cuwide_lbfgs_gram", "cuwide_lbfgs_direction"):
        raise ValueError(f"no L-BFGS memory kernel {name!r}")
    return kernel_name(name, int(n_rows))


#: the layout build's kernels that take no dtype (``cuda/cuwide_build.cu``)
BUILD_PLAIN = ("cuwide_rank_keys", "cuwide_rank_order", "cuwide_keyed_permutation",
               "cuwide_batch_nnz", "cuwide_penalty_held", "cuwide_penalty_scale")


def build_instantiations(indices_dtype, data_dtype, value_dtype):
    """The layout build's kernels (``cuda/cuwide_build.cu``) for a CSR of
    these dtypes tiled into values of ``value_dtype``: ``{role: name
    expression}``, every one of them compiled in one module."""
    idx, t, v = (CTYPE[str(d)] for d in (indices_dtype, data_dtype, value_dtype))
    names = {
        "count": kernel_name("cuwide_count_rows", idx, t),
        "keys": kernel_name("cuwide_chunk_keys", idx, t, v),
        "copy": kernel_name("cuwide_copy_rows", idx, t),
        "runs": kernel_name("cuwide_chunk_runs", v),
        "store": kernel_name("cuwide_chunk_store", v),
    }
    names.update({n: n for n in BUILD_PLAIN})
    return names


def factors_instantiation(dtype):
    """The initial factors' kernel (``cuda/cuwide_factors.cu``) for factors
    of ``dtype`` (its name, e.g. ``"float32"``)."""
    return kernel_name("cuwide_draw_factors", CTYPE[str(dtype)])


def loss_instantiation(loss):
    """The weighted loss's kernel (``cuda/cuwide_loss.cu``) of ``loss``
    (``"logistic"`` or ``"squared"``)."""
    if loss not in ("logistic", "squared"):
        raise ValueError(f"no weighted-loss kernel for loss={loss!r}")
    return kernel_name("cuwide_weighted_loss", LOSS[loss])


def classic_instantiation(model, n_factors, solver, loss):
    """The classic schema's kernel (``cuda/cuwide_classic.cu``, the
    benchmarks' ablation): ``cuwide_classic<MODEL, NF, SOLVER, LOSS>``."""
    return kernel_name("cuwide_classic", MODEL[model], int(n_factors), SOLVER[solver],
                       LOSS[loss])


# --------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------
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


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.MULTILINE)


def source_text(filename, directory=None):
    """The source of ``filename`` with the ``#include "..."`` of its folder's
    files inlined (each once: they are ``#pragma once``).

    CuPy's on-disk cache is keyed by the source text, not by the headers it
    includes: inlined, a changed header is a new key, not a stale module.
    """
    d = Path(directory) if directory is not None else source_dir()
    seen = set()

    def expand(name):
        text = (d / name).read_text()

        def sub(m):
            inc = m.group(1)
            if not (d / inc).is_file():
                return m.group(0)  # not ours: left to the compiler
            if inc in seen:
                return f"// {inc}: inlined above"
            seen.add(inc)
            body = _PRAGMA_ONCE.sub("", expand(inc))
            return f"// ---- {inc} (inlined) ----\n{body}\n// ---- end of {inc} ----"

        return _INCLUDE.sub(sub, text)

    return expand(filename)


# --------------------------------------------------------------------------
# modules (cupy)
# --------------------------------------------------------------------------
_CACHE = {}  # (device, filename, name_expression or their tuple) -> RawKernel(s)
_PENDING = {}  # the same keys -> the Future of a build under way
_SOURCES = {}  # filename -> source text (read once per process)
_LOCK = threading.Lock()  # guards the three dicts; never held while compiling
_COMPILE = {"seconds": 0.0, "modules": 0}


def compile_seconds():
    """Wall-clock seconds this process's fits and predictions waited for
    kernel modules (NVRTC compilation, a load from CuPy's on-disk cache, or
    a :func:`prefetch` still at work), and how many modules were built: a
    ``(seconds, modules)`` pair that only grows.  A prefetch's own time is
    not counted: it overlaps other work."""
    return _COMPILE["seconds"], _COMPILE["modules"]


def _module_kernels(cupy, dev, filename, name_expressions):
    """One RawModule of ``name_expressions`` and their kernels, built on
    device ``dev`` (compiled here, or loaded from CuPy's cache)."""
    with cupy.cuda.Device(dev):
        mod = cupy.RawModule(code=_SOURCES[filename], options=NVRTC_OPTIONS,
                             name_expressions=list(name_expressions))
        return [mod.get_function(e) for e in name_expressions]


def _obtain(filename, keys, build, count=True):
    """The memoised values of ``keys`` (``(device, filename, expression(s))``),
    the missing ones made by ``build(missing_keys)`` (a list, in order) in
    this thread; those another thread is making are waited for.

    Rule: every key is built once per process, whichever thread asks first,
    and no lock is held while it compiles.  Why: a prefetch compiles in the
    background while the fit's own thread gets other modules.
    """
    if all(k in _CACHE for k in keys):
        return [_CACHE[k] for k in keys]
    from concurrent.futures import Future

    t0 = time.perf_counter()
    with _LOCK:
        if filename not in _SOURCES:
            _SOURCES[filename] = source_text(filename)
        mine, theirs = [], []
        for k in dict.fromkeys(keys):
            if k in _CACHE:
                continue
            if k in _PENDING:
                theirs.append(_PENDING[k])
            else:
                _PENDING[k] = Future()
                mine.append(k)
    if mine:
        try:
            built = build(mine)
        except BaseException as e:
            with _LOCK:
                for k in mine:
                    _PENDING.pop(k).set_exception(e)
            raise
        with _LOCK:
            _COMPILE["modules"] += len(mine)
            for k, b in zip(mine, built):
                _CACHE[k] = b
                _PENDING.pop(k).set_result(b)
    for f in theirs:
        f.result()  # raises the other thread's error, if its build failed
    if count:
        with _LOCK:
            _COMPILE["seconds"] += time.perf_counter() - t0
    return [_CACHE[k] for k in keys]


def get_kernels(filename, name_expressions, count=True):
    """The compiled ``cupy.RawKernel`` of each name expression (a list, in
    order), on the current device.

    Those not yet memoised are built at once, one module each, in threads:
    the instantiations an epoch launches cost the time of the slowest, not
    their sum.  ``count``: the wait goes into :func:`compile_seconds`.
    """
    import cupy

    dev = cupy.cuda.runtime.getDevice()

    def build(missing):
        if len(missing) == 1:
            return [_module_kernels(cupy, dev, filename, [missing[0][2]])[0]]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(missing)) as pool:
            return list(pool.map(
                lambda k: _module_kernels(cupy, dev, filename, [k[2]])[0], missing))

    return _obtain(filename, [(dev, filename, e) for e in name_expressions], build, count)


def get_module_kernels(filename, name_expressions, count=True):
    """The compiled ``cupy.RawKernel`` of each name expression (a list, in
    order), all from one module of ``filename`` on the current device,
    compiled (or loaded) once: kernels launched together, none worth a
    module of its own.  ``count``: as :func:`get_kernels`'s."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (dev, filename, tuple(name_expressions))
    return _obtain(filename, [key],
                   lambda m: [_module_kernels(cupy, dev, filename, key[2])], count)[0]


def memoised_module(filename):
    """The kernels of a module of ``filename`` built by
    :func:`get_module_kernels` on the current device (the first one
    memoised), and their name expressions: ``(names, kernels)``, or None."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    with _LOCK:
        for key, kernels in _CACHE.items():
            if key[0] == dev and key[1] == filename and isinstance(key[2], tuple):
                return key[2], kernels
    return None


def prefetch(*requests):
    """Start building kernels in a background thread, on the current
    device: each request is ``(getter, filename, name_expressions)`` with
    ``getter`` :func:`get_kernels` or :func:`get_module_kernels`.  Returns
    at once; a fit that asks for them later gets them from the memo, or
    waits for the build under way (and gets its error, if it failed, where
    the fit can report it)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()

    def memoised(getter, filename, names):
        if getter is get_module_kernels:
            return (dev, filename, tuple(names)) in _CACHE
        return all((dev, filename, e) in _CACHE for e in names)

    requests = [r for r in requests if not memoised(*r)]
    if not requests:  # a later fit of the same kind: no thread
        return

    def run():
        with cupy.cuda.Device(dev):
            for getter, filename, names in requests:
                try:
                    getter(filename, names, count=False)
                except Exception:  # noqa: BLE001 - see the docstring
                    pass

    threading.Thread(target=run, name="cuwide-prefetch", daemon=True).start()


def get_kernel(filename, name_expression):
    """The compiled ``cupy.RawKernel`` for one instantiation, on the current device."""
    return get_kernels(filename, [name_expression])[0]


#: Gibbs sampling's joint draw of a block of features (``cuda/cuwide_mcmc.cu``)
MCMC_DRAW = "cuwide_mcmc_draw_block"
