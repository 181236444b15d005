"""The demo (``python -m sklearn_cuwide.demo``) runs end to end on a small
size and prints its table."""

import io
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sklearn_cuwide import demo
from sklearn_cuwide._device import cuda_device_count

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--n-samples", "5000", "--n-features", "1024", "--epochs", "2", "--device", "cpu"]


def _table(text):
    """``{model name: [cells]}`` of the table's rows."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("model "))
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.strip():
            break
        name, rest = ln[:ln.index("  ")], ln[ln.index("  "):].split()
        rows[name] = rest
    return rows


def _num(cell):
    return math.nan if cell == "-" else float(cell)


@pytest.fixture(scope="module")
def small_run():
    out = io.StringIO()
    rc = demo.main(SMALL, out=out)
    return rc, out.getvalue()


@pytest.mark.slow
def test_demo_prints_a_row_per_model(small_run):
    rc, text = small_run
    assert rc == 0, text
    rows = _table(text)
    expected = [
        "sklearn LogisticRegression (lbfgs)",
        "sklearn SGDClassifier (log_loss)",
        "GPULogisticRegression (lbfgs)",
        "GPULogisticRegression (adagrad)",
        "GPUFactorizationMachine (k=8)",
        "sklearn Ridge",
        "GPUFactorizationMachineRegressor (k=8)",
    ]
    assert list(rows) == expected, text
    for name, cells in rows.items():
        device, fit_s, unit, auc, logloss, rmse = cells
        assert device == "cpu", (name, cells)
        assert unit == "s" and float(fit_s) >= 0, (name, cells)
        auc, logloss, rmse = _num(auc), _num(logloss), _num(rmse)
        if "Ridge" in name or "Regressor" in name:
            assert math.isnan(auc) and math.isnan(logloss) and rmse > 0, (name, cells)
        else:
            assert 0 <= auc <= 1 and logloss > 0 and math.isnan(rmse), (name, cells)


@pytest.mark.slow
def test_demo_lbfgs_matches_sklearn(small_run):
    # same objective (same C) on the same split: the same test scores
    rows = _table(small_run[1])
    ours = rows["GPULogisticRegression (lbfgs)"]
    ref = rows["sklearn LogisticRegression (lbfgs)"]
    assert abs(float(ours[3]) - float(ref[3])) <= 1e-3, (ours, ref)
    assert abs(float(ours[4]) - float(ref[4])) <= 1e-3, (ours, ref)


def test_demo_reports_a_failing_model(monkeypatch):
    real = demo._models

    def broken(args, device, n_train):
        models = real(args, device, n_train)

        def boom():
            raise RuntimeError("kaputt")

        task, name, _ = models[-1]
        return models[:-1] + [(task, name, boom)]

    monkeypatch.setattr(demo, "_models", broken)
    out = io.StringIO()
    rc = demo.main(SMALL + ["--no-sklearn", "--epochs", "1"], out=out)
    assert rc == 1
    assert "FAILED: RuntimeError: kaputt" in out.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["--n-samples", "10"], "--n-samples must be at least 100"),
    (["--random-state", "-1"], "--random-state must be in [0, 2**32 - 1]"),
    (["--random-state", str(2**32)], "--random-state must be in [0, 2**32 - 1]"),
])
def test_demo_rejects_bad_arguments(capsys, argv, message):
    # argparse's error (exit code 2), not a traceback from the data's draw
    with pytest.raises(SystemExit) as exc:
        demo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(cuda_device_count() > 0, reason="a usable GPU is present")
def test_demo_cuda_without_gpu_says_why(capsys):
    rc = demo.main(["--device", "cuda"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no usable GPU" in err


def test_demo_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "sklearn_cuwide.demo", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--n-samples" in proc.stdout and "--device" in proc.stdout
