"""`nmt train`: the training loop and the parts it is built from (see `loop.py`)."""

from nmt_cli.engines.train.loop import TrainOptions, TrainResult, train
from nmt_cli.engines.train.plan import model_config_for
from nmt_cli.engines.train.report import EventSink

__all__ = ["EventSink", "TrainOptions", "TrainResult", "model_config_for", "train"]
