"""Merge the parts of several runs of the suite into one results folder.

The device gives a session 30 minutes, so the suite's parts may run in
different calls.  Later runs replace the parts they ran; each run's header
(command, date, commit) is kept under ``runs``; results.md and the plots
are rewritten.

    PYTHONPATH=. python benchmarks/merge_results.py OUT_DIR RUN1/results.json RUN2/results.json \
        [--commit RUN2=abc1234 ...] [--drop-epoch SYSTEM=K:WHY ...] [--add-points]

``--drop-epoch``: a system's epoch time is recomputed without its epoch K
(1-based; the median of the other epochs after the first), for an epoch a
run is known to have spoiled (e.g. a kernel compiled inside it); the raw
value stays as ``epoch_ms_raw`` and the notes say why.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402
import run_all  # noqa: E402

#: what a part writes into results.json
PART_KEYS = {
    "floors": ["floors"],
    "systems": ["systems"],
    "real": ["real", "real_info"],
    "ablation": ["ablation"],
    "scaling": ["scaling"],
}


def _merge_scaling(old, new, add_points=False, run=None):
    """A later run's scaling part replaces the sweeps it ran (rows, features,
    factors) and keeps the earlier run's others (``--scale-sweeps``).  With
    ``add_points`` its points join the earlier ones instead (a point of the
    same x replaces the earlier one), tagged with their run, and the slopes
    are fitted again over all of them."""
    if not isinstance(old, dict) or not isinstance(new, dict) or "error" in new:
        return new
    out = dict(old)
    out["fits"] = dict(old.get("fits") or {})
    for sweep in ("rows", "features", "factors"):
        if not new.get(sweep):
            continue
        if not add_points:
            out[sweep] = new[sweep]
            out["fits"] = {k: v for k, v in out["fits"].items() if not k.startswith(sweep + " ")}
            out["fits"].update({k: v for k, v in (new.get("fits") or {}).items()
                                if k.startswith(sweep + " ")})
            continue
        merged = {m: list(pts) for m, pts in (old.get(sweep) or {}).items()}
        for model, pts in new[sweep].items():
            fresh = [dict(p, run=run) if run is not None else dict(p) for p in pts]
            xs = {p["x"] for p in fresh}
            keep = [p for p in merged.get(model, []) if p["x"] not in xs]
            merged[model] = sorted(keep + fresh, key=lambda p: p["x"])
        out[sweep] = merged
    if add_points:
        out["fits"] = run_all.scaling_fits(out)
    return out


def merge(results, commits=None, add_points=False):
    commits = commits or {}
    out = {"runs": []}
    for i, res in enumerate(results):
        parts = [p for p, keys in PART_KEYS.items() if any(k in res for k in keys)]
        # an earlier merge keeps its runs' headers (a later merge adds a run to it)
        runs = ([dict(r) for r in res["runs"]] if res.get("runs") else
                [{"env": dict(res.get("env") or {}), "parts": parts,
                  "timings": res.get("timings", {})}])
        if str(i) in commits:  # an earlier merge: its last run
            runs[-1]["env"] = {**runs[-1]["env"], "git_commit": commits[str(i)],
                               "git_dirty_files": 0}
        out["runs"].extend(runs)
        for p in parts:
            for k in PART_KEYS[p]:
                if k in res:
                    out[k] = (_merge_scaling(out.get(k), res[k], add_points, len(out["runs"]))
                              if k == "scaling" else res[k])
        for k in ("compile_s", "data_generated"):
            out.setdefault(k, {}).update(res.get(k) or {})
        out["config"] = {**out.get("config", {}), **(res.get("config") or {})}
        out["notes"] = [n for n in res.get("notes", out.get("notes", []))
                        if not n.startswith(("Merged from several runs", "- run "))]
        out["errors"] = out.get("errors", []) + list(res.get("errors") or [])
    out["env"] = out["runs"][-1]["env"]
    out["timings"] = {f"run {i + 1}: {p}": s for i, r in enumerate(out["runs"])
                      for p, s in r["timings"].items()}
    runs_md = [f"- run {i + 1}: `{r['env'].get('command')}` ({r['env'].get('date_utc')}, commit "
               f"{r['env'].get('git_commit')}): {', '.join(r['parts']) or 'env only'}"
               for i, r in enumerate(out["runs"])]
    out["notes"] = ["Merged from several runs (benchmarks/merge_results.py); each part comes "
                    "from the last run that ran it:"] + runs_md + out["notes"]
    return out


def drop_epoch(res, sid, k, why):
    """Recompute ``sid``'s epoch time (every dataset) without epoch ``k``."""
    import numpy as np

    for name, entry in (res.get("systems") or {}).items():
        r = (entry.get("systems") or {}).get(sid) if isinstance(entry, dict) else None
        if not r or len(r.get("epoch_ms_list") or []) < max(k, 3):
            continue
        times = r["epoch_ms_list"]
        kept = [t for i, t in enumerate(times[1:], start=2) if i != k]
        r["epoch_ms_raw"] = r["epoch_ms"]
        r["epoch_ms"] = float(np.median(kept))
        r["epoch_ms_note"] = f"epoch {k} ({times[k - 1]:.1f} ms) left out: {why}"
        run_all.derive_rates(entry)
        res["notes"].append(f"{name}, {r.get('label', sid)}: epoch ms {r['epoch_ms']:.3f} "
                            f"(the run's median {r['epoch_ms_raw']:.3f}): {r['epoch_ms_note']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--commit", action="append", default=[],
                    help="INDEX=SHA: the commit run INDEX (0-based) ran, when its own header "
                         "could not know it")
    ap.add_argument("--add-points", action="store_true",
                    help="a later run's scaling points join the earlier ones (same x: "
                         "replaced) instead of replacing its sweeps")
    ap.add_argument("--drop-epoch", action="append", default=[],
                    help="SYSTEM=K:WHY: recompute SYSTEM's epoch time without its epoch K")
    args = ap.parse_args(argv)
    commits = dict(c.split("=", 1) for c in args.commit)
    res = merge([json.loads(Path(p).read_text()) for p in args.results], commits,
                args.add_points)
    for spec in args.drop_epoch:
        sid, rest = spec.split("=", 1)
        k, why = rest.split(":", 1)
        drop_epoch(res, sid, int(k), why)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    run_all.write_markdown(res, out / "results.md")
    for p in plots.make_plots(res, str(out)):
        print(p)
    print(run_all.short_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
