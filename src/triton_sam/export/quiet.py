"""The warnings an export would print that say nothing about what it writes, silenced where they arise.

Each rule names a warning's category, the start of its message and the module it is raised from
(a pattern matched at the start of the module's name), so that other warnings, from our own
wrappers above all, still reach the user. Every exported graph is compared with its official
model's outputs in tests/export/test_parity.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from torch.jit import TracerWarning

Rule = tuple[type[Warning], str, str]  # category, message start, module pattern

OFFICIAL_PACKAGES = r"(sam2|sam3|mobile_sam|segment_anything)\."

TRACE: tuple[Rule, ...] = (
    # The official models' code reads tensor sizes as Python values: shape checks (`assert L ==
    # H * W`, `image_pe.size(0) == 1`, which the trace drops), window padding of the fixed image
    # side (`if pad_h > 0`), a head's width (`math.sqrt(c_per_head)`). Our wrappers' own stay shown.
    (TracerWarning, "Converting a tensor to a Python", OFFICIAL_PACKAGES),
    # An optimisation the exporter skips for strided slices; the graph computes the same.
    (UserWarning, "Constant folding - Only steps=1 can be constant folded", r"torch\.onnx\."),
    # About negative indices; the only advanced indexing traced is SAM2's single-mask choice,
    # indexed by `arange` and `argmax` (never negative).
    (UserWarning, "Exporting aten::index operator of advanced indexing", r"torch\.onnx\."),
)

INSTANCE_DECODER_TRACE: tuple[Rule, ...] = (
    # torch_em's decoder crops its skip inputs by sizes read as Python values (fixed: one image of one size).
    (TracerWarning, "Converting a tensor to a Python", r"torch_em\."),
    # Instance norms compute with the input's statistics, as they should (micro-sam's norms do too).
    (UserWarning, "ONNX export mode is set to TrainingMode.EVAL, but operator 'instance_norm'", r"torch\.onnx\."),
)

MOBILE_SAM_IMPORT: tuple[Rule, ...] = (
    # MobileSAM imports timm's old module paths and registers its TinyViT variants over timm's own.
    (FutureWarning, r"Importing from timm\.models\.", r"timm\."),
    (UserWarning, "Overwriting tiny_vit_", r"mobile_sam\."),
)

SAM3_BUILD: tuple[Rule, ...] = (
    # The sam3 package scripts helpers at import and, on a machine without CUDA, says at import and
    # build that it turns off its bfloat16 autocast (the export traces in float32 or float16 as asked).
    (FutureWarning, "`torch.jit.script` is deprecated", r"torch\.jit\."),
    (UserWarning, "CUDA is not available or torch_xla is imported. Disabling autocast", r"sam3\."),
)

SAM3_DETECTOR_TRACE: tuple[Rule, ...] = (
    # The detector's fixed map size (72 x 72) and sam3's checks of its inputs, as Python values.
    (TracerWarning, "torch.tensor results are registered as constants", r"sam3\."),
    (TracerWarning, "Using len to get tensor shape", r"sam3\."),
    (TracerWarning, "Converting a tensor to a Python boolean", r"torch$"),  # torch._assert_async's check
    # sam3's adaptive sampling (-1) is ONNX RoiAlign's 0: the same.
    (UserWarning, "ONNX export for RoIAlign with a non-zero sampling_ratio", r"torchvision\."),
)


@contextmanager
def ignoring(rules: tuple[Rule, ...]) -> Iterator[None]:
    """Ignore the warnings `rules` name while the block runs (no others; warnings.catch_warnings
    restores the filters after it)."""
    with warnings.catch_warnings():
        for category, message, module in rules:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
        yield
