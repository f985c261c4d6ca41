"""The exported SAM2 video graphs of one model, run in this process with ONNX Runtime."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import contract
from ..engines.local import prompt_feeds
from ..engines.providers import TENSORRT, usable_providers
from ..errors import ModelFileError
from ..prompts import DecodeRequest
from ..repository import ExportedModel
from .memory import MemoryInputs, VideoSettings

# The file names `export.sam2_video_onnx` writes (kept here: the client does not import the exporter).
MEMORY_ATTENTION_FILE = "memory_attention.onnx"
MEMORY_ENCODER_FILE = "memory_encoder.onnx"
TRACKING_DECODER_FILE = "tracking_decoder.onnx"
MASK_PROMPT_FILE = "mask_prompt.onnx"
SETTINGS_FILE = "video.json"
CONSTANTS_FILE = "constants.npz"


@dataclass(frozen=True)
class TrackingOutput:
    """The tracking decoder's outputs for one prompt set (batch of one)."""

    multi_masks: np.ndarray  # [1, 3, S, S]
    multi_scores: np.ndarray  # [1, 3]
    single_mask: np.ndarray  # [1, 1, S, S]
    single_score: np.ndarray  # [1, 1]
    object_score_logits: np.ndarray  # [1, 1]
    obj_ptr: np.ndarray  # [1, 4, C]: single-mask token's pointer, then the multimask tokens'


class VideoGraphs:
    """Memory attention, memory encoder, tracking decoder and mask prompt graphs of `exported`'s model."""

    def __init__(self, exported: ExportedModel, *, providers: list[str] | None = None, intra_op_threads: int = 0) -> None:
        directory = exported.video_dir
        if not (directory / SETTINGS_FILE).is_file():
            raise ModelFileError(
                f"{exported.spec.model_id} has no video graphs in {directory}: it was exported before triton-sam "
                f"could propagate through volumes, or its family has none. Export it again "
                f"(`triton-sam setup {exported.spec.model_id}` or `triton-sam export ... --checkpoint PATH`)."
            )
        self.settings = VideoSettings.from_dict(json.loads((directory / SETTINGS_FILE).read_text()))
        with np.load(directory / CONSTANTS_FILE) as constants:
            self.no_mem_embed = constants["no_mem_embed"].reshape(1, -1, 1, 1)
            self.no_obj_ptr = constants["no_obj_ptr"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        chosen = [p for p in providers or usable_providers() if p != TENSORRT]  # dynamic memory lengths
        self._attention = _session(directory / MEMORY_ATTENTION_FILE, options, chosen)
        self._memory_encoder = _session(directory / MEMORY_ENCODER_FILE, options, chosen)
        self._decoder = _session(directory / TRACKING_DECODER_FILE, options, chosen)
        self._mask_prompt = _session(directory / MASK_PROMPT_FILE, options, chosen)

    def raw_features(self, image_embed: np.ndarray) -> np.ndarray:
        """The backbone's features as the video predictor uses them: the encoder adds
        `no_mem_embed` (what an initial conditioning plane gets), memory paths take them without."""
        return image_embed - self.no_mem_embed

    def attend(self, pix_feat: np.ndarray, inputs: MemoryInputs) -> np.ndarray:
        """Raw features [1, C, H, W] conditioned on the memories in `inputs`."""
        feeds = {
            "pix_feat": pix_feat,
            "memory": inputs.memory,
            "memory_tpos": inputs.memory_tpos,
            "obj_ptrs": inputs.obj_ptrs,
            "obj_ptr_tpos": inputs.obj_ptr_tpos,
        }
        (conditioned,) = self._attention.run(None, feeds)
        return conditioned

    def encode_memory(
        self, pix_feat: np.ndarray, mask_logits: np.ndarray, object_score_logits: np.ndarray, binarize: bool
    ) -> np.ndarray:
        """A mask memory [1, M, H, W] of raw features and low-res mask logits [1, 1, S, S]."""
        feeds = {
            "pix_feat": pix_feat,
            "mask_logits": np.ascontiguousarray(mask_logits, np.float32),
            "object_score_logits": np.ascontiguousarray(object_score_logits, np.float32),
            "binarize": np.array([float(binarize)], np.float32),
        }
        (memory,) = self._memory_encoder.run(None, feeds)
        return memory

    def mask_prompt(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A boolean mask [H, W] -> (low-res logits, the decoder's mask prompt, object score logits)."""
        low_res, prompt, score = self._mask_prompt.run(None, {"mask": mask.astype(np.float32)[None, None]})
        return low_res, prompt, score

    def decode(self, features: dict[str, np.ndarray], request: DecodeRequest, low_res_size: int) -> TrackingOutput:
        """The tracking decoder on feature maps (`image_embed` possibly memory-conditioned)."""
        names = [*contract.DECODER_OUTPUTS, contract.OBJ_PTR]
        outputs = self._decoder.run(names, {**features, **prompt_feeds(request, low_res_size)})
        return TrackingOutput(*outputs)


def _session(path: Path, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as error:  # ORT raises several unrelated types for unreadable models
        raise ModelFileError(f"Cannot load {path}: {error}. Export the model again.") from error
