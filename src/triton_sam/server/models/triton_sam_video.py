"""SAM2.1's video graphs run on one plane's features: what tracking an object needs besides the
image encoder. Used in process by `triton_sam.video` (local engine) and by the session model
(written next to its `model.py`), so both compute alike. numpy and onnxruntime only.

The graphs are exported by `triton_sam.export.sam2_video_onnx` into `<model>_session/1/video/`.
Features come in as the image encoder makes them (`image_embed` includes `no_mem_embed`, what an
initial conditioning plane is decoded with); memory paths take them without it.
"""

import json
from pathlib import Path

import numpy as np

MEMORY_ATTENTION_FILE = "memory_attention.onnx"
MEMORY_ENCODER_FILE = "memory_encoder.onnx"
TRACKING_DECODER_FILE = "tracking_decoder.onnx"
MASK_PROMPT_FILE = "mask_prompt.onnx"
SETTINGS_FILE = "video.json"
CONSTANTS_FILE = "constants.npz"
TRACK_OUTPUTS = ("masks", "iou_predictions", "single_mask", "single_iou", "object_score_logits", "obj_ptr")
EMBED = "image_embed"
PADDING = (np.zeros((1, 1, 2), np.float32), np.full((1, 1), -1, np.int32))  # a padding point: no clicks


def has_video_graphs(directory: Path) -> bool:
    return (Path(directory) / SETTINGS_FILE).is_file()


def to_bfloat16(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), kept as float32: the video
    predictor stores mask memories in bfloat16."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


class VideoGraphs:
    """The four video graphs of one model, as ONNX Runtime sessions made by `open_session(path)`."""

    def __init__(self, directory: Path, open_session) -> None:
        directory = Path(directory)
        self.settings = json.loads((directory / SETTINGS_FILE).read_text())
        with np.load(directory / CONSTANTS_FILE) as constants:
            self.no_mem_embed = constants["no_mem_embed"].reshape(1, -1, 1, 1)
            self.no_obj_ptr = constants["no_obj_ptr"]
        self.attention = open_session(directory / MEMORY_ATTENTION_FILE)
        self.memory_encoder = open_session(directory / MEMORY_ENCODER_FILE)
        self.decoder = open_session(directory / TRACKING_DECODER_FILE)
        self.mask_prompt = open_session(directory / MASK_PROMPT_FILE)
        low_res = {i.name: i.shape for i in self.decoder.get_inputs()}["mask_input"][-1]
        self.low_res = low_res if isinstance(low_res, int) else 256

    def raw(self, features: dict) -> np.ndarray:
        """The backbone's features without `no_mem_embed` (what memories are made and fused with)."""
        return features[EMBED] - self.no_mem_embed

    def track(self, features: dict, memories: list, memory_tpos, obj_ptrs, obj_ptr_tpos, prompts: dict, options=None) -> list:
        """Decode one object on one plane (`TRACK_OUTPUTS`): its features conditioned on
        `memories` (mask memories [1, M, H, W]) and pointers, or as they are with no memories (an
        initial conditioning plane). `prompts`: the decoder's point and mask inputs."""
        conditioned = features[EMBED]
        if memories:
            feeds = {
                "pix_feat": self.raw(features),
                "memory": np.concatenate(memories),
                "memory_tpos": np.asarray(memory_tpos, np.int64),
                "obj_ptrs": np.asarray(obj_ptrs, np.float32),
                "obj_ptr_tpos": np.asarray(obj_ptr_tpos, np.float32),
            }
            (conditioned,) = self.attention.run(None, feeds, options)
        return self.decoder.run(list(TRACK_OUTPUTS), {**features, EMBED: conditioned, **prompts}, options)

    def remember(self, features: dict, mask_logits: np.ndarray, object_score_logits: np.ndarray, binarize: bool) -> np.ndarray:
        """A mask memory [1, M, H, W] (rounded to bfloat16) of a plane and its low-res mask logits."""
        feeds = {
            "pix_feat": self.raw(features),
            "mask_logits": np.ascontiguousarray(mask_logits, np.float32).reshape(1, 1, self.low_res, self.low_res),
            "object_score_logits": np.ascontiguousarray(object_score_logits, np.float32).reshape(1, 1),
            "binarize": np.array([float(binarize)], np.float32),
        }
        (memory,) = self.memory_encoder.run(None, feeds)
        return to_bfloat16(memory)

    def mask_as_output(self, features: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A mask prompt [H, W] taken as the object's mask: (low-res logits [1, 1, S, S], object
        score logits [1, 1], object pointer [C]) as `SAM2Base._use_mask_as_output` makes them; the
        pointer from the decoder given the mask, on the plane's raw features."""
        low_res, mask_prompt, score = self.mask_prompt.run(None, {"mask": np.asarray(mask, np.float32)[None, None]})
        prompts = {
            "point_coords": PADDING[0],
            "point_labels": PADDING[1],
            "mask_input": mask_prompt,
            "has_mask_input": np.ones((1, 1), np.float32),
        }
        outputs = self.decoder.run(["obj_ptr"], {**features, EMBED: self.raw(features), **prompts})
        obj_ptr = outputs[0][0, 0] if score[0, 0] > 0 else self.no_obj_ptr
        return low_res, score, obj_ptr
