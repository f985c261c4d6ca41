"""`triton-sam export <micro-sam model> --random-init` writes the instance decoder beside the session
model, and `InstanceSegmenter` runs on it (vit_t_lm: micro-sam's cheapest model with a decoder)."""

from __future__ import annotations

import numpy as np

from synthetic import disk_image
from triton_sam import Predictor
from triton_sam.instance import InstanceSegmenter
from triton_sam.registry import get_model
from triton_sam.repository import instance_decoder_path, read_metadata

MODEL = "vit_t_lm"


def test_random_init_export_writes_a_decoder_the_segmenter_runs(exported_repository):
    repository = exported_repository(MODEL)
    decoder = instance_decoder_path(repository, get_model(MODEL))
    assert decoder.is_file()
    assert read_metadata(decoder.parent) | {"decoder": "random-init", "seed": 0} == read_metadata(decoder.parent)

    image = disk_image(120, 160, [(50, 60, 20)])
    with Predictor(MODEL, model_repository=repository) as predictor:
        segmenter = InstanceSegmenter(predictor)
        segmenter.initialize(image)
        maps = segmenter.get_state()
        labels = segmenter.generate(min_size=0)
    assert {name: value.shape for name, value in maps.items()} == dict.fromkeys(maps, (120, 160))
    assert all(np.all((0 <= value) & (value <= 1)) for value in maps.values())  # sigmoid maps
    assert labels.shape == (120, 160)
