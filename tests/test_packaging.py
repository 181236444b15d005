"""Packaging: the wheel carries the CUDA sources and all Python modules, and
importing the package (or fitting on the CPU) never touches cupy."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "cuda"
PKG_DIR = REPO / "sklearn_cuwide"

# What a build needs from the source tree: the top-level files (setup.cfg,
# pyproject.toml, README.md, MANIFEST.in, ...) and these folders.
_BUILD_DIRS = ["sklearn_cuwide", "cuda"]


def _cuda_sources():
    return sorted(p.name for p in CUDA_DIR.glob("*") if p.suffix in (".cu", ".cuh"))


def _python_files():
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in PKG_DIR.rglob("*.py")
        if "__pycache__" not in p.parts
    )


def _env_with_repo():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


def _can_build_wheels():
    """setuptools >= 70.1 builds wheels itself; older ones need ``wheel``."""
    import importlib.util

    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(v) for v in re.findall(r"\d+", setuptools.__version__)[:2])
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Build the wheel from a copy of the source tree, offline, once."""
    if not _can_build_wheels():
        # CI installs .[test], which brings setuptools>=70.1: never skip there
        assert not os.environ.get("CI"), "setuptools>=70.1 missing in CI"
        pytest.skip(
            "building a wheel offline needs setuptools>=70.1 (or the wheel "
            "package): pip install -e '.[test]'"
        )
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.o", "*.egg-info")
    for p in REPO.iterdir():
        if p.is_file():
            shutil.copy2(p, src / p.name)
    for name in _BUILD_DIRS:
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp / "dist"
    cmd = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-index", "--disable-pip-version-check", "-w", str(out), str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"building the wheel failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}"
    )
    wheels = list(out.glob("sklearn_cuwide-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}, found {wheels}"
    with zipfile.ZipFile(wheels[0]) as zf:
        names = set(zf.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(meta_name).decode())
        contents = {n: zf.read(n) for n in names if n.startswith("sklearn_cuwide/cuda/")}
    return names, metadata, contents


@pytest.mark.slow
def test_wheel_carries_every_cuda_source(wheel):
    names, _, contents = wheel
    sources = _cuda_sources()
    missing = [s for s in sources if f"sklearn_cuwide/cuda/{s}" not in names]
    assert not missing, f"cuda/ files missing from the wheel: {missing}"
    for s in sources:
        assert contents[f"sklearn_cuwide/cuda/{s}"] == (CUDA_DIR / s).read_bytes(), s
    # nothing but the sources under sklearn_cuwide/cuda/, and no top-level cuda/
    extra = sorted(
        n for n in contents
        if n.rsplit("/", 1)[-1] not in sources and not n.endswith("/")
    )
    assert not extra, f"unexpected files under sklearn_cuwide/cuda/: {extra}"
    assert not any(n.startswith("cuda/") for n in names)


@pytest.mark.slow
def test_wheel_carries_every_python_module(wheel):
    names, _, _ = wheel
    missing = [f for f in _python_files() if f not in names]
    assert not missing, (
        f"Python files missing from the wheel: {missing}; add their package to "
        "[options] packages in setup.cfg"
    )
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_wheel_metadata(wheel):
    _, metadata, _ = wheel
    assert metadata["Name"] == "sklearn-cuwide"
    assert metadata["Requires-Python"] == ">=3.10"
    requires = metadata.get_all("Requires-Dist")
    base = {r.split(";")[0].strip() for r in requires if "extra ==" not in r}
    base_names = {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in base}
    assert base_names == {"numpy", "scipy", "scikit-learn", "joblib"}, base
    assert any(r.startswith("scikit-learn>=1.6") for r in base), base
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"cuda12", "cuda13", "test", "docs", "bench"} <= extras

    def extra_reqs(extra):
        return {
            r.split(";")[0].split(">")[0].split("=")[0].strip()
            for r in requires
            if f'extra == "{extra}"' in r
        }

    assert "cupy-cuda12x" in extra_reqs("cuda12")
    assert "cupy-cuda13x" in extra_reqs("cuda13")
    assert "pytest" in extra_reqs("test")
    assert {"sphinx", "numpydoc"} <= extra_reqs("docs")


# A meta-path finder, put first, that records every attempt to import cupy
# (cupy, cupyx, cupy_backends) and then lets the import go on as usual.  On a
# machine without cupy the import would simply fail, so the record, not
# sys.modules, is what shows whether cupy was asked for.
_RECORD_CUPY = """
import json, sys
attempts = []
class _Recorder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cupy", "cupyx", "cupy_backends"):
            attempts.append(name)
        return None
sys.meta_path.insert(0, _Recorder())
"""


def _run_recording(body):
    code = _RECORD_CUPY + textwrap.dedent(body) + (
        "\nprint(json.dumps({'attempts': attempts, "
        "'loaded': sorted(m for m in sys.modules if m.split('.')[0] in "
        "('cupy', 'cupyx', 'cupy_backends'))}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        cwd=REPO, env=_env_with_repo(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_does_not_import_cupy():
    rec = _run_recording("import sklearn_cuwide\n")
    assert rec == {"attempts": [], "loaded": []}, rec


def test_importing_every_module_but_the_cuda_backend_does_not_import_cupy():
    rec = _run_recording(
        """
        import importlib, pkgutil
        import sklearn_cuwide
        # the CUDA backend (a package: walk_packages would import it to
        # descend) and the kernel sources' folder are not walked
        skipped = {"sklearn_cuwide.__main__", "sklearn_cuwide.cuda",
                   "sklearn_cuwide._backends._cuda"}
        seen = []
        todo = [(sklearn_cuwide.__path__, "sklearn_cuwide.")]
        while todo:
            path, prefix = todo.pop()
            for m in pkgutil.iter_modules(path, prefix):
                if m.name in skipped:
                    continue
                mod = importlib.import_module(m.name)
                seen.append(m.name)
                if m.ispkg:
                    todo.append((mod.__path__, m.name + "."))
        assert "sklearn_cuwide._backends._cpu" in seen, seen
        """
    )
    assert rec == {"attempts": [], "loaded": []}, rec


def test_cpu_fit_does_not_import_cupy():
    rec = _run_recording(
        """
        import numpy as np
        import scipy.sparse as sp
        import sklearn_cuwide
        rng = np.random.default_rng(0)
        X = sp.random(60, 12, density=0.3, format="csr", random_state=0)
        y = rng.integers(0, 2, 60)
        y_reg = rng.normal(size=60)
        est = [getattr(sklearn_cuwide, n) for n in (
            "GPULogisticRegression", "GPUFactorizationMachine",
            "GPUFactorizationMachineRegressor") if hasattr(sklearn_cuwide, n)]
        assert est, "no estimator exported by sklearn_cuwide"
        for cls in est:
            m = cls(device="cpu", max_iter=2)
            m.fit(X, y_reg if cls.__name__.endswith("Regressor") else y)
            m.predict(X)
            assert m.device_ == "cpu", m.device_
        """
    )
    assert rec == {"attempts": [], "loaded": []}, rec
