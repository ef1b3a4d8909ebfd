"""PNG charts of a run's report rows (matplotlib, an optional extra: ``pip install pytest-mgpu[plot]``).

Three kinds, after the reference experiments: a bar chart per group (median step time with the
interquartile range as error bars, and peak memory when known), a curve per group over a numeric
parameter (the split-size trade-off of pipelining), and scaling efficiency against world size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .report import Row


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:80] or "group"


def _by_group(rows: Sequence[Row]) -> Dict[str, List[Row]]:
    out: Dict[str, List[Row]] = {}
    for r in rows:
        key = r.group + (" (emulated)" if r.emulated else "")
        out.setdefault(key, []).append(r)
    return out


def _iqr_bars(rows: Sequence[Row]):
    """Error bars from each median down to the first and up to the third quartile."""
    return [[max(0.0, r.median_s - r.q1_s) for r in rows], [max(0.0, r.q3_s - r.median_s) for r in rows]]


def draw(rows: Sequence[Row], out_dir: Path) -> List[Path]:
    """Write the charts into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: List[Path] = []
    groups = _by_group(rows)

    for group, members in groups.items():
        labels = [f"{r.label}\n{r.world_size} dev" for r in members]
        mems = [r.peak_mem_bytes for r in members]
        has_mem = any(m for m in mems)
        fig, axes = plt.subplots(1, 2 if has_mem else 1, figsize=(max(5, 1.1 * len(members)) * (2 if has_mem else 1), 4.2))
        ax = axes[0] if has_mem else axes
        xs = range(len(members))
        ax.bar(xs, [r.median_s for r in members], yerr=_iqr_bars(members), capsize=6, alpha=0.6,
               ecolor="red", width=0.6)
        base = [(x, r.verdict["baseline_median"]) for x, r in zip(xs, members)
                if r.verdict and r.verdict.get("baseline_median") is not None]
        if base:
            ax.scatter([b[0] for b in base], [b[1] for b in base], marker="_", s=900, linewidths=2,
                       color="black", label="baseline median", zorder=3)
            ax.legend(fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=30 if len(members) > 4 else 0, ha="right" if len(members) > 4 else "center",
                           fontsize=8)
        ax.set_ylabel("step time (s): median, bars to quartiles")
        ax.set_title(group)
        ax.yaxis.grid(True)
        if has_mem:
            ax2 = axes[1]
            ax2.bar(xs, [(m or 0) / 2**20 for m in mems], alpha=0.6, color="tab:green", width=0.6)
            ax2.set_xticks(list(xs))
            ax2.set_xticklabels(labels, rotation=30 if len(members) > 4 else 0,
                                ha="right" if len(members) > 4 else "center", fontsize=8)
            ax2.set_ylabel("peak memory per rank (MiB)")
            ax2.set_title(f"{group}: memory")
            ax2.yaxis.grid(True)
        fig.tight_layout()
        path = out_dir / f"bars-{_slug(group)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

        # a curve over a numeric parameter (e.g. split_size) when a strategy varies it 3+ times
        by_param: Dict[Tuple[str, str], List[Tuple[float, Row]]] = {}
        for r in members:
            for k, v in r.params.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    by_param.setdefault((r.strategy, k), []).append((float(v), r))
        for (strategy, param), pts in by_param.items():
            if len(pts) < 3:
                continue
            pts.sort(key=lambda p: p[0])
            fig, ax = plt.subplots(figsize=(6, 4.2))
            x = [p for p, _ in pts]
            y = [r.median_s for _, r in pts]
            ax.plot(x, y, color="tab:blue")
            ax.errorbar(x, y, yerr=_iqr_bars([r for _, r in pts]), fmt="ro", ecolor="red", capsize=4,
                        label=f"{strategy} (median, quartiles)")
            for other in members:
                if other.strategy != strategy:
                    ax.axhline(other.median_s, linestyle="--", linewidth=1,
                               label=f"{other.label} ({other.world_size} dev)", color="gray" if other.world_size > 1 else "black")
            ax.set_xlabel(param)
            ax.set_ylabel("step time (s)")
            ax.set_xticks(x)
            ax.set_title(f"{group}: {strategy} over {param}")
            ax.yaxis.grid(True)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out_dir / f"curve-{_slug(group)}-{_slug(param)}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)

    # scaling efficiency against world size, one line per (group, strategy) over 2+ world sizes
    lines: Dict[str, List[Tuple[int, float]]] = {}
    for group, members in groups.items():
        ref = [r for r in members if r.efficiency is not None]
        sizes = {r.world_size for r in ref}
        if len(sizes) < 2:
            continue
        ref_row = min(ref, key=lambda r: r.world_size)
        for r in ref:
            if not r.params and r.world_size > ref_row.world_size:
                lines.setdefault(f"{group}: {r.strategy}", [(ref_row.world_size, 1.0)]).append(
                    (r.world_size, r.efficiency))
    if lines:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o", label=name)
        ax.axhline(100, color="black", linewidth=0.8, linestyle=":")
        ax.set_xlabel("world size (devices)")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_xticks(sorted({p[0] for pts in lines.values() for p in pts}))
        ax.set_title("scaling efficiency vs world size")
        ax.yaxis.grid(True)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "scaling-efficiency.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
