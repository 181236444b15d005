"""Every CUDA source of cuda/ compiles standalone with nvcc for sm_90 (the
H200 the kernels run on) and for sm_80 (an A100: no thread block clusters,
so the cluster helpers must compile away there).

Each ``cuda/*.cu`` instantiates its kernel templates when
``CUWIDE_NVCC_CHECK`` is defined, so compiling it on its own type-checks the
kernels that the CUDA backend otherwise compiles at run time through NVRTC.
The training kernel's scalar arguments, ``cuwide::StepArgs``, must match the
numpy dtype the backend builds them with (``_tiles.STEP_ARGS``): a generated
source static_asserts every field's type and offset and the struct's size,
and the shared-memory rules the two sides share.
The tests that run nvcc are skipped where it is not on the PATH.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sklearn_cuwide._backends import _tiles

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
NVCC = shutil.which("nvcc")

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")

SOURCES = sorted(CUDA_DIR.glob("*.cu"))


def _nvcc(source, arch, tmp_path):
    obj = tmp_path / (source.stem + ".o")
    cmd = [
        NVCC, f"-arch={arch}", "-std=c++17", "-DCUWIDE_NVCC_CHECK",
        "-I", str(CUDA_DIR), "-c", str(source), "-o", str(obj),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n"
        f"{proc.stderr}\n{proc.stdout}"
    )
    assert obj.stat().st_size > 0


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
@needs_nvcc
@pytest.mark.slow
def test_compiles_with_nvcc(source, arch, tmp_path):
    _nvcc(source, arch, tmp_path)


#: the instantiations ``cuwide_train.cu`` must check: the estimators' kernels
#: (LR binary adagrad, multinomial sgd, FM16 adagrad logistic, FM128 sgd
#: squared; clusters of 2, 4 and 8) and every ablation variant, with and
#: without clusters
REQUIRED_TRAIN_INSTANTIATIONS = [
    "cuwide_train<LINEAR, 1, 0, ADAGRAD, LOGISTIC>",
    "cuwide_train<LINEAR, 3, 0, SGD, MULTINOMIAL>",
    "cuwide_train<FM, 1, 16, ADAGRAD, LOGISTIC>",
    "cuwide_train<FM, 1, 128, SGD, SQUARED>",
    "cuwide_train_in_order<16, ADAGRAD, LOGISTIC>",
    "cuwide_train_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 2>",
    "cuwide_train_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 8>",
    "cuwide_train_cluster<LINEAR, 3, 0, SGD, MULTINOMIAL, 4>",
    "cuwide_train_cluster<FM, 1, 16, ADAGRAD, LOGISTIC, 4>",
    "cuwide_train_cluster<FM, 1, 1, SGD, SQUARED, 2>",
    "cuwide_train_ablation<LINEAR, 1, 0, ADAGRAD, LOGISTIC, NO_REPLICAS>",
    "cuwide_train_ablation<LINEAR, 1, 0, ADAGRAD, LOGISTIC, GLOBAL_ACCUMULATORS>",
    "cuwide_train_ablation<FM, 1, 16, ADAGRAD, LOGISTIC, NO_REPLICAS>",
    "cuwide_train_ablation<FM, 1, 16, ADAGRAD, LOGISTIC, GLOBAL_ACCUMULATORS>",
    "cuwide_train_ablation_cluster<LINEAR, 1, 0, ADAGRAD, LOGISTIC, 2, GLOBAL_ACCUMULATORS>",
    "cuwide_train_ablation_cluster<FM, 1, 16, ADAGRAD, LOGISTIC, 8, NO_REPLICAS>",
]


def test_train_source_instantiates_the_production_and_ablation_kernels():
    text = (CUDA_DIR / "cuwide_train.cu").read_text()
    check = text[text.index("#ifdef CUWIDE_NVCC_CHECK"):]
    found = {
        re.sub(r"\s+", " ", m.group(1))
        for m in re.finditer(r"\(void\*\)&(\w+<[^>]*>)", check)
    }
    missing = [k for k in REQUIRED_TRAIN_INSTANTIATIONS if k not in found]
    assert not missing, missing


def _layout_check_source():
    """C++ that static_asserts ``cuwide::StepArgs`` against
    ``_tiles.STEP_ARGS`` and the kernel's shared-memory rules against
    ``_tiles``'s."""
    dt = _tiles.STEP_ARGS
    lines = [
        "#include <cstddef>",
        "#include <type_traits>",
        '#include "cuwide_train.cu"',
        "using cuwide::StepArgs;",
        f'static_assert(sizeof(StepArgs) == {dt.itemsize}, "sizeof(StepArgs)");',
        f'static_assert(alignof(StepArgs) == {dt.alignment}, "alignof(StepArgs)");',
    ]
    assert [n for n, _ in _tiles.STEP_ARGS_FIELDS] == list(dt.names)
    for name, ctype in _tiles.STEP_ARGS_FIELDS:
        fdt, offset = dt.fields[name][:2]
        lines += [
            f'static_assert(std::is_same<decltype(StepArgs::{name}), {ctype}>::value, '
            f'"type of {name}");',
            f'static_assert(offsetof(StepArgs, {name}) == {offset}, "offset of {name}");',
            f'static_assert(sizeof(StepArgs::{name}) == {fdt.itemsize}, "size of {name}");',
        ]
    for hw in range(1, 258):
        lines.append(
            f"static_assert(hot_replicas({hw}) == {_tiles.replicas_of_width(hw)}, "
            f'"hot_replicas({hw})");'
        )

    class FM:  # row_stride of an FM with n_factors = w - 1
        model = "fm"

    for w in range(1, 258):
        rs = _tiles.row_stride(FM, 1, w - 1)
        lines.append(f'static_assert(cuwide::OddStride<{w}>::v == {rs}, "OddStride<{w}>");')
    for k in range(1, 257):  # the in-order kernel's per-sample stride
        lines.append(f"static_assert(cuwide::InOrderRow<{k}>::RS == "
                     f'{_tiles.in_order_row_stride(k)}, "InOrderRow<{k}>");')
    return "\n".join(lines) + "\n"


@needs_nvcc
@pytest.mark.slow
def test_step_args_struct_matches_the_numpy_dtype(tmp_path):
    """``cuwide::StepArgs`` has the field types, offsets and size of
    ``_tiles.STEP_ARGS`` (the kernel would read the launch's scalars from
    the wrong bytes otherwise); ``hot_replicas`` and the per-sample stride
    follow ``_tiles``'s rules (the shared memory the backend sizes), and so
    does the in-order kernel's per-sample stride (its scratch)."""
    src = tmp_path / "step_args_check.cu"
    src.write_text(_layout_check_source())
    _nvcc(src, "sm_90", tmp_path)


def test_step_args_dtype_is_c_aligned():
    """Every field at a multiple of its size, no field overlapping the next:
    the layout a C compiler gives the struct (checked against nvcc above)."""
    dt = _tiles.STEP_ARGS
    end = 0
    for name in dt.names:
        fdt, offset = dt.fields[name][:2]
        assert offset % fdt.alignment == 0, name
        assert offset >= end, name
        end = offset + fdt.itemsize
    assert dt.itemsize % dt.alignment == 0 and dt.itemsize >= end
