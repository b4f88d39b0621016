"""How the two scripts that run fairseq beside nmt start (bench_train_fairseq.py,
import_check_fairseq.py): the command printed for the record, then the work in a
directory, kept where `--work` names one, with fairseq run from its own Python."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

# (the arguments, the work directory, the command prefix that runs a module of fairseq's
# Python: [python, "-m"]) -> None
Body = Callable[[argparse.Namespace, Path, list[str]], None]


def run_beside_fairseq(args: argparse.Namespace, body: Body) -> None:
    """`body` with args.fairseq_python's module prefix, in args.work (made if need be)
    or, without it, a temporary directory removed afterwards."""
    print("command:", shlex.join(["python", *sys.argv]))
    fairseq = [str(args.fairseq_python), "-m"]
    with tempfile.TemporaryDirectory() as name:
        work = args.work or Path(name)
        work.mkdir(parents=True, exist_ok=True)
        body(args, work, fairseq)
