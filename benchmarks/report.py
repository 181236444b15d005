"""What a run writes: ``results.json``, ``results.md``, the PNG plots
(matplotlib, when it is installed), and the short table printed last."""

import json
import math
from pathlib import Path

import numpy as np

from .stages import format_stages


#: a scaling point keeps the device busy when its workers are at least this
#: share of the most workers any point of its sweep ran (on the CPU: always)
BUSY_SHARE = 0.9


def _f(v, fmt, dash="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return dash
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def _mib(b):
    return None if b is None else b / 2**20


def _ok(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def entries(block):
    """The datasets of a systems/real block that ran."""
    return {n: e for n, e in (block or {}).items() if isinstance(e, dict) and "systems" in e}


# --------------------------------------------------------------------------
# derived figures
# --------------------------------------------------------------------------
def loglog_slope(xs, ys):
    """Slope and R^2 of log(y) against log(x)."""
    x = np.log(np.asarray(xs, dtype=np.float64))
    y = np.log(np.asarray(ys, dtype=np.float64))
    if x.size < 2 or not np.all(np.isfinite(y)):
        return None
    slope, icpt = np.polyfit(x, y, 1)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - (slope * x + icpt)) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"slope": float(slope), "r2": r2}


def busy(p, pts):
    """Whether a scaling point ran (nearly) as many workers as its sweep's most."""
    most = max((q.get("workers") or 1 for q in pts), default=1)
    return (p.get("workers") or 1) >= BUSY_SHARE * most


def scaling_fits(sc):
    """Log-log slope of every sweep and model; the rows sweep's linearity
    is judged on its busy points (fewer workers are latency-bound by design)."""
    fits = {}
    for sweep in ("rows", "features", "factors"):
        for model, pts in (sc.get(sweep) or {}).items():
            ok = [p for p in pts if p.get("epoch_ms")]
            fit = loglog_slope([p["x"] for p in ok], [p["epoch_ms"] for p in ok]) \
                if len(ok) >= 2 else None
            if fit is not None and sweep == "rows":
                sat = [p for p in ok if busy(p, ok)]
                sat_fit = loglog_slope([p["x"] for p in sat], [p["epoch_ms"] for p in sat]) \
                    if len(sat) >= 2 else None
                judged = sat_fit or fit
                fit["saturated"] = sat_fit
                fit["linear"] = bool(abs(judged["slope"] - 1.0) <= 0.15 and judged["r2"] >= 0.98)
            fits[f"{sweep} {model}"] = fit
    return fits


#: the PyTorch system whose tuned best test AUC is each family's target
TARGET_SYSTEM = {"LR": "torch_lr", "LR-fit": "torch_lr", "lbfgs": "torch_lr",
                 "FM": "torch_fm", "FM-fit": "torch_fm"}
#: the family's fallback target without PyTorch: scikit-learn's optimum
FALLBACK_TARGET = {"LR": "sk_lr", "LR-fit": "sk_lr", "lbfgs": "sk_lr"}


def time_to_auc(curve, target):
    """The first time (``time_s``, setup included) at which a curve's test
    AUC is at least ``target``; inf if it never is; None without a target
    or a curve."""
    if target is None or not curve:
        return None
    for pt in curve:
        auc = pt.get("test_auc")
        if auc is not None and math.isfinite(auc) and auc >= target:
            return float(pt["time_s"])
    return math.inf


def targets(systems):
    """``{family: (target AUC, from)}``: the tuned PyTorch baseline's best
    test AUC (for LR without PyTorch: scikit-learn LogisticRegression's)."""
    out = {}
    for fam, sid in TARGET_SYSTEM.items():
        r = systems.get(sid, {})
        auc = r.get("best_auc", r.get("test_auc"))
        if not _finite(auc) and fam in FALLBACK_TARGET:
            sid = FALLBACK_TARGET[fam]
            auc = systems.get(sid, {}).get("test_auc")
        if _finite(auc):
            out[fam] = (float(auc), sid)
    return out


def _finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def ratio(peer, ours):
    """``peer / ours`` of two times (how many times faster ours is), or
    None where either is missing; inf / inf is None (neither got there)."""
    if not (isinstance(peer, (int, float)) and isinstance(ours, (int, float))):
        return None
    if ours <= 0 or (math.isinf(peer) and math.isinf(ours)):
        return None
    return float(peer / ours)


def derive(entry):
    """A dataset's targets, times to them, rates and ratios; scikit-learn's
    lbfgs against ours on the same rows."""
    systems, info = entry["systems"], entry["info"]
    tg = targets(systems)
    entry["targets"] = {f: {"auc": a, "from": s} for f, (a, s) in tg.items()}
    for r in systems.values():
        fam = r.get("family")
        if "curve" in r and fam in tg:
            r["target_auc"] = tg[fam][0]
            r["time_to_target_s"] = time_to_auc(r["curve"], tg[fam][0])
        if r.get("epoch_ms") and r.get("rows"):
            r["samples_per_s"] = r["rows"] / (r["epoch_ms"] / 1e3)
            r["ms_per_mrow"] = r["epoch_ms"] / r["rows"] * 1e6
            if info.get("floor_ms") and r["rows"] == info["rows"]:
                r["x_floor"] = r["epoch_ms"] / info["floor_ms"]
        if r.get("fit_s") and r.get("rows"):
            r["fit_samples_per_s"] = r["rows"] * (r.get("n_iter") or r.get("epochs") or 1) \
                / r["fit_s"]
    refs = {"LR": systems.get("ours_lr_adagrad"),
            "FM": systems.get("ours_fm") or systems.get("ours_fm_reg")}
    for r in systems.values():
        ref = refs.get(r.get("family"))
        if ref and ref.get("ms_per_mrow") and r.get("ms_per_mrow"):
            r["x_ours"] = r["ms_per_mrow"] / ref["ms_per_mrow"]
    # the ratio columns: the tuned PyTorch baseline's time over each system's
    for r in systems.values():
        peer = systems.get(TARGET_SYSTEM.get(r.get("family"), ""), {})
        if peer and "error" not in peer and "skipped" not in peer:
            # a peer's one fit against our first (not the median of ours)
            if peer.get("fit_s") and r.get("fit_s") and peer.get("rows") == r.get("rows"):
                r["x_torch_fit"] = ratio(peer["fit_s"], r.get("fit_first_s", r["fit_s"]))
            r["x_torch_target"] = ratio(peer.get("time_to_target_s"),
                                        r.get("time_to_target_s"))
    sk, ours = systems.get("sk_lr", {}), systems.get("est_lr_lbfgs", {})
    if sk.get("fit_s") and ours.get("fit_s") and sk.get("rows") == ours.get("rows"):
        ours["x_sklearn_fit"] = sk["x_ours_fit"] = (
            sk["fit_s"] / ours.get("fit_first_s", ours["fit_s"]))
        a, b = ours.get("coef"), sk.get("coef")
        if a is not None and b is not None and np.shape(a) == np.shape(b):
            b = np.asarray(b)
            ours["coef_rel_diff_vs_sklearn"] = float(
                np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-300))
    for r in systems.values():
        r.pop("coef", None)


def collect_errors(res):
    errs = []

    def walk(node, path):
        if isinstance(node, dict):
            if isinstance(node.get("error"), str):
                errs.append(f"{path}: {node['error']}")
            for k, v in node.items():
                if k not in ("error", "traceback"):
                    walk(v, f"{path}/{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk({k: v for k, v in res.items() if k != "errors"}, "")
    return errs


# --------------------------------------------------------------------------
# results.json
# --------------------------------------------------------------------------
def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def write_json(res, path):
    Path(path).write_text(json.dumps(res, indent=1, default=_json_default))


# --------------------------------------------------------------------------
# results.md
# --------------------------------------------------------------------------
def _md_header(res):
    g = (res.get("env") or {}).get
    return ["# sklearn-cuwide benchmark suite", "",
            f"Command: `{g('command')}`  ", f"Date (UTC): {g('date_utc')}  ",
            f"Mode: {g('mode')} on {g('device')}"
            + (f" — {g('gpu')}, driver {g('driver')}, CUDA runtime {g('cuda_runtime')}"
               if g("gpu") else "") + "  ",
            f"CPU: {g('cpu_model', '?')} ({g('cpu_count')} cores)  ",
            "Versions: " + ", ".join(f"{k} {g(k)}" for k in (
                "python", "numpy", "scipy", "sklearn", "sklearn_cuwide", "cupy", "torch")) + "  ",
            f"Commit: {g('git_commit')} ({g('git_dirty_files', '?')} files changed)", ""]


def _md_floors(res):
    fl = res.get("floors")
    if not fl:
        return []
    if "copy_bw" not in fl:
        return ["## Floors", "", f"Not measured: {fl.get('error')}", ""]
    h2d = fl.get("h2d_bw")
    return ["## Floors", "",
            f"Copy bandwidth ({fl.get('kind')}): {fl['copy_bw'] / 1e9:.1f} GB/s read+write"
            + (f"; pinned host->device {h2d / 1e9:.1f} GB/s" if _ok(h2d) else "")
            + ". The floor of an epoch is one read of the CSR bytes at the copy bandwidth.", ""]


def _failed_row(label, r, cols):
    what = ("error: " + r["error"]) if "error" in r else ("skipped: " + r["skipped"])
    return f"| {label} | {what[:150].replace('|', '/')} " + "|" * cols


def _setting(r):
    """A row's setting, short: PyTorch's chosen one, or ours' solver."""
    if r.get("optimizer"):
        return f"{r['optimizer']}, batch {r['batch_size']:,}, rate {r['learning_rate']:g}"
    st = r.get("settings") or {}
    if isinstance(st, str):  # scikit-learn's fits say theirs in words
        return st
    keys = ("solver", "concurrency", "n_factors") + (
        ("learning_rate", "C") if r.get("grid") else ())  # a tuned row says its setting
    return ", ".join(f"{k}={st[k]}" for k in keys if k in st)


def end_to_end_table(entry):
    """What a user waits for: the fit from a host CSR (every copy
    included) and the time to the target test AUC, with the tuned PyTorch
    baseline's times over each system's (above 1: faster than PyTorch)."""
    rows = ["| system | rows | fit s | first fit s | samples/s (fit) | time to target s "
            "| x PyTorch (fit) | x PyTorch (to target) | test AUC | logloss | RMSE | setting |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for sid, r in entry["systems"].items():
        label = r.get("label", sid)
        if "error" in r or "skipped" in r:
            if sid.startswith(("est_", "torch_", "sk_")):
                rows.append(_failed_row(label, r, 11))
            continue
        if r.get("fit_s") is None and r.get("time_to_target_s") is None:
            continue
        rows.append(
            f"| {label} | {_f(r.get('rows'), ',')} | {_f(r.get('fit_s'), '.3f')} | "
            f"{_f(r.get('fit_first_s'), '.3f')} | "
            f"{_f(r.get('fit_samples_per_s'), '.3g')} | {_f(r.get('time_to_target_s'), '.3g')} "
            f"| {_f(r.get('x_torch_fit'), '.2f')} | {_f(r.get('x_torch_target'), '.2f')} | "
            f"{_f(r.get('test_auc'), '.4f')} | {_f(r.get('test_logloss'), '.4f')} | "
            f"{_f(r.get('test_rmse'), '.4f')} | {_setting(r)} |")
    return "\n".join(rows)


def prediction_table(entry):
    """Scoring from a scipy CSR in host memory with a fitted model (empty
    string when nothing was timed)."""
    rows = ["| system | rows | predict ms | rows/s |", "|---|---:|---:|---:|"]
    for sid, r in entry["systems"].items():
        if r.get("predict_s") is None:
            continue
        rate = r["predict_rows"] / r["predict_s"] if r["predict_s"] > 0 else None
        rows.append(f"| {r.get('label', sid)} | {_f(r.get('predict_rows'), ',')} | "
                    f"{_f(1000 * r['predict_s'], '.1f')} | {_f(rate, '.3g')} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def stages_table(entry):
    """Where each fit row's time went: the stage lines of one more fit with
    ``verbose=1`` (empty string when no row has them)."""
    rows = ["| system | fit s | stages, seconds (epochs and L-BFGS iterations summed) |",
            "|---|---:|---|"]
    for sid, r in entry["systems"].items():
        if r.get("stages"):
            rows.append(f"| {r.get('label', sid)} | {_f(r.get('stages_fit_s'), '.3f')} | "
                        f"{format_stages(r['stages'])} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def epochs_table(entry):
    """Epoch times with the data resident (kernels; PyTorch and cuSPARSE
    per epoch), and each system's time per row over ours."""
    rows = ["| system | rows | epoch ms | samples/s | x ours | first epoch ms | setup s "
            "| test AUC | GPU peak MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for sid, r in entry["systems"].items():
        label = r.get("label", sid)
        if "error" in r or "skipped" in r:
            if not sid.startswith(("est_", "sk_")):
                rows.append(_failed_row(label, r, 8))
            continue
        if not r.get("epoch_ms"):
            continue
        rows.append(
            f"| {label} | {_f(r.get('rows'), ',')} | {_f(r.get('epoch_ms'), '.3f')} | "
            f"{_f(r.get('samples_per_s'), '.3g')} | {_f(r.get('x_ours'), '.2f')} | "
            f"{_f(r.get('first_epoch_ms'), '.2f')} | {_f(r.get('setup_s'), '.2f')} | "
            f"{_f(r.get('test_auc'), '.4f')} | {_f(_mib(r.get('gpu_peak_bytes')), '.0f')} |")
    return "\n".join(rows)


#: the columns of a grid table: (header, key, format, right-aligned)
_GRID_COLUMNS = {
    "torch": [("optimizer", "optimizer", "s", False), ("batch", "batch_size", ",", True),
              ("rate", "learning_rate", "g", True)],
    "lr": [("rate", "learning_rate", "g", True), ("C", "C", "g", True)],
}
_GRID_SCORES = [("best test AUC", "best_auc", ".4f", True),
                ("time to it s", "time_to_best_s", ".3g", True)]


def grid_table(r, kind="torch"):
    """A tuned system's grid (a PyTorch baseline's, ``kind="torch"``, or
    our adagrad LR's, ``"lr"``): every setting tried, the chosen one
    marked; an empty string without a grid."""
    grid = r.get("grid") or []
    if not grid:
        return ""
    on = r.get("tuned_on") or {}
    cols = _GRID_COLUMNS[kind] + _GRID_SCORES + (
        [("epoch ms", "epoch_ms", ".1f", True)] if kind == "torch" else [])
    how = "tuned as PyTorch's, on" if kind == "lr" else "tuned on"
    rows = [f"{r.get('label', kind)}: the grid ({how} {_f(on.get('rows'), ',')} rows, "
            f"{on.get('epochs', '?')} epoch(s); best test AUC, ties within 1e-4 by the time "
            "to it)", "",
            "| " + " | ".join(c[0] for c in cols) + " | chosen |",
            "|" + "|".join("---:" if c[3] else "---" for c in cols) + "|---|"]
    for i, t in enumerate(grid):
        rows.append("| " + " | ".join(_f(t.get(key), fmt) for _, key, fmt, _ in cols)
                    + f" | {'yes' if i == r.get('grid_best') else ''} |")
    return "\n".join(rows)


def _md_systems(res, part, title):
    block = res.get(part)
    if not block:
        return []
    L = [f"## {title}", ""]
    if isinstance(block.get("error"), str):
        return L + [f"The part failed: {block['error']}", ""]
    for name, entry in block.items():
        if name not in entries(block):
            what = entry.get("error") or entry.get("skipped") if isinstance(entry, dict) else entry
            L += [f"### {name}", "", f"{what}", ""]
            continue
        i = entry["info"]
        L += [f"### {name}", "",
              f"{i['rows']:,} train / {i['test_rows']:,} test rows, {i['features']:,} "
              f"features, {i['nnz_per_row']:.1f} nonzeros per row, CSR "
              f"{i['csr_bytes'] / 2**20:.1f} MiB"
              + (f"; floor {i['floor_ms']:.3f} ms" if "floor_ms" in i else "")
              + (f"; host->device {i['h2d_ms']:.1f} ms" if "h2d_ms" in i else "")
              + "".join(f"; target AUC {fam} {t['auc']:.4f} (from {t['from']})"
                        for fam, t in (entry.get("targets") or {}).items()
                        if fam in ("LR", "FM")), "",
              "End to end (from a scipy CSR in host memory, every copy included):", "",
              end_to_end_table(entry), ""]
        pred = prediction_table(entry)
        if pred:
            L += ["Prediction (`predict_proba`, `predict` for a regressor, of the first "
                  "test rows from a scipy CSR in host memory, the fitted model kept where "
                  "it was fitted):", "", pred, ""]
        stages = stages_table(entry)
        if stages:
            L += ["Where the fit's time goes (one more fit of each row with `verbose=1`, "
                  "its stage lines):", "", stages, ""]
        L += ["Epoch times (data resident on the device):", "",
              epochs_table(entry), ""]
        for sid in ("torch_lr", "torch_fm"):
            g = grid_table(entry["systems"].get(sid, {}))
            if g:
                L += [g, ""]
        g = grid_table(entry["systems"].get("ours_lr_adagrad", {}), "lr")
        if g:
            L += [g, ""]
    if part == "real":
        L += _md_real_summary(block)
        info = res.get("real_info") or {}
        if info.get("absent"):
            L += [f"Absent (skipped): {', '.join(info['absent'])} (looked in "
                  f"{info['data_dir']}).", ""]
    return L


REAL_SUMMARY = ("ours_lr_adagrad", "ours_fm", "ours_fm_scaled", "est_lr_lbfgs", "sk_lr",
                "est_lr_default", "est_fm_default", "sk_lr_default", "sk_lr_best",
                "torch_lr", "torch_fm", "ours_fm_reg", "est_fm_reg", "est_fm_reg_default",
                "est_fm_reg_mcmc", "sk_ridge")


def _md_real_summary(block):
    """One line per real dataset: test AUC (RMSE for regression) of each system."""
    ran = entries(block)
    cols = [c for c in REAL_SUMMARY if any(c in e["systems"] for e in ran.values())]
    if not cols:
        return []
    label = {c: next(e["systems"][c].get("label", c) for e in ran.values()
                     if c in e["systems"]) for c in cols}
    L = ["### Summary: test AUC (RMSE for regression)", "",
         "| dataset | " + " | ".join(label[c] for c in cols) + " | ours epoch ms |",
         "|---|" + "---:|" * (len(cols) + 1)]
    for name, e in ran.items():
        cells = []
        for c in cols:
            r = e["systems"].get(c, {})
            v = r.get("test_auc", r.get("test_rmse"))
            cells.append(_f(v, ".4f") if v is not None else ("err" if "error" in r else "-"))
        ep = e["systems"].get("ours_lr_adagrad", e["systems"].get("ours_fm_reg", {}))
        L.append(f"| {name} | " + " | ".join(cells) + f" | {_f(ep.get('epoch_ms'), '.3f')} |")
    return L + [""]


def _md_startup(res):
    st = res.get("startup")
    if not st:
        return []
    if "models" not in st:
        return ["## Start-up", "", f"The part failed: {st.get('error')}", ""]
    L = ["## Start-up: the first fit of a fresh process", "",
         f"{st['rows']:,} rows; each figure from its own process. Cold: CuPy's kernel cache "
         f"empty (target {st['cold_target_s']:g} s); warm cache: the next process, the cache "
         f"the cold one filled (target: at most {st['warm_over_target_s']:g} s over the warm "
         "fit); warm fit: a second fit in the same process. Kernels: the seconds the first "
         "fit's verbose lines give to compiling (or loading) our kernels; modules compiled: "
         "CuPy's cache entries written by the process, ours and CuPy's own kernels.", "",
         "| model | cold first fit s | kernels s | modules compiled (ours / CuPy) | warm cache "
         "first fit s | over warm s | warm fit s | import s | targets met |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for mid, r in st["models"].items():
        label = r.get("label", mid)
        if "cold_first_fit_s" not in r:
            what = r.get("error") or r.get("skipped") or "?"
            L.append(f"| {label} | {what[:150].replace('|', '/')} ||||||||")
            continue
        m = r.get("modules_compiled_cold") or {}
        L.append(f"| {label} | {r['cold_first_fit_s']:.2f} | {r['cold_kernels_s']:.2f} | "
                 f"{m.get('ours', '-')} / {m.get('cupy', '-')} | "
                 f"{r['warm_cache_first_fit_s']:.3f} | {r['warm_cache_over_warm_s']:.3f} | "
                 f"{r['warm_fit_s']:.3f} | {r['import_s']:.2f} | "
                 f"cold {'yes' if r['cold_ok'] else 'no'}, warm cache "
                 f"{'yes' if r['warm_cache_ok'] else 'no'} |")
    return L + [""]


def _md_ablation(res):
    ab = res.get("ablation")
    if not ab:
        return []
    if "models" not in ab:
        return ["## Ablation", "", f"The part failed: {ab.get('error')}", ""]
    L = ["## Ablation (cuWide paper style)", "", f"Data: {ab['data']}.", ""]
    for model, rows in ab["models"].items():
        L += [f"### {model}", "",
              "| variant | epoch ms | x flow | first epoch ms | test AUC | note |",
              "|---|---:|---:|---:|---:|---|"]
        for r in rows:
            note = r.get("error") or r.get("skipped") or r.get("note") or ""
            L.append(f"| {r['label']} | {_f(r.get('epoch_ms'), '.3f')} | "
                     f"{_f(r.get('x_flow'), '.2f')} | {_f(r.get('first_epoch_ms'), '.2f')} | "
                     f"{_f(r.get('test_auc'), '.4f')} | {note[:120].replace('|', '/')} |")
        L.append("")
    return L


def _md_scaling(res):
    sc = res.get("scaling")
    if not sc:
        return []
    if "fits" not in sc:
        return ["## Scaling", "", f"The part failed: {sc.get('error')}", ""]
    L = ["## Scaling", ""]
    for sweep, xname in (("rows", "rows"), ("features", "features"), ("factors", "n_factors")):
        for model, pts in (sc.get(sweep) or {}).items():
            fit = sc["fits"].get(f"{sweep} {model}")
            sat = (fit or {}).get("saturated")
            L += [f"### epoch time vs {xname}, {model}"
                  + (f" — log-log slope {fit['slope']:.3f} (R² {fit['r2']:.3f})"
                     + (f"; busy points {sat['slope']:.3f} (R² {sat['r2']:.3f})" if sat else "")
                     + (f", linear: {fit['linear']}" if "linear" in fit else "")
                     if fit else ""), "",
                  f"| {xname} | epoch ms | first epoch ms | floor ms | setup s | workers |",
                  "|---:|---:|---:|---:|---:|---:|"]
            for p in pts:
                if "epoch_ms" in p:
                    L.append(f"| {p['x']:,} | {p['epoch_ms']:.3f} | {p['first_epoch_ms']:.2f} | "
                             f"{_f(p.get('floor_ms'), '.3f')} | {p['setup_s']:.2f} | "
                             f"{_f(p.get('workers'), 'd')} |")
                else:
                    L.append(f"| {p['x']:,} | {(p.get('error') or p.get('skipped', ''))[:80]} "
                             "|||||")
            L.append("")
    return L


def _md_tail(res):
    est = (res.get("config") or {}).get("estimates", {})
    L = ["## Part timings", "", "| part | seconds | estimate |", "|---|---:|---:|"]
    L += [f"| {p} | {s:.1f} | {est.get(p, '-')} |" for p, s in res.get("timings", {}).items()]
    if res.get("compile_s"):
        L += ["", "Kernel compilation and warm-up (excluded from timings): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in res["compile_s"].items())]
    if res.get("data_generated"):
        L += ["", "Data generation: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in res["data_generated"].items())]
    L += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    if res.get("errors"):
        L += ["", "## Errors recorded", ""] + [f"- {e}" for e in res["errors"]]
    return L


def write_markdown(res, path):
    """results.md; a section that cannot be written says so, the others still are."""
    L = []
    for fn, a in ((_md_header, ()), (_md_floors, ()), (_md_startup, ()),
                  (_md_systems, ("systems", "Systems side by side (synthetic data)")),
                  (_md_systems, ("real", "Systems side by side (real datasets)")),
                  (_md_ablation, ()), (_md_scaling, ()), (_md_tail, ())):
        try:
            L += fn(res, *a)
        except Exception as exc:
            L += [f"(section {fn.__name__}{a[:1]} could not be written: "
                  f"{type(exc).__name__}: {exc})", ""]
    Path(path).write_text("\n".join(L) + "\n")


# --------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_systems(res, path):
    """Epoch ms per million rows of every epoch-based system, per synthetic dataset."""
    blocks = [(n, e) for n, e in entries(res.get("systems")).items()
              if any(_ok(r.get("ms_per_mrow")) for r in e["systems"].values())]
    if not blocks:
        return None
    plt = _plt()
    heights = [max(2.0, 0.45 * sum(_ok(r.get("ms_per_mrow")) for r in e["systems"].values())
                   + 1.2) for _, e in blocks]
    fig, axes = plt.subplots(len(blocks), 1, figsize=(9, sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (name, entry) in zip(axes[:, 0], blocks):
        rows = sorted(((r.get("label", sid), r["ms_per_mrow"]) for sid, r in
                       entry["systems"].items() if _ok(r.get("ms_per_mrow"))),
                      key=lambda t: t[1], reverse=True)
        ax.barh([lab for lab, _ in rows], [v for _, v in rows],
                color=["tab:green" if lab.startswith("ours") else "tab:gray" for lab, _ in rows])
        ax.set_xscale("log")
        info = entry.get("info", {})
        if _ok(info.get("floor_ms")) and info.get("rows"):
            floor = info["floor_ms"] / info["rows"] * 1e6
            ax.axvline(floor, color="tab:red", ls="--", lw=1)
            ax.text(floor, -0.6, " floor", color="tab:red", fontsize=8, va="top")
        for i, (_, v) in enumerate(rows):
            ax.text(v, i, f" {v:.3g}", va="center", fontsize=8)
        ax.set_xlabel("epoch time per million training rows (ms), log scale")
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("Systems side by side (lower is faster)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ablation(res, path):
    ab = res.get("ablation") or {}
    models = {m: [r for r in rows if _ok(r.get("epoch_ms"))]
              for m, rows in (ab.get("models") or {}).items()}
    models = {m: rows for m, rows in models.items() if rows}
    if not models:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, (model, rows) in zip(axes[0], models.items()):
        x = range(len(rows))
        vals = [r["epoch_ms"] for r in rows]
        ax.bar(x, vals, color=["tab:green" if r["id"] == "flow" else "tab:orange"
                               if r["id"] == "classic" else "tab:blue" for r in rows])
        for i, r in enumerate(rows):
            auc = r.get("test_auc")
            if isinstance(auc, float) and math.isfinite(auc):
                ax.text(i, vals[i], f"AUC\n{auc:.4f}", ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["id"] for r in rows], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("epoch ms (log scale)")
        ax.set_title(f"{model}: {ab.get('data', '')}", fontsize=10)
    fig.suptitle("Ablation: classic schema, flow-based kernel, each optimisation off",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(res, path):
    sc = res.get("scaling") or {}
    panels = [(s, x) for s, x in (("rows", "training rows"), ("features", "features"),
                                  ("factors", "n_factors"))
              if any(_ok(p.get("epoch_ms")) for pts in (sc.get(s) or {}).values() for p in pts)]
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.3), squeeze=False)
    fits = sc.get("fits") or {}
    for ax, (sweep, xname) in zip(axes[0], panels):
        for model, pts in sc[sweep].items():
            ok = [p for p in pts if _ok(p.get("epoch_ms"))]
            if not ok:
                continue
            fit = fits.get(f"{sweep} {model}")
            line, = ax.plot([p["x"] for p in ok], [p["epoch_ms"] for p in ok], "o-",
                            label=model + (f" (slope {fit['slope']:.2f})" if fit else ""))
            idle = [p for p in ok if not busy(p, ok)]  # hollow: fewer workers
            if idle:
                ax.plot([p["x"] for p in idle], [p["epoch_ms"] for p in idle], "o",
                        mfc="white", color=line.get_color())
        floor = sorted({(p["x"], p["floor_ms"]) for pts in sc[sweep].values() for p in pts
                        if _ok(p.get("floor_ms"))})
        if floor and sweep != "factors":
            ax.plot([f[0] for f in floor], [f[1] for f in floor], "--", color="tab:red", lw=1,
                    label="floor (CSR bytes / copy bandwidth)")
        ax.set_xscale("log", base=2 if sweep != "rows" else 10)
        ax.set_yscale("log")
        ax.set_xlabel(xname + " (log)")
        ax.set_ylabel("epoch ms (log)")
        ax.set_title(f"epoch time vs {xname}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Scaling (log-log; hollow: fewer workers than the sweep's most)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(res, out_dir):
    """The PNG plots of a results dict; the paths written (a plot with
    nothing to show is not)."""
    made = []
    for fn, name in ((plot_systems, "systems.png"), (plot_ablation, "ablation.png"),
                     (plot_scaling, "scaling.png")):
        p = fn(res, Path(out_dir) / name)
        if p is not None:
            made.append(p)
    return made


# --------------------------------------------------------------------------
# the short table printed last
# --------------------------------------------------------------------------
def short_table(res):
    out = []
    for name, entry in entries(res.get("systems")).items():
        if not entry.get("main"):
            continue
        tg = ", ".join(f"{fam} {t['auc']:.4f}" for fam, t in (entry.get("targets") or {}).items()
                       if fam in ("LR", "FM"))
        out.append(f"\n{name} (epoch floor {_f(entry['info'].get('floor_ms'), '.3f')} ms; "
                   f"target test AUC {tg or '-'})")
        out.append(f"{'system':48s} {'epoch ms':>10s} {'x ours':>7s} {'fit s':>7s} "
                   f"{'t->tgt s':>8s} {'xPT fit':>7s} {'xPT tgt':>7s} {'AUC':>7s} "
                   f"{'GPU MiB':>8s}")
        for sid, r in entry["systems"].items():
            label = r.get("label", sid)[:48]
            if "error" in r or "skipped" in r:
                what = ("ERROR " + r["error"]) if "error" in r else "skipped: " + r["skipped"]
                out.append(f"{label:48s} " + what[:60])
                continue
            out.append(f"{label:48s} {_f(r.get('epoch_ms'), '10.3f'):>10s} "
                       f"{_f(r.get('x_ours'), '7.2f'):>7s} {_f(r.get('fit_s'), '7.2f'):>7s} "
                       f"{_f(r.get('time_to_target_s'), '8.3g'):>8s} "
                       f"{_f(r.get('x_torch_fit'), '7.2f'):>7s} "
                       f"{_f(r.get('x_torch_target'), '7.2f'):>7s} "
                       f"{_f(r.get('test_auc'), '7.4f'):>7s} "
                       f"{_f(_mib(r.get('gpu_peak_bytes')), '8.0f'):>8s}")
    st = res.get("startup")
    if st and st.get("models"):
        out.append(f"\nstart-up ({st['rows']:,} rows): cold first fit / warm-cache first fit / "
                   "warm fit, seconds")
        for mid, r in st["models"].items():
            out.append(f"  {mid:6s} " + (
                f"{r['cold_first_fit_s']:.2f} / {r['warm_cache_first_fit_s']:.3f} / "
                f"{r['warm_fit_s']:.3f}" if "cold_first_fit_s" in r else
                (r.get("error") or r.get("skipped") or "")[:70]))
    ab = res.get("ablation")
    if ab and ab.get("models"):
        out.append(f"\nablation ({ab['data']}): epoch ms (x flow) / first epoch ms / AUC")
        for model, rows in ab["models"].items():
            for r in rows:
                if "epoch_ms" in r:
                    out.append(f"  {model:5s} {r['id']:16s} {r['epoch_ms']:10.3f} "
                               f"({_f(r.get('x_flow'), '.2f')}) / {r['first_epoch_ms']:.2f} / "
                               f"{_f(r.get('test_auc'), '.4f')}")
                else:
                    out.append(f"  {model:5s} {r['id']:16s} "
                               + (r.get("error") or r.get("skipped") or "")[:70])
    sc = res.get("scaling")
    if sc and "fits" in sc:
        out.append("\nscaling (log-log slopes)")
        for key, fit in sc["fits"].items():
            if fit:
                sat = fit.get("saturated")
                out.append(f"  {key:16s} slope {fit['slope']:.3f}  R2 {fit['r2']:.3f}"
                           + (f"  busy-points slope {sat['slope']:.3f}" if sat else "")
                           + (f"  linear: {fit['linear']}" if "linear" in fit else ""))
    out.append("\nparts: " + ", ".join(f"{p} {s:.0f}s" for p, s in res.get("timings", {}).items()))
    out.append(f"errors recorded: {len(res.get('errors', []))} (see results.json / results.md)")
    return "\n".join(out)
