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
from sklearn.base import clone

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
    assert {"config", "timings", "notes", "env", "floors", "startup", "systems", "real",
            "real_info", "ablation", "scaling", "compile_s", "data_generated",
            "errors"} <= set(res)
    assert res["config"]["mode"] == "cpu" and res["config"]["smoke"]
    env = res["env"]
    assert env["command"].startswith("python -m benchmarks --cpu --smoke")
    assert env["device"] == "cpu" and env["sklearn"] and "git_commit" in env
    assert res["floors"]["copy_bw"] > 0
    main = [e for e in res["systems"].values() if e.get("main")]
    assert len(main) == 1 and main[0]["info"]["floor_ms"] > 0
    # without PyTorch (skipped here) the LR target is scikit-learn's test AUC
    assert main[0]["targets"]["LR"]["from"] == "sk_lr"
    assert main[0]["targets"]["LR"]["auc"] == main[0]["systems"]["sk_lr"]["test_auc"]
    assert "FM" not in main[0]["targets"]
    assert set(res["timings"]) == {"env", "floors", "startup", "systems", "real", "ablation",
                                   "scaling", "finish"}
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
            "est_lr_adagrad", "est_lr_lbfgs", "est_fm", "est_fm_max", "est_lr_default",
            "est_fm_default",
            "est_fm_reg", "est_fm_reg_default", "sk_lr", "sk_sgd", "sk_ridge",
            "cusparse_lr"} <= seen


def test_derived_figures(smoke):
    from benchmarks import report

    res, _, _ = smoke
    entry = next(e for e in res["systems"].values() if e.get("main"))
    s = entry["systems"]
    assert s["ours_lr_adagrad"]["x_ours"] == 1.0 and s["ours_fm"]["x_ours"] == 1.0
    assert s["est_lr_lbfgs"]["rows"] == s["sk_lr"]["rows"]
    assert s["est_lr_lbfgs"]["coef_rel_diff_vs_sklearn"] < 0.05
    assert s["est_lr_lbfgs"]["x_sklearn_fit"] > 0 and "coef" not in s["sk_lr"]
    for r in s.values():
        if "curve" in r and r["family"] in ("LR", "LR-fit", "lbfgs"):
            assert r["target_auc"] == entry["targets"]["LR"]["auc"]
            assert r["time_to_target_s"] == report.time_to_auc(r["curve"], r["target_auc"])
    # the fits report their samples per second over the fit
    est = s["est_lr_adagrad"]
    assert est["fit_samples_per_s"] == est["rows"] * est["n_iter"] / est["fit_s"]


def test_startup_part_on_the_cpu(smoke):
    """The start-up part's processes ran (on the CPU: nothing to compile)."""
    res, out, _ = smoke
    st = res["startup"]
    assert st["rows"] == 2000 and set(st["models"]) == {"lr"}
    r = st["models"]["lr"]
    for key in ("cold_first_fit_s", "warm_cache_first_fit_s", "warm_fit_s", "import_s"):
        assert r[key] > 0, key
    assert r["cold_kernels_s"] == 0 and r["modules_compiled_cold"] == {"ours": 0, "cupy": 0}
    # the first fit's stages, as verbose printed them
    lines = r["cold"]["first_fit_lines"]
    assert lines[0].startswith("Stage: input checks in ") and lines[-1].startswith("Fit: ")
    assert "## Start-up: the first fit of a fresh process" in (out / "results.md").read_text()


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
    """The PyTorch baseline's code path on tiny data: every setting of the
    grid tuned on fewer rows and epochs, the best by test AUC trained again
    on all of them; with a grid on all the rows, the best run is the one
    reported."""
    torch = pytest.importorskip("torch", reason="the PyTorch baselines need torch")
    from benchmarks.configs import make_config
    from benchmarks.data import DataPool
    from benchmarks.systems import Ctx, run_torch, select_best

    torch.set_num_threads(1)  # a small model: threads only contend
    pool = DataPool(300, log=lambda *a: None)
    data = pool.get("binary", 10, 1000)
    grid = {"optimizers": ("adagrad", "adam"), "batch_sizes": (128, 256),
            "learning_rates": {"adagrad": (0.05,), "adam": (0.003, 0.01)},
            "tune_rows": 600, "tune_epochs": 1}
    ctx = Ctx(False, make_config("cpu", smoke=True, torch_grid=grid))
    for k in (0, 4):
        rec = run_torch(ctx, data, k=k, epochs=2)
        assert len(rec["epoch_ms_list"]) == len(rec["curve"]) == 2 and rec["epoch_ms"] > 0
        assert rec["rows"] == 1000 and rec["tuned_on"] == {"rows": 600, "epochs": 1}
        assert np.isfinite(rec["test_logloss"]) and 0 < rec["test_auc"] < 1
        tried = rec["grid"]
        assert [(g["optimizer"], g["batch_size"], g["learning_rate"]) for g in tried] == [
            ("adagrad", 128, 0.05), ("adagrad", 256, 0.05), ("adam", 128, 0.003),
            ("adam", 128, 0.01), ("adam", 256, 0.003), ("adam", 256, 0.01)]
        assert rec["grid_best"] == select_best(tried)
        chosen = tried[rec["grid_best"]]
        assert (rec["optimizer"], rec["batch_size"], rec["learning_rate"]) == (
            chosen["optimizer"], chosen["batch_size"], chosen["learning_rate"])
        # end to end: the setup (the copies) and the epochs
        assert rec["fit_s"] == pytest.approx(rec["setup_s"] + sum(rec["epoch_ms_list"]) / 1e3)
        assert rec["curve"][-1]["time_s"] == pytest.approx(rec["fit_s"])
        assert rec["best_auc"] == max(p["test_auc"] for p in rec["curve"])
    # tuned on all the rows and epochs: no second run, the best one is reported
    grid_all = dict(grid, tune_rows=None, tune_epochs=None, batch_sizes=(256,))
    ctx = Ctx(False, make_config("cpu", smoke=True, torch_grid=grid_all))
    rec = run_torch(ctx, data, k=0, epochs=2)
    assert rec["tuned_on"] == {"rows": 1000, "epochs": 2}
    assert rec["fit_s"] == rec["grid"][rec["grid_best"]]["fit_s"]


def test_lr_tuned_as_peers():
    """Our adagrad LR's rows run at the setting its grid chose on the tuning
    rows (the best test AUC of every rate x C), tuned once per data set."""
    from benchmarks.configs import make_config
    from benchmarks.data import DataPool
    from benchmarks.systems import Ctx, select_best, system_list, tune_lr

    pool = DataPool(300, log=lambda *a: None)
    data = pool.get("binary", 10, 1000)
    grid = {"optimizers": ("adagrad",), "batch_sizes": (128,), "learning_rates": (0.05,),
            "tune_rows": 600, "tune_epochs": 1}
    lr_grid = {"learning_rates": (0.01, 0.2), "C": (0.001, 1.0)}
    ctx = Ctx(False, make_config("cpu", smoke=True, torch_grid=grid, lr_grid=lr_grid))
    t = tune_lr(ctx, data, 2)
    assert t["tuned_on"] == {"rows": 600, "epochs": 1}
    assert [(g["learning_rate"], g["C"]) for g in t["grid"]] == [
        (0.01, 0.001), (0.01, 1.0), (0.2, 0.001), (0.2, 1.0)]
    assert all(0 < g["best_auc"] < 1 for g in t["grid"])
    assert t["grid_best"] == select_best(t["grid"])
    chosen = t["grid"][t["grid_best"]]
    assert (t["learning_rate"], t["C"]) == (chosen["learning_rate"], chosen["C"])
    assert tune_lr(ctx, data, 2) is t  # once per data set
    thunks = {sid: thunk for sid, _, _, thunk in system_list(ctx, data, real=False)}
    rec = thunks["est_lr_adagrad"]()
    assert (rec["settings"]["learning_rate"], rec["settings"]["C"]) == (
        t["learning_rate"], t["C"])
    assert rec["grid"] == t["grid"] and rec["grid_best"] == t["grid_best"]
    # a grid of one setting is not run
    one = Ctx(False, make_config("cpu", smoke=True))
    assert tune_lr(one, data, 2)["grid"] == []


def test_grid_selection():
    """The best setting: the highest test AUC; within AUC_TIE of it, the
    fastest to reach its own; settings without a finite AUC never."""
    from benchmarks.configs import AUC_TIE, TORCH_GRIDS
    from benchmarks.systems import grid_settings, peak_auc, select_best

    def t(auc, time_s):
        return {"best_auc": auc, "time_to_best_s": time_s}

    assert select_best([t(0.70, 5.0), t(0.72, 9.0), t(0.71, 1.0)]) == 1
    assert select_best([t(0.72, 9.0), t(0.72 - AUC_TIE / 2, 2.0), t(0.70, 0.1)]) == 1
    assert select_best([t(0.72, 9.0), t(0.72 - 2 * AUC_TIE, 2.0)]) == 0
    assert select_best([t(float("nan"), 1.0), t(0.6, 3.0)]) == 1
    assert select_best([t(float("nan"), 1.0)]) is None and select_best([]) is None
    # a curve's peak AUC and the first time it reached it
    curve = [{"time_s": 1.0, "test_auc": 0.6}, {"time_s": 2.0, "test_auc": 0.7},
             {"time_s": 3.0, "test_auc": 0.7}, {"time_s": 4.0, "test_auc": 0.65}]
    assert peak_auc(curve) == (0.7, 2.0)
    auc, when = peak_auc([{"time_s": 1.0, "test_auc": float("nan")}])
    assert np.isnan(auc) and when == float("inf")
    # the full grid: both optimisers, the three batch sizes, each with its rates
    full = grid_settings(TORCH_GRIDS["full"])
    assert {o for o, _, _ in full} == {"adagrad", "adam"}
    assert {b for _, b, _ in full} == {1024, 4096, 65536}
    assert len(full) == 2 * 3 * 4 and len(grid_settings(TORCH_GRIDS["small"])) == 2


def test_time_to_target_and_the_ratio_columns():
    """The target: the tuned PyTorch's best test AUC per family; a system's
    time to it: the first curve point at or above it (setup included), inf
    when never; the ratio columns: PyTorch's time over the system's."""
    from benchmarks import report

    def curve(*pts):
        return [{"epoch": i + 1, "time_s": t, "test_auc": a} for i, (t, a) in enumerate(pts)]

    assert report.time_to_auc(curve((1.0, 0.6), (2.0, 0.7), (3.0, 0.8)), 0.7) == 2.0
    assert report.time_to_auc(curve((1.0, 0.6)), 0.7) == float("inf")
    assert report.time_to_auc(curve((1.0, 0.6)), None) is None
    assert report.time_to_auc([], 0.5) is None
    systems = {
        "torch_lr": {"family": "LR", "rows": 100, "fit_s": 8.0, "best_auc": 0.70,
                     "test_auc": 0.69, "curve": curve((3.0, 0.65), (6.0, 0.70), (8.0, 0.69))},
        "torch_fm": {"family": "FM", "rows": 100, "fit_s": 10.0, "best_auc": 0.75,
                     "test_auc": 0.75, "curve": curve((5.0, 0.72), (10.0, 0.75))},
        "ours_lr_adagrad": {"family": "LR", "rows": 100, "epoch_ms": 2.0,
                            "curve": curve((0.5, 0.69), (1.0, 0.705), (1.5, 0.71))},
        "est_lr_adagrad": {"family": "LR-fit", "rows": 100, "fit_s": 2.0, "n_iter": 3,
                           "curve": curve((2.0, 0.71))},
        "ours_fm": {"family": "FM", "rows": 100, "epoch_ms": 20.0,
                    "curve": curve((1.0, 0.70), (2.0, 0.74))},
        "est_fm": {"family": "FM-fit", "rows": 50, "fit_s": 5.0, "curve": curve((5.0, 0.76))},
        "sk_lr": {"family": "lbfgs", "rows": 100, "fit_s": 4.0, "test_auc": 0.72,
                  "curve": curve((4.0, 0.72))},
    }
    entry = {"systems": systems, "info": {"rows": 100}}
    report.derive(entry)
    assert entry["targets"]["LR"] == {"auc": 0.70, "from": "torch_lr"}
    assert entry["targets"]["FM"] == {"auc": 0.75, "from": "torch_fm"}
    s = systems
    assert s["torch_lr"]["time_to_target_s"] == 6.0
    assert s["ours_lr_adagrad"]["time_to_target_s"] == 1.0
    assert s["ours_lr_adagrad"]["x_torch_target"] == 6.0
    assert s["est_lr_adagrad"]["time_to_target_s"] == 2.0
    assert s["est_lr_adagrad"]["x_torch_fit"] == 4.0 and s["est_lr_adagrad"]["x_torch_target"] == 3.0
    assert s["est_lr_adagrad"]["fit_samples_per_s"] == 150.0
    assert s["sk_lr"]["time_to_target_s"] == 4.0 and s["sk_lr"]["x_torch_target"] == 1.5
    assert s["torch_lr"]["x_torch_fit"] == 1.0 and s["torch_lr"]["x_torch_target"] == 1.0
    # never reaching the target: inf, and a ratio of 0
    assert s["ours_fm"]["time_to_target_s"] == float("inf") and s["ours_fm"]["x_torch_target"] == 0
    # fit times are compared on the same rows only
    assert "x_torch_fit" not in s["est_fm"] and s["est_fm"]["x_torch_target"] == 2.0
    # the tables: end to end first (with the ratio columns), then the epochs
    e2e, epochs = report.end_to_end_table(entry), report.epochs_table(entry)
    row = next(ln for ln in e2e.splitlines() if ln.startswith("| est_lr_adagrad "))
    assert "| 2.000 |" in row and "| 4.00 | 3.00 |" in row
    assert "ours_lr_adagrad" in epochs and "est_lr_adagrad" not in epochs


def test_ratio():
    from benchmarks.report import ratio

    inf = float("inf")
    assert ratio(6.0, 2.0) == 3.0 and ratio(inf, 2.0) == inf and ratio(2.0, inf) == 0.0
    assert ratio(inf, inf) is None and ratio(None, 1.0) is None and ratio(1.0, 0.0) is None


def test_merge_keeps_the_parts_not_run_again():
    """A full run split over two calls: the second keeps the first's parts
    it did not run, with their timings; its own parts win."""
    from benchmarks.suite import merge_results

    earlier = {"env": {"git_commit": "abc", "date_utc": "d"}, "floors": {"copy_bw": 1.0},
               "startup": {"models": {}}, "systems": {"old": 1}, "real": {"old": 2},
               "real_info": {"absent": []}, "timings": {"env": 0.1, "systems": 300.0,
                                                        "real": 20.0},
               "notes": ["a", "b", "Parts real are those of an earlier run (commit x, d), merged."],
               "compile_s": {"x": 1.0}, "data_generated": {"d1": 2.0}}
    res = {"env": {}, "real": {"new": 3}, "timings": {"env": 0.2, "real": 25.0},
           "notes": ["b", "c"], "compile_s": {"y": 2.0}, "data_generated": {}}
    merged = merge_results(res, earlier, ["real", "ablation", "scaling"])
    assert merged == ["floors", "startup", "systems"]
    assert res["systems"] == {"old": 1} and res["real"] == {"new": 3}
    assert "real_info" not in res  # the real part ran again: none of its keys are taken
    assert res["timings"] == {"env": 0.2, "real": 25.0, "systems": 300.0}
    assert res["compile_s"] == {"x": 1.0, "y": 2.0}
    # the earlier run's own merge note is dropped: this run ran that part
    assert res["notes"][:3] == ["b", "c", "a"] and len(res["notes"]) == 4
    assert res["notes"][-1].startswith("Parts floors, startup, systems are those of an "
                                       "earlier run (commit abc")
    assert res["env_merged"] == [{"git_commit": "abc", "date_utc": "d", "parts": merged}]
    # a run of one part over results that had merged others: each merged
    # part is credited to the run it came from
    again = {"env": {}, "systems": {"new": 4}, "timings": {}, "notes": [],
             "compile_s": {}, "data_generated": {}}
    first = dict(res, env={"git_commit": "new", "date_utc": "e"})
    assert merge_results(again, first, ["systems"]) == ["floors", "startup", "real"]
    assert again["env_merged"] == [
        {"git_commit": "abc", "date_utc": "d", "parts": ["floors", "startup"]},
        {"git_commit": "new", "date_utc": "e", "parts": ["real"]}]
    assert [n for n in again["notes"] if n.startswith("Parts ")] == [
        "Parts floors, startup are those of an earlier run (commit abc, d), merged.",
        "Parts real are those of an earlier run (commit new, e), merged."]


def test_startup_pieces(tmp_path):
    """The start-up part's arithmetic and its count of compiled modules."""
    from benchmarks import startup

    (tmp_path / "a.cubin.cu").write_text("namespace cuwide {\n}")
    (tmp_path / "b.cubin.cu").write_text("extern \"C\" __global__ void cupy_add() {}")
    (tmp_path / "c.cubin.cu").write_text("extern \"C\" __global__ void cupy_sum() {}")
    (tmp_path / "c.cubin").write_bytes(b"\0")
    assert startup.count_modules(tmp_path) == {"ours": 1, "cupy": 2}
    cold = {"first_fit_s": 2.5, "second_fit_s": 0.03, "kernels_s": 1.9, "import_s": 1.0}
    warm = {"first_fit_s": 0.4, "second_fit_s": 0.03, "kernels_s": 0.05, "import_s": 0.9}
    r = startup.summarize(cold, warm)
    assert r["cold_ok"] and r["warm_cache_ok"]
    assert r["warm_cache_over_warm_s"] == pytest.approx(0.37)
    assert not startup.summarize(dict(cold, first_fit_s=3.5), dict(warm, first_fit_s=0.6))[
        "cold_ok"]
    assert not startup.summarize(cold, dict(warm, first_fit_s=0.6))["warm_cache_ok"]
    lines = ["Stage: layout in 0.100 s", "Epoch 1/3 in 2.000 s (kernels 1.750 s): loss 0.6",
             "Stage: upload in 0.300 s (kernels 0.250 s)"]
    assert startup._kernel_seconds(lines) == pytest.approx(2.0)


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
    # early_stopping=False: no small-data penalty choice (its fits would be
    # the fake backend's calls too; time_epochs_matches_fit checks the choice)
    fm = GPUFactorizationMachine(n_factors=4, batch_size=256, tol=None, random_state=0,
                                 early_stopping=False)

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


def test_sklearn_jobs_in_a_worker_equal_the_fit_in_this_process():
    """A worker process gets its data from a file written at submission and
    returns what the same job returns here; the files go with the pool."""
    from benchmarks.systems import Jobs, sklearn_job

    X, y = make_ctr_classification(600, 2**10, random_state=0)
    spec = dict(kind="lr", X=X[:400], y=y[:400], Xt=X[400:], yt=y[400:], C=1.0, tol=1e-6,
                max_iter=200)
    here = sklearn_job(spec)
    jobs = Jobs(1)
    assert jobs.pool is not None, jobs.error
    tmp = Path(jobs.tmp.name)
    handle = jobs.submit(spec, key="lr")
    assert jobs.submit(spec, key="lr") is handle and len(list(tmp.iterdir())) == 1
    there = jobs.result(handle, timeout=120)
    jobs.close()
    assert "error" not in there and "note" not in there, there
    np.testing.assert_allclose(there["coef"], here["coef"], rtol=1e-6, atol=1e-9)
    assert there["test_auc"] == pytest.approx(here["test_auc"])
    assert not tmp.exists()


def test_worker_and_main_cores_are_split(monkeypatch):
    from benchmarks import systems

    os_mod = __import__("os")
    monkeypatch.setattr(os_mod, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    assert systems._split_cores(3) == ([0, 1], [2, 3, 4])
    assert systems._split_cores(5) is None


def test_sklearn_peers_of_our_defaults():
    """On the real (binary) datasets the harness adds LogisticRegression()
    at its defaults and at the C a validation split of the training rows
    picks (refitted on all of them): the same models as fitted here."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from benchmarks.data import Data
    from benchmarks.systems import SK_C_GRID, _lr_best_c, sklearn_job, sklearn_specs

    X, y = make_ctr_classification(1500, 2**10, random_state=1)
    data = Data("t", "binary", X[:1200], y[:1200], X[1200:], y[1200:], source="real")
    specs = sklearn_specs(data, epochs=1, sk_rows=1200, sgd_rows=1200, real=True)
    assert {"sk_lr_default", "sk_lr_best"} <= set(specs)
    assert "sk_lr_best" not in sklearn_specs(data, epochs=1, sk_rows=1200, sgd_rows=1200)
    got = sklearn_job(specs["sk_lr_default"][1])
    ref = LogisticRegression().fit(X[:1200], y[:1200]).decision_function(X[1200:])
    assert got["test_auc"] == pytest.approx(roc_auc_score(y[1200:], ref))
    best = sklearn_job(specs["sk_lr_best"][1])
    c = _lr_best_c(X[:1200], y[:1200], SK_C_GRID, 0)
    assert c in SK_C_GRID and best["settings"].startswith(f"C={c:g} ")
    ref = LogisticRegression(C=c, max_iter=1000).fit(X[:1200], y[:1200])
    assert best["test_auc"] == pytest.approx(roc_auc_score(y[1200:],
                                                           ref.decision_function(X[1200:])))


def test_prediction_timing_and_its_table():
    """time_prediction times the first rows' scoring of a fitted model; the
    report lists it (and leaves the table out when nothing was timed)."""
    import types

    import scipy.sparse as sp

    from benchmarks import report
    from benchmarks.systems import time_prediction
    from sklearn_cuwide import GPULogisticRegression

    rng = np.random.default_rng(0)
    X = sp.random(300, 40, density=0.2, format="csr", random_state=0, dtype=np.float32)
    y = rng.integers(0, 2, 300)
    est = GPULogisticRegression(device="cpu").fit(X, y)
    calls = []
    est.predict_proba = lambda Z: calls.append(Z.shape) or np.zeros((Z.shape[0], 2))
    ctx = types.SimpleNamespace(gpu=False, sync=lambda: None)
    d = types.SimpleNamespace(Xt=X, task="binary")
    got = time_prediction(ctx, est, d, rows=120)
    assert calls == [(120, 40)] and got["predict_rows"] == 120 and got["predict_s"] >= 0
    entry = {"systems": {"ours_lr": {"label": "ours LR", **got},
                         "torch_lr": {"label": "PyTorch", "fit_s": 1.0}}}
    table = report.prediction_table(entry)
    assert "| ours LR | 120 |" in table and "PyTorch" not in table
    assert report.prediction_table({"systems": {"torch_lr": {"fit_s": 1.0}}}) == ""


@pytest.mark.parametrize("est", [
    GPULogisticRegression(solver="adagrad", max_iter=4, early_stopping=True, device="cpu"),
    GPULogisticRegression(device="cpu"),
    GPUFactorizationMachine(n_factors=4, max_iter=3, device="cpu"),
], ids=["adagrad", "lbfgs", "fm-penalty-choice"])
def test_stage_times_read_a_fit_log(est):
    """The stage list of a verbose fit: its stages in order, the epochs (or
    L-BFGS iterations) summed with their count, and the spans adding up to
    the Fit line's total (each line rounded to the millisecond); the
    report's table lists it."""
    from benchmarks import report
    from benchmarks.stages import stage_times, verbose_fit

    X, y = make_ctr_classification(n_samples=3000, n_features=2**10, random_state=0)[:2]
    est = clone(est)
    _, lines = verbose_fit(est, X, y)
    stages, total = stage_times(lines)
    names = [n for n, _, _ in stages]
    assert names[0] == "input checks" and names[-1] == "attributes"
    assert len(names) == len(set(names))  # the epochs' lines make one entry
    counts = dict((n, c) for n, _, c in stages)
    if est.solver == "lbfgs":
        assert counts["iterations"] == est.n_iter_[0]
    elif "epochs" in counts:
        assert counts["epochs"] == est.n_iter_ and "layout" in names
    else:  # the penalty choice's fits print their epochs from verbose=2 only
        assert any(n.startswith("penalty choice") for n in names)
    assert abs(sum(s for _, s, _ in stages) - total) <= 0.0005 * (len(lines) + 2)
    entry = {"systems": {"ours": {"label": "ours X", "stages": stages, "stages_fit_s": total},
                         "peer": {"label": "peer", "fit_s": 1.0}}}
    table = report.stages_table(entry)
    assert "| ours X |" in table and "input checks" in table and "peer" not in table
    assert report.stages_table({"systems": {"peer": {"fit_s": 1.0}}}) == ""


def test_ours_fit_reports_the_first_fit_and_the_median_of_the_repeats(monkeypatch):
    """On the GPU each of our end-to-end fits runs FIT_REPEATS times (fresh
    estimators): fit_s is their median, fit_first_s the first; the GPU peak
    is the largest. On the CPU one fit. (A stand-in context whose "GPU"
    fits run on the CPU, and a clock that each fit moves by its own time.)"""
    import types

    import scipy.sparse as sp

    from benchmarks import systems
    from benchmarks.data import Data
    from sklearn_cuwide import GPULogisticRegression

    rng = np.random.default_rng(0)
    X = sp.random(200, 30, density=0.2, format="csr", random_state=0, dtype=np.float32)
    y = rng.integers(0, 2, 200)
    d = Data("k", "binary", X, y, X[:50], y[:50])
    now, took = [0.0], iter([5.0, 2.0, 1.0, 7.0])  # the last: the verbose fit, not timed

    class Timed(GPULogisticRegression):
        def fit(self, *a, **k):
            out = super().fit(*a, **k)
            now[0] += next(took)
            return out

    peaks = iter([100, 300, 200, 0])

    class Ctx(systems.Ctx):
        def sync(self):
            pass

        def mem_begin(self):
            return None

        def mem_peak(self, tok):
            return next(peaks)

    monkeypatch.setattr(systems, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    ctx = Ctx(True, {"budget_s": 1e9})
    ctx.warmed.add(("fit", repr(Timed(device="cpu"))))
    rec = systems.ours_fit(ctx, d, lambda: Timed(device="cpu"))
    assert rec["fit_repeats"] == systems.FIT_REPEATS == 3
    assert rec["fit_first_s"] == 5.0 and rec["fit_s"] == 2.0 and rec["gpu_peak_bytes"] == 300
    assert [n for n, _, _ in rec["stages"]][:2] == ["input checks", "objective"]
    monkeypatch.undo()
    cpu = systems.ours_fit(Ctx(False, {"budget_s": 1e9}), d,
                           lambda: GPULogisticRegression(device="cpu"))
    assert cpu["fit_repeats"] == 1 and cpu["fit_first_s"] == cpu["fit_s"]


def test_ours_fit_from_device_input_fits_the_converted_matrix(monkeypatch):
    """``on_device``: the warm-up, the timed fits and the verbose fit all get
    the matrix and targets as ``_on_device`` made them (a stand-in that
    records what it converted, on the CPU), and the prediction is not timed
    again; the host fit keeps the user's matrix and times it."""
    import types

    import scipy.sparse as sp

    from benchmarks import systems
    from benchmarks.data import Data
    from sklearn_cuwide import GPULogisticRegression

    rng = np.random.default_rng(0)
    X = sp.random(300, 30, density=0.2, format="csr", random_state=0, dtype=np.float32)
    y = rng.integers(0, 2, 300)
    d = Data("k", "binary", X, y, X[:50], y[:50])
    converted, fitted = [], []

    class Marked(types.SimpleNamespace):
        pass

    def on_device(X, y):
        converted.append(X.shape[0])
        return Marked(X=X), y

    class Fits(GPULogisticRegression):
        def fit(self, X, y):
            fitted.append(isinstance(X, Marked))
            return super().fit(X.X if isinstance(X, Marked) else X, y)

    class Ctx(systems.Ctx):
        def sync(self):
            pass

        def mem_begin(self):
            return None

    monkeypatch.setattr(systems, "_on_device", on_device)
    ctx = Ctx(True, {"budget_s": 1e9})
    rec = systems.ours_fit(ctx, d, lambda: Fits(solver="adagrad", max_iter=2, device="cpu"),
                           on_device=True)
    assert converted == [300]  # the training rows, which the warm-up fits too
    assert fitted == [True] * (2 + systems.FIT_REPEATS)  # warm-up, timed, verbose
    assert "predict_s" not in rec and 0.5 <= rec["test_auc"] <= 1.0
    assert ("fit", repr(Fits(solver="adagrad", max_iter=2, device="cpu")), "cupyx") in ctx.warmed
    converted.clear(), fitted.clear()
    host = systems.ours_fit(ctx, d, lambda: Fits(solver="adagrad", max_iter=2, device="cpu"))
    assert converted == [] and not any(fitted) and host["predict_rows"] == 50


def test_out_of_core_harness_smoke(tmp_path):
    """The out-of-core harness end to end on a few thousand rows (the CPU
    without a GPU: the limits do not apply there, the plumbing does), and
    its reading of verbose epoch lines."""
    from benchmarks import out_of_core

    assert out_of_core.epoch_seconds(
        "Stage: layout in 0.1 s\nEpoch 1/2 in 0.250 s: loss 0.5\n"
        "Model 1 of 3, epoch 2/2 in 1.5 s: loss 0.4\n") == [0.25, 1.5]
    assert out_of_core.main(["--smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "out_of_core.json").read_text())
    for conc in ("1", "auto"):
        run = res["model"]["runs"][conc]
        assert run["resident"]["epoch_s"] and run["limited"]["epoch_s"]
        assert 0.5 < run["resident"]["test_auc"] <= 1.0
    assert res["stream"]["layout_bytes"] > 0 and res["stream"]["run"]["epoch_s"]
    assert res["partial"]["chunks"] == 4  # --chunks' default, of --chunk-rows each
    assert res["partial"]["rows"] == 4 * res["partial"]["chunk_rows"]
    for reader in out_of_core.READERS:
        part = res["partial"][reader]
        assert part["read_s"] > 0 and part["partial_fit_s"] > 0
        assert 0.5 < part["test_auc"] <= 1.0
        # every format reads back the same chunks: the same model (on the
        # CPU: a GPU's atomics may round two fits differently)
        if res["device"] == "cpu":
            assert part["test_auc"] == res["partial"]["npz"]["test_auc"], reader
        assert f"partial_fit from {reader} files:" in out_of_core.table(res)
    assert len(res["partial"]["fit_runs_s"]) == res["partial"]["repeats"] == 3
    # the recipe through read_ahead: the same model as the loop without it
    for reader in ("npy", "npz"):
        ahead = res["partial"][f"{reader}_read_ahead"]
        assert ahead["wall_s"] > 0
        if res["device"] == "cpu":
            assert ahead["test_auc"] == res["partial"]["npz"]["test_auc"]
        assert f"partial_fit from {reader} files with read_ahead" in out_of_core.table(res)
    assert "svmlight_read_ahead" not in res["partial"]
    assert "mmap_read_ahead" not in res["partial"]  # read during the calls
    # the pool's peaks: what a wrapped allocator sees (a stand-in pool)
    pool = _StandInPool()
    def previous(n):
        return None

    pool.allocator = previous
    fake = type("cp", (), {"get_default_memory_pool": staticmethod(lambda: pool),
                           "cuda": type("cuda", (), {
                               "set_allocator": staticmethod(
                                   lambda f: setattr(pool, "allocator", f)),
                               "get_allocator": staticmethod(lambda: pool.allocator)})})
    with out_of_core.pool_peaks(fake) as peaks:
        pool.allocator(100)
        pool.free(100)
        pool.allocator(30)
    assert peaks == {"used": 100, "held": 130} and pool.allocator is previous


class _StandInPool:
    """Bytes in use and held (a freed block is kept, never reused): 7 in use
    and 9 held before."""

    def __init__(self):
        self.used, self.held, self.allocator = 7, 9, None

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.held

    def malloc(self, n):
        self.used += n
        self.held += n

    def free(self, n):
        self.used -= n


@pytest.mark.parametrize("variant, in_order_tiles", [
    ("flow", True), ("no_hot_cache", True), ("no_replicas", False),
    ("global_accumulators", False)])
def test_ablation_kernels_get_shared_memory_tiles(variant, in_order_tiles):
    """The probe asks the backend for the fit's tiles, except for the
    ablation kernels that keep theirs in shared memory: those never get the
    in-order kernel's whole-batch tiles, even for one worker (the in-order
    kernel does not run them)."""
    from sklearn_cuwide._profiling import _Probe

    asked = []

    class Backend:
        def tile_shape(self, params, n_outputs, n_factors, batch_size, workers=None):
            asked.append(workers)
            return 1024, 16384

    probe = _Probe(Backend(), variant, None, 0.0)
    sb, n_hot = probe.tile_shape("params", 1, 16, 1024, 1)
    assert asked == [1 if in_order_tiles else None]
    assert (sb, n_hot) == (1024, 0 if variant == "no_hot_cache" else 16384)
