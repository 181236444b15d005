"""Draw the architecture diagram of the docs: ``docs/_static/architecture.png``.

Run it after changing the picture (the PNG is committed; the docs build does
not run this script)::

    python docs/make_diagram.py            # writes docs/_static/architecture.png
    python docs/make_diagram.py --out x.png

Three panels: the path of a fit through the package (top), the tiled
training layout (bottom left) and one thread block's aggregate / loss /
apply flows over one sample block (bottom right).  Needs only matplotlib.
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

OUT = Path(__file__).resolve().parent / "_static" / "architecture.png"

# colours (colour-blind safe, print friendly)
BLUE = "#4C72B0"
ORANGE = "#DD8452"
GREEN = "#55A868"
RED = "#C44E52"
PURPLE = "#8172B3"
GREY = "#8C8C8C"
LIGHT = {
    BLUE: "#DCE6F2",
    ORANGE: "#F8E1D2",
    GREEN: "#DDEEDF",
    RED: "#F3DADB",
    PURPLE: "#E5E1F0",
    GREY: "#EFEFEF",
}


def box(ax, x, y, w, h, title, body="", color=BLUE, title_size=9.5, body_size=7.8):
    """A rounded box with a bold title line and a smaller body."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y), w, h,
            boxstyle="round,pad=0.15,rounding_size=0.6",
            linewidth=1.2, edgecolor=color, facecolor=LIGHT[color],
        )
    )
    ax.text(x + w / 2, y + h - 0.9, title, ha="center", va="top",
            fontsize=title_size, fontweight="bold", color="#222222")
    if body:
        ax.text(x + w / 2, y + h - 3.0, body, ha="center", va="top",
                fontsize=body_size, color="#222222", linespacing=1.35)


def arrow(ax, a, b, color="#333333", text=None, text_xy=None, rad=0.0, lw=1.4,
          size=8, style="-|>", ls="-"):
    ax.add_patch(
        FancyArrowPatch(
            a, b, arrowstyle=style, mutation_scale=12, linewidth=lw, color=color,
            connectionstyle=f"arc3,rad={rad}", linestyle=ls,
        )
    )
    if text:
        tx, ty = text_xy if text_xy else ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
        ax.text(tx, ty, text, ha="center", va="center", fontsize=size, color=color,
                fontweight="bold",
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.9))


def panel_title(ax, x, y, text):
    ax.text(x, y, text, ha="left", va="bottom", fontsize=11.5, fontweight="bold",
            color="#111111")


# --------------------------------------------------------------------------
# top: the path of a fit
# --------------------------------------------------------------------------
def draw_pipeline(ax):
    panel_title(ax, 1, 95.5, "The modules, in the order a mini-batch fit goes through them (L-BFGS: estimators -> solvers -> backends)")
    y, h = 79.0, 15.5
    specs = [
        ("Estimators", "_logistic.py, _fm.py\n_base.py: parameters,\ninput checks, device,\n"
         "prediction, pickling", BLUE),
        ("Driver", "_minibatch.py\nfit_heads: early-stopping\nsplit, one layout,\n"
         "one solver call per model", BLUE),
        ("Layout", "_layout.py\nplan: ranks, rows, blocks,\nhot features, chunks;\n"
         "tiles of a chunk\n(numpy or cupy)", ORANGE),
        ("Solvers", "_solvers.py: fit_minibatch,\nfit_lbfgs_linear\n_lbfgs.py, _loss.py,\n"
         "_state.py (arrays in,\narrays out)", PURPLE),
        ("Backends", "Backend (the interface)\n_cpu.py: numpy, in order\n(the reference)\n"
         "_concurrency.py, _tiles.py\n(pure policies)", GREEN),
        ("CUDA backend", "_backends/_cuda/: _runtime,\n_layout + _upload, _train,\n_predict, "
         "_lbfgs, _validate,\n_ablation (benchmarks only)\n<- cuda/*.cu via _kernels.py", GREEN),
    ]
    w, gap, x = 14.6, 2.0, 1.0
    centers = []
    for title, body, color in specs:
        box(ax, x, y, w, h, title, body, color, body_size=7.6)
        centers.append((x, x + w))
        x += w + gap
    for (a0, a1), (b0, b1) in zip(centers[:-1], centers[1:]):
        arrow(ax, (a1 + 0.25, y + h / 2), (b0 - 0.25, y + h / 2))


# --------------------------------------------------------------------------
# bottom left: the tiled layout
# --------------------------------------------------------------------------
def draw_layout(ax):
    panel_title(ax, 1, 72.0, "The training layout (one copy of X, made once per fit)")
    x0, y0, W, H = 8.0, 14.0, 30.0, 52.0
    n_hot_x = x0 + 8.5
    rng = np.random.default_rng(3)
    # mini-batches (2) x sample blocks (2 each)
    sb_h = H / 4
    for i in range(4):
        yb = y0 + H - (i + 1) * sb_h
        ax.add_patch(Rectangle((x0, yb), n_hot_x - x0, sb_h, facecolor=LIGHT[RED],
                               edgecolor=RED, linewidth=0.9))
        ax.add_patch(Rectangle((n_hot_x, yb), x0 + W - n_hot_x, sb_h,
                               facecolor=LIGHT[BLUE], edgecolor=BLUE, linewidth=0.9))
        # nonzeros: dense on the hot (left) side, sparse in the long tail
        n = 90
        fx = x0 + 0.4 + (W - 0.8) * rng.random(n) ** 2.5
        fy = yb + 0.5 + (sb_h - 1.0) * rng.random(n)
        ax.scatter(fx, fy, s=4, color="#333333", linewidths=0, zorder=3)
    for i in (0, 2, 4):  # mini-batch boundaries
        yy = y0 + H - i * sb_h
        ax.plot([x0 - 5.5, x0 + W], [yy, yy], color="#111111", linewidth=2.0)
    ax.plot([n_hot_x, n_hot_x], [y0 - 1.0, y0 + H + 1.0], color=RED, linewidth=1.4,
            linestyle="--")
    ax.text(n_hot_x, y0 + H + 1.4, "n_hot", ha="center", va="bottom", fontsize=8,
            color=RED, fontweight="bold")
    ax.text(x0 + W / 2, y0 - 1.2,
            "features, renumbered by frequency (hot ids first) ->",
            ha="center", va="top", fontsize=8)
    for i, lab in enumerate(["mini-batch 0", "mini-batch 1"]):
        yy = y0 + H - (2 * i + 1) * sb_h
        ax.text(x0 - 3.0, yy, lab, rotation=90, ha="center", va="center", fontsize=8,
                fontweight="bold")
    for i in range(4):
        yy = y0 + H - (i + 0.5) * sb_h
        ax.text(x0 - 1.0, yy, f"sb {i}", ha="right", va="center", fontsize=7,
                color="#444444")
    ax.text((x0 + n_hot_x) / 2, y0 + H - 0.5 * sb_h, "hot\ntile", ha="center",
            va="center", fontsize=8, color=RED, fontweight="bold",
            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    ax.text((n_hot_x + x0 + W) / 2, y0 + H - 0.5 * sb_h, "cold tile", ha="center",
            va="center", fontsize=8, color=BLUE, fontweight="bold",
            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    notes = (
        "tile = sample block x {hot, cold}\n"
        "sample block: rows whose per-sample\n"
        "  accumulators fit in shared memory\n"
        "inside a tile: sorted by feature,\n"
        "  then row (feature-major);\n"
        "  duplicates summed\n\n"
        "per nonzero, 10 bytes:\n"
        "  feat int32 | row uint16 | val float32\n"
        "plus tile_ptr, sblock_row_ptr,\n"
        "  batch_sblock_ptr (int64, small)\n\n"
        "rows visited in the same order by\n"
        "both backends; the mapping back to\n"
        "the user's feature order is kept"
    )
    ax.text(x0 + W + 1.5, y0 + H, notes, ha="left", va="top", fontsize=7.6,
            linespacing=1.35, family="DejaVu Sans")


# --------------------------------------------------------------------------
# bottom right: one thread block, one sample block
# --------------------------------------------------------------------------
def draw_flows(ax):
    panel_title(ax, 55, 72.0, "One thread block, one sample block: three flows")
    # global memory (bottom) and shared memory (top)
    ax.add_patch(FancyBboxPatch((55, 12.0), 44, 19.0, boxstyle="round,pad=0.2",
                                facecolor=LIGHT[GREY], edgecolor=GREY, linewidth=1.0))
    ax.text(98.5, 30.6, "global memory", fontsize=8.5, fontweight="bold",
            color="#444444", va="top", ha="right")
    ax.add_patch(FancyBboxPatch((55, 36.5), 44, 33.5, boxstyle="round,pad=0.2",
                                facecolor="#FBFBF4", edgecolor="#B8B07A", linewidth=1.0))
    ax.text(98.5, 69.5, "shared memory of the block", fontsize=8.5, fontweight="bold",
            color="#6B6433", va="top", ha="right")

    box(ax, 57, 13.5, 12, 11.5, "tiles", "feat | row | val\nhot tile, then\ncold tile",
        ORANGE, title_size=8.5, body_size=7.2)
    box(ax, 72, 13.5, 26, 11.5, "model state (float32)",
        "w, V, b and Adagrad's G;\nupdated by atomic adds (L1: CAS)", GREEN,
        title_size=8.5, body_size=7.2)

    box(ax, 57, 47.0, 16.5, 16.0, "per-sample acc",
        "acc[row]: margin and the\nFM sums  sum_f v_f x_f;\nthen, in place, the\n"
        "scaled loss derivative", PURPLE, title_size=8.5, body_size=7.2)
    box(ax, 77, 54.0, 20.5, 9.5, "hot cache",
        "weights (+ factors) of the hot\nfeatures, loaded per sample block", RED,
        title_size=8.5, body_size=7.2)
    box(ax, 77, 39.5, 20.5, 11.5, "hot gradient replicas",
        "n_rep copies (4 for binary LR,\n2 or 1 for FM): fewer\natomic conflicts", RED,
        title_size=8.5, body_size=7.2)

    # 1 aggregate: feature -> sample (hot weights from the cache, cold from global)
    arrow(ax, (63, 25.4), (63, 46.6), color=BLUE,
          text="1 aggregate\nfeature -> sample", text_xy=(63.2, 35.5), size=7.5)
    arrow(ax, (76.8, 58.8), (74.1, 58.8), color=BLUE)
    # 2 loss: per sample, in place
    arrow(ax, (70.5, 63.7), (60.0, 63.7), color=PURPLE, rad=0.55,
          text="2 loss, per sample (in place)", text_xy=(65.2, 67.6), size=7.5)
    # 3 apply: sample -> feature
    arrow(ax, (74.0, 49.5), (76.8, 45.5), color=RED)
    ax.text(75.6, 52.2, "3 apply\n(hot)", ha="center", va="center", fontsize=7.0,
            color=RED, fontweight="bold",
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
    arrow(ax, (92.0, 39.2), (92.0, 25.6), color=RED, text="flush once per\nsample block",
          text_xy=(92.2, 32.5), size=7.2)
    arrow(ax, (70.0, 46.7), (79.0, 25.6), color=BLUE, rad=-0.12,
          text="3 apply (cold): one lane\ngroup per feature\nsegment, atomic update",
          text_xy=(79.0, 32.5), size=7.2)


def draw_footer(ax):
    txt = (
        "GPU: up to 2 blocks per SM (at least 16 mini-batches each) take mini-batches from an "
        "atomic counter (Hogwild: lock-free atomic updates; no update is lost, reads may be stale).\n"
        "A feature that about u = 1 + (P - 1) q of P workers update at once (q: its share of the "
        "mini-batches) takes steps damped beyond a cap C; the first epoch of a fresh fit adds the "
        "workers in stages (1, 2, 4, ...).\n"
        "Layouts larger than the device-memory budget are built on the host and streamed in 64 MiB "
        "chunks through two buffers (pinned staging, copy stream).  CPU: the same tiles, one sample "
        "block after another."
    )
    ax.text(50, 1.8, txt, ha="center", va="bottom", fontsize=7.4, color="#333333",
            linespacing=1.4)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="PNG to write")
    ap.add_argument("--dpi", type=int, default=130)
    args = ap.parse_args(argv)
    fig = plt.figure(figsize=(14.5, 9.3))
    ax = fig.add_axes([0.0, 0.0, 1.0, 1.0])
    ax.set_xlim(0, 100)
    ax.set_ylim(0.8, 98.5)
    ax.axis("off")
    draw_pipeline(ax)
    draw_layout(ax)
    draw_flows(ax)
    draw_footer(ax)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # no timestamp or version in the file: the PNG only changes with the picture
    fig.savefig(args.out, dpi=args.dpi, metadata={"Software": None}, facecolor="white")
    plt.close(fig)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
