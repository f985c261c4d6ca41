"""The session model's SAM3 concept requests (`contract`, "concept request"): the text encoder and
the detector run next to the image's kept detector maps (no second encode, no maps sent: they are
111 MB an image), and the answer is compact. Written next to `model.py`; numpy, onnxruntime and
Triton's utilities only.

What is answered: every query's box, logit and the presence logit as the detector gives them (a few
KB: the client scores and filters them), and the mask logits only of the queries scoring above the
request's floor, each cropped in the detector's 288 x 288 logits to the box of its positive logits
grown by one sample (`triton_sam_arrays.cropped_queries`), packed into one flat array with a table
of the boxes. The crop loses nothing the client shows: a bilinear resize to the image reads 2 x 2
neighbouring samples for an output pixel; if one is positive all are within one sample of it, so in
the crop, and the pixel is exact; if none is, the pixel is off however the outside is filled; so the
crops resized with the outside weighing 0 (`triton_sam_arrays.resized_crop`) give exactly the masks
`Sam3Processor` gives (client side: `triton_sam.concepts.instances`). A phrase's text features are
kept by its token ids (a small LRU): a phrase asked again on another image runs only the detector.
"""

import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract
from triton_sam_arrays import concept_answer
from triton_sam_features import LruStore
from triton_sam_requests import ort_session, released, required, response

PHRASES_KEPT = 64  # text features are 32 KB a phrase


def has_concept_graphs(model_dir: Path) -> bool:
    """Whether the session model in `model_dir` (its version folder) has SAM3's concept graphs:
    then its feature stores keep the detector maps too."""
    directory = model_dir / contract.CONCEPTS_DIR
    return all((directory / name).is_file() for name in (contract.TEXT_ENCODER_FILE, contract.DETECTOR_FILE))


class ConceptRequests:
    """Concept requests of the session model in `model_dir`: its text encoder and detector, loaded on
    each device by the first request for an image there; without them each request fails saying
    what to export."""

    def __init__(self, model_dir: Path, model_id: str) -> None:
        self.directory = model_dir / contract.CONCEPTS_DIR
        self.available = has_concept_graphs(model_dir)
        self.model_id = model_id
        self._sessions: dict = {}  # device index -> (text encoder, detector) there
        self._texts = LruStore(PHRASES_KEPT)  # token ids (a tuple) -> text features [1, 32, 256]
        self._loading = threading.Lock()

    def handles(self, request) -> bool:
        return any(
            pb_utils.get_input_tensor_by_name(request, n) is not None for n in (contract.TEXT_TOKENS, contract.VOCABULARY_WANTED)
        )

    def run(self, request, device, row) -> "pb_utils.InferenceResponse":
        """The instances of the request's phrase and exemplars in the image whose features are `row`
        (an entry of `device`'s cache), answered compactly (module docstring); or the tokenizer's
        merges file, where the request asks for it."""
        if pb_utils.get_input_tensor_by_name(request, contract.VOCABULARY_WANTED) is not None:
            return self._vocabulary()
        text_encoder, detector = self._graphs(device.index)
        tokens = required(request, contract.TEXT_TOKENS).astype(np.int64)
        if tokens.shape != (1, _context_length(text_encoder)):
            raise ValueError(f"'{contract.TEXT_TOKENS}' must be [1, {_context_length(text_encoder)}], got {list(tokens.shape)}")
        boxes, labels = _exemplars(request)
        floor = float(required(request, contract.SCORE_FLOOR).reshape(-1)[0])
        feeds = {
            contract.TEXT_FEATURES: self._text(text_encoder, tokens),
            contract.TEXT_PADDING: tokens == 0,
            contract.EXEMPLAR_BOXES: boxes,
            contract.EXEMPLAR_LABELS: labels,
        }
        detected = device.cache.run_decoder(detector, list(contract.DETECTOR_OUTPUTS), [row], feeds, released(detector))
        arrays = concept_answer(*detected, floor)
        return response(list(contract.CONCEPT_OUTPUTS), [np.ascontiguousarray(a) for a in arrays])

    def _vocabulary(self) -> "pb_utils.InferenceResponse":
        """The tokenizer's merges file beside the graphs, as bytes [1, n]."""
        path = self.directory / contract.VOCABULARY_FILE
        if not (self.available and path.is_file()):
            raise ValueError(
                f"{contract.NO_CONCEPT_GRAPHS}: {self.model_id} was exported without SAM3's concept graphs ({path} is missing)"
            )
        return response([contract.VOCABULARY], [np.frombuffer(path.read_bytes(), np.uint8)[None]])

    def _text(self, text_encoder, tokens: np.ndarray) -> np.ndarray:
        """The text features of `tokens`, kept by their ids."""
        key = tuple(tokens.reshape(-1).tolist())
        if key not in self._texts:
            self._texts.put(key, text_encoder.run([contract.TEXT_FEATURES], {contract.TEXT_TOKENS: tokens})[0])
        return self._texts.get(key)

    def _graphs(self, device_index: int) -> tuple:
        """The text encoder's and the detector's sessions on a device, loaded once (by one thread)."""
        with self._loading:
            if device_index not in self._sessions:
                if not self.available:
                    raise ValueError(
                        f"{contract.NO_CONCEPT_GRAPHS}: {self.model_id} was exported without SAM3's concept graphs "
                        f"({self.directory} lacks {contract.TEXT_ENCODER_FILE} and {contract.DETECTOR_FILE}): export them "
                        "there and restart the server"
                    )
                paths = (self.directory / contract.TEXT_ENCODER_FILE, self.directory / contract.DETECTOR_FILE)
                self._sessions[device_index] = tuple(ort_session(path, device_index) for path in paths)
                pb_utils.Logger.log_info(f"{self.model_id}: concept graphs loaded on device {device_index} for a first request")
        return self._sessions[device_index]


def _context_length(text_encoder) -> int:
    """The token ids a phrase has (the text encoder's context: 32)."""
    length = text_encoder.get_inputs()[0].shape[-1]
    return length if isinstance(length, int) else 32


def _exemplars(request) -> tuple:
    """The request's exemplar boxes [1, N, 4] float32 and labels [1, N] int64 (N = 0 where none is sent)."""
    boxes = pb_utils.get_input_tensor_by_name(request, contract.EXEMPLAR_BOXES)
    labels = pb_utils.get_input_tensor_by_name(request, contract.EXEMPLAR_LABELS)
    boxes = np.zeros((1, 0, 4), np.float32) if boxes is None else boxes.as_numpy().astype(np.float32).reshape(1, -1, 4)
    labels = np.zeros((1, 0), np.int64) if labels is None else labels.as_numpy().astype(np.int64).reshape(1, -1)
    if boxes.shape[1] != labels.shape[1]:
        raise ValueError(f"{boxes.shape[1]} exemplar boxes and {labels.shape[1]} labels: send one label a box")
    return boxes, labels
