"""Decoding speed of nmt next to CTranslate2, every system in a process of its own; memory.

    nmt run recipes/multi30k-en-de.toml          # a trained Multi30k EN-DE model
    python bench/bench_translate.py [DIR/test_2016_flickr.en.gz] \\
        --model runs/multi30k-en-de/average.pt [--ref DIR/test_2016_flickr.de.gz]

(DIR: a local copy of Multi30k; by default the raw corpus beside the checkout,
../shared/data/multi30k, source and reference.) The model must be trained: decoding speed depends on
output lengths, and an untrained model runs every sentence to the length limit.

The checkpoint is exported with `nmt export --to ctranslate2` (float32 and int8) into a
temporary directory, and every system decodes the same sentences with the same settings
(beam 4, alpha 0.6, at most |source| + 50 tokens; see peer_ct2.py for the two differences
that remain) and the same SentencePiece model. Each runs in a process of its own, one
after another, pinned with taskset to the cores of the layout (peer_launch.py), as a
reader comparing toolkits would run them; CTranslate2's never imports torch:

- CT2 (peer_ct2.py): timed around SentencePiece encoding, `translate_batch` on the
  batches nmt cuts, SentencePiece decoding; after a warm-up, model load and file I/O not
  included.
- nmt Translator (peer_nmt.py): nmt in process, timed around `Translator.translate` on
  the same sentences: the same steps, after the same warm-up.
- `nmt translate` (the command a user times): the wall time of the whole command on a
  file of the sentences, less its start-up, measured as the median wall time of the same
  command on an empty input (Python, imports, model load): reading, tokenizing, decoding,
  detokenizing, writing, the start of its worker processes; no warm-up.

Layouts (`--layouts`, default: one core and every usable core): n cores, n batches side by
side with one thread each (nmt `--threads n --workers n`, CTranslate2 inter_threads=n,
intra_threads=1). Batch sizes (`--batches`, default 128 and 1): the test set, and at
batch 1 its first `--single` sentences. Precisions: nmt `--precisions`, CTranslate2
`--ct2`; nmt fp32 and bf16 are compared with CT2 float32, nmt int8 with CT2 int8.

Prints every run as measured, then a table for each layout and batch size: sentences/s,
target tokens/s, sacreBLEU of each system's output on the same sentences (with --ref),
and each nmt measurement's ratio to its peer. `--rounds N` repeats every run N times, in
turn; the tables give medians and each round's ratio (a round's systems ran minutes
apart). Then the latency of one line at a time (bench_interactive.py for nmt;
CTranslate2's worker on one core) and the peak resident memory of fresh `nmt translate`
processes. A precision this nmt refuses fails its run, with nmt's message. `--emulate
LEVEL` runs every system as on a CPU of a lower class (`emulate`), on a CPU with more:
`avx2` an AVX2-only AMD CPU (`--avx2` for short), `avx512` an Intel one with AVX-512 and
no VNNI (Skylake-SP), `avx512_vnni` one with VNNI and no bf16 units (Cascade Lake, Ice
Lake).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from peer_ct2 import export
from peer_launch import Layout, run_worker, time_command, usable_cores, worker_command

from nmt_cli.cpu_level import torch_environment
from nmt_cli.text_io import read_lines

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared/data/multi30k"
# Variables that change how the systems' runtimes spread work, printed when set.
THREAD_VARIABLES = {
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY",
    "GOMP_CPU_AFFINITY", "CT2_USE_EXPERIMENTAL_PACKED_GEMM",
    # instruction sets capped: another CPU class emulated (--emulate)
    "NMT_CPU_LEVEL", "CT2_FORCE_CPU_ISA", "CT2_USE_MKL", "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
}  # fmt: skip


# The CPU classes --emulate stands for, by nmt's level.
EMULATED = {
    "avx2": "an AVX2-only AMD CPU",
    "avx512": "an Intel CPU with AVX-512 and no VNNI (Skylake-SP)",
    "avx512_vnni": "an Intel CPU with AVX-512 VNNI and no bf16 units (Cascade Lake, Ice Lake)",
}


def emulate(level: str) -> None:
    """Every process of the run as on the CPU class `level` stands for (EMULATED): nmt's
    kernels, PyTorch's libraries and CTranslate2's own code capped at the level, and
    CTranslate2's products on the backend it takes there, capped too: oneDNN on the AMD
    CPU (it takes MKL only on Intel's), MKL on the Intel ones."""
    isa = "AVX2" if level == "avx2" else "AVX512"
    os.environ.update(NMT_CPU_LEVEL=level, CT2_FORCE_CPU_ISA=isa, **torch_environment(level))
    if level == "avx2":
        os.environ["CT2_USE_MKL"] = "0"


# What each nmt precision is compared with: CTranslate2's nearest compute type.
PEER_OF = {"fp32": "float32", "bf16": "float32", "int8": "int8"}
INCLUDES = {
    "CT2": "SentencePiece encoding, translate_batch, SentencePiece decoding, after a "
    "warm-up of max(8, batch x cores) lines; model load and file I/O excluded",
    "Translator": "Translator.translate: SentencePiece encoding, batching, beam search, "
    "detokenization, after a warm-up of max(8, batch x cores) lines (which starts its "
    "worker processes); model load and file I/O excluded",
    "command": "the whole command on the input (reading, tokenizing, decoding, "
    "detokenizing, writing, starting its worker processes; no warm-up) less its start-up: "
    "the median of {startup} runs of the same command on an empty input (Python, imports, "
    "model load)",
}


@dataclass(frozen=True)
class Measured:
    """One system's run: what it took and produced, and how it was run."""

    seconds: float
    outputs: list[str]
    tokens: int | None  # target tokens of the best hypotheses; None: not known
    command: str
    details: str  # how the system decoded (threads, precision, pinning, torch loaded)


Run = Callable[[Layout, int, Path, Path], Measured]  # (layout, batch, lines, out dir)


@dataclass(frozen=True)
class System:
    name: str  # "CT2 int8", "nmt int8 Translator", "nmt int8 command"
    kind: str  # a key of INCLUDES
    peer: str  # the CT2 system an nmt system is compared with ("" for CT2 itself)
    run: Run
    tokens_from: str = ""  # a system whose token count holds when the outputs are equal


@dataclass(frozen=True)
class Row:
    system: System
    layout: Layout
    batch: int
    turn: int  # the round, from 0
    lines: int
    measured: Measured
    tokens: int | None
    bleu: float | None

    @property
    def sent_s(self) -> float:
        return self.lines / self.measured.seconds

    @property
    def tok_s(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.measured.seconds


def warmup_lines(layout: Layout, batch: int) -> int:
    """Enough lines for a batch on every core: nmt's worker processes start in the warm-up."""
    return max(8, batch * layout.n)


def run_in_worker(script: str, model: Path, setting: str, value: str) -> Run:
    """A system run by a worker script (peer_ct2.py, peer_nmt.py) with its own `--setting`."""

    def run(layout: Layout, batch: int, lines: Path, out: Path) -> Measured:
        output = out / f"{Path(script).stem}-{value}.txt"
        command = worker_command(
            script, model, lines, output, batch=batch, threads=layout.n,
            warmup=warmup_lines(layout, batch), **{setting: value},
        )  # fmt: skip
        done = run_worker(command, output, layout)
        report = done.report
        return Measured(report["seconds"], done.outputs, report["tokens"], done.command,
                        done.describe())  # fmt: skip

    return run


def translate_command(model: Path, precision: str, layout: Layout, batch: int) -> list[str]:
    """`nmt translate` as a user runs it, in the layout's threads (without -i, -o)."""
    return [
        sys.executable, "-m", "nmt_cli", "translate", "-m", str(model),
        "--precision", precision, "--batch-size", str(batch),
        "--threads", str(layout.n), "--workers", str(layout.n),
    ]  # fmt: skip


def run_command(model: Path, precision: str, startup_runs: int) -> Run:
    def run(layout: Layout, batch: int, lines: Path, out: Path) -> Measured:
        command = translate_command(model, precision, layout, batch)
        done = time_command(command, lines, out / "nmt-command.txt", layout, startup_runs)
        startup = ", ".join(f"{s:.2f}" for s in done.startup)
        own = re.search(r"translated [\d,]+ lines in ([\d.]+)s", done.stderr)
        details = (
            f"wall {done.wall:.2f}s, start-up {startup}s (median taken off); the command's "
            f"own report of its reading, decoding and writing: "
            f"{own.group(1) + 's' if own else 'not found'}"
        )
        return Measured(done.seconds, done.outputs, None, done.command, details)

    return run


def systems(args: argparse.Namespace, dirs: dict[str, Path]) -> list[System]:
    """The peers first, so that every nmt row can print its ratio as it is measured."""
    found = [
        System(f"CT2 {c}", "CT2", "", run_in_worker("peer_ct2.py", d, "compute_type", c))
        for c, d in dirs.items()
    ]
    for p in args.precisions:
        peer = f"CT2 {PEER_OF.get(p, '')}"
        peer = peer if peer.removeprefix("CT2 ") in dirs else ""
        translator = f"nmt {p} Translator"
        if "translator" not in args.skip:
            run = run_in_worker("peer_nmt.py", args.model, "precision", p)
            found.append(System(translator, "Translator", peer, run))
        if "command" not in args.skip:
            run = run_command(args.model, p, args.startup_runs)
            found.append(System(f"nmt {p} command", "command", peer, run, translator))
    return found


def find(rows: list[Row], name: str, layout: Layout, batch: int, turn: int) -> Row | None:
    key = (name, layout, batch, turn)
    return next((r for r in rows if (r.system.name, r.layout, r.batch, r.turn) == key), None)


def ratio(row: Row, rows: list[Row]) -> float | None:
    """nmt's sentences/s over its peer's, measured in the same round, layout and batch."""
    peer = find(rows, row.system.peer, row.layout, row.batch, row.turn)
    return row.sent_s / peer.sent_s if row.system.peer and peer else None


def format_row(row: Row, rows: list[Row]) -> str:
    tok_s = "-" if row.tok_s is None else f"{row.tok_s:,.0f}"
    text = (
        f"round {row.turn + 1}, {row.layout.name}, batch {row.batch}, {row.system.name}: "
        f"{row.sent_s:.1f} sent/s, {tok_s} tok/s ({row.lines} sentences in "
        f"{row.measured.seconds:.2f}s)"
    )
    if row.bleu is not None:
        text += f", sacreBLEU {row.bleu:.1f}"
    found = ratio(row, rows)
    if found is not None:
        text += f"; {found:.2f}x {row.system.peer}"
    return text


def speed(args: argparse.Namespace, lines: list[str], dirs: dict[str, Path], tmp: Path) -> None:
    """Every system, layout and batch size, `args.rounds` times; rows printed as measured,
    then the tables."""
    import sacrebleu

    metric = sacrebleu.BLEU()
    refs = read_lines(args.ref) if args.ref else None
    layouts = [Layout.first(n) for n in args.layouts]
    for layout in layouts:
        print("layout", layout.describe())
    inputs: dict[int, Path] = {}
    for batch in args.batches:
        subset = lines if batch > 1 else lines[: args.single]
        inputs[batch] = tmp / f"lines-{len(subset)}.txt"
        inputs[batch].write_text("".join(line + "\n" for line in subset), encoding="utf-8")
    chosen = systems(args, dirs)
    described: set[str] = set()
    rows: list[Row] = []
    for turn in range(args.rounds):
        for layout in layouts:
            for batch in args.batches:
                n = len(inputs[batch].read_text(encoding="utf-8").splitlines())
                for system in chosen:
                    measured = system.run(layout, batch, inputs[batch], tmp)
                    tokens = measured.tokens
                    source = find(rows, system.tokens_from, layout, batch, turn)
                    if tokens is None and source and source.measured.outputs == measured.outputs:
                        tokens = source.tokens  # the same translations: the same tokens
                    bleu = None
                    if refs is not None:
                        bleu = metric.corpus_score(measured.outputs, [refs[:n]]).score
                    row = Row(system, layout, batch, turn, n, measured, tokens, bleu)
                    if system.name not in described:
                        described.add(system.name)
                        includes = INCLUDES[system.kind].format(startup=args.startup_runs)
                        print(f"{system.name}: timing includes {includes}")
                    print(f"  {measured.command}\n  {measured.details}")
                    if measured.seconds <= 0:  # left out of the tables
                        print(f"{row.system.name}: no figure, its start-up varied by more "
                              "than its decoding took", flush=True)  # fmt: skip
                        continue
                    rows.append(row)
                    print(format_row(row, rows), flush=True)
    if refs is not None:
        print(f"sacreBLEU signature: {metric.get_signature()}")
    shown = [s for s in chosen if s.kind != "CT2"] + [s for s in chosen if s.kind == "CT2"]
    print_tables(rows, shown, layouts, args.batches)
    print_summary(rows, shown, layouts, args.batches)


def median_cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):,.{digits}f}" if values else "-"


def print_tables(
    rows: list[Row], chosen: list[System], layouts: list[Layout], batches: list[int]
) -> None:
    """One table a layout and batch size: medians over the rounds, every round's ratio."""
    rounds = max(r.turn for r in rows) + 1 if rows else 0
    for layout in layouts:
        for batch in batches:
            mine = [r for r in rows if (r.layout, r.batch) == (layout, batch)]
            if not mine:
                continue
            what = "median of " + str(rounds) + " rounds" if rounds > 1 else "one round"
            print(
                f"\n| {layout.name}, batch {batch}, {mine[0].lines} sentences ({what}) "
                "| sentences/s | tokens/s | sacreBLEU | nmt / peer (each round) |"
            )
            print("|---|---:|---:|---:|---|")
            for system in chosen:
                own = [r for r in mine if r.system.name == system.name]
                ratios = [x for x in (ratio(r, rows) for r in own) if x is not None]
                cells = [
                    median_cell([r.sent_s for r in own], 1),
                    median_cell([r.tok_s for r in own if r.tok_s is not None], 0),
                    median_cell([r.bleu for r in own if r.bleu is not None], 1),
                    (
                        f"**{statistics.median(ratios):.2f}x** {system.peer} ("
                        + ", ".join(f"{x:.2f}" for x in ratios)
                        + ")"
                        if ratios
                        else ""
                    ),
                ]
                print(f"| {system.name} | " + " | ".join(cells) + " |")


def print_summary(
    rows: list[Row], chosen: list[System], layouts: list[Layout], batches: list[int]
) -> None:
    """A table a layout, a row a batch size, the median sentences/s of every system; then
    each nmt measurement's median ratio to its peer (BENCHMARKS.md's summary layout)."""
    nmt = [s for s in chosen if s.peer]
    for layout in layouts:
        print(f"\n| {layout.name}, sentences/s | " + " | ".join(s.name for s in chosen) + " |")
        print("|---|" + "---:|" * len(chosen))
        for batch in batches:
            cells = [
                median_cell([r.sent_s for r in rows if (r.system, r.layout, r.batch) ==
                             (s, layout, batch)], 1)
                for s in chosen
            ]  # fmt: skip
            print(f"| batch {batch} | " + " | ".join(cells) + " |")
        if not nmt:
            continue
        print(f"\n| {layout.name}, nmt / peer | " + " | ".join(
            f"{s.name} / {s.peer}" for s in nmt) + " |")  # fmt: skip
        print("|---|" + "---:|" * len(nmt))
        for batch in batches:
            cells = []
            for s in nmt:
                own = [r for r in rows if (r.system, r.layout, r.batch) == (s, layout, batch)]
                ratios = [x for x in (ratio(r, rows) for r in own) if x is not None]
                cells.append(f"{statistics.median(ratios):.2f}x" if ratios else "-")
            print(f"| batch {batch} | " + " | ".join(cells) + " |")


def interactive(args: argparse.Namespace, lines: list[str], dirs: dict[str, Path]) -> None:
    """One line at a time: nmt through bench_interactive.py (the command as a server, the
    Translator in this process), CTranslate2 through its worker on one core, one thread."""
    from bench_interactive import report

    report(args.model, lines, dirs, args.precisions)


def cpu_flags() -> set[str]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    found = re.search(r"^flags\s*:\s*(.+)$", info, re.MULTILINE)
    return set(found.group(1).split()) if found else set()


def cpu_model() -> str:
    """The CPU's model name and its bf16/int8 instruction sets (Linux), else the machine."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE)
    wanted = ("avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
    have = [f for f in wanted if f in cpu_flags()]
    return f"{name.group(1) if name else platform.machine()} ({', '.join(have) or 'no AVX-512'})"


def cpu_notes(precisions: list[str]) -> list[str]:
    """What this CPU lacks for the precisions asked, so that no one reads its figures as
    those of a CPU that has it."""
    flags, notes = cpu_flags(), []
    if "bf16" in precisions and not {"avx512_bf16", "amx_bf16"} & flags:
        notes.append("no AVX-512 BF16 or AMX: nmt bf16 is emulated here, far from its speed")
    if "int8" in precisions and not {"avx512_vnni", "avx_vnni"} & flags:
        notes.append("no VNNI: nmt int8 runs its kernel's AVX2 route")
    if "avx512f" not in flags:
        notes.append("no AVX-512: nmt's packed bf16 and its AVX-512 kernels do not run here")
    return notes


def versions() -> str:
    found = []
    for package in ("torch", "ctranslate2", "sentencepiece", "sacrebleu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{package} {importlib.metadata.version(package)}")
    return ", ".join(found)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "test_src", type=Path, nargs="?", help="source side of the test set (gz); default "
        "test_2016_flickr.en.gz of ../shared/data/multi30k, with its .de.gz as --ref"
    )  # fmt: skip
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--ref", type=Path, help="reference (gz): sacreBLEU of every system")
    parser.add_argument(
        "--precisions", default="fp32,bf16,int8", help="nmt precisions, comma-separated"
    )
    parser.add_argument("--ct2", default="float32,int8", help="CTranslate2 exports to compare")
    parser.add_argument("--batches", default="128,1", help="batch sizes, comma-separated")
    parser.add_argument("--single", type=int, default=300, help="sentences at batch 1")
    parser.add_argument(
        "--layouts", default="", help="cores of each layout, comma-separated; default 1,all"
    )
    parser.add_argument("--rounds", type=int, default=1, help="every run this many times")
    parser.add_argument(
        "--startup-runs", type=int, default=3, help="runs of `nmt translate` on empty input"
    )
    parser.add_argument("--interactive-lines", type=int, default=100)
    parser.add_argument("--memory-lines", type=int, default=200_000)
    parser.add_argument("--uncapped-reps", type=int, default=20, help="test set x N, full length")
    parser.add_argument(
        "--skip", default="", help="comma list: translator,command,speed,interactive,memory"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100 sentences, 30 at batch 1, less memory"
    )
    parser.add_argument(
        "--emulate", choices=sorted(EMULATED), help="every system as on this lower CPU class"
    )
    parser.add_argument("--avx2", action="store_true", help="short for --emulate avx2")
    args = parser.parse_args()
    if args.test_src is None:
        args.test_src = CORPUS / "test_2016_flickr.en.gz"
        args.ref = args.ref or CORPUS / "test_2016_flickr.de.gz"
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.ct2 = [c for c in args.ct2.split(",") if c]
    args.batches = int_list(args.batches)
    all_cores = len(usable_cores())
    args.layouts = int_list(args.layouts) or sorted({1, all_cores})
    args.skip = set(filter(None, args.skip.split(",")))
    return args


def main() -> None:
    args = parse_args()
    print("command:", shlex.join(["python", *sys.argv]), flush=True)
    if args.avx2:
        args.emulate = "avx2"
    if args.emulate:
        emulate(args.emulate)
    lines = read_lines(args.test_src)
    if args.quick:
        lines, args.single, args.interactive_lines = lines[:100], 30, 20
        args.uncapped_reps, args.memory_lines = 10, 10_000
    print(
        f"{date.today()}, {cpu_model()}, {len(usable_cores())} usable cores, Python "
        f"{platform.python_version()}, {versions()}; model {args.model}; {len(lines)} "
        "sentences; beam 4, alpha 0.6, max |src| + 50"
    )
    if args.emulate:
        print(f"note: {EMULATED[args.emulate]} emulated: the figures are not this CPU's own")
    for note in [] if args.emulate else cpu_notes(args.precisions):
        print("note:", note)
    threading = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k in THREAD_VARIABLES]
    print("thread and ISA variables in the environment:", ", ".join(threading) or "none")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        dirs = {c: tmp / f"ct2-{c}" for c in args.ct2}
        for compute_type, model_dir in dirs.items():
            print("export:", export(args.model, model_dir, compute_type), flush=True)
        if "speed" not in args.skip:
            speed(args, lines, dirs, tmp)
        if "interactive" not in args.skip:
            interactive(args, lines[: args.interactive_lines], dirs)
    if "memory" not in args.skip:
        from bench_memory import report

        report(args.model, lines, args.uncapped_reps, args.memory_lines)


if __name__ == "__main__":
    main()
