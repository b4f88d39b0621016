"""TensorBoard, when installed: the metrics.jsonl scalars and, at every validation, the
attention of a fixed dev sentence as images, read back from the event file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from nmt_cli.engines.pictures.tensorboard_images import heads_image
from nmt_cli.engines.train import train
from tests.fixtures.train_data import tiny_recipe

pytest.importorskip("tensorboard")


def test_heads_image_puts_heads_side_by_side_white_to_blue() -> None:
    weights = np.zeros((2, 3, 4))
    weights[0, 1, 2] = 1.0
    image = heads_image(weights, cell=2)
    assert image.shape == (3, 6, 2 * 8 + 4) and image.dtype == np.uint8
    assert list(image[:, 2, 4]) == [8, 81, 156]  # head 1, row 1, column 2: full weight
    assert (image[:, :, 8:12] == 160).all() and (image[:, :, 12:] == 255).all()  # gap, head 2


def test_event_file_has_the_scalars_and_attention_images(data: Path, tmp_path: Path) -> None:
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train(tiny_recipe(data, run, max_steps=6, save_interval_steps=3))
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for kind, key in (("train", "loss"), ("train", "grad_norm"), ("valid", "dev_ppl")):
        logged = [(r["step"], r[key]) for r in records if r["type"] == kind]
        scalars = [(e.step, e.value) for e in events.Scalars(f"{kind}/{key}")]
        assert [s for s, _ in scalars] == [s for s, _ in logged]
        assert [v for _, v in scalars] == pytest.approx([v for _, v in logged], rel=1e-6)
    expected = {f"attention/{k}/layer1" for k in ("encoder", "decoder", "cross")}
    assert expected <= set(tags["images"])
    images = events.Images("attention/encoder/layer1")
    assert [i.step for i in images] == [3, 6]
    picture = np.asarray(Image.open(io.BytesIO(images[-1].encoded_image_string)))
    assert picture.shape[0] == images[-1].height and picture.shape[1] == images[-1].width
    assert images[-1].width > 4 * images[-1].height // 2  # four heads side by side
    assert picture.min() < 160 and picture.max() == 255  # some attention, some none
