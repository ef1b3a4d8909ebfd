"""PNG charts of a run's report rows (matplotlib, an optional extra: ``pip install pytest-mgpu[plot]``).

Three kinds, after the reference experiments: a bar chart per group (median step time with the
interquartile range as error bars, and peak memory when known), a curve per group over a numeric
parameter (the split-size trade-off of pipelining), and scaling efficiency against world size.
Rows of the revision lane (``--mgpu-against``) get their own charts per group ("<group> vs REV"):
the head's medians as bars, the base's as markers.
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
        key = r.group + (" (emulated)" if r.emulated else "") + (f" vs {r.against}" if r.lane == "revision" else "")
        out.setdefault(key, []).append(r)
    return out


def _iqr_bars(rows: Sequence[Row]):
    """Error bars from each median down to the first and up to the third quartile."""
    return [[max(0.0, r.median_s - r.q1_s) for r in rows], [max(0.0, r.q3_s - r.median_s) for r in rows]]


# -- what to draw (bookkeeping) -----------------------------------------------------------------------
def param_series(members: Sequence[Row]) -> Dict[Tuple[str, str], List[Tuple[float, Row]]]:
    """(strategy, numeric parameter) -> its points, sorted, where a strategy varies it 3+ times (e.g.
    split_size): a curve shows a trade-off only with three points or more."""
    by_param: Dict[Tuple[str, str], List[Tuple[float, Row]]] = {}
    for r in members:
        for k, v in r.params.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                by_param.setdefault((r.strategy, k), []).append((float(v), r))
    return {key: sorted(pts, key=lambda p: p[0]) for key, pts in by_param.items() if len(pts) >= 3}


def efficiency_lines(groups: Dict[str, List[Row]]) -> Dict[str, List[Tuple[int, float]]]:
    """"group: strategy" -> (world size, efficiency) points, from the group's smallest world size
    (100%), for every (group, strategy) measured over 2+ world sizes without varying parameters."""
    lines: Dict[str, List[Tuple[int, float]]] = {}
    for group, members in groups.items():
        ref = [r for r in members if r.efficiency is not None]
        if len({r.world_size for r in ref}) < 2:
            continue
        ref_row = min(ref, key=lambda r: r.world_size)
        for r in ref:
            eff = r.efficiency
            if eff is not None and not r.params and r.world_size > ref_row.world_size:
                lines.setdefault(f"{group}: {r.strategy}", [(ref_row.world_size, 1.0)]).append(
                    (r.world_size, eff))
    return {name: sorted(pts) for name, pts in lines.items()}


# -- drawing ------------------------------------------------------------------------------------------
def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _bar_axis(ax, xs, heights, labels: List[str], ylabel: str, title: str, **bar) -> None:
    ax.bar(xs, heights, alpha=0.6, width=0.6, **bar)
    ax.set_xticks(list(xs))
    crowded = len(labels) > 4
    ax.set_xticklabels(labels, rotation=30 if crowded else 0, ha="right" if crowded else "center", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.yaxis.grid(True)


def _bars(plt, group: str, members: Sequence[Row], out_dir: Path) -> Path:
    """Median step time with the interquartile range as error bars, and peak memory when known."""
    labels = [f"{r.label}\n{r.world_size} dev" for r in members]
    mems = [r.peak_mem_bytes for r in members]
    has_mem = any(m for m in mems)
    fig, axes = plt.subplots(1, 2 if has_mem else 1, figsize=(max(5, 1.1 * len(members)) * (2 if has_mem else 1), 4.2))
    ax = axes[0] if has_mem else axes
    xs = range(len(members))
    _bar_axis(ax, xs, [r.median_s for r in members], labels, "step time (s): median, bars to quartiles", group,
              yerr=_iqr_bars(members), capsize=6, ecolor="red")
    base = [(x, r.base_s) for x, r in zip(xs, members) if r.base_s is not None]
    if base:
        label = f"base median ({members[0].against})" if members[0].lane == "revision" else "baseline median"
        ax.scatter([b[0] for b in base], [b[1] for b in base], marker="_", s=900, linewidths=2,
                   color="black", label=label, zorder=3)
        ax.legend(fontsize=8)
    if has_mem:
        _bar_axis(axes[1], xs, [(m or 0) / 2**20 for m in mems], labels, "peak memory per rank (MiB)",
                  f"{group}: memory", color="tab:green")
    return _save(plt, fig, out_dir / f"bars-{_slug(group)}.png")


def _curve(plt, group: str, members: Sequence[Row], strategy: str, param: str,
           pts: List[Tuple[float, Row]], out_dir: Path) -> Path:
    """Step time over a parameter, with the group's other strategies as horizontal lines."""
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
    return _save(plt, fig, out_dir / f"curve-{_slug(group)}-{_slug(param)}.png")


def _efficiency(plt, lines: Dict[str, List[Tuple[int, float]]], out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sorted(lines.items()):
        ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o", label=name)
    ax.axhline(100, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("world size (devices)")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_xticks(sorted({p[0] for pts in lines.values() for p in pts}))
    ax.set_title("scaling efficiency vs world size")
    ax.yaxis.grid(True)
    ax.legend(fontsize=7)
    return _save(plt, fig, out_dir / "scaling-efficiency.png")


def draw(rows: Sequence[Row], out_dir: Path) -> List[Path]:
    """Write the charts into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: List[Path] = []
    groups = _by_group(rows)
    for group, members in groups.items():
        written.append(_bars(plt, group, members, out_dir))
        for (strategy, param), pts in param_series(members).items():
            written.append(_curve(plt, group, members, strategy, param, pts, out_dir))
    lines = efficiency_lines(groups)
    if lines:
        written.append(_efficiency(plt, lines, out_dir))
    return written
