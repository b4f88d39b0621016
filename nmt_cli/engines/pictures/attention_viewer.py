"""The attention viewer's script and style, read from the package.

`attention.js` and `attention.css` beside this module are the one definition of how a
browser draws attention: `nmt attention` inlines them into its self-contained page, and
`nmt serve` sends them to its web page as /attention.js and /attention.css. This module
imports nothing heavy, so a server can hand them out without numpy or torch.
"""

from __future__ import annotations

from importlib import resources


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def viewer_script() -> str:
    """attention.js: defines `NmtAttention.mount(element, data)`."""
    return _read("attention.js")


def viewer_style() -> str:
    """attention.css: the look of what the script draws."""
    return _read("attention.css")
