"""Plots of the benchmark suite (matplotlib, Agg backend), from its results.

``benchmarks/run_all.py`` calls :func:`make_plots` at the end of a run; the
same plots can be drawn again from a saved ``results.json``::

    python benchmarks/plots.py benchmarks/results/suite/results.json [--out DIR]

Three PNG files (few files: the device machine returns at most eight):

``systems.png``
    Epoch time per million rows of every epoch-based system on each
    synthetic dataset (log scale), the floor marked.
``ablation.png``
    Epoch time of each ablation variant, LR and FM side by side, with the
    test AUC written on the bars.
``scaling.png``
    Epoch time against rows, features and ``n_factors``, log-log, with the
    fitted slope of each curve and a slope-1 guide on the rows panel.
"""

import argparse
import json
import math
import sys
from pathlib import Path

__all__ = ["make_plots"]


#: a scaling point counts as "every block busy" when its workers' thread
#: blocks (workers x blocks per worker) fill at least this share of the blocks
#: the device runs at once (the 4M-row point: 244 workers of 264 slots)
BUSY_SHARE = 0.9


def busy_grid(p):
    """Whether a scaling point kept the device's blocks busy: its workers
    times their thread block cluster size (1 where not recorded: plain
    blocks) against the full grid; True without a grid (the CPU)."""
    blocks, full = p.get("blocks"), p.get("full_grid")
    if not blocks or not full:
        return True
    return blocks * p.get("cluster", 1) >= BUSY_SHARE * full


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def plot_systems(res, path):
    """Horizontal bars: epoch ms per million rows, per synthetic dataset."""
    blocks = [(name, e) for name, e in (res.get("systems") or {}).items()
              if isinstance(e, dict) and "systems" in e]
    blocks = [(n, e) for n, e in blocks
              if any(_ok(r.get("ms_per_mrow")) for r in e["systems"].values())]
    if not blocks:
        return None
    plt = _plt()
    heights = [max(2.0, 0.45 * sum(_ok(r.get("ms_per_mrow")) for r in e["systems"].values()) + 1.2)
               for _, e in blocks]
    fig, axes = plt.subplots(len(blocks), 1, figsize=(9, sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (name, entry) in zip(axes[:, 0], blocks):
        rows = [(r.get("label", sid), r["ms_per_mrow"], r.get("family", ""))
                for sid, r in entry["systems"].items() if _ok(r.get("ms_per_mrow"))]
        rows.sort(key=lambda t: t[1], reverse=True)
        colors = ["tab:green" if lab.startswith("ours") else "tab:gray" for lab, _, _ in rows]
        ax.barh([lab for lab, _, _ in rows], [v for _, v, _ in rows], color=colors)
        ax.set_xscale("log")
        info = entry.get("info", {})
        if _ok(info.get("floor_ms")) and info.get("rows"):
            floor = info["floor_ms"] / info["rows"] * 1e6
            ax.axvline(floor, color="tab:red", ls="--", lw=1)
            ax.text(floor, -0.6, " floor", color="tab:red", fontsize=8, va="top")
        for i, (_, v, _) in enumerate(rows):
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
        labels = [r["id"] for r in rows]
        vals = [r["epoch_ms"] for r in rows]
        colors = ["tab:green" if r["id"] == "flow" else
                  "tab:orange" if r["id"] == "classic" else "tab:blue" for r in rows]
        x = range(len(rows))
        ax.bar(x, vals, color=colors)
        firsts = [r.get("first_epoch_ms") for r in rows]
        ax.scatter(x, [f if _ok(f) else float("nan") for f in firsts], marker="_", s=300,
                   color="black", label="first epoch (upload included in the stream rows)")
        for i, r in enumerate(rows):
            auc = r.get("test_auc")
            if isinstance(auc, float) and math.isfinite(auc):
                ax.text(i, vals[i], f"AUC\n{auc:.4f}", ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("epoch ms (log scale)")
        ax.set_title(f"{model}: {ab.get('data', '')}", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("Ablation: classic schema, flow-based kernel, each optimisation off",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(res, path):
    sc = res.get("scaling") or {}
    panels = [("rows", "training rows"), ("features", "features"), ("factors", "n_factors")]
    panels = [(s, x) for s, x in panels if any(
        any(_ok(p.get("epoch_ms")) for p in pts) for pts in (sc.get(s) or {}).values())]
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
            xs = [p["x"] for p in ok]
            ys = [p["epoch_ms"] for p in ok]
            fit = fits.get(f"{sweep} {model}")
            sat = (fit or {}).get("saturated")
            lab = model + (f" (slope {fit['slope']:.2f}" if fit else "")
            if fit:
                lab += f"; every block busy: {sat['slope']:.2f})" if sat else ")"
            line, = ax.plot(xs, ys, "o-", label=lab)
            # hollow: fewer busy blocks than the device runs at once (latency-bound)
            part = [p for p in ok if not busy_grid(p)]
            if part:
                ax.plot([p["x"] for p in part], [p["epoch_ms"] for p in part], "o",
                        mfc="white", color=line.get_color())
            if sweep == "rows" and len(xs) >= 2:
                busy = [p for p in ok if p not in part] or ok
                x0, y0 = busy[0]["x"], busy[0]["epoch_ms"]
                ax.plot([x0, xs[-1]], [y0, y0 * xs[-1] / x0], ":", color="gray", lw=1)
        floors = [(p["x"], p["floor_ms"]) for pts in sc[sweep].values() for p in pts
                  if _ok(p.get("floor_ms"))]
        if floors and sweep != "factors":
            floors = sorted(set(floors))
            ax.plot([f[0] for f in floors], [f[1] for f in floors], "--", color="tab:red",
                    lw=1, label="floor (CSR bytes / copy bandwidth)")
        ax.set_xscale("log", base=2 if sweep != "rows" else 10)
        ax.set_yscale("log")
        ax.set_xlabel(xname + " (log)")
        ax.set_ylabel("epoch ms (log)")
        ax.set_title(f"epoch time vs {xname}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Scaling (log-log; dotted: slope 1 through the first point with every "
                 "block busy; hollow: fewer blocks than the device runs at once)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(res, out_dir):
    """Draw the PNG plots of a results dict into ``out_dir``; returns the
    paths written (a plot with nothing to show is not written)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for fn, name in ((plot_systems, "systems.png"), (plot_ablation, "ablation.png"),
                     (plot_scaling, "scaling.png")):
        p = fn(res, out_dir / name)
        if p is not None:
            made.append(p)
    return made


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot a benchmark suite's results.json.")
    ap.add_argument("results", help="path of results.json")
    ap.add_argument("--out", default=None, help="folder for the PNGs (default: beside it)")
    args = ap.parse_args(argv)
    res = json.loads(Path(args.results).read_text())
    out = args.out or str(Path(args.results).resolve().parent)
    for p in make_plots(res, out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
