"""Which kernel instantiations a fit compiles (``sklearn_cuwide._kernels``):
derived from the fit's parameters in plain Python, and every name the
launchers can ask for exists in ``cuda/``.

The names are checked against the sources twice: by parsing the template
declarations (always), and by compiling the instantiations a few fits ask
for with nvcc, from the very source text NVRTC gets (where nvcc is on the
PATH).
"""

import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sklearn_cuwide import _kernels
from sklearn_cuwide._backends import _concurrency

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
NVCC = shutil.which("nvcc")
H200_SLOTS = 264  # 132 multiprocessors, two training blocks each
HOPPER = _concurrency.CLUSTER_SIZES
AMPERE = (1,)


# --------------------------------------------------------------------------
# the names, from the parameters
# --------------------------------------------------------------------------
def test_names_are_derived_without_cupy():
    """Choosing the instantiations imports no cupy (the CPU backend, and the
    CPU tests, never do)."""
    code = ("import sys; from sklearn_cuwide import _kernels; "
            "_kernels.epoch_instantiations('fm', 1, 16, 'adagrad', 'logistic', "
            "chunk_batches=[100], grid=4, ramp=32, slots=264, cluster_sizes=(1, 2, 4, 8)); "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("args, expected", [
    (("linear", 1, 0, "adagrad", "logistic"),
     "cuwide_train<cuwide::LINEAR, 1, 0, cuwide::ADAGRAD, cuwide::LOGISTIC>"),
    (("linear", 5, 0, "sgd", "multinomial", 4),
     "cuwide_train_cluster<cuwide::LINEAR, 5, 0, cuwide::SGD, cuwide::MULTINOMIAL, 4>"),
    # an FM has one output, whatever it is given; logistic regression no factors
    (("fm", 3, 16, "adagrad", "logistic", 8),
     "cuwide_train_cluster<cuwide::FM, 1, 16, cuwide::ADAGRAD, cuwide::LOGISTIC, 8>"),
    (("linear", 1, 7, "sgd", "squared"),
     "cuwide_train<cuwide::LINEAR, 1, 0, cuwide::SGD, cuwide::SQUARED>"),
    (("fm", 1, 128, "sgd", "squared", 1, "no_replicas"),
     "cuwide_train_ablation<cuwide::FM, 1, 128, cuwide::SGD, cuwide::SQUARED, "
     "cuwide::NO_REPLICAS>"),
    (("linear", 1, 0, "adagrad", "logistic", 2, "global_accumulators"),
     "cuwide_train_ablation_cluster<cuwide::LINEAR, 1, 0, cuwide::ADAGRAD, "
     "cuwide::LOGISTIC, 2, cuwide::GLOBAL_ACCUMULATORS>"),
])
def test_train_instantiation(args, expected):
    assert _kernels.train_instantiation(*args) == expected


def test_train_instantiation_refuses_what_has_no_kernel():
    with pytest.raises(ValueError, match="no training kernel"):
        _kernels.train_instantiation("linear", 1, 0, "adam", "logistic")
    with pytest.raises(ValueError, match="variant"):
        _kernels.train_instantiation("linear", 1, 0, "sgd", "logistic", variant="fast")


def test_lbfgs_forward_pass_lanes_per_row():
    """The L-BFGS forward pass gives a lane at most 8 nonzeros of a mean row
    with the fewest lanes; rows longer than 8 warps' worth get a warp."""
    lanes = _kernels.lbfgs_row_lanes
    assert [lanes(m * 1000, 1000) for m in (0, 1, 32, 33, 64, 65, 128, 129, 256, 5000)] == [
        4, 4, 4, 8, 8, 16, 16, 32, 32, 32]
    assert lanes(39_000_000, 1_000_000) == 8  # the benchmark's CTR rows
    assert lanes(10, 0) == 4
    assert _kernels.lbfgs_instantiations("int32", "float32", 8)[0] == (
        "cuwide_lbfgs_logistic_forward<int, float, 8>")
    with pytest.raises(ValueError, match="row_lanes"):
        _kernels.lbfgs_instantiations("int32", "float32", 12)


def test_predict_instantiation():
    assert _kernels.predict_instantiation("int32", "int32", "float32", "linear", 3, 0) == \
        "cuwide_predict<int, int, float, cuwide::LINEAR, 3, 0>"
    assert _kernels.predict_instantiation("int64", "int64", "float64", "fm", 1, 16) == \
        "cuwide_predict<long long, long long, double, cuwide::FM, 1, 16>"


def _reference_launches(chunk_batches, grid, ramp):
    """The launches the training launcher made before its plan was a pure
    function: the warm-up stages consumed chunk by chunk, then the grid."""
    stages = _concurrency.ramp_stages(ramp, grid)
    out = []
    for c, n in enumerate(chunk_batches):
        while stages and n:
            P, cnt = stages[0]
            take = min(cnt, n)
            out.append((c, take, P))
            n -= take
            stages[0] = (P, cnt - take)
            if stages[0][1] == 0:
                stages.pop(0)
        if n:
            out.append((c, n, grid))
    return out


@pytest.mark.parametrize("chunks, grid, ramp", [
    ([4000], 264, 8), ([100], 4, 32), ([20], 1, 8), ([4000], 264, 0),
    ([300, 300, 300, 3000], 264, 8), ([7, 5, 900], 16, 4), ([0, 50], 8, 8), ([], 8, 8),
])
def test_launch_plan(chunks, grid, ramp):
    plan = _kernels.launch_plan(chunks, grid, ramp)
    assert plan == _reference_launches(chunks, grid, ramp)
    # every mini-batch is launched once, chunk by chunk, in order
    for c, n in enumerate(chunks):
        assert sum(m for cc, m, _ in plan if cc == c) == n
    assert [c for c, _, _ in plan] == sorted(c for c, _, _ in plan)


@pytest.mark.parametrize("windows, grid, ramp", [
    ([100, 7, 300, 5000], 264, 8), ([1, 1, 1, 40], 16, 4), ([5000], 264, 8),
    ([3, 4000], 8, 0), ([2040, 1, 2000], 264, 8),
])
def test_launch_plan_of_windows_goes_on_with_the_warm_up(windows, grid, ramp):
    """An epoch trained window by window (out of core), each window's plan
    told the warm-up's mini-batches the windows before it trained: each
    mini-batch gets the workers it gets in the whole epoch's plan."""
    def per_batch(plan):
        return [P for _, n, P in plan for _ in range(n)]

    got, done = [], 0
    for n in windows:
        got += per_batch(_kernels.launch_plan([n], grid, ramp, ramp_done=done))
        done += n
    assert got == per_batch(_kernels.launch_plan([sum(windows)], grid, ramp))


def test_launch_plan_warms_up_in_doubling_stages():
    plan = _kernels.launch_plan([10000], 264, 8)
    assert [(n, P) for _, n, P in plan] == [
        (8, 1), (16, 2), (32, 4), (64, 8), (128, 16), (256, 32), (512, 64), (1024, 128),
        (2048, 256), (10000 - 4088, 264)]


IN_ORDER = _kernels.IN_ORDER


def _clusters(model, n_batches, concurrency, *, solver="adagrad", warm=False,
              sizes=HOPPER, slots=H200_SLOTS, chunks=None):
    grid = _concurrency.blocks(concurrency, model, solver, n_batches, slots)
    ramp = 0 if warm else _concurrency.default_ramp(model)
    names = _kernels.epoch_instantiations(
        model, 1, 16 if model == "fm" else 0, solver, "logistic",
        chunk_batches=chunks or [n_batches], grid=grid, ramp=ramp, slots=slots,
        cluster_sizes=sizes)
    return names


@pytest.mark.parametrize("model, n_batches, concurrency, kw, expected", [
    # LR adagrad on the full grid: the warm-up runs 1..128 workers, as
    # clusters of 8 up to 33 workers, 4 for 64, 2 for 128, plain blocks for 264
    ("linear", 3907, "auto", {}, [8, 4, 2, 1]),
    # a warm start skips the warm-up: plain blocks only
    ("linear", 3907, "auto", {"warm": True}, [1]),
    # 20 mini-batches (20k rows): one worker, a cluster of 8
    ("linear", 20, "auto", {}, [8]),
    # the FM's "auto" is one worker: the in-order kernel on the whole grid
    ("fm", 3907, "auto", {}, [IN_ORDER]),
    # the FM's warm-up takes 32 mini-batches per worker, the first stage's
    # one worker in order: it reaches 256 workers on 20000 mini-batches,
    # not on 3907
    ("fm", 20000, "max", {}, [IN_ORDER, 8, 4, 2, 1]),
    ("fm", 3907, "max", {}, [IN_ORDER, 8, 4]),
    # an FM's one worker is the in-order kernel before compute capability 9.0 too
    ("fm", 3907, 1, {"sizes": AMPERE}, [IN_ORDER]),
    # sgd runs one worker in order
    ("linear", 3907, "auto", {"solver": "sgd"}, [8]),
    # before compute capability 9.0 there are no clusters
    ("linear", 3907, "auto", {"sizes": AMPERE}, [1]),
    ("fm", 3907, 4, {"sizes": AMPERE}, [IN_ORDER, 1]),  # the warm-up's first stage in order
])
def test_epoch_instantiations_are_the_launches_clusters(model, n_batches, concurrency, kw,
                                                        expected):
    names = _clusters(model, n_batches, concurrency, **kw)
    assert list(names) == expected
    solver = kw.get("solver", "adagrad")
    for cl, name in names.items():
        if cl == IN_ORDER:
            assert name == _kernels.in_order_instantiation(16, solver, "logistic")
        else:
            assert name == _kernels.train_instantiation(model, 1, 16, solver, "logistic", cl)


def test_epoch_instantiations_follow_each_launch():
    """A launch runs min(workers, its mini-batches) workers: a short last
    chunk runs fewer workers, so larger clusters."""
    names = _clusters("linear", 1000, "max", warm=True, chunks=[990, 10])
    assert list(names) == [4, 8]  # 62 workers (as clusters of 4), then 10 (of 8)


def test_and_later_adds_the_epochs_after_the_warm_up():
    """A first epoch whose warm-up does not reach the grid (3907 mini-batches
    of an FM on 244 workers) also gets the later epochs' plain blocks."""
    kw = dict(chunk_batches=[3907], grid=244, ramp=32, slots=H200_SLOTS,
              cluster_sizes=HOPPER)
    first = _kernels.epoch_instantiations("fm", 1, 16, "adagrad", "logistic", **kw)
    both = _kernels.epoch_instantiations("fm", 1, 16, "adagrad", "logistic", and_later=True,
                                         **kw)
    assert list(first) == [IN_ORDER, 8, 4] and list(both) == [IN_ORDER, 8, 4, 1]
    # without a warm-up there is nothing to add
    kw["ramp"] = 0
    assert _kernels.epoch_instantiations("fm", 1, 16, "adagrad", "logistic", and_later=True,
                                         **kw) == {1: _kernels.train_instantiation(
                                             "fm", 1, 16, "adagrad", "logistic")}


def test_an_explicit_cluster_is_the_only_instantiation():
    names = _kernels.epoch_instantiations(
        "linear", 1, 0, "adagrad", "logistic", chunk_batches=[4000], grid=264, ramp=8,
        slots=H200_SLOTS, cluster_sizes=HOPPER, cluster=2, variant="no_replicas")
    assert names == {2: _kernels.train_instantiation("linear", 1, 0, "adagrad", "logistic",
                                                      2, "no_replicas")}


# --------------------------------------------------------------------------
# the names exist in the sources
# --------------------------------------------------------------------------
def _templates(filename):
    """``{kernel: number of template parameters}`` of a source's
    ``__global__`` function templates."""
    text = (CUDA_DIR / filename).read_text()
    out = {}
    for m in re.finditer(r"template\s*<([^>]*)>\s*__global__\s+void\s+(?:[A-Z_]+\([^)]*\)\s*"
                         r"|__launch_bounds__\([^)]*\)\s*)*(\w+)\s*\(", text):
        out[m.group(2)] = len([p for p in m.group(1).split(",") if p.strip()])
    return out


def _enumerators():
    text = "\n".join(p.read_text() for p in CUDA_DIR.glob("*.cu*"))
    text = re.sub(r"//[^\n]*", "", text)
    names = set()
    for body in re.findall(r"enum\s+\w+\s*\{([^}]*)\}", text):
        names |= {e.split("=")[0].strip() for e in body.split(",") if e.strip()}
    return names


def _split(expr):
    name, args = re.fullmatch(r"(\w+)<(.*)>", expr).groups()
    return name, [a.strip() for a in args.split(",")]


def _every_launcher_name():
    """Every training and predict name expression the launchers can ask
    for, over the parameters' whole range (the outputs and the factors at
    a few values: they are plain integers)."""
    names = set()
    for model, solver, loss, out, k, cl, var in itertools.product(
            _kernels.MODEL, _kernels.SOLVER, _kernels.LOSS, (1, 3), (1, 16, 128),
            (1,) + HOPPER, (None,) + tuple(_kernels.VARIANTS)):
        names.add(_kernels.train_instantiation(model, out, k, solver, loss, cl, var))
    for ipt, idx, val, model, out, k in itertools.product(
            ("int32", "int64"), ("int32", "int64"), ("float32", "float64"), _kernels.MODEL,
            (1, 3), (4, 16)):
        names.add(_kernels.predict_instantiation(ipt, idx, val, model, out, k))
    for idx, val, lanes in itertools.product(("int32", "int64"), ("float32", "float64"),
                                             _kernels.LBFGS_ROW_LANES):
        names.update(_kernels.lbfgs_instantiations(idx, val, lanes))
    for name in ("cuwide_lbfgs_gram", "cuwide_lbfgs_direction"):
        names.add(_kernels.lbfgs_memory_instantiation(name, 20))
    for model, solver, loss in itertools.product(_kernels.MODEL, _kernels.SOLVER,
                                                 _kernels.LOSS):
        names.add(_kernels.classic_instantiation(model, 16 if model == "fm" else 0, solver,
                                                 loss))
    for idx, val, out in itertools.product(("int32", "int64"), ("float32", "float64"),
                                           ("float32", "float64")):
        names.update(n for n in _kernels.build_instantiations(idx, val, out).values()
                     if "<" in n)
    names |= {_kernels.factors_instantiation(d) for d in ("float32", "float64")}
    names |= {_kernels.loss_instantiation(loss) for loss in ("logistic", "squared")}
    return names


def test_every_launcher_name_matches_a_template_of_the_sources():
    templates = {}
    for source in ("cuwide_train.cu", "cuwide_predict.cu", "cuwide_lbfgs.cu",
                   "cuwide_classic.cu", "cuwide_build.cu", "cuwide_factors.cu",
                   "cuwide_loss.cu"):
        templates.update(_templates(source))
    build = (CUDA_DIR / "cuwide_build.cu").read_text().split("#ifdef CUWIDE_NVCC_CHECK")[0]
    plain = set(re.findall(r"__global__\s+void\s+(\w+)\s*\(", build))
    assert plain - set(_templates("cuwide_build.cu")) == set(_kernels.BUILD_PLAIN)
    assert {"cuwide_train", "cuwide_train_cluster", "cuwide_train_ablation",
            "cuwide_train_ablation_cluster", "cuwide_predict", "cuwide_lbfgs_logistic_forward",
            "cuwide_lbfgs_logistic_backward", "cuwide_lbfgs_gram", "cuwide_lbfgs_direction",
            "cuwide_classic"} <= set(templates)
    enums = _enumerators()
    for expr in _every_launcher_name():
        name, args = _split(expr)
        assert templates.get(name) == len(args), expr
        for a in args:
            if a.startswith("cuwide::"):
                assert a[len("cuwide::"):] in enums, expr


def test_source_text_inlines_the_headers(tmp_path):
    text = _kernels.source_text("cuwide_train.cu", CUDA_DIR)
    assert '#include "cuwide_common.cuh"' not in text
    assert "enum Model" in text and "__global__" in text
    assert "#pragma once" not in text
    # a header's change changes the text (CuPy's cache key)
    (tmp_path / "a.cuh").write_text("#pragma once\nint a = 1;\n")
    (tmp_path / "b.cuh").write_text('#pragma once\n#include "a.cuh"\nint b = 2;\n')
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include "b.cuh"\n'
                                   "#include <cstdint>\nint k;\n")
    before = _kernels.source_text("k.cu", tmp_path)
    assert before.count("int a = 1;") == 1 and "int b = 2;" in before
    assert "#include <cstdint>" in before
    (tmp_path / "a.cuh").write_text("#pragma once\nint a = 3;\n")
    assert _kernels.source_text("k.cu", tmp_path) != before


#: the instantiations of a few fits, as their launchers ask for them
FITS = [
    ("linear", 1, 0, "adagrad", "logistic", 3907, "auto"),  # LR, the full grid's warm-up
    ("linear", 4, 0, "sgd", "multinomial", 3907, "max"),
    ("fm", 1, 16, "adagrad", "logistic", 3907, "auto"),
    ("fm", 1, 8, "adagrad", "squared", 20, "auto"),
]


def _fit_names():
    names = []
    for model, out, k, solver, loss, nb, conc in FITS:
        grid = _concurrency.blocks(conc, model, solver, nb, H200_SLOTS)
        names += _kernels.epoch_instantiations(
            model, out, k, solver, loss, chunk_batches=[nb], grid=grid,
            ramp=_concurrency.default_ramp(model), slots=H200_SLOTS,
            cluster_sizes=HOPPER).values()
    return names


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.slow
@pytest.mark.parametrize("filename, names", [
    ("cuwide_train.cu", _fit_names()),
    ("cuwide_predict.cu", [_kernels.predict_instantiation("int32", "int32", "float32",
                                                          "linear", 1, 0),
                           _kernels.predict_instantiation("int64", "int32", "float64", "fm",
                                                          1, 16)]),
    ("cuwide_lbfgs.cu", [*_kernels.lbfgs_instantiations("int32", "float32", 4),
                         *_kernels.lbfgs_instantiations("int64", "float64", 32),
                         _kernels.lbfgs_memory_instantiation("cuwide_lbfgs_gram", 20),
                         _kernels.lbfgs_memory_instantiation("cuwide_lbfgs_direction", 20)]),
    ("cuwide_factors.cu", [_kernels.factors_instantiation("float32")]),
    ("cuwide_loss.cu", [_kernels.loss_instantiation("logistic"),
                        _kernels.loss_instantiation("squared")]),
    ("cuwide_build.cu", [*_kernels.build_instantiations("int32", "float32", "float32").values(),
                         *_kernels.build_instantiations("int64", "float64",
                                                        "float64").values()]),
])
def test_the_launchers_names_compile_from_the_source_nvrtc_gets(filename, names, tmp_path):
    """The source text handed to NVRTC (headers inlined: no include path)
    with the launchers' name expressions instantiated compiles for sm_90."""
    src = tmp_path / ("check_" + filename)
    src.write_text(_kernels.source_text(filename, CUDA_DIR)
                   + "\nvoid* const cuwide_names_check[] = {\n"
                   + ",\n".join(f"    (void*)&{n}" for n in names) + "\n};\n")
    obj = tmp_path / "check.o"
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert obj.stat().st_size > 0


# --------------------------------------------------------------------------
# the memo: each module built once, by whichever thread asks first
# --------------------------------------------------------------------------
def test_a_key_is_built_once_whichever_thread_asks_first():
    """``_obtain`` (behind get_kernels, get_module_kernels and prefetch):
    threads asking for the same keys at once build each once, the others
    wait for it; a failed build's error reaches its waiters and the key
    can be built again; only the waits that are counted add seconds."""
    import threading
    import time

    built, gate = [], threading.Event()

    def build(keys):
        gate.wait(5)
        built.extend(keys)
        return [("kernel", k) for k in keys]

    keys = [("dev", "memo_test.cu", f"k{i}") for i in range(3)]
    try:
        seconds = _kernels.compile_seconds()[0]
        out = []
        threads = [threading.Thread(target=lambda: out.append(
            _kernels._obtain("cuwide_train.cu", keys, build, count=False))) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        gate.set()
        for t in threads:
            t.join(10)
        assert sorted(built) == sorted(keys)  # once each
        assert out == [[("kernel", k) for k in keys]] * 4
        assert _kernels.compile_seconds()[0] == seconds  # not counted
        bad = [("dev", "memo_test.cu", "bad")]
        calls = []

        def fail(ks):
            calls.append(ks)
            raise RuntimeError("nvrtc said no")

        with pytest.raises(RuntimeError, match="nvrtc said no"):
            _kernels._obtain("cuwide_train.cu", bad, fail)
        assert bad[0] not in _kernels._PENDING and bad[0] not in _kernels._CACHE
        assert _kernels._obtain("cuwide_train.cu", bad, build) == [("kernel", bad[0])]
        assert len(calls) == 1 and _kernels.compile_seconds()[0] > seconds
    finally:
        for k in keys + [("dev", "memo_test.cu", "bad")]:
            _kernels._CACHE.pop(k, None)


# --------------------------------------------------------------------------
# on the GPU: a fit builds the instantiations its plan names, and no other
# --------------------------------------------------------------------------
def _needs_gpu():
    from sklearn_cuwide._device import cuda_device_count

    return pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")


@pytest.mark.gpu
@_needs_gpu()
@pytest.mark.parametrize("make, model, k", [
    (lambda: __import__("sklearn_cuwide").GPULogisticRegression(
        solver="adagrad", max_iter=2, random_state=0, device="cuda"), "linear", 0),
    (lambda: __import__("sklearn_cuwide").GPUFactorizationMachine(
        n_factors=8, max_iter=2, tol=None, random_state=0, device="cuda"), "fm", 8),
])
def test_gpu_fit_builds_only_its_plans_instantiations(make, model, k, monkeypatch):
    from sklearn_cuwide._backends._cuda import _runtime
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(n_samples=20_000, n_features=2**16, random_state=0)[:2]
    _kernels._CACHE.clear()  # this process's memo (CuPy's caches may still serve them)
    modules = _kernels.compile_seconds()[1]
    started, prefetch = set(), _kernels.prefetch

    def recorded(*requests):
        for getter, fname, names in requests:
            started.update((fname, n) for n in names)
        return prefetch(*requests)

    monkeypatch.setattr(_kernels, "prefetch", recorded)
    est = make().fit(X, y)
    built = {name for (_, fname, name) in _kernels._CACHE if fname == "cuwide_train.cu"}
    n_batches = -(-X.shape[0] // est.batch_size)
    grid = _concurrency.blocks("auto", model, "adagrad", n_batches, _runtime.full_grid())
    expected = _kernels.epoch_instantiations(
        model, 1, k, "adagrad", "logistic", chunk_batches=[n_batches], grid=grid,
        ramp=_concurrency.default_ramp(model), slots=_runtime.full_grid(),
        cluster_sizes=_runtime.cluster_sizes(), and_later=True)
    assert built == set(expected.values())
    # the layout build's kernels: one module, of the matrix's dtypes
    builds = [names for (_, fname, names) in _kernels._CACHE if fname == "cuwide_build.cu"]
    assert builds == [tuple(_kernels.build_instantiations(
        X.indices.dtype, X.data.dtype, "float32").values())]
    # every module got is memoised: none was built twice
    assert _kernels.compile_seconds()[1] - modules == len(_kernels._CACHE)

    def got(fname):
        return {name for (_, f, name) in _kernels._CACHE if f == fname}

    # early stopping's held-out rows (20,000 rows: on) are scored by one
    # predict and one loss kernel, those prepare_fit started; an FM's
    # initial factors by the factors' kernel of the model's dtype
    fitted = got("cuwide_predict.cu")
    assert len(fitted) == 1 and next(iter(fitted)).startswith("cuwide_predict<")
    assert got("cuwide_loss.cu") == {_kernels.loss_instantiation("logistic")}
    assert got("cuwide_factors.cu") == ({_kernels.factors_instantiation("float32")} if k
                                        else set())
    # each kernel of the fit was started before the fit reached it (prepare_fit)
    for fname in ("cuwide_train.cu", "cuwide_predict.cu", "cuwide_loss.cu",
                  "cuwide_factors.cu"):
        assert {(fname, n) for n in got(fname)} <= started
    # the prediction of the user's rows (the same dtypes) builds no other
    est.decision_function(X[:100])
    est.decision_function(X[100:200])
    assert got("cuwide_predict.cu") == fitted


@pytest.mark.gpu
@_needs_gpu()
def test_gpu_first_epoch_line_reports_the_kernels(capsys, monkeypatch):
    """With nothing memoised and no prefetch (which would have them ready),
    the first epoch's verbose line says how long the fit waited for its
    kernels (compiled, or loaded from CuPy's cache); the next one none.
    Each module's build is made 2 ms longer: a load from CuPy's cache can
    take less than the half millisecond the line shows at all."""
    import time

    from sklearn_cuwide import GPULogisticRegression
    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide.datasets import make_ctr_classification

    monkeypatch.setattr(_cuda, "prepare_fit", lambda *a, **k: None)
    real = _kernels._module_kernels

    def slower(*a, **k):
        time.sleep(0.002)
        return real(*a, **k)

    monkeypatch.setattr(_kernels, "_module_kernels", slower)
    X, y = make_ctr_classification(n_samples=5_000, n_features=2**14, random_state=1)[:2]
    _kernels._CACHE.clear()
    # C fixed: with C="auto" the choice's fits would wait for the kernels first
    GPULogisticRegression(solver="sgd", C=1.0, max_iter=2, tol=0.0, verbose=1, random_state=0,
                          device="cuda").fit(X, y)
    lines = capsys.readouterr().out.splitlines()
    epochs = [ln for ln in lines if ln.startswith("Epoch")]
    m = re.match(r"^Epoch 1/2 in \d+\.\d{3} s \(kernels (\d+\.\d{3}) s\): ", epochs[0])
    assert m and float(m.group(1)) >= 0.002
    assert "(kernels" not in epochs[1]


_WARMUP_CHILD = r"""
import json, sys, threading
import warnings
warnings.simplefilter("ignore")
from cupy.cuda import compiler
from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression
from sklearn_cuwide._backends._cuda import _warmup
from sklearn_cuwide.datasets import make_ctr_classification

X, y = make_ctr_classification(n_samples=20000, n_features=2**16, random_state=0)[:2]
deferred = sys.argv[1].endswith("-deferred")
if deferred:  # the input's checks on the device copy at any size
    import sklearn_cuwide._base as base
    base.DEVICE_SCAN_MIN_NNZ = 0
# C given where the checks are deferred: C="auto"'s choice checks on the host
est = (GPULogisticRegression(solver="adagrad", max_iter=2, device="cuda", random_state=0,
                             **({"C": 1.0} if deferred else {}))
       if sys.argv[1].startswith("lr") else
       GPUFactorizationMachine(n_factors=8, alpha=1e-5, beta=1e-4, max_iter=2,
                               device="cuda", random_state=0))
real_warm_up, threads = _warmup.warm_up, []

def warm_up_and_wait(*a):
    t = real_warm_up(*a)
    if t is not None:
        t.join()  # its kernels compiled before the fit goes on
    threads.append(t)

_warmup.warm_up = warm_up_and_wait
real_input = _warmup.warm_up_input

def input_and_wait(*a):
    t = real_input(*a)
    if t is not None:
        t.join()
    threads.append(t)

_warmup.warm_up_input = input_and_wait
import sklearn_cuwide._backends._cuda._train as train
train.warm_up = warm_up_and_wait
real, late = compiler._compile_using_nvrtc_no_warning, []

def record(source, *a, **k):
    if threading.current_thread() is threading.main_thread() \
            and "namespace cuwide" not in source:
        late.append(source[:200])
    return real(source, *a, **k)

compiler._compile_using_nvrtc_no_warning = record
est.fit(X, y)
print(json.dumps({"warmed": len(threads), "late": late}))
"""


@pytest.mark.gpu
@_needs_gpu()
@pytest.mark.parametrize("model", ["lr", "fm", "lr-deferred", "fm-deferred"])
def test_gpu_warm_up_compiles_the_fits_cupy_kernels(model, tmp_path):
    """In a fresh process with CuPy's kernel cache empty, the CuPy kernels a
    mini-batch fit from scipy CSR runs (early stopping on, Adagrad, scaled
    penalties for logistic regression; the input's checks on the device
    copy, ``-deferred``) are compiled by its warm-ups (``_warmup.warm_up``,
    and ``warm_up_input`` when the copy is staged), not on the fit's
    thread: the warm-ups' lists follow the fit's path."""
    import json
    import os

    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", _WARMUP_CHILD, model], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["warmed"] >= 1
    assert out["late"] == []
