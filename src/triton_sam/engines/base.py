"""The interface every engine (local ONNX Runtime, Triton) implements, and the values it passes."""

from __future__ import annotations

import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidInputError
from ..masks import MaskResizer
from ..prompts import DecodeRequest
from ..registry import ModelSpec
from ..server.models.triton_sam_arrays import best_candidate

if TYPE_CHECKING:
    from ..features import FeatureCache
    from ..video.backend import VideoBackend


@dataclass(frozen=True, eq=False)
class ImageFeatures:
    """Encoder output for one image, held in one of three places: numpy arrays here (local engine on
    the CPU), buffers on the local engine's GPU (fed back to its decoder without a host round
    trip), or on a server behind a handle, with the encoder input kept so that the image can be
    encoded again if the server lost them. Equal only to itself (the same image encoded twice is
    two features).
    """

    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [1, C, H, W]
    handle: str | None = None
    encoder_input: np.ndarray | None = None  # what was encoded (`image.encoder_input`), kept only with a handle
    device: dict[str, Any] = field(default_factory=dict)  # name -> the engine's device buffer (an ONNX Runtime OrtValue)

    @property
    def on_server(self) -> bool:
        return self.handle is not None

    @property
    def nbytes(self) -> int:
        """Bytes held for these features here and on the local GPU (features, or the kept input)."""
        kept = self.encoder_input.nbytes if self.encoder_input is not None else 0
        on_device = sum(int(np.prod(value.shape())) * 4 for value in self.device.values())  # float32
        return kept + on_device + sum(a.nbytes for a in self.arrays.values())

    def host_arrays(self) -> dict[str, np.ndarray]:
        """The features as numpy arrays, copied from the GPU if they live there (not for server features)."""
        return self.arrays or {name: value.numpy() for name, value in self.device.items()}


@dataclass(frozen=True)
class DecodeResult:
    """Decoder output for B prompt sets: C masks each (3 with multimask, else 1)."""

    low_res_logits: np.ndarray  # float32 [B, C, 256, 256]
    scores: np.ndarray  # float32 [B, C], predicted IoU
    object_score_logits: np.ndarray  # float32 [B, 1]


def best_candidates(result: DecodeResult) -> DecodeResult:
    """Each prompt set's candidate with the highest predicted IoU (the first of equals, as
    `torch.argmax`), as a one-mask result (`DecodeRequest.best_of_multimask`)."""
    return DecodeResult(*best_candidate(result.low_res_logits, result.scores), result.object_score_logits)


# When a running decode is superseded: cancel it at once (stopping is free, e.g. ONNX Runtime's
# terminate), or only once it is overdue (stopping and resending costs more than finishing).
CANCEL_ALWAYS = "always"
CANCEL_OVERDUE = "overdue"


class CancelToken:
    """Cancels one piece of work; engines register how to stop it (terminate flag, gRPC cancel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run `callback` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return
        callback()


class Engine(ABC):
    """Runs one model's encoder and decoder; callers never see where or how."""

    spec: ModelSpec
    # How a scheduler should treat a superseded running decode (see speculative.py).
    cancel_running: str = CANCEL_ALWAYS
    # Whether a scheduler should wait for the cursor to rest before a hover decode: yes where
    # decodes cost a shared server; no on the user's own CPU, where a superseded decode stops at once.
    settle_hovers: bool = False
    # How many images of one shape (a large plane's tiles) callers should hand `encode_many` at
    # once: more than one where the engine encodes them together faster (a server batching on a GPU).
    encode_batch: int = 1
    # SAM3's concept detector maps (`contract.DETECTOR_MAPS`) that this engine's features hold besides
    # the decoder's: none unless asked for (`LocalEngine(detector_maps=True)`).
    detector_maps: tuple[str, ...] = ()
    answers_concepts = False  # runs SAM3's concept request where the features are (`concepts`)

    @abstractmethod
    def encode(self, image: np.ndarray) -> ImageFeatures:
        """Encode one image as `image.encoder_input` makes it (uint8 h x w x C)."""

    def encode_many(self, images: Sequence[np.ndarray]) -> list[ImageFeatures]:
        """Encode several images (one by one unless the engine can do better)."""
        return [self.encode(image) for image in images]

    @abstractmethod
    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        """Decode prompts against features from `encode`; raises DecodeCancelled if cancelled."""

    def instance_maps(self, features: ImageFeatures, image_hw: tuple[int, int]) -> np.ndarray:
        """micro-sam's instance-segmentation maps of an image encoded by `encode`: foreground,
        center distances and boundary distances, float32 [3, H, W] at `image_hw` (as its
        `InstanceSegmentationWithDecoder.initialize` computes them), run where the features are."""
        raise InvalidInputError(f"{self.describe()} has no instance-segmentation decoder for {self.spec.model_id}.")

    def concepts(
        self, features: ImageFeatures, tokens: np.ndarray, boxes: np.ndarray, labels: np.ndarray, floor: float
    ) -> dict[str, np.ndarray]:
        """SAM3's detector on an image encoded by `encode`, for a phrase's token ids (int64 [1, 32]) and
        exemplar boxes ([1, N, 4], labels [1, N]), answered compactly (`contract.CONCEPT_OUTPUTS`: the
        masks only of queries scoring above `floor`, cropped), run where the features are."""
        raise InvalidInputError(f"{self.describe()} runs no SAM3 concept requests.")

    def concepts_vocabulary(self, features: ImageFeatures) -> bytes:
        """The tokenizer's merges file of the concept graphs that `concepts` runs (gzip bytes)."""
        raise InvalidInputError(f"{self.describe()} runs no SAM3 concept requests.")

    @functools.cached_property
    def resizer(self) -> MaskResizer:
        """Brings this engine's low-res logits to an image's size (on the CPU unless the engine says otherwise)."""
        return MaskResizer(self.spec)

    @property
    def weights_id(self) -> str | None:
        """Names the weights behind this engine's features (for caches that outlive it); None if unknown."""
        return None

    def describe(self) -> str:
        """One line for status displays: where this engine runs."""
        return type(self).__name__

    def video(self, cache: FeatureCache) -> VideoBackend:
        """Where SAM2.1 volumes run beside this engine (`video.VolumePredictor`): planes encoded
        through `cache` (this engine's), the video graphs run where the engine runs. Raises with
        what to do where the engine cannot (no video graphs exported, a server without them)."""
        raise InvalidInputError(f"{self.describe()} cannot track objects through volumes.")

    def close(self) -> None:  # noqa: B027 (a hook: engines that hold nothing need not close)
        """Release sessions and connections."""
