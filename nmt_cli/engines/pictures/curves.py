"""Training curves of one or more runs, overlaid: against steps and against time.

    curves-steps.{png,svg}   x = update step
    curves-time.{png,svg}    x = training time (wall clock, summed over restarts)

Six panels: loss (train solid, dev dashed with dots), dev perplexity (log scale), dev BLEU,
learning rate, tokens per second and gradient norm. One colour per run. A panel with
nothing logged says so instead of drawing an empty frame, so a missing figure (dev BLEU
off, an old run without gradient norms) is visible as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nmt_cli.engines.pictures.backend import (
    IMAGE_FORMATS,
    check_out_dir,
    new_figure,
    require_plotting,
    save_figure,
)
from nmt_cli.engines.training_log import RunLog, Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Axis = Literal["step", "time"]


@dataclass(frozen=True)
class Curve:
    kind: str  # "train" or "valid" records
    key: str
    label: str
    style: str  # matplotlib format: "-" solid, "--o" dashed with dots


@dataclass(frozen=True)
class PanelSpec:
    title: str
    curves: tuple[Curve, ...]
    log_y: bool = False


PANELS = (
    PanelSpec(
        "loss (label-smoothed, per token)",
        (Curve("train", "loss", "train", "-"), Curve("valid", "dev_loss", "dev", "--o")),
    ),
    PanelSpec("dev perplexity", (Curve("valid", "dev_ppl", "dev", "-o"),), log_y=True),
    PanelSpec("dev BLEU (greedy)", (Curve("valid", "dev_bleu", "dev", "-o"),)),
    PanelSpec("learning rate", (Curve("train", "lr", "train", "-"),)),
    PanelSpec("tokens / s", (Curve("train", "tokens_per_s", "train", "-"),)),
    PanelSpec("gradient norm (before clipping)", (Curve("train", "grad_norm", "train", "-"),)),
)


def draw_curves(runs: Sequence[RunLog], axis: Axis) -> Figure:
    """All panels for `runs`, x = steps or training time."""
    from matplotlib import colormaps

    colours = colormaps["tab10"]
    hours = axis == "time" and _longest_seconds(runs) > 3 * 3600
    unit = "hours" if hours else "minutes"
    fig = new_figure(13.0, 7.0)
    axes = fig.subplots(2, 3)
    for ax, panel in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for n, run in enumerate(runs):
            for curve in panel.curves:
                series = run.series(curve.kind, curve.key)
                if not series:
                    continue
                ax.plot(
                    _x(series, axis, hours),
                    series.values,
                    curve.style,
                    color=colours(n % colours.N),
                    markersize=3,
                    linewidth=1.3,
                    label=f"{run.name} {curve.label}" if len(runs) > 1 else curve.label,
                )
                drawn = True
        _frame(ax, panel, drawn, axis, unit, legend=len(runs) > 1 or len(panel.curves) > 1)
    title = ", ".join(run.name for run in runs)
    fig.suptitle(f"Training curves: {title}", fontsize=11)
    return fig


FIGURES = (("step", "curves-steps"), ("time", "curves-time"))


def curve_files(out_dir: Path, formats: Sequence[str] = IMAGE_FORMATS) -> list[Path]:
    """The files `write_curves` writes into `out_dir`."""
    return [out_dir / f"{name}.{fmt}" for _, name in FIGURES for fmt in formats]


def write_curves(
    runs: Sequence[RunLog], out_dir: Path, formats: Sequence[str] = IMAGE_FORMATS
) -> list[Path]:
    """Draw both figures into `out_dir`; returns the files written."""
    require_plotting()
    out = check_out_dir(out_dir)
    written: list[Path] = []
    for axis, name in FIGURES:
        fig = draw_curves(runs, axis)  # type: ignore[arg-type]
        written += save_figure(fig, out / name, formats)
    return written


def _x(series: Series, axis: Axis, hours: bool) -> list[float]:
    if axis == "step":
        return [float(s) for s in series.steps]
    return [s / (3600.0 if hours else 60.0) for s in series.seconds]


def _longest_seconds(runs: Sequence[RunLog]) -> float:
    times = [float(r.get("elapsed_s", 0.0)) for run in runs for r in run.records]
    return max(times, default=0.0)


def _frame(ax: Axes, panel: PanelSpec, drawn: bool, axis: Axis, unit: str, legend: bool) -> None:
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel("step" if axis == "step" else f"training time ({unit})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        return
    if panel.log_y:
        ax.set_yscale("log")
    if legend:
        ax.legend(fontsize=7)
