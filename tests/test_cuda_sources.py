"""Every CUDA source of cuda/ compiles standalone with nvcc for sm_90.

Each ``cuda/*.cu`` adds explicit template instantiations when
``CUWIDE_NVCC_CHECK`` is defined, so compiling it on its own type-checks the
kernels that the CUDA backend otherwise compiles at run time through NVRTC.
Skipped where nvcc is not on the PATH.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
NVCC = shutil.which("nvcc")

pytestmark = [
    pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH"),
    pytest.mark.slow,
]

SOURCES = sorted(CUDA_DIR.glob("*.cu"))


@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_compiles_with_nvcc(source, tmp_path):
    obj = tmp_path / (source.stem + ".o")
    cmd = [
        NVCC, "-arch=sm_90", "-std=c++17", "-DCUWIDE_NVCC_CHECK",
        "-I", str(CUDA_DIR), "-c", str(source), "-o", str(obj),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n"
        f"{proc.stderr}\n{proc.stdout}"
    )
    assert obj.stat().st_size > 0
