"""What every rank starts from, decided once by `train()`: the training plan.

`plan_training` sizes the recipe's model for the data directory's vocabulary and, when a
previous run left `checkpoints/last.pt`, loads it and checks that it can be resumed here
(same model, same vocabulary, same data). A fine-tuning run (`train.init_from`) takes
its model from the checkpoint it starts from instead: the architecture is the
checkpoint's, with the recipe's dropout, and the data must be encoded with the
checkpoint's vocabulary; resuming it is resuming any run. The plan is handed to every
rank, so no rank opens the data directory, builds the model configuration or loads a
checkpoint again. It is a frozen dataclass of picklable parts: ranks spawned on this
machine receive it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nmt_cli.config import RecipeConfig
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.vocab import PAD_ID, VocabPair
from nmt_cli.data_dir import PreparedData
from nmt_cli.engines.train.checkpoints import check_resumable
from nmt_cli.engines.train.data_record import refuse_other_data
from nmt_cli.engines.train.run_dir import RunDir
from nmt_cli.errors import NmtError

# Settings of training alone, which a fine-tuning recipe chooses for itself; every other
# model setting is the architecture, which the starting checkpoint decides.
TRAINING_ONLY = ("dropout", "attention_dropout", "relu_dropout")
# Settings filled in from the vocabulary, which is the checkpoint's too.
FROM_VOCABULARY = ("src_vocab_size", "tgt_vocab_size", "pad_id", "joint_vocab")


def model_config_for(recipe: RecipeConfig, vocab: VocabPair) -> ModelConfig:
    """The recipe's model, sized for the data's vocabulary; whether the source embedding
    joins the shared matrix follows the vocabulary being joint (section 3.4)."""
    return dataclasses.replace(
        recipe.model,
        src_vocab_size=len(vocab.src),
        tgt_vocab_size=len(vocab.tgt),
        pad_id=PAD_ID,
        joint_vocab=vocab.joint,
    )


def model_config_from(recipe: RecipeConfig, start: ModelConfig, path: Path) -> ModelConfig:
    """The model a fine-tuning run trains: `start` (the configuration of the checkpoint it
    starts or resumes from) with the recipe's dropout. A recipe setting of the
    architecture that is neither the default nor the checkpoint's contradicts it."""
    default = ModelConfig()
    clashes = [
        f"model.{item.name} = {mine!r} (the checkpoint's is {theirs!r})"
        for item in fields(ModelConfig)
        if item.name not in TRAINING_ONLY + FROM_VOCABULARY
        and (mine := getattr(recipe.model, item.name)) != (theirs := getattr(start, item.name))
        and mine != getattr(default, item.name)
    ]
    if clashes:
        raise NmtError(
            f"train.init_from {path}: the recipe's model contradicts the checkpoint's: "
            + "; ".join(clashes)
            + ". Fine-tuning keeps the checkpoint's architecture: remove these settings"
        )
    return dataclasses.replace(
        start, **{name: getattr(recipe.model, name) for name in TRAINING_ONLY}
    )


def check_init_vocabulary(start: Checkpoint, vocab: VocabPair, path: Path, data: Path) -> None:
    """The data must be encoded with the starting checkpoint's own vocabulary."""
    if (start.vocab.src.model_proto, start.vocab.tgt.model_proto) != (
        vocab.src.model_proto,
        vocab.tgt.model_proto,
    ):
        raise NmtError(
            f"train.init_from {path}: the data directory {data} was encoded with another "
            f"vocabulary than the checkpoint's; prepare it with the model's own: "
            f"nmt prepare ... --vocab-from {path}"
        )


class Resume:
    """A checkpoint a run starts from (the one a rerun continues, or the weights a
    fine-tuning run begins with), loaded and checked once.

    A rank's trainer takes it once (`take`), and the holder lets go of it then, so the
    weights and optimizer state read from disk are not kept beside the live ones for the
    whole run. A rank spawned on this machine receives the path alone and reads the same
    file itself (rank 0 holds the run directory's lock, so it does not change), rather
    than every tensor through shared memory.
    """

    def __init__(self, path: Path, checkpoint: Checkpoint | None = None) -> None:
        self.path = path
        self._checkpoint = checkpoint

    def take(self) -> Checkpoint:
        checkpoint, self._checkpoint = self._checkpoint, None
        return checkpoint if checkpoint is not None else load_checkpoint(self.path)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_checkpoint": None}


@dataclass(frozen=True)
class TrainPlan:
    recipe: RecipeConfig  # its [data] as the data directory has it (data_record.reconcile)
    run_root: Path
    data: PreparedData
    model_config: ModelConfig  # the recipe's model sized for the data's vocabulary
    resume: Resume | None  # None: a fresh run
    init: Resume | None = None  # a fresh fine-tuning run: the weights it starts from
    origin: dict[str, Any] | None = None  # where the weights came from, for checkpoints
    resumed_world: int | None = None  # processes the resumed run was trained with


def plan_training(recipe: RecipeConfig, data: PreparedData, run: RunDir) -> TrainPlan:
    """The plan of `recipe` (already reconciled with `data`) in `run`. Refuses to resume
    a run directory whose last checkpoint was trained with another model, vocabulary or
    data, and to fine-tune on data encoded with another vocabulary than the starting
    checkpoint's; call it under the run directory's lock, so that the checkpoint read is
    the one resumed."""
    init_from = Path(recipe.train.init_from) if recipe.train.init_from else None
    if run.last.is_file():
        checkpoint = load_checkpoint(run.last)
        cfg = model_config_for(recipe, data.vocab)
        if init_from is not None:
            cfg = model_config_from(recipe, checkpoint.model_config, init_from)
        check_resumable(checkpoint, cfg, data.vocab, run.last)
        refuse_other_data(run, data)
        resume = Resume(run.last, checkpoint)
        split = (checkpoint.train_state or {}).get("split") or {}
        world = int(split["world"]) if "world" in split else None
        return TrainPlan(
            recipe, run.root, data, cfg, resume, origin=checkpoint.origin, resumed_world=world
        )
    if init_from is None:
        return TrainPlan(recipe, run.root, data, model_config_for(recipe, data.vocab), None)
    start = load_checkpoint(init_from)
    cfg = model_config_from(recipe, start.model_config, init_from)
    check_init_vocabulary(start, data.vocab, init_from, data.root)
    origin = {"init_from": str(init_from), "step": start.step, "origin": start.origin}
    return TrainPlan(recipe, run.root, data, cfg, None, Resume(init_from, start), origin)
