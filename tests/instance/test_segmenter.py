"""`InstanceSegmenter` without a decoder, and its reuse of a `FeatureCache`, on the synthetic model."""

from __future__ import annotations

import pytest

from synthetic import disk_image
from triton_sam import Predictor
from triton_sam.errors import InvalidInputError
from triton_sam.features import FeatureCache
from triton_sam.instance import InstanceSegmenter


@pytest.fixture
def predictor(synthetic_repository):
    with Predictor("sam2.1_hiera_tiny", model_repository=synthetic_repository) as predictor:
        yield predictor


def test_a_model_without_decoder_says_so_and_the_plane_stays_encoded_once(predictor):
    image = disk_image(120, 160, [(50, 60, 20)])
    cache = FeatureCache(predictor.engine)
    segmenter = InstanceSegmenter(predictor, cache=cache)
    with pytest.raises(InvalidInputError, match="no instance-segmentation decoder"):
        segmenter.initialize(image)
    assert not segmenter.is_initialized
    assert predictor.original_size == (120, 160)  # set to the image, as micro-sam's predictor is
    with pytest.raises(InvalidInputError):
        segmenter.initialize(image)
    assert (cache.misses, cache.hits) == (1, 1)


def test_generate_before_initialize_is_an_error(predictor):
    with pytest.raises(RuntimeError, match="initialize"):
        InstanceSegmenter(predictor).generate()
