"""The session model's requests about volumes (SAM2.1): track an object on a plane, remember a
mask as a memory, take a mask as the object's (`contract`, "SAM2.1 volumes"). Written next to
`model.py`; numpy, onnxruntime and Triton's `triton_python_backend_utils` only.
"""

import hashlib
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract
from triton_sam_features import LruStore
from triton_sam_requests import UnknownMemory, ort_session, required, response, text
from triton_sam_video import TRACK_OUTPUTS, VideoGraphs, has_video_graphs

# The inputs that tell a volume request from a decode.
VIDEO_INPUTS = (contract.MASK, contract.MASK_LOGITS, contract.MEMORY_TPOS)


def video_requests(model_dir: Path, params: dict):
    """The model's volume requests if its video graphs were exported, else None."""
    if not has_video_graphs(model_dir / contract.VIDEO_DIR):
        return None
    return VideoRequests(model_dir / contract.VIDEO_DIR, int(params.get(contract.MEMORY_CACHE_SIZE_PARAMETER, "512")))


class VideoRequests:
    """A volume's requests about one encoded plane (`handle`): track an object there, remember a
    mask as a memory (kept here in a bounded LRU, returned as a handle), or take a mask as the
    object's. Which memories a plane attends to is the client's choice."""

    def __init__(self, directory: Path, capacity: int) -> None:
        self.graphs = VideoGraphs(directory, ort_session)
        self.track_outputs = TRACK_OUTPUTS
        self.memories = LruStore(capacity)

    def handles(self, request) -> bool:
        return any(pb_utils.get_input_tensor_by_name(request, name) is not None for name in VIDEO_INPUTS)

    def run(self, request, features: dict) -> "pb_utils.InferenceResponse":
        if pb_utils.get_input_tensor_by_name(request, contract.MASK) is not None:
            mask = required(request, contract.MASK)
            if mask.ndim != 3 or mask.shape[0] != 1 or 0 in mask.shape:
                raise ValueError(f"mask must be [1, H, W], got {list(mask.shape)}")
            low_res, score, obj_ptr = self.graphs.mask_as_output(features, mask[0] > 0)
            return response(
                [contract.LOW_RES_LOGITS, contract.OBJECT_SCORE, contract.MASK_OBJ_PTR], [low_res, score, obj_ptr.reshape(1, -1)]
            )
        if pb_utils.get_input_tensor_by_name(request, contract.MASK_LOGITS) is not None:
            logits, score = required(request, contract.MASK_LOGITS), required(request, contract.MASK_SCORE)
            binarize = bool(required(request, contract.BINARIZE).reshape(-1)[0] > 0.5)
            memory = self.graphs.remember(features, logits, score, binarize)
            digest = hashlib.blake2b(memory.tobytes(), digest_size=16).hexdigest()
            self.memories.put(digest, memory)
            return response([contract.MEMORY_HANDLE], [np.array([[digest.encode()]], dtype=np.object_)])
        return self._track(request, features)

    def _track(self, request, features: dict) -> "pb_utils.InferenceResponse":
        handles = [text(h) for h in required(request, contract.MEMORY_HANDLES).reshape(-1)]
        try:
            memories = [self.memories.get(h) for h in handles]
        except KeyError as error:
            raise UnknownMemory(error.args[0]) from None
        mask = pb_utils.get_input_tensor_by_name(request, contract.MASK_INPUT)
        low = self.graphs.low_res
        prompts = {
            contract.POINT_COORDS: required(request, contract.POINT_COORDS).astype(np.float32),
            contract.POINT_LABELS: required(request, contract.POINT_LABELS).astype(np.int32),
            contract.MASK_INPUT: mask.as_numpy() if mask is not None else np.zeros((1, 1, low, low), np.float32),
            contract.HAS_MASK_INPUT: np.full((1, 1), float(mask is not None), np.float32),
        }
        ptrs = required(request, contract.OBJ_PTRS)
        outputs = self.graphs.track(
            features,
            memories,
            required(request, contract.MEMORY_TPOS).reshape(-1),
            ptrs.reshape(-1, ptrs.shape[-1]),
            required(request, contract.OBJ_PTR_TPOS).reshape(-1),
            prompts,
        )
        return response(list(self.track_outputs), outputs)
