"""matplotlib on demand, and figures written the way every file of a run is written.

Figures are built as `matplotlib.figure.Figure` objects, not through pyplot: no global
figure registry, no backend switch in a process that embeds nmt, and PNG/SVG are rendered
by the Agg and SVG canvases that `savefig` picks by format.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.core.files import atomic_path
from nmt_cli.errors import NmtError
from nmt_cli.optional import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

IMAGE_FORMATS = ("png", "svg")
ATTENTION_FORMATS = (*IMAGE_FORMATS, "html")  # nmt attention adds its browsable page
PURPOSE = "drawing PNG/SVG pictures"


def require_plotting(avoid: str = "") -> None:
    """Raise the one-line install hint (`nmt_cli.optional.MissingPackage`) unless
    matplotlib can be imported; called before any work whose pictures would be lost.
    `avoid` names the option that does without pictures, where a command has one."""
    require("matplotlib.figure", purpose=PURPOSE, avoid=avoid)


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of `width` x `height` inches; matplotlib is imported here."""
    figure = require("matplotlib.figure", purpose=PURPOSE)
    fig: Figure = figure.Figure(figsize=(width, height), layout="constrained")
    return fig


def save_figure(fig: Figure, stem: Path, formats: Sequence[str], dpi: int = 110) -> list[Path]:
    """Write `fig` as stem.png / stem.svg (atomically); returns the paths written.

    SVG output keeps its text as text (small, searchable, selectable) and is reproducible
    (no date, fixed element ids): a regenerated figure that did not change is the same
    file."""
    matplotlib = require("matplotlib", purpose=PURPOSE)
    written = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {"Software": None}
        with (
            matplotlib.rc_context({"svg.hashsalt": "nmt", "svg.fonttype": "none"}),
            atomic_path(path) as tmp,
        ):
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)
        written.append(path)
    return written


def check_out_dir(path: Path, option: str = "--out") -> Path:
    """Create the output directory, or explain in one line why it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NmtError(f"{option} {path}: cannot create the directory ({exc.strerror})") from None
    if not path.is_dir():
        raise NmtError(f"{option} {path}: not a directory")
    probe = path / ".nmt-write-test"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise NmtError(f"{option} {path}: cannot write there ({exc.strerror})") from None
    return path
