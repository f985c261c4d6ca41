"""The session model's instance-maps requests, run in this process as in `test_python_model`: a
synthetic micro-sam model (vit_t_lm's shapes) whose instance decoder is a small graph."""

from __future__ import annotations

import numpy as np
import pytest
import test_python_model
from test_python_model import _encode, _Error, _Logger, _Request, _session_model

from synthetic import disk_image, write_instance_decoder, write_repository
from triton_sam import contract
from triton_sam.engines.local import LocalEngine
from triton_sam.image import encoder_input
from triton_sam.registry import get_model
from triton_sam.repository import locate
from triton_sam.server.models.triton_sam_arrays import resized

VIT_T = get_model("vit_t_lm")
backend_utils, python_model = test_python_model.backend_utils, test_python_model.python_model  # its fixtures


@pytest.fixture(scope="module")
def repositories(tmp_path_factory):
    """(with its instance decoder, without one): the synthetic vit_t_lm."""
    with_decoder = write_repository(VIT_T, tmp_path_factory.mktemp("vit_t_lm_with_decoder"))
    write_instance_decoder(VIT_T, with_decoder)
    return with_decoder, write_repository(VIT_T, tmp_path_factory.mktemp("vit_t_lm_without_decoder"))


def _maps_request(handle: str, image_hw: tuple[int, int], region: tuple[int, int] | None = None) -> _Request:
    return _Request(
        (contract.INSTANCE_MAPS,),
        handle=np.array([[handle.encode()]], dtype=np.object_),
        maps_region=np.array([region or VIT_T.input_hw(image_hw)], np.int64),
        image_hw=np.array([image_hw], np.int64),
    )


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_maps_come_at_the_image_size_or_as_its_region_whichever_is_smaller_and_resize_to_the_local_maps(
    python_model, repositories, buffers
):
    """A 320 x 384 image gets its maps at its size (fewer samples than its 853 x 1024 region); a
    2048 x 1536 one its 1024 x 768 region, resized by the client: both equal the local engine's maps.
    The decoder is loaded by the first request for maps, once."""
    _Logger.infos.clear()
    model = _session_model(python_model, repositories[0], buffers, spec=VIT_T)
    local = LocalEngine(locate(VIT_T, repositories[0]))
    assert not _decoder_loads()  # not with the model: by the first request for maps
    for image_hw, answered_hw in (((320, 384), (320, 384)), ((2048, 1536), (1024, 768))):
        image = encoder_input(disk_image(*image_hw, [(image_hw[1] / 3, image_hw[0] / 2, image_hw[0] / 5)]), VIT_T)
        (answer,) = model.run([_maps_request(_encode(model, image), image_hw)])
        assert answer.error is None, answer.error.message
        maps = answer.outputs[contract.INSTANCE_MAPS]
        assert maps.dtype == np.float32 and maps.shape == (1, 3, *answered_hw)
        ours = maps[0] if answered_hw == image_hw else resized(maps[0], image_hw)
        expected = local.instance_maps(local.encode(image), image_hw)
        assert 0.2 < expected.std() and np.abs(ours - expected).max() < 1e-5
    assert _decoder_loads() == [f"{VIT_T.model_id}: instance decoder loaded on device 0 for its first instance-maps request"]


def _decoder_loads() -> list[str]:
    """What the session models said, since the log was cleared, of loading their instance decoder."""
    return [line for line in _Logger.infos if "instance decoder loaded" in line]


def test_without_a_decoder_or_with_a_bad_region_or_handle_the_request_fails_saying_why(python_model, repositories):
    with_decoder = _session_model(python_model, repositories[0], "off", spec=VIT_T)
    without = _session_model(python_model, repositories[1], "off", spec=VIT_T)
    image = encoder_input(disk_image(100, 120, [(50, 50, 20)]), VIT_T)
    (answer,) = without.run([_maps_request(_encode(without, image), (100, 120))])
    assert answer.error.code == _Error.INVALID_ARG
    assert answer.error.message.startswith(f"invalid request: {contract.NO_INSTANCE_DECODER}")
    assert "--decoder" in answer.error.message
    handle = _encode(with_decoder, image)
    (answer,) = with_decoder.run([_maps_request(handle, (100, 120), region=(1025, 1024))])
    assert answer.error.code == _Error.INVALID_ARG and contract.MAPS_REGION in answer.error.message
    (answer,) = with_decoder.run([_maps_request("0" * 32, (100, 120))])
    assert answer.error.code == _Error.NOT_FOUND and contract.UNKNOWN_HANDLE in answer.error.message
