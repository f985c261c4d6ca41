"""The models triton-sam knows: where their weights come from and how images are prepared for them.

A `ModelSpec` is everything a caller needs to prepare inputs and read outputs without knowing
the model family; families differ only in the values held here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelNotFoundError


@dataclass(frozen=True)
class ModelSpec:
    """One downloadable, exportable model."""

    model_id: str
    family: str
    url: str
    sha256: str
    config: str
    input_size: int  # images are stretched to input_size x input_size (SAM2)
    feature_shapes: dict[str, tuple[int, ...]]
    low_res_size: int = 256

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
        """Name of the stateful model that keeps embeddings on the server (encode -> handle -> decode)."""
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


MODELS: dict[str, ModelSpec] = {
    spec.model_id: spec
    for spec in (
        _sam2("tiny", "t", "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69"),
        _sam2("small", "s", "6d1aa6f30de5c92224f8172114de081d104bbd23dd9dc5c58996f0cad5dc4d38"),
        _sam2("base_plus", "b+", "a2345aede8715ab1d5d31b4a509fb160c5a4af1970f199d9054ccfb746c004c5"),
        _sam2("large", "l", "2647878d5dfa5098f2f8649825738a9345572bae2d4350a2468587ece47dd318"),
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
