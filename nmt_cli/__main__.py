"""Allow `python -m nmt_cli`."""

from nmt_cli.cli import main

main()
