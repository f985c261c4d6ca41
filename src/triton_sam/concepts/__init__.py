"""SAM3 concept prompts: every instance of a phrase ("nucleus") or of exemplar boxes in an image.

How `sam3`'s `Sam3Processor` computes them, and the ONNX graphs that reproduce it:

1. Image. `set_image` resizes to 1008 x 1008 (mean = std = 0.5) and runs the ViT trunk once; SAM3's
   dual neck then makes two sets of maps from the trunk's [1, 1024, 72, 72] output: the detector's
   (`backbone_fpn`: 256 channels at 288, 144 and 72 px, with fixed sine position encodings) and the
   tracker's (`sam2_backbone_out`). One encode serves both: SAM3's encoder graph
   (`export.sam3_onnx.Encoder`) answers the detector's maps (`contract.DETECTOR_MAPS`) after the
   tracker's features, from one trunk run. They are 111 MB per image in float32 (256 x (288^2 +
   144^2 + 72^2)), so an engine keeps them only when asked (`LocalEngine(detector_maps=True)`) and
   the decoder ignores them; the `FeatureCache` is bounded in bytes (1 GB by default: ~7 such
   images, ~48 without the maps).
2. Phrase -> text features: CLIP's BPE tokenizer (`concepts.tokenizer`, on the client, no torch),
   then the text encoder graph (`text_encoder.onnx`: 24-layer, 1024-wide transformer and a linear
   resize to 256; token ids int64 [B, 32] -> float32 [B, 32, 256]). It depends on the phrase alone,
   so its output is cached by phrase (`PhraseEncoder`). With boxes and no phrase, sam3 encodes the
   phrase "visual".
3. Detector graph (`detector.onnx`, `export.sam3_detector_onnx`; contract.DETECTOR_INPUTS/OUTPUTS),
   per request: the image's three detector maps (their sine position encodings are constants in
   the graph), the text features and their padding mask (token id 0), and 0..N exemplar boxes
   (cx, cy, w, h normalised to [0, 1], labels positive/negative; `add_geometric_prompt`'s format) ->
   the geometry encoder (box projections, ROI-align on the 72 px map, box position encodings,
   label embeddings, a CLS token, 3 layers attending to the image), concatenated after the text
   tokens as the prompt; the fusion encoder (6 layers, image attends to the prompt); the DETR-style
   decoder (200 queries, 6 layers, box refinement, a presence token); dot-product scores against
   the prompt; the segmentation head (pixel decoder over the 288/144/72 px maps, mask embeddings)
   -> per query: a box (cx, cy, w, h), a score logit, 288 x 288 mask logits, and one presence logit.
4. Post-processing on the client (`concepts.instances`, as `_forward_grounding`): score =
   sigmoid(logit) * sigmoid(presence), kept above `confidence_threshold`; boxes to x0, y0, x1, y1 in
   image pixels; masks bilinearly resized to the image and thresholded at sigmoid 0.5. A new
   threshold re-filters the last detector outputs without running the detector again.

`ConceptProcessor` (`concepts.processor`) is `Sam3Processor`'s API on these graphs, run locally
(ONNX Runtime), the image encoded through a `FeatureCache` that a tracker `Predictor` can share
(one encode for points and concepts), or on a Triton engine: the session model keeps the image's
detector maps and answers each query's box and score and only the masks above a floor, cropped to
their positive logits (`server/models/triton_sam_concepts.py`); the same post-processing
(`concepts.instances`) makes the instances of both. It matches `Sam3Processor` end to end on random
weights, locally and through Triton (tests/export/test_sam3_processor_parity.py,
test_sam3_triton_parity.py).

`triton-sam export sam3_tracker` writes the concept graphs beside the session model
(`repository.concepts_path`) from the same model as the tracker: sam3's image model with its
interactive tracker (`export.sam3_onnx.build_model`; `--no-concepts` leaves them out). The napari
panel's Find (`plugin.find`) runs on planes encoded whole, on a large plane's tiles in view
(`concepts.tiled`) and on every plane of a stack.

Through a Triton server the session model runs the text encoder and detector next to the
features it keeps (`server/models/triton_sam_concepts.py`); a client without the export's files
asks it once for the tokenizer's merges file (`contract.VOCABULARY`), so napari's Find runs there too.

Every engine answers the same concept request (`Engine.concepts`): the local engine runs it on the
detector maps it keeps (`engines.local_concepts`), so `backend="auto"` goes on finding locally once
its server is gone. `python -m benchmarks concepts` times it all against `Sam3Processor`.

Found while reading and running sam3 0.1.4 on a CPU, for the detector's export and its reference:
`Sam3Processor` itself fails there (the geometry encoder's `pin_memory()` needs CUDA), so the
reference must run with `pin_memory` made a no-op; `set_image` took 35 s for one image on 2 cores;
the text transformer's positional embedding and projection are `torch.empty` at random init (filled
by `export.sam3_concepts_onnx.fill_uninitialised`; the detector has no such weights); boxes are
pooled with torchvision's `roi_align` (ONNX RoiAlign, sampling ratio adaptive, aligned=False);
`nn.MultiheadAttention` and sam3's box encoding reshape by Python ints, which a trace freezes (the
number of exemplar boxes), so the export traces equivalent forms (`export.traceable_attention`).
"""

from .processor import ConceptProcessor
from .text import PhraseEncoder
from .tokenizer import Tokenizer

__all__ = ["ConceptProcessor", "PhraseEncoder", "Tokenizer"]
