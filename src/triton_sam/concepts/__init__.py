"""SAM3 concept prompts: every instance of a phrase ("nucleus") or of exemplar boxes in an image.

How `sam3`'s `Sam3Processor` computes them, and the ONNX graphs that reproduce it:

1. Image. `set_image` resizes to 1008 x 1008 (mean = std = 0.5) and runs the ViT trunk once; SAM3's
   dual neck then makes two sets of maps from the trunk's [1, 1024, 72, 72] output: the detector's
   (`backbone_fpn`: 256 channels at 288, 144 and 72 px, with fixed sine position encodings) and the
   tracker's (`sam2_backbone_out`, what `export.sam3_onnx` exports for points and boxes). One encode
   serves both when the encoder graph answers the detector's maps beside the tracker's (the trunk,
   ~95 % of the encode, is shared); the session model keeps them under the same handle.
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
4. Post-processing on the client (as `_forward_grounding`): score = sigmoid(logit) *
   sigmoid(presence), kept above `confidence_threshold`; boxes to x0, y0, x1, y1 in image pixels;
   masks bilinearly resized to the image and thresholded at sigmoid 0.5. A new threshold re-filters
   the last detector outputs without running the detector again.

One encode for both (not done): SAM3's tracker export already holds the detector's neck
(`backbone.vision_backbone.convs`, loaded from `detector.backbone.vision_backbone.*` of a sam3.pt)
but `Sam3TrackerPredictor.forward_image` keeps only `sam2_backbone_out`; a SAM3 encoder wrapper
would call `backbone.forward_image` once and answer its `backbone_fpn` (the three detector maps)
beside the tracker's features (conv_s0/conv_s1 applied as the tracker does). They are 111 MB per
image in float32 (256 x (288^2 + 144^2 + 72^2)), so the session model should keep them on the server.

Found while reading and running sam3 0.1.4 on a CPU, for the detector's export and its reference:
`Sam3Processor` itself fails there (the geometry encoder's `pin_memory()` needs CUDA), so the
reference must run with `pin_memory` made a no-op; `set_image` took 35 s for one image on 2 cores;
the text transformer's positional embedding and projection are `torch.empty` at random init (filled
by `export.sam3_concepts_onnx.fill_uninitialised`; the detector has no such weights); boxes are
pooled with torchvision's `roi_align` (ONNX RoiAlign, sampling ratio adaptive, aligned=False);
`nn.MultiheadAttention` and sam3's box encoding reshape by Python ints, which a trace freezes (the
number of exemplar boxes), so the export traces equivalent forms (`export.traceable_attention`).
"""

from .text import PhraseEncoder
from .tokenizer import Tokenizer

__all__ = ["PhraseEncoder", "Tokenizer"]
