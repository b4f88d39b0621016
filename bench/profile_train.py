"""Where the real training loop's time goes, beside the update alone.

Runs the training engine (`nmt_cli.engines.train.train`, in this process) on a prepared
data directory for a few hundred updates of its real, length-varying batches, with
timers around each part of every update:

    batch preparation  TrainFeed.micro_batches / prefetch (collation, copies)
    forward            Transformer.forward
    loss               the label-smoothed loss over the logits
    backward           Tensor.backward
    optimizer          Adam's step
    norm and clipping  the rest of the update's step (gradient norm, clip, zero_grad)
    reporting          Reporter.update (events, metrics.jsonl)
    thread tuner       ThreadTuner before/after each update
    bookkeeping        the remainder of the update's wall time

Validation and checkpoints are timed apart (they are not per-update work). In the same
process it then times the engine's `Updater` alone, as `bench/bench_train.py` does: on
the first real batches repeated (shapes reused) and on the loop's batches in order
(every shape new), so the difference between the microbenchmark and the loop is split
into its causes. On a CPU every part is synchronous, so wall-clock timers are exact.
With --gpus the parts time what the host spends in them (launches), "device wait" is the
update's one synchronisation, and the line that matters is the host time outside the
model's parts (bench/gpu_check.sh prints it).

    .venv/bin/python bench/profile_train.py --data data/multi30k-en-de --updates 300 \
        --threads 2 --precision fp32
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shlex
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_train import nmt_step

from nmt_cli.config import load_recipe
from nmt_cli.core import objective as objective_module
from nmt_cli.core.batching import Batch
from nmt_cli.core.transformer import Transformer
from nmt_cli.engines.train import TrainOptions, train
from nmt_cli.engines.train import loop as loop_module
from nmt_cli.engines.train import step as step_module
from nmt_cli.engines.train.checkpoints import CheckpointKeeper
from nmt_cli.engines.train.device_choices import choose
from nmt_cli.engines.train.feed import TrainFeed
from nmt_cli.engines.train.report import Reporter
from nmt_cli.engines.train.step import PendingUpdate, Updater
from nmt_cli.engines.train.threads import ThreadTuner
from nmt_cli.engines.train.validate import Validator
from nmt_cli.heap import reused_heap

PARTS = (
    "batch preparation",
    "forward",
    "loss",
    "backward",
    "optimizer",
    "norm and clipping",
    "device wait",
    "reporting",
    "thread tuner",
    "seeds, schedule",
    "accounting",
    "stop policy",
    "instrumentation",
)


@dataclass
class Ledger:
    """Seconds per part of each update, and what the loop did besides updates."""

    updates: list[dict[str, float]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    saving_s: float = 0.0
    saves: int = 0
    current: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    depth: int = 0  # > 0 inside a timed part: nested calls are not counted twice
    saving: bool = False
    gc_started: float = 0.0
    save_parts: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def timed(self, part: str, fn: Callable[..., Any], saving: bool = False) -> Callable[..., Any]:
        """`fn` timed into the current update's `part`, or with `saving` into the saves'
        split (parts called inside another timed part, or during a save, are not counted
        into an update)."""
        ledger = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not saving and (ledger.saving or ledger.depth):
                return fn(*args, **kwargs)
            into = ledger.save_parts if saving else ledger.current
            ledger.depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                into[part] += time.perf_counter() - t
                ledger.depth -= 1

        return wrapper


@contextlib.contextmanager
def patched(ledger: Ledger) -> Iterator[None]:
    """Timers around the engine's parts, removed on exit."""
    saved: list[tuple[Any, str, Any]] = []

    def replace(owner: Any, name: str, new: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def wrap(owner: Any, name: str, part: str, saving: bool = False) -> None:
        replace(owner, name, ledger.timed(part, getattr(owner, name), saving))

    original_micro = TrainFeed.micro_batches

    def keep_batches(self: TrainFeed, plan: Any, update: int) -> Any:
        """The loop's batches, for the update alone to run again afterwards."""
        out = original_micro(self, plan, update)
        if len(ledger.batches) < 400:
            ledger.batches.extend(b for b, _ in out)
        return out

    replace(TrainFeed, "micro_batches", ledger.timed("batch preparation", keep_batches))
    wrap(TrainFeed, "prefetch", "batch preparation")
    wrap(Transformer, "forward", "forward")
    wrap(objective_module, "label_smoothed_sums", "loss")
    wrap(objective_module, "projected_label_smoothed_sums", "loss")
    wrap(torch.Tensor, "backward", "backward")
    wrap(torch.optim.Adam, "step", "optimizer")
    wrap(PendingUpdate, "result", "device wait")
    wrap(Reporter, "update", "reporting")
    wrap(ThreadTuner, "before_update", "thread tuner")
    wrap(ThreadTuner, "after_update", "thread tuner")
    wrap(step_module, "seed_dropout", "seeds, schedule")
    wrap(loop_module, "paper_learning_rate", "seeds, schedule")
    wrap(TrainFeed, "micro_seeds", "seeds, schedule")
    wrap(loop_module._Trainer, "_account", "accounting")
    wrap(loop_module._Trainer, "_count", "accounting")
    wrap(loop_module.StopPolicy, "local_flags", "stop policy")
    wrap(loop_module.StopPolicy, "decide", "stop policy")

    wrap(Validator, "__call__", "validation", saving=True)
    wrap(CheckpointKeeper, "save_step", "writing", saving=True)
    wrap(CheckpointKeeper, "save_last", "writing", saving=True)

    def collecting(phase: str, info: dict[str, int]) -> None:
        """Python's garbage collections, wherever they fall (inside the parts too)."""
        if phase == "start":
            ledger.gc_started = time.perf_counter()
        elif not ledger.saving:
            ledger.current["(garbage collection)"] += time.perf_counter() - ledger.gc_started
            ledger.current[f"(gc generation {info['generation']})"] += 1

    gc.callbacks.append(collecting)
    original_step = Updater._step

    def step(self: Updater, *args: Any) -> Any:  # norm and clipping = _step - optimizer
        before = ledger.current["optimizer"]
        t = time.perf_counter()
        out = original_step(self, *args)
        spent = time.perf_counter() - t - (ledger.current["optimizer"] - before)
        ledger.current["norm and clipping"] += spent
        return out

    replace(Updater, "_step", step)

    original_save = loop_module._Trainer.save

    def save(self: Any, validate: bool) -> None:
        ledger.saving = True
        t = time.perf_counter()
        try:
            original_save(self, validate)
        finally:
            ledger.saving_s += time.perf_counter() - t
            ledger.saves += 1
            ledger.saving = False

    replace(loop_module._Trainer, "save", save)

    original_updates = TrainFeed.updates

    def updates(self: TrainFeed, pos: Any) -> Iterator[Any]:
        """Each update's wall time: from one yield to the next, minus saving."""
        last = None
        saving_before = 0.0
        for plan, update in original_updates(self, pos):
            now = time.perf_counter()
            if last is not None:
                ledger.walls.append(now - last - (ledger.saving_s - saving_before))
                ledger.updates.append(dict(ledger.current))
            ledger.current = defaultdict(float)
            last, saving_before = now, ledger.saving_s
            lo = update * plan.slots
            ledger.tokens.append(plan.update_tgt_tokens(update))
            ledger.threads.append(torch.get_num_threads())
            for index in plan.batches[lo : lo + plan.slots]:
                src_len = int(self.src.lengths[index].max()) + 1
                tgt_len = int(self.tgt.lengths[index].max()) + 1
                ledger.shapes.append((len(index), src_len, tgt_len))
            ledger.current["instrumentation"] += time.perf_counter() - now
            yield plan, update

    replace(TrainFeed, "updates", updates)

    try:
        yield
    finally:
        gc.callbacks.remove(collecting)
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def time_alone(run: Callable[[Batch], None], batches: list[Batch]) -> tuple[float, float]:
    """(median, mean) target tokens/s of one update per batch, after two warm-ups."""
    for batch in batches[:2]:
        run(batch)
    rates, tokens, seconds = [], 0, 0.0
    for batch in batches:
        t = time.perf_counter()
        run(batch)
        dt = time.perf_counter() - t
        rates.append(batch.tgt_tokens / dt)
        tokens += batch.tgt_tokens
        seconds += dt
    return statistics.median(rates), tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/multi30k-en-de.toml")
    parser.add_argument("--data", required=True, help="prepared data directory (nmt prepare)")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--threads", type=int, default=0, help="train.threads (0 = tuner)")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--alone", type=int, default=40, help="updates of the Updater alone")
    parser.add_argument("--gpus", type=int, default=0, help="train on GPUs (no --alone then)")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="K=V")
    args = parser.parse_args()
    print("command:", shlex.join([sys.executable.split("/")[-1], *sys.argv]))
    with tempfile.TemporaryDirectory() as tmp:
        sets = [
            f'data.dir="{args.data}"',
            f'train.run_dir="{Path(tmp) / "run"}"',
            f"train.max_steps={args.updates}",
            "train.max_time_minutes=0",
            f"train.threads={args.threads}",
            f'train.precision="{args.precision}"',
            "train.tensorboard=false",
            *args.sets,
        ]
        recipe = load_recipe(args.recipe, sets)
        ledger = Ledger()
        start = time.perf_counter()
        with patched(ledger):
            result = train(recipe, TrainOptions(gpus=args.gpus, procs=1))
        total = time.perf_counter() - start
    print(
        f"torch {torch.__version__}; {args.updates} updates, threads "
        f"{sorted(set(ledger.threads))}, {result.steps} steps in {total:.1f} s "
        f"(validation and checkpoints {ledger.saving_s:.1f} s in {ledger.saves} saves: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in ledger.save_parts.items())
        + ")"
    )
    walls = ledger.walls[2:]  # the first updates warm up allocators and kernels
    parts = ledger.updates[2:]
    tokens = ledger.tokens[2 : 2 + len(walls)]
    wall = sum(walls)
    loop_rate = sum(tokens) / wall
    print(f"\nper update (mean of {len(walls)}, after 2 warm-up): {1e3 * wall / len(walls):.1f} ms")
    accounted = 0.0
    for part in PARTS:
        spent = sum(p.get(part, 0.0) for p in parts)
        accounted += spent
        print(f"  {part:18s} {1e3 * spent / len(walls):7.1f} ms  {spent / wall:6.1%}")
    rest = wall - accounted
    print(f"  {'bookkeeping':18s} {1e3 * rest / len(walls):7.1f} ms  {rest / wall:6.1%}")
    model = ("forward", "loss", "backward", "optimizer", "norm and clipping", "device wait")
    inside = sum(p.get(part, 0.0) for p in parts for part in model)
    outside = wall - inside - sum(p.get("instrumentation", 0.0) for p in parts)
    print(
        f"host time outside the model's forward, loss, backward and optimizer: "
        f"{1e3 * outside / len(walls):.2f} ms per update"
    )
    collected = sum(p.get("(garbage collection)", 0.0) for p in parts)
    runs = {g: sum(p.get(f"(gc generation {g})", 0) for p in parts) for g in range(3)}
    print(
        f"  of all the above, Python's garbage collection {1e3 * collected / len(walls):.2f} ms"
        f" per update ({runs[0]} / {runs[1]} / {runs[2]} collections of generation 0 / 1 / 2)"
    )
    probes = [w for w, n in zip(walls, ledger.threads[2:], strict=False) if n == 1]
    if probes and max(ledger.threads) > 1:
        print(f"  thread-tuner probes at 1 thread: {len(probes)} updates")
    shapes = len(set(ledger.shapes))
    print(f"distinct batch shapes: {shapes} of {len(ledger.shapes)} batches")
    print(f"real loop: {loop_rate:,.0f} target tokens/s (update wall time, saves excluded)")

    if args.gpus or not args.alone:
        return
    cfg = result_model_config(recipe)
    fused = choose(recipe.train, torch.device("cpu")).fused_projection
    run = nmt_step(cfg, args.precision, fused)
    batches = ledger.batches
    if args.threads:
        torch.set_num_threads(args.threads)
    repeated = [batches[i % 6] for i in range(args.alone)]
    in_order = batches[6 : 6 + args.alone] or batches[: args.alone]  # a short profile
    for heap in ("glibc's default heap", "the training loop's kept heap"):
        with reused_heap() if "kept" in heap else contextlib.nullcontext():
            med_rep, mean_rep = time_alone(run, repeated)
            med_seq, mean_seq = time_alone(run, in_order)
        print(f"update alone, {heap}:")
        print(
            f"  6 real batches repeated: median {med_rep:,.0f} / mean {mean_rep:,.0f} tok/s; "
            f"loop / alone-median {loop_rate / med_rep:.1%}"
        )
        print(
            f"  {len(in_order)} loop batches in order (new shapes): median {med_seq:,.0f} / "
            f"mean {mean_seq:,.0f} tok/s; loop / alone-mean {loop_rate / mean_seq:.1%}"
        )


def result_model_config(recipe: Any) -> Any:
    """The model configuration training built (the data decides the vocabulary)."""
    from nmt_cli.data_dir import open_data_dir
    from nmt_cli.engines.train.plan import model_config_for

    return model_config_for(recipe, open_data_dir(recipe.data.dir).vocab)


if __name__ == "__main__":
    main()
