"""Decoding speed of `nmt translate` next to CTranslate2, in one run, and peak memory.

    nmt run recipes/multi30k-en-de.toml          # a trained Multi30k EN-DE model
    python bench/bench_translate.py DIR/test_2016_flickr.en.gz \\
        --model runs/multi30k-en-de/average.pt --ref DIR/test_2016_flickr.de.gz

(DIR: a local copy of Multi30k.) The model must be trained: decoding speed depends on
output lengths, and an untrained model runs every sentence to the length limit.

A speed ratio counts only when both systems ran in the same run on the same machine, so
the checkpoint is exported with `nmt export --to ctranslate2` (float32 and int8) into a
temporary directory and CTranslate2 decodes the same sentences with the same settings
(beam 4, alpha 0.6, at most |source| + 50 tokens; see peer_ct2.py for the two differences
that remain) and the same SentencePiece model, at batch 128 (the test set) and batch 1
(its first `--single` sentences), in two core layouts:

- one core: nmt `set_threads(1, 1)`, CTranslate2 inter_threads=1, intra_threads=1;
- all usable cores, N: nmt decodes N batches side by side, one thread each (what
  `nmt translate` does by default), CTranslate2 inter_threads=N, intra_threads=1 with
  its batches submitted asynchronously, so they run side by side too.

Prints every row (sentences/s, target tokens/s, sacreBLEU at batch 128 with --ref, nmt's
ratio to CTranslate2 in the same layout and batch: nmt fp32 and bf16 against float32,
nmt int8 against int8), a table per layout, the latency of one line at a time
(bench_interactive.py), and the peak resident memory of fresh `nmt translate` processes
on the test set, on 20 copies of it and on a 200,000-line input with capped outputs.
A precision the installed nmt refuses is skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from peer_ct2 import Ct2Decoder, Output, export

from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.cpus import usable_cpus
from nmt_cli.engines.translate.loading import set_threads
from nmt_cli.engines.translate.translator import Translator
from nmt_cli.errors import NmtError
from nmt_cli.text_io import read_lines

Decode = Callable[[list[str]], list[Output]]
# What each nmt precision is compared with: CTranslate2's nearest compute type.
PEER_OF = {"fp32": "float32", "bf16": "float32", "int8": "int8"}


@dataclass(frozen=True)
class Layout:
    """`cores` batches decoded side by side, one thread each (1: everything on one core)."""

    cores: int

    @property
    def name(self) -> str:
        return "1 core" if self.cores == 1 else f"{self.cores} cores"

    def describe(self) -> str:
        n = self.cores
        return (
            f"{self.name}: nmt set_threads({n}, {n}) ({n} batch(es) at once, 1 thread each); "
            f"CTranslate2 inter_threads={n}, intra_threads=1"
        )


@dataclass(frozen=True)
class Row:
    system: str  # "nmt bf16", "CT2 int8"
    layout: Layout
    batch: int
    sentences: int
    seconds: float
    tokens: int
    bleu: float | None = None

    @property
    def sent_s(self) -> float:
        return self.sentences / self.seconds

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def nmt_decoder(ckpt: Checkpoint, precision: str, layout: Layout, batch: int) -> Decode:
    """nmt's Translator as `nmt translate` builds it: NmtError (or a SettingError) when
    this nmt does not know `precision`."""
    cfg = DecodeConfig(precision=precision, batch_sentences=batch, device="cpu")  # type: ignore[arg-type]
    _, workers = set_threads(layout.cores, layout.cores)
    translator = Translator.from_checkpoint(ckpt, cfg, workers)

    def decode(lines: list[str]) -> list[Output]:
        out: list[Output] = []
        for lo in range(0, len(lines), cfg.buffer_lines):  # the command's chunks
            for r in translator.translate_chunk(lines[lo : lo + cfg.buffer_lines]):
                out.append(Output(r.text, r.hypotheses[0].length if r.hypotheses else 0))
        return out

    return decode


def ct2_decoder(model_dir: Path, compute_type: str, layout: Layout, batch: int) -> Decode:
    decoder = Ct2Decoder(model_dir, compute_type, layout.cores)
    return lambda lines: decoder.translate(lines, batch)


def timed(decode: Decode, lines: list[str], warmup: int = 8) -> tuple[float, list[Output]]:
    """Seconds to decode `lines`, after a warm-up on the first `warmup` (kernels,
    allocators, and nmt's worker processes: one batch each)."""
    decode(lines[:warmup])
    start = time.perf_counter()
    outputs = decode(lines)
    return time.perf_counter() - start, outputs


@dataclass(frozen=True)
class Memory:
    """Peak memory (MiB) of a command and the worker processes it starts."""

    largest: float  # the largest single process's peak resident set
    rss: float  # the highest sum of the processes' resident sets, sampled
    pss: float  # the same for proportional sets: pages shared by n processes count 1/n each
    seconds: float


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def _rollup(pid: int) -> tuple[float, float]:
    """(Rss, Pss) of one process in MiB, (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0, 0.0
    fields = {line.split(":")[0]: float(line.split()[1]) for line in text.splitlines()[1:]}
    return fields.get("Rss", 0.0) / 1024, fields.get("Pss", 0.0) / 1024


def peak_memory(command: list[str]) -> Memory:
    """Peak memory and wall time of a fresh subprocess and its workers, sampled every
    0.1 s from /proc (a peak shorter than that can be missed)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    largest = rss = pss = 0.0
    while proc.poll() is None:
        sizes = [_rollup(p) for p in _tree(proc.pid)]
        largest = max([largest, *(r for r, _ in sizes)])
        rss, pss = max(rss, sum(r for r, _ in sizes)), max(pss, sum(p for _, p in sizes))
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    if proc.returncode:
        assert proc.stderr is not None
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.read().decode().strip()}")
    return Memory(largest, rss, pss, seconds)


def speed(args: argparse.Namespace, lines: list[str], dirs: dict[str, Path]) -> list[Row]:
    """Every system in every layout at batch 128 and batch 1; rows printed as measured."""
    ckpt = load_checkpoint(args.model)
    refs = read_lines(args.ref) if args.ref else None
    cores = args.threads or usable_cpus()
    layouts = [Layout(1)] + ([Layout(cores)] if cores > 1 else [])
    for layout in layouts:
        print("layout", layout.describe())
    makers: dict[str, Callable[[Layout, int], Decode]] = {}
    for compute_type, model_dir in dirs.items():  # peers first: nmt rows print their ratio
        makers[f"CT2 {compute_type}"] = functools.partial(ct2_decoder, model_dir, compute_type)
    for precision in args.precisions:
        makers[f"nmt {precision}"] = functools.partial(nmt_decoder, ckpt, precision)
    refused: set[str] = set()
    rows: list[Row] = []
    for layout in layouts:
        for batch, subset in ((128, lines), (1, lines[: args.single])):
            for system, make in makers.items():
                if system in refused:
                    continue
                try:
                    decode = make(layout, batch)
                except (NmtError, ValueError) as exc:
                    print(f"note: {system} skipped, this nmt refuses it: {exc}")
                    refused.add(system)
                    continue
                seconds, outputs = timed(decode, subset, max(8, batch * layout.cores))
                del decode
                bleu = None
                if refs is not None and batch == 128:
                    import sacrebleu

                    texts = [o.text for o in outputs]
                    bleu = sacrebleu.corpus_bleu(texts, [refs[: len(subset)]]).score
                tokens = sum(o.tokens for o in outputs)
                row = Row(system, layout, batch, len(subset), seconds, tokens, bleu)
                rows.append(row)
                print(format_row(row, rows), flush=True)
    return rows


def find(rows: list[Row], system: str, layout: Layout, batch: int) -> Row | None:
    return next((r for r in rows if (r.system, r.layout, r.batch) == (system, layout, batch)), None)


def peer_row(row: Row, rows: list[Row]) -> Row | None:
    """The CTranslate2 row an nmt row is compared with: same layout, batch, and precision."""
    if not row.system.startswith("nmt "):
        return None
    peer = PEER_OF.get(row.system.removeprefix("nmt "), "")
    return find(rows, f"CT2 {peer}", row.layout, row.batch)


def format_row(row: Row, rows: list[Row]) -> str:
    text = (
        f"{row.layout.name}, batch {row.batch}, {row.system}: {row.sent_s:.1f} sent/s, "
        f"{row.tok_s:.0f} tok/s ({row.sentences} sentences in {row.seconds:.1f}s)"
    )
    if row.bleu is not None:
        text += f", sacreBLEU {row.bleu:.1f}"
    peer = peer_row(row, rows)
    if peer is not None:
        text += f"; {row.sent_s / peer.sent_s:.2f}x {peer.system}"
    return text


def print_tables(rows: list[Row], systems: list[str]) -> None:
    """A table of sentences/s, rows batch 128 / batch 1, one column per system."""
    for layout in dict.fromkeys(r.layout for r in rows):
        print(f"\n| {layout.name}, sentences/s | " + " | ".join(systems) + " |")
        print("|---|" + "---:|" * len(systems))
        for batch in (128, 1):
            found = [find(rows, system, layout, batch) for system in systems]
            cells = [f"{r.sent_s:.1f}" if r else "-" for r in found]
            print(f"| batch {batch} | " + " | ".join(cells) + " |")


def memory(args: argparse.Namespace, lines: list[str]) -> None:
    """Peak RSS of fresh `nmt translate` processes (default settings) on growing inputs."""
    base = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(args.model), "-q"]
    print(f"\npeak resident memory of `nmt translate` (defaults), fresh processes: {base[2:]}")
    # A build of the compiled module (after a source change) would be measured with it.
    subprocess.run(base, input="warm-up\n", capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            (1, [], "full length"),
            (args.uncapped_reps, [], "full length"),
            (-(-args.memory_lines // len(lines)), ["--max-len-a", "0", "--max-len-b", "2"],
             "outputs capped at 2 tokens, so it takes minutes, not an hour"),
        ]  # fmt: skip
        for reps, extra, note in runs:
            if reps < 1:
                continue
            path = Path(tmp) / f"input-{reps}.txt"
            with open(path, "w", encoding="utf-8") as fh:
                for _ in range(reps):
                    fh.write("\n".join(lines) + "\n")
            command = [*base, "-i", str(path), *extra]
            mem = peak_memory(command)
            print(
                f"  {reps * len(lines):,} lines ({note}): largest process {mem.largest:.0f} MiB, "
                f"all processes {mem.rss:.0f} MiB resident / {mem.pss:.0f} MiB proportional, "
                f"in {mem.seconds:.0f}s; extra flags: {' '.join(extra) or 'none'}",
                flush=True,
            )


def cpu_model() -> str:
    """The CPU's model name and its bf16/int8 instruction sets (Linux), else the machine."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.MULTILINE)
    wanted = ("avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    have = [f for f in wanted if flags and f in flags.group(1).split()]
    return f"{name.group(1) if name else platform.machine()} ({', '.join(have) or 'no bf16/vnni'})"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_src", type=Path, help="source side of the test set (gz)")
    parser.add_argument("--model", type=Path, required=True, help="a trained checkpoint")
    parser.add_argument("--ref", type=Path, help="reference (gz): sacreBLEU of every system")
    parser.add_argument(
        "--precisions", default="fp32,bf16,int8", help="nmt precisions, comma-separated"
    )
    parser.add_argument("--ct2", default="float32,int8", help="CTranslate2 exports to compare")
    parser.add_argument("--single", type=int, default=300, help="sentences at batch 1")
    parser.add_argument("--threads", type=int, default=0, help="cores of the wide layout; 0: all")
    parser.add_argument("--interactive-lines", type=int, default=100)
    parser.add_argument("--memory-lines", type=int, default=200_000)
    parser.add_argument("--uncapped-reps", type=int, default=20, help="test set x N, full length")
    parser.add_argument("--skip", default="", help="comma list: speed,interactive,memory")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100 sentences, 30 at batch 1, less memory"
    )
    args = parser.parse_args()
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.ct2 = [c for c in args.ct2.split(",") if c]
    args.skip = set(filter(None, args.skip.split(",")))
    return args


def main() -> None:
    args = parse_args()
    print("command:", " ".join(["python", *sys.argv]), flush=True)
    lines = read_lines(args.test_src)
    if args.quick:
        lines, args.single, args.interactive_lines = lines[:100], 30, 20
        args.uncapped_reps, args.memory_lines = 10, 10_000
    ckpt = load_checkpoint(args.model)
    cfg = ckpt.model_config
    print(
        f"{date.today()}, {cpu_model()}, "
        f"{usable_cpus()} usable cores, torch {torch.__version__}; model {args.model} (step "
        f"{ckpt.step}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model "
        f"{cfg.d_model}); {len(lines)} sentences; beam 4, alpha 0.6, max |src| + 50"
    )
    del ckpt
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {c: Path(tmp) / f"ct2-{c}" for c in args.ct2}
        for compute_type, model_dir in dirs.items():
            print("export:", export(args.model, model_dir, compute_type), flush=True)
        if "speed" not in args.skip:
            rows = speed(args, lines, dirs)
            systems = [*(f"nmt {p}" for p in args.precisions), *(f"CT2 {c}" for c in dirs)]
            print_tables(rows, systems)
        if "interactive" not in args.skip:
            from bench_interactive import report

            report(args.model, lines[: args.interactive_lines], dirs)
    if "memory" not in args.skip:
        memory(args, lines)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this benchmark process: {own:.0f} MiB")


if __name__ == "__main__":
    main()
