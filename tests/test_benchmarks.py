"""The benchmark harness (``python -m benchmarks``) and its hook into the
package (``sklearn_cuwide._profiling.time_epochs``), on the CPU.

One run of ``--cpu --smoke`` (seconds; the scikit-learn fits in a worker
process as on the GPU machine): results.json's structure and every system
row's metrics.  Tests that need matplotlib or torch skip without them.  No
timing is asserted.
"""

import json
import time
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._profiling import EpochTimings, time_epochs
from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _run(args, cwd, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    # torch on a 2-core CPU is slow and has its own test below
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "out"
    proc = _run(["--cpu", "--smoke", "--sk-workers", "1", "--skip", "torch", "--out", str(out)],
                tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out, proc.stdout


def _rows(res):
    """(part, dataset, id, record) of every system row."""
    for part in ("systems", "real"):
        for name, entry in res[part].items():
            for sid, rec in entry.get("systems", {}).items():
                yield part, name, sid, rec


def test_results_structure(smoke):
    res, out, stdout = smoke
    assert {"config", "timings", "notes", "env", "floors", "systems", "real", "real_info",
            "ablation", "scaling", "compile_s", "data_generated", "errors"} <= set(res)
    assert res["config"]["mode"] == "cpu" and res["config"]["smoke"]
    env = res["env"]
    assert env["command"].startswith("python -m benchmarks --cpu --smoke")
    assert env["device"] == "cpu" and env["sklearn"] and "git_commit" in env
    assert res["floors"]["copy_bw"] > 0
    main = [e for e in res["systems"].values() if e.get("main")]
    assert len(main) == 1 and main[0]["info"]["floor_ms"] > 0
    assert main[0]["target_from"] == "sk_lr" and main[0]["target_logloss"] > 0
    assert set(res["timings"]) == {"env", "floors", "systems", "real", "ablation", "scaling",
                                   "finish"}
    assert (out / "results.md").read_text().startswith("# sklearn-cuwide benchmark suite")
    # the short table is printed last
    assert re.search(r"errors recorded: \d+ \(see results.json / results.md\)\s*$", stdout)
    assert "ours LR adagrad (epochs)" in stdout.split("wrote ")[-1]


def test_every_system_row_has_its_metrics(smoke):
    res, _, _ = smoke
    seen = set()
    for part, name, sid, rec in _rows(res):
        seen.add(sid)
        assert rec["label"] and rec["family"], sid
        if "skipped" in rec:
            continue
        if "error" in rec:  # only what cannot run on a CPU
            assert rec["error"].startswith("not available"), (name, sid, rec["error"])
            assert sid.startswith("cusparse"), sid
            continue
        test = ("test_rmse",) if res[part][name]["info"]["task"] == "regression" else (
            "test_auc", "test_logloss")
        assert all(np.isfinite(rec[m]) for m in test), (name, sid)
        if sid.startswith("ours_"):
            n = rec["epochs"]
            assert len(rec["epoch_ms_list"]) == len(rec["curve"]) == len(rec["train_loss"]) == n
            assert rec["epoch_ms"] > 0 and rec["setup_s"] > 0 and rec["workers"] == 1
            assert all(set(test) <= set(pt) for pt in rec["curve"])
            times = [pt["time_s"] for pt in rec["curve"]]
            assert times == sorted(times) and rec["samples_per_s"] > 0
        elif sid.startswith(("est_", "sk_")):
            assert rec["fit_s"] > 0, (name, sid)
    assert {"ours_lr_adagrad", "ours_lr_sgd", "ours_fm", "ours_fm_scaled", "ours_fm_reg",
            "est_lr_adagrad", "est_lr_lbfgs", "est_fm", "est_lr_default", "est_fm_default",
            "est_fm_reg", "est_fm_reg_default", "sk_lr", "sk_sgd", "sk_ridge",
            "cusparse_lr"} <= seen


def test_derived_figures(smoke):
    res, _, _ = smoke
    entry = next(e for e in res["systems"].values() if e.get("main"))
    s = entry["systems"]
    assert s["ours_lr_adagrad"]["x_ours"] == 1.0 and s["ours_fm"]["x_ours"] == 1.0
    assert s["est_lr_lbfgs"]["rows"] == s["sk_lr"]["rows"]
    assert s["est_lr_lbfgs"]["coef_rel_diff_vs_sklearn"] < 0.05
    assert s["est_lr_lbfgs"]["x_sklearn_fit"] > 0 and "coef" not in s["sk_lr"]
    for r in s.values():
        if "curve" in r:
            assert "time_to_target_s" in r


def test_ablation_and_scaling(smoke):
    res, _, _ = smoke
    ab = res["ablation"]
    assert set(ab["models"]) == {"LR", "FM4"}
    for rows in ab["models"].values():
        by = {r["id"]: r for r in rows}
        assert set(by) == {"classic", "flow", "no_hot", "no_cross_stage", "no_replication"}
        assert by["flow"]["x_flow"] == 1.0 and by["flow"]["test_auc"] > 0.5
        # the other variants are the GPU's
        assert all(r["error"].startswith("not available") for i, r in by.items()
                   if i != "flow")
    sc = res["scaling"]
    assert [p["x"] for p in sc["rows"]["LR"]] == res["config"]["scale_rows"]
    assert [p["x"] for p in sc["factors"]["FM"]] == res["config"]["scale_factors"]
    for pts in list(sc["rows"].values()) + list(sc["features"].values()):
        assert all(p["epoch_ms"] > 0 and p["floor_ms"] > 0 and p["nnz"] > 0 for p in pts)
    assert {"slope", "r2", "saturated", "linear"} <= set(sc["fits"]["rows LR"])
    assert set(sc["fits"]) == {"rows LR", "rows FM4", "features LR", "features FM4",
                               "factors FM"}


def test_real_datasets_present_or_listed_absent(smoke):
    res, _, _ = smoke
    want = set(res["config"]["real_datasets"])
    assert set(res["real"]) | set(res["real_info"]["absent"]) == want
    for name in res["real"]:
        assert res["real"][name]["info"]["source"] == "real"


def test_plots(smoke):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    _, out, _ = smoke
    for name in ("systems.png", "ablation.png", "scaling.png"):
        assert (out / name).stat().st_size > 1000


def test_budget_parts_and_bad_arguments(tmp_path, capsys):
    from benchmarks.suite import main

    out = tmp_path / "out"
    assert main(["--cpu", "--smoke", "--budget-s", "0", "--parts", "systems",
                 "--skip", "plots,regression", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert "ablation" not in res and "floors" not in res
    recs = [r for _, _, _, r in _rows(dict(res, real={}))]
    assert recs and all("time budget" in r.get("skipped", "") for r in recs)
    for bad in (["--parts", "nope"], ["--skip", "nope"]):
        with pytest.raises(SystemExit) as exc:
            main(["--cpu", *bad, "--out", str(out)])
        assert exc.value.code == 2


def test_torch_baselines_on_the_cpu():
    pytest.importorskip("torch", reason="the PyTorch baselines need torch")
    from benchmarks.configs import make_config
    from benchmarks.data import DataPool
    from benchmarks.systems import Ctx, run_torch

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # a small model: threads only contend
    pool = DataPool(300, log=lambda *a: None)
    data = pool.get("binary", 10, 1000)
    grid = {"optimizers": ("adagrad", "adam"), "batch_sizes": (256,), "learning_rates": (0.05,)}
    ctx = Ctx(False, make_config("cpu", smoke=True, torch_grid=grid))
    for k in (0, 4):
        rec = run_torch(ctx, data, k=k, epochs=2)
        assert len(rec["epoch_ms_list"]) == len(rec["curve"]) == 2 and rec["epoch_ms"] > 0
        assert np.isfinite(rec["test_logloss"]) and 0 < rec["test_auc"] < 1
        assert [g["optimizer"] for g in rec["grid"]] == ["adagrad", "adam"]
        assert rec["test_logloss"] == min(g["test_logloss"] for g in rec["grid"])


def test_benchmarks_use_only_the_public_api_and_the_hook():
    private = re.compile(r"sklearn_cuwide\._(?!profiling\b)\w+|from \._|monkeypatch")
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        assert not private.search(text), (path.name, private.search(text).group(0))


# --------------------------------------------------------------------------
# the hook: time_epochs trains what fit trains
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctr():
    X, y = make_ctr_classification(n_samples=2400, n_features=2**10, model="fm",
                                   random_state=0)
    return X[:2000], y[:2000], X[2000:]


def _check_against_fit(est, X, y, Xe, epochs, decision):
    before = repr(est)
    t = time_epochs(est, X, y, epochs=epochs, eval_X=Xe)
    assert isinstance(t, EpochTimings) and repr(est) == before
    assert not hasattr(est, "n_iter_")  # the estimator is not modified
    fitted = est.set_params(max_iter=epochs).fit(X, y)
    np.testing.assert_allclose(t.loss, fitted.loss_curve_, rtol=1e-12)
    assert len(t.epoch_s) == len(t.eval_decision) == epochs
    assert all(s > 0 for s in t.epoch_s) and t.setup_s > 0 and t.workers == 1
    Z = t.eval_decision[-1]
    np.testing.assert_allclose(Z, decision(fitted, Xe), rtol=1e-9, atol=1e-12)
    return t


@pytest.mark.parametrize("est", [
    GPULogisticRegression(solver="adagrad", C=0.1, learning_rate=0.05, batch_size=256,
                          random_state=0, device="cpu"),
    GPULogisticRegression(solver="sgd", l1_ratio=0.5, batch_size=256, random_state=1,
                          device="cpu"),
    GPUFactorizationMachine(n_factors=4, batch_size=256, tol=None, scale_penalty=True,
                            random_state=0, device="cpu"),
], ids=["lr-adagrad", "lr-sgd-elasticnet", "fm"])
def test_time_epochs_matches_fit(ctr, est):
    X, y, Xe = ctr
    t = _check_against_fit(est, X, y, Xe, 3, lambda f, Z: f.decision_function(Z))
    assert t.eval_decision[-1].shape == (Xe.shape[0],) and t.n_hot > 0


def test_time_epochs_multiclass_regression_and_weights(ctr):
    X, y, Xe = ctr
    y3 = y + (np.arange(y.size) % 3 == 0)
    for est in (GPUFactorizationMachine(n_factors=3, batch_size=256, tol=None, random_state=0,
                                        device="cpu"),
                GPULogisticRegression(solver="adagrad", batch_size=256, random_state=0,
                                      device="cpu")):
        t = _check_against_fit(est, X, y3, Xe, 2, lambda f, Z: f.decision_function(Z))
        assert t.eval_decision[0].shape == (Xe.shape[0], 3)
    Xr, yr = make_ctr_regression(n_samples=1500, n_features=2**10, model="fm", random_state=0)
    reg = GPUFactorizationMachineRegressor(n_factors=4, learning_rate=0.02, tol=None,
                                           random_state=0, device="cpu")
    _check_against_fit(reg, Xr, yr, Xr[:100], 2, lambda f, Z: f.predict(Z))
    sw = np.random.default_rng(0).uniform(0.5, 2.0, X.shape[0])
    for est in (GPULogisticRegression(solver="adagrad", class_weight="balanced",
                                      batch_size=256, random_state=0, device="cpu"),
                GPUFactorizationMachine(n_factors=3, class_weight="balanced", batch_size=256,
                                        tol=None, random_state=0, device="cpu")):
        t = time_epochs(est, X, y, epochs=2, sample_weight=sw)
        assert t.eval_decision == []
        assert t.loss == est.set_params(max_iter=2).fit(X, y, sample_weight=sw).loss_curve_


def test_time_epochs_refuses_what_it_cannot_time(ctr):
    X, y, _ = ctr
    with pytest.raises(ValueError, match="mini-batch solver"):
        time_epochs(GPULogisticRegression(device="cpu"), X, y)
    for variant in ("classic", "no_hot_cache", "no_replicas", "global_accumulators"):
        with pytest.raises(ValueError, match="needs the CUDA backend"):
            time_epochs(GPULogisticRegression(solver="adagrad", device="cpu"), X, y,
                        variant=variant)
    with pytest.raises(ValueError, match="variant must be one of"):
        time_epochs(GPULogisticRegression(solver="adagrad", device="cpu"), X, y,
                    variant="nope")


def _fm_kernels(k, variant):
    """The training kernels of an FM with ``k`` factors for clusters of 1 and 2."""
    from sklearn_cuwide._kernels import train_instantiation

    return [("cuwide_train.cu", train_instantiation("fm", 1, k, "adagrad", "logistic", cl,
                                                     variant)) for cl in (1, 2)]


def test_time_epochs_gpu_branch_on_a_cpu_stand_in(ctr, monkeypatch):
    """The GPU branch of the probe, driven by the CPU backend dressed as the
    CUDA one and a stand-in for cupy's events: the ablation switches reach
    run_epoch, every cluster size's kernel is compiled before the first
    epoch, and the classic schema trains from the training CSR in the
    layout's row and feature order, visiting the rows batch by batch."""
    import types

    import sklearn_cuwide._base as base
    import sklearn_cuwide._profiling as profiling
    from sklearn_cuwide._backends import _cpu

    X, y, Xe = ctr
    calls = {"run_epoch": [], "kernels": [], "classic": []}

    class Backend:
        name = "cuda"

        def __getattr__(self, attr):
            return getattr(_cpu, attr)

        def build_layout(self, X, **kw):
            self.layout = _cpu.build_layout(X, **kw)
            return self.layout

        def concurrent_blocks(self, concurrency, params, n_batches):
            return 3

        def run_epoch(self, *a, **opts):
            calls["run_epoch"].append(dict(opts, variant="flow"))
            return _cpu.run_epoch(*a)

    def run_epoch_ablation(*a, variant, **opts):
        calls["run_epoch"].append(dict(opts, variant=variant))
        return _cpu.run_epoch(*a)

    def get_kernels(source, names):
        calls["kernels"].extend((source, n) for n in names)

    def run_epoch_classic(Xc, y, sw, state, params, order_rows):
        calls["classic"].append((Xc, np.asarray(order_rows)))
        return 0.0

    class Event:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    gpu = types.SimpleNamespace(
        run_epoch_classic=run_epoch_classic, run_epoch_ablation=run_epoch_ablation,
        SOURCE="cuwide_train.cu", get_kernels=get_kernels, cluster_sizes=lambda: (1, 2),
        Event=Event,
        elapsed_ms=lambda a, b: (b.t - a.t) * 1e3,
    )
    monkeypatch.setattr(profiling, "_gpu_entry_points", lambda: gpu)
    be = Backend()
    monkeypatch.setattr(base, "_fit_device", lambda device, X: ("cuda:0", be))
    fm = GPUFactorizationMachine(n_factors=4, batch_size=256, tol=None, random_state=0)

    t = time_epochs(fm, X, y, epochs=2, variant="no_replicas", eval_X=Xe)
    assert [o["variant"] for o in calls["run_epoch"]] == ["no_replicas"] * 2
    assert [o["workers"] for o in calls["run_epoch"]] == [3, 3] and t.workers == 3
    assert calls["run_epoch"][0]["ramp"] > 0 and calls["run_epoch"][1]["ramp"] == 0
    assert calls["kernels"] == _fm_kernels(4, "no_replicas")
    assert len(t.epoch_s) == len(t.eval_decision) == 2 and t.n_hot > 0
    calls["run_epoch"].clear()
    calls["kernels"].clear()
    t = time_epochs(fm, X, y, epochs=1, variant="global_accumulators")
    assert calls["run_epoch"][0]["variant"] == "global_accumulators"
    assert calls["kernels"] == _fm_kernels(4, "global_accumulators")
    assert time_epochs(fm, X, y, epochs=1, variant="no_hot_cache").n_hot == 0

    time_epochs(fm, X, y, epochs=2, variant="classic")
    L = be.layout
    (_, empty), (Xc, rows1), (_, rows2) = calls["classic"]
    assert empty.size == 0  # the compiling launch
    expect = X.tocsr()[L.row_order][:, L.feature_order]
    assert Xc.dtype == np.float32 and (abs(Xc - expect) > 0).nnz == 0
    srp, bsp = L.sblock_row_ptr, L.batch_sblock_ptr
    for rows in (rows1, rows2):
        assert np.array_equal(np.sort(rows), np.arange(X.shape[0]))
        starts = rows[np.flatnonzero(np.diff(rows) != 1) + 1]
        assert set(starts.tolist()) <= set(srp[bsp[:-1]].tolist())
