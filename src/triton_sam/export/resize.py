"""The encoder's resize: torchvision's antialiased bilinear `Resize`, exported as ONNX `Resize`.

torch's ONNX exporter drops `antialias=True` from `F.interpolate`; this op traces as PyTorch's own
antialiased resize and exports as `Resize(mode=linear, antialias=1, exclude_outside=1)` (opset 18),
which ONNX Runtime computes with the same triangle filter (checked against torch in the tests).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.onnx._internal.torchscript_exporter import symbolic_helper


class _AntialiasedResize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)

    @staticmethod
    def symbolic(g, x, height: int, width: int):
        start, end = (g.op("Constant", value_t=torch.tensor([i])) for i in (0, 2))
        batch_channels = g.op("Slice", g.op("Shape", x), start, end)
        sizes = g.op("Concat", batch_channels, g.op("Constant", value_t=torch.tensor([height, width])), axis_i=0)
        none = symbolic_helper._optional_input_placeholder_tensor(g)
        return g.op(
            "Resize",
            x,
            none,
            none,
            sizes,
            mode_s="linear",
            antialias_i=1,
            exclude_outside_i=1,
            coordinate_transformation_mode_s="half_pixel",
        )


def antialiased_resize(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[N, C, h, w] float -> [N, C, `height`, `width`], as torchvision's `Resize(antialias=True)`."""
    return _AntialiasedResize.apply(x, height, width)
