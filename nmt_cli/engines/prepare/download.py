"""Downloading a corpus file into a cache, verified by its SHA-256 before it is kept.

A file is fetched once: a cached copy whose checksum matches is used as it is, and one
that does not (a disk error, a file edited by hand) is fetched again. A download is
written to a temporary file beside its place in the cache and renamed only after its
checksum matched, so an interrupted or corrupt download leaves nothing behind that a
later run could mistake for the real file. `file://` URLs work like `https://` ones,
which is how a local mirror (and the test suite) stands in for the network.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from nmt_cli.core.files import atomic_path
from nmt_cli.data_dir import sha256_file
from nmt_cli.errors import NmtError

TIMEOUT_S = 60.0


class ChecksumMismatch(NmtError):
    """A downloaded file is not the file the checksum table names."""


def fetch(
    url: str,
    dest: Path,
    sha256: str,
    advance: Callable[[int], None] = lambda n: None,
    offline_hint: str = "",
) -> Path:
    """`dest`, downloaded from `url` unless a verified copy is already there.

    `advance(n)` is told of every n bytes received (for a progress bar); `offline_hint`
    ends the error message when the download fails (what to do without a network).
    """
    if dest.is_file() and sha256_file(dest) == sha256:
        return dest
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(tmp, "wb") as fh:
                while block := response.read(1 << 16):
                    fh.write(block)
                    advance(len(block))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            hint = f"; {offline_hint}" if offline_hint else ""
            raise NmtError(f"could not download {url} ({reason}){hint}") from None
        got = sha256_file(tmp)
        if got != sha256:
            raise ChecksumMismatch(
                f"{url}: SHA-256 {got[:16]}... is not the expected {sha256[:16]}...; the "
                "download is damaged or the file changed at its source, and was not kept"
            )
    return dest


def read_checksums(path: Path) -> dict[str, str]:
    """A checksum table in `sha256sum` format ("HEX  NAME" a line)."""
    table: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NmtError(f"{path}: cannot read the checksum table ({exc})") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")
        if len(digest) != 64 or not name:
            raise NmtError(f"{path}:{n}: expected 'SHA256  NAME' as sha256sum writes it")
        table[name] = digest.lower()
    return table
