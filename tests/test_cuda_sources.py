"""Every CUDA source of cuda/ compiles standalone with nvcc for sm_90 (the
H200 the kernels run on) and for sm_80 (an A100: no thread block clusters,
so the cluster helpers must compile away there).

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


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_compiles_with_nvcc(source, arch, tmp_path):
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
