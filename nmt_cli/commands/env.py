"""`nmt env`: this machine and install as nmt sees them, for a bug report."""

from __future__ import annotations

import json

import typer

from nmt_cli.commands.common import out_console, user_errors, verbose_option


def env(
    build: bool = typer.Option(
        False, "--build", help="Build the compiled CPU module first if it is missing."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object instead of text."),
    verbose: bool = verbose_option(),
) -> None:
    """Print nmt, torch, CUDA, the CPU's flags and level, which precision auto picks,
    whether the compiled module is built and which path each decoding and training
    operation takes here. Paste it into a bug report.

    NMT_CPU_LEVEL=generic|avx2|avx512|avx512_vnni|avx512_bf16|amx lowers the level nmt
    (and oneDNN and ATen) run at, so a bigger CPU takes a smaller one's paths.
    """
    from nmt_cli.engines.environment import describe_environment

    with user_errors(verbose):
        sections = describe_environment(build)
    if as_json:
        data = {section.title: dict(section.rows) for section in sections}
        typer.echo(json.dumps(data, indent=2))
        return
    for section in sections:
        out_console.print(section.title, style="bold", highlight=False)
        width = max(len(key) for key, _ in section.rows)
        for key, value in section.rows:
            line = f"  {key:<{width}}  {value}"
            out_console.print(line, highlight=False, markup=False, soft_wrap=True)
