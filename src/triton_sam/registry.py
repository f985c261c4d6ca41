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
    # "<algorithm>:<hex digest>" of the file at `url` ("sha256:...", "xxh128:..." as micro-sam
    # publishes them); None: a gated download the user makes (see download.download_checkpoint)
    checksum: str | None
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
    description: str = ""  # one line for model lists: what the weights were trained for
    source: str = ""  # who publishes the weights and under which licence (the panel's model box shows it)
    # The file name a download is kept under, where the URL's own is not unique (micro-sam's
    # "vit_b.pt" is several models; owncloud's ".../download"); None: the URL's last part.
    filename: str | None = None
    # micro-sam's instance-segmentation decoder published beside the weights (None: none).
    decoder_url: str | None = None
    decoder_checksum: str | None = None
    # micro-sam's models see each channel of a plane (or tile) stretched from its min..max to 0..255
    # before encoding (`image.stretch_channels`), as micro-sam runs them.
    channel_stretch: bool = False

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
        """Name of the downloaded checkpoint in the checkpoint folder."""
        return self.filename or self.url.rsplit("/", 1)[-1]

    @property
    def decoder_filename(self) -> str | None:
        """Name of the downloaded instance-segmentation decoder in the checkpoint folder."""
        return f"{self.model_id}_decoder.pt" if self.decoder_url else None


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
        checksum=f"sha256:{sha256}",
        config=f"configs/sam2.1/sam2.1_hiera_{config_suffix}.yaml",
        input_size=1024,
        feature_shapes=_SAM2_FEATURES,
        description=f"natural images, general purpose (SAM 2.1 {size})",
        source="Meta AI, SAM 2 (Apache-2.0)",
    )


def _sam1(model_id: str, family: str, builder: str, url: str, checksum: str, **published) -> ModelSpec:
    """A SAM1-architecture model; `published`: description, source, file names, decoder of a fine-tune."""
    return ModelSpec(
        model_id=model_id,
        family=family,
        url=url,
        checksum=checksum,
        config=builder,
        input_size=1024,
        feature_shapes={"image_embed": (256, 64, 64)},
        resize=LONGEST_SIDE,
        prompt_format=SAM1_PROMPTS,
        low_res_clamp=None,
        **published,
    )


_SAM1_URL = "https://dl.fbaipublicfiles.com/segment_anything/{}"

# SAM3's interactive tracker: SAM2's decoder on SAM3's ViT at 1008 px; its predictor fills holes.
_SAM3_TRACKER = ModelSpec(
    model_id="sam3_tracker",
    family="sam3",
    url="https://huggingface.co/facebook/sam3/resolve/main/sam3.pt",
    checksum=None,  # gated: Hugging Face serves it only after the user accepts its licence
    config="build_sam3_image_model",  # with its tracker (`enable_inst_interactivity`): one model for points and concepts
    input_size=1008,
    feature_shapes={"image_embed": (256, 72, 72), "high_res_feats_0": (32, 288, 288), "high_res_feats_1": (64, 144, 144)},
    low_res_size=288,
    fill_hole_area=256,
    description="natural images, general purpose (SAM 3's interactive tracker)",
    source="Meta AI, SAM 3 (SAM License; gated on Hugging Face)",
)


_BIOIMAGE_IO = "https://uk1s3.embassy.ebi.ac.uk/public-datasets/bioimage.io/{}/files/{}"
_OWNCLOUD = "https://owncloud.gwdg.de/index.php/s/{}/download"
# micro-sam's code is MIT; the weights it publishes on bioimage.io carry the licence its bioimage.io
# export sets (CC-BY-4.0, micro_sam/bioimageio/model_export.py); those on GWDG's ownCloud name none there.
_ON_BIOIMAGE_IO = "micro-sam, bioimage.io model {} (CC-BY-4.0)"
_ON_OWNCLOUD = "micro-sam, GWDG ownCloud (licence: see micro-sam)"
_MICROSCOPY = {
    "lm": "light microscopy: cells and nuclei",
    "em_organelles": "electron microscopy: mitochondria, nuclei and other organelles",
    "histopathology": "histopathology: nuclei in stained tissue sections",
    "medical_imaging": "medical imaging: organs and lesions in CT, MRI and other scans",
}


def _micro_sam(model_id: str, url: str, checksum: str, decoder_url: str, decoder_checksum: str, source: str) -> ModelSpec:
    """A micro-sam fine-tune under its micro-sam name: SAM1's architecture (vit_t: MobileSAM's), its
    instance-segmentation decoder in a second file (checksums as micro-sam's registry gives them)."""
    builder, domain = model_id[:5], model_id[6:]
    return _sam1(
        model_id,
        "mobile_sam" if builder == "vit_t" else "sam1",
        builder,
        url,
        f"xxh128:{checksum}",
        description=_MICROSCOPY[domain],
        source=source,
        filename=f"{model_id}.pt",
        channel_stretch=True,
        decoder_url=decoder_url,
        decoder_checksum=f"xxh128:{decoder_checksum}",
    )


def _on_bioimage_io(model_id: str, record: str, checksum: str, decoder_checksum: str) -> ModelSpec:
    """A micro-sam model published on bioimage.io as `record` ("diplomatic-bug/1.2")."""
    vit = model_id[:5]
    url, decoder_url = (_BIOIMAGE_IO.format(record, name) for name in (f"{vit}.pt", f"{vit}_decoder.pt"))
    source = _ON_BIOIMAGE_IO.format(record.split("/")[0])
    return _micro_sam(model_id, url, checksum, decoder_url, decoder_checksum, source)


def _on_owncloud(model_id: str, share: str, checksum: str, decoder_share: str, decoder_checksum: str) -> ModelSpec:
    """A micro-sam model published as GWDG ownCloud shares."""
    url, decoder_url = _OWNCLOUD.format(share), _OWNCLOUD.format(decoder_share)
    return _micro_sam(model_id, url, checksum, decoder_url, decoder_checksum, _ON_OWNCLOUD)


# micro-sam 1.8.14's `micro_sam.util.models()`: its fine-tunes, each with its decoder.
MICRO_SAM_MODELS = (
    _on_bioimage_io("vit_t_lm", "faithful-chicken/1.1", "72ec5074774761a6e5c05a08942f981e", "3e914a5f397b0312cdd36813031f8823"),
    _on_bioimage_io("vit_b_lm", "diplomatic-bug/1.2", "fe9252a29f3f4ea53c15a06de471e186", "708b15ac620e235f90bb38612c4929ba"),
    _on_bioimage_io("vit_l_lm", "idealistic-rat/1.2", "017f20677997d628426dec80a8018f9d", "2faeafa03819dfe03e7c46a44aaac64a"),
    _on_bioimage_io(
        "vit_t_em_organelles", "greedy-whale/1", "253474720c497cce605e57c9b1d18fd9", "8f897c7bb93174a4d1638827c4dd6f44"
    ),
    _on_bioimage_io(
        "vit_b_em_organelles", "noisy-ox/1.2", "f3bf2ed83d691456bae2c3f9a05fb438", "bb6398956a6b0132c26b631c14f95ce2"
    ),
    _on_bioimage_io(
        "vit_l_em_organelles", "humorous-crab/1.2", "810b084b6e51acdbf760a993d8619f2d", "334877640bfdaaabce533e3252a17294"
    ),
    _on_owncloud(
        "vit_b_histopathology",
        "sBB4H8CTmIoBZsQ",
        "ffd1a2cd84570458b257bd95fdd8f974",
        "KO9AWqynI7SFOBj",
        "6a66194dcb6e36199cbee2214ecf7213",
    ),
    _on_owncloud(
        "vit_l_histopathology",
        "IZgnn1cpBq2PHod",
        "b591833c89754271023e901281dee3f2",
        "oIs6VSmkOp7XrKF",
        "46aab7765d4400e039772d5a50b55c04",
    ),
    _on_owncloud(
        "vit_h_histopathology",
        "L7AcvVz7DoWJ2RZ",
        "bd1856dafc156a43fb3aa705f1a6e92e",
        "1qAKxy5H0jgwZvM",
        "3ed9f87e46ad5e16935bd8d722c8dc47",
    ),
    _on_owncloud(
        "vit_b_medical_imaging",
        "f5Ol4FrjPQWfjUF",
        "40169f1e3c03a4b67bff58249c176d92",
        "ahd3ZhZl2e0RIwz",
        "9e498b12f526f119b96c88be76e3b2ed",
    ),
)

MODELS: dict[str, ModelSpec] = {
    spec.model_id: spec
    for spec in (
        _sam2("tiny", "t", "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69"),
        _sam2("small", "s", "6d1aa6f30de5c92224f8172114de081d104bbd23dd9dc5c58996f0cad5dc4d38"),
        _sam2("base_plus", "b+", "a2345aede8715ab1d5d31b4a509fb160c5a4af1970f199d9054ccfb746c004c5"),
        _sam2("large", "l", "2647878d5dfa5098f2f8649825738a9345572bae2d4350a2468587ece47dd318"),
        *(
            _sam1(
                f"sam_{vit}",
                "sam1",
                vit,
                _SAM1_URL.format(name),
                f"sha256:{sha256}",
                description=f"natural images, general purpose (SAM {vit})",
                source="Meta AI, Segment Anything (Apache-2.0)",
            )
            for vit, name, sha256 in (
                ("vit_b", "sam_vit_b_01ec64.pth", "ec2df62732614e57411cdcf32a23ffdf28910380d03139ee0f4fcbe91eb8c912"),
                ("vit_l", "sam_vit_l_0b3195.pth", "3adcc4315b642a4d2101128f611684e8734c41232a17c648ed1693702a49a622"),
                ("vit_h", "sam_vit_h_4b8939.pth", "a7bf3b02f3ebf1267aba913ff637d9a2d5c33d3173bb679e46d9f338c26f262e"),
            )
        ),
        _sam1(
            "mobile_sam",
            "mobile_sam",
            "vit_t",
            "https://github.com/ChaoningZhang/MobileSAM/raw/master/weights/mobile_sam.pt",
            "sha256:6dbb90523a35330fedd7f1d3dfc66f995213d81b29a5ca8108dbcdd4e37d6c2f",
            description="natural images, general purpose; the fastest encoder (MobileSAM)",
            source="MobileSAM, Kyung Hee University (Apache-2.0)",
        ),
        _SAM3_TRACKER,
        *MICRO_SAM_MODELS,
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
