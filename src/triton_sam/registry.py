"""The models triton-sam knows: where their weights come from and how images are prepared for them.

A `ModelSpec` is everything a caller needs to prepare inputs and read outputs without knowing
the model family; families differ only in the values held here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ModelNotFoundError

# How an image becomes the encoder's input.
STRETCH = "stretch"  # to input_size x input_size, aspect ratio ignored, in the encoder (SAM2)
LONGEST_SIDE = "longest_side"  # longest side to input_size on the client, aspect kept; the encoder pads (SAM1)
# A stretched model's client sends planes as they are up to this many times its input size per
# side, and reduces longer sides itself first (bounds bytes per encode; see image.encoder_input).
MAX_SENT_FACTOR = 4

# How prompts become decoder points.
SAM2_PROMPTS = "sam2"  # box corners before clicks; the decoder adds SAM2's padding point itself
SAM1_PROMPTS = "sam1"  # clicks before box corners; a (0, 0) point labelled -1 when there is no box


@dataclass(frozen=True)
class ModelSpec:
    """One downloadable, exportable model."""

    model_id: str
    family: str  # "sam2", "sam1", "mobile_sam" or "sam3": which official code builds it
    url: str
    sha256: str | None  # None: a gated download the user makes (see download.download_checkpoint)
    config: str  # the official builder's name for it: a SAM2 config file, a SAM1 registry key, a sam3 builder
    input_size: int
    feature_shapes: dict[str, tuple[int, ...]]
    low_res_size: int = 256
    resize: str = STRETCH
    prompt_format: str = SAM2_PROMPTS
    fill_hole_area: int = 0  # holes of at most this many low-res pixels are filled, as the official predictor does
    # The official predictor clamps the low-res logits it returns (and users send back as a mask
    # input) to +-this (SAM2, SAM3); None: as they are (SAM1's SamPredictor).
    low_res_clamp: float | None = 32.0

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of the image the network sees, resized from an image of `image_hw` (prompts are
        scaled to it)."""
        if self.resize == STRETCH:
            return self.input_size, self.input_size
        height, width = image_hw
        scale = self.input_size / max(height, width)
        return int(height * scale + 0.5), int(width * scale + 0.5)  # rounded as SAM1's ResizeLongestSide

    def as_mask_input(self, low_res: np.ndarray) -> np.ndarray:
        """Low-res logits as the official predictor returns them for a next round's mask input."""
        if self.low_res_clamp is None:
            return low_res
        return np.clip(low_res, -self.low_res_clamp, self.low_res_clamp)

    @property
    def max_sent_side(self) -> int:
        """Longest side of an image the client sends to the encoder."""
        return MAX_SENT_FACTOR * self.input_size if self.resize == STRETCH else self.input_size

    @property
    def max_read_side(self) -> int:
        """Longest side of a window of a large plane read as it is for a tile; larger windows (tiles
        zoomed out beyond the plane's pyramid) are reduced while they are read (`image.read_window`)."""
        return MAX_SENT_FACTOR * self.input_size

    def sent_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of the encoder input the client makes from an image of `image_hw`: the image
        itself with sides capped at `max_sent_side` (stretch: the encoder resizes), or `input_hw` (SAM1)."""
        if self.resize == STRETCH:
            return min(image_hw[0], self.max_sent_side), min(image_hw[1], self.max_sent_side)
        return self.input_hw(image_hw)

    @property
    def encoder_name(self) -> str:
        """Name of the encoder in a Triton model repository."""
        return f"{self.model_id}_encoder"

    @property
    def decoder_name(self) -> str:
        """Name of the stateless decoder in a Triton model repository."""
        return f"{self.model_id}_decoder"

    @property
    def session_name(self) -> str:
        """Name of the stateful model that keeps features on the server (encode -> handle -> decode)."""
        return f"{self.model_id}_session"

    @property
    def checkpoint_filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


_SAM2_FEATURES = {
    "image_embed": (256, 64, 64),
    "high_res_feats_0": (32, 256, 256),
    "high_res_feats_1": (64, 128, 128),
}
_SAM2_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/092824/{}.pt"


def _sam2(size: str, config_suffix: str, sha256: str) -> ModelSpec:
    model_id = f"sam2.1_hiera_{size}"
    return ModelSpec(
        model_id=model_id,
        family="sam2",
        url=_SAM2_URL.format(model_id),
        sha256=sha256,
        config=f"configs/sam2.1/sam2.1_hiera_{config_suffix}.yaml",
        input_size=1024,
        feature_shapes=_SAM2_FEATURES,
    )


def _sam1(model_id: str, family: str, builder: str, url: str, sha256: str) -> ModelSpec:
    return ModelSpec(
        model_id=model_id,
        family=family,
        url=url,
        sha256=sha256,
        config=builder,
        input_size=1024,
        feature_shapes={"image_embed": (256, 64, 64)},
        resize=LONGEST_SIDE,
        prompt_format=SAM1_PROMPTS,
        low_res_clamp=None,
    )


_SAM1_URL = "https://dl.fbaipublicfiles.com/segment_anything/{}"

# SAM3's interactive tracker: SAM2's decoder on SAM3's ViT at 1008 px; its predictor fills holes.
_SAM3_TRACKER = ModelSpec(
    model_id="sam3_tracker",
    family="sam3",
    url="https://huggingface.co/facebook/sam3/resolve/main/sam3.pt",
    sha256=None,  # gated: Hugging Face serves it only after the user accepts its licence
    config="build_tracker",
    input_size=1008,
    feature_shapes={"image_embed": (256, 72, 72), "high_res_feats_0": (32, 288, 288), "high_res_feats_1": (64, 144, 144)},
    low_res_size=288,
    fill_hole_area=256,
)

MODELS: dict[str, ModelSpec] = {
    spec.model_id: spec
    for spec in (
        _sam2("tiny", "t", "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69"),
        _sam2("small", "s", "6d1aa6f30de5c92224f8172114de081d104bbd23dd9dc5c58996f0cad5dc4d38"),
        _sam2("base_plus", "b+", "a2345aede8715ab1d5d31b4a509fb160c5a4af1970f199d9054ccfb746c004c5"),
        _sam2("large", "l", "2647878d5dfa5098f2f8649825738a9345572bae2d4350a2468587ece47dd318"),
        _sam1(
            "sam_vit_b",
            "sam1",
            "vit_b",
            _SAM1_URL.format("sam_vit_b_01ec64.pth"),
            "ec2df62732614e57411cdcf32a23ffdf28910380d03139ee0f4fcbe91eb8c912",
        ),
        _sam1(
            "sam_vit_l",
            "sam1",
            "vit_l",
            _SAM1_URL.format("sam_vit_l_0b3195.pth"),
            "3adcc4315b642a4d2101128f611684e8734c41232a17c648ed1693702a49a622",
        ),
        _sam1(
            "sam_vit_h",
            "sam1",
            "vit_h",
            _SAM1_URL.format("sam_vit_h_4b8939.pth"),
            "a7bf3b02f3ebf1267aba913ff637d9a2d5c33d3173bb679e46d9f338c26f262e",
        ),
        _sam1(
            "mobile_sam",
            "mobile_sam",
            "vit_t",
            "https://github.com/ChaoningZhang/MobileSAM/raw/master/weights/mobile_sam.pt",
            "6dbb90523a35330fedd7f1d3dfc66f995213d81b29a5ca8108dbcdd4e37d6c2f",
        ),
        _SAM3_TRACKER,
    )
}

DEFAULT_MODEL = "sam2.1_hiera_tiny"


def get_model(model_id: str) -> ModelSpec:
    """Return the spec of `model_id`, or say which ids exist."""
    try:
        return MODELS[model_id]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ModelNotFoundError(f"Unknown model {model_id!r}. Known models: {known}.") from None
