"""The session model's instance-segmentation requests (`contract`, "instance maps"): micro-sam's
decoder run next to an image's kept features (no second encode, no features sent), its maps
answered as the image needs them. Written next to `model.py`; numpy, onnxruntime and Triton's
utilities only.

What is answered: micro-sam's post-processing needs the maps at the image's size, as
`UNETR.postprocess_masks` makes them: the decoder's 1024 x 1024 maps cropped to the image's part of
the padded input (`MAPS_REGION`), then resized bilinearly to the image (`IMAGE_HW`). The crop is
exact and only drops samples, so it is always made here; the resize is made on the side where the
maps are smaller: here for an image with fewer pixels than its region (a 320 x 384 plane: 1.47 MB
instead of 10.5 MB for its 853 x 1024 region or 12.6 MB for the whole maps), on the client for a
larger one (a 2048 x 2048 plane: its region's 12.6 MB instead of 50 MB). Both sides resize with
`triton_sam_arrays.resized`, in float32, so nothing is lost for the fewer bytes.
"""

import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract
from triton_sam_arrays import resized
from triton_sam_requests import ort_session, released, required, response


class InstanceRequests:
    """Instance-maps requests of the session model in `model_dir`: its instance decoder if exported
    (`<session>/1/instance_decoder/model.onnx`), loaded by the first request for maps (a server
    nobody asks for maps holds no decoder; one on each device that holds an image asked about);
    else each request fails saying what to do."""

    def __init__(self, model_dir: Path, model_id: str) -> None:
        self.path = model_dir / contract.INSTANCE_DECODER_DIR / "model.onnx"
        self.model_id = model_id
        self._sessions: dict = {}  # device index -> the decoder's session there
        self._loading = threading.Lock()

    def handles(self, request) -> bool:
        return pb_utils.get_input_tensor_by_name(request, contract.IMAGE_HW) is not None

    def run(self, request, device, row) -> "pb_utils.InferenceResponse":
        """The maps of the image whose features are `row` (an entry of `device`'s cache)."""
        session = self._decoder(device.index)
        region = _sides(request, contract.MAPS_REGION)
        image_hw = _sides(request, contract.IMAGE_HW)
        (maps,) = device.cache.run_decoder(session, [contract.INSTANCE_MAPS], [row], {}, released(session))
        if region[0] > maps.shape[-2] or region[1] > maps.shape[-1]:
            raise ValueError(f"'{contract.MAPS_REGION}' {region} exceeds the decoder's maps {list(maps.shape[-2:])}")
        maps = maps[:, :, : region[0], : region[1]]
        if image_hw[0] * image_hw[1] < region[0] * region[1]:
            maps = resized(maps, image_hw)
        return response([contract.INSTANCE_MAPS], [np.ascontiguousarray(maps, np.float32)])

    def _decoder(self, device_index: int):
        """The instance decoder's onnxruntime session on a device, loaded once (by one thread) on
        that device's first use."""
        with self._loading:
            if device_index not in self._sessions:
                if not self.path.exists():
                    raise ValueError(
                        f"{contract.NO_INSTANCE_DECODER}: {self.model_id} was exported without its instance-segmentation "
                        f"decoder ({self.path} is missing): export it with the decoder (`triton-sam setup "
                        f"{self.model_id}`, or `triton-sam export {self.model_id} --checkpoint PATH --decoder PATH`) "
                        "and restart the server"
                    )
                self._sessions[device_index] = ort_session(self.path, device_index)
                pb_utils.Logger.log_info(
                    f"{self.model_id}: instance decoder loaded on device {device_index} for its first instance-maps request"
                )
        return self._sessions[device_index]


def _sides(request, name: str) -> tuple:
    """The request's (height, width) under `name`: two positive numbers."""
    sides = required(request, name).reshape(-1)
    if sides.shape != (2,) or (sides < 1).any():
        raise ValueError(f"'{name}' must be one (height, width) of positive sides, got {sides.tolist()}")
    return int(sides[0]), int(sides[1])
