"""Pictures: attention maps of a translation and training curves of runs.

matplotlib is an optional extra (`nmt-cli[plot]`); it is imported through `backend`
(`nmt_cli.optional.require`) on first use only, so `nmt --help` and every other command
never pay for it, and a machine without it gets a one-line way to install it. The HTML
attention page needs no matplotlib.
"""
