"""What every rank starts from, decided once by `train()`: the training plan.

`plan_training` sizes the recipe's model for the data directory's vocabulary and, when a
previous run left `checkpoints/last.pt`, loads it and checks that it can be resumed here
(same model, same vocabulary, same data). The plan is handed to every rank, so no rank
opens the data directory, builds the model configuration or loads the checkpoint again.
It is a frozen dataclass of picklable parts: ranks spawned on this machine receive it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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


class Resume:
    """The checkpoint a rerun continues from, loaded and checked once.

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


def plan_training(recipe: RecipeConfig, data: PreparedData, run: RunDir) -> TrainPlan:
    """The plan of `recipe` (already reconciled with `data`) in `run`. Refuses to resume
    a run directory whose last checkpoint was trained with another model, vocabulary or
    data; call it under the run directory's lock, so that the checkpoint read is the one
    resumed."""
    cfg = model_config_for(recipe, data.vocab)
    resume = None
    if run.last.is_file():
        checkpoint = load_checkpoint(run.last)
        check_resumable(checkpoint, cfg, data.vocab, run.last)
        refuse_other_data(run, data)
        resume = Resume(run.last, checkpoint)
    return TrainPlan(recipe, run.root, data, cfg, resume)
