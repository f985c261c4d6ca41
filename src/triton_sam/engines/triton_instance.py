"""micro-sam's instance-segmentation maps from a Triton server (`TritonEngine.instance_maps`): the
session model runs the decoder next to the image's features and answers the maps at the image's
size, or, where that is more bytes, the image's part of them, which is resized here
(`server/models/triton_sam_instance.py` says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import contract
from ..errors import ServerModelError
from ..server.models.triton_sam_arrays import resized
from .base import ImageFeatures

if TYPE_CHECKING:
    from .triton import TritonEngine


def instance_maps(engine: TritonEngine, features: ImageFeatures, image_hw: tuple[int, int]) -> np.ndarray:
    """Float32 [3, H, W] maps at `image_hw` of the image of `features` (encoded by `engine`)."""
    spec = engine.spec
    config = engine.session_config(features.handle)
    if not any(output["name"] == contract.INSTANCE_MAPS for output in config.get("output", [])):
        raise ServerModelError(_missing(engine, "its model repository was exported before triton-sam served them"))
    arrays = {
        contract.MAPS_REGION: np.array([spec.input_hw(image_hw)], np.int64),
        contract.IMAGE_HW: np.array([image_hw], np.int64),
    }
    try:
        maps = engine.call(features, arrays, [contract.INSTANCE_MAPS])[contract.INSTANCE_MAPS][0]
    except ServerModelError as error:
        if contract.NO_INSTANCE_DECODER in str(error):
            raise ServerModelError(_missing(engine, "its model was exported without its decoder")) from error
        raise
    return maps if maps.shape[-2:] == tuple(image_hw) else resized(maps, image_hw)


def _missing(engine: TritonEngine, why: str) -> str:
    """What to do where the server cannot compute the maps, and `why`."""
    model = engine.spec.model_id
    return (
        f"{engine.spec.session_name} on {engine.describe()} computes no instance-segmentation maps ({why}): export "
        f"{model} with its instance-segmentation decoder into the server's model repository (`triton-sam setup {model}`, "
        f"or `triton-sam export {model} --checkpoint PATH --decoder PATH`) and restart the server."
    )
