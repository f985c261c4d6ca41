"""Export SAM3's concept path (see `triton_sam.concepts` for how it splits into graphs).

Done so far: the text encoder, `sam3.model.text_encoder_ve.VETextEncoder` from the token ids on
(tokenizing stays on the client, `concepts.tokenizer`), with CLIP's BPE merges copied beside it.
Needs the `export` extra (torch, sam3; open_clip_torch ships the merges file that sam3 0.1.4's
wheel leaves out).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import nn

from .. import contract
from ..concepts.tokenizer import CONTEXT_LENGTH, VOCAB_FILE
from .onnx_file import export_onnx, external_data_path


def vocab_file() -> Path:
    """CLIP's BPE merges: sam3's own copy where its package has one, else open_clip's (the same file)."""
    import sam3

    own = Path(sam3.__file__).parent.parent / "assets" / VOCAB_FILE
    if own.exists():
        return own
    import open_clip

    return Path(os.path.dirname(open_clip.__file__)) / VOCAB_FILE


def fill_uninitialised(text_encoder: nn.Module) -> None:
    """Give random values to the weights sam3 0.1.4 leaves as `torch.empty` (whatever memory held,
    NaN at times), drawn from the global generator as CLIP initialises them; a checkpoint's
    weights replace them. The text transformer's positional embedding and its projection of the
    pooled text (which the detector does not read: it reads the tokens)."""
    transformer = text_encoder.encoder
    with torch.no_grad():
        torch.nn.init.normal_(transformer.positional_embedding, std=0.01)
        torch.nn.init.normal_(transformer.text_projection, std=transformer.width**-0.5)


class TextEncoder(nn.Module):
    """Token ids int64 [B, 32] -> text features float32 [B, 32, 256], batch first (sam3 keeps them
    sequence first); the padding mask is `tokens == 0` (sam3's `language_mask`)."""

    def __init__(self, text_encoder: nn.Module):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, memory = self.text_encoder.encoder(tokens)
        return self.text_encoder.resizer(memory)


def export_text_encoder(text_encoder: nn.Module, directory: Path) -> list[Path]:
    """`text_encoder.onnx` (its weights, 1.4 GB in float32, in `text_encoder.onnx.data`) and the
    tokenizer's merges file into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / contract.TEXT_ENCODER_FILE
    tokens = torch.zeros(1, CONTEXT_LENGTH, dtype=torch.int64)
    tokens[0, :3] = torch.tensor([49406, 25693, 49407])  # "nucleus"
    dynamic = {contract.TEXT_TOKENS: {0: "batch"}, contract.TEXT_FEATURES: {0: "batch"}}
    wrapper = TextEncoder(text_encoder.eval())
    export_onnx(wrapper, (tokens,), path, [contract.TEXT_TOKENS], [contract.TEXT_FEATURES], dynamic, external_data=True)
    vocab = directory / VOCAB_FILE
    shutil.copyfile(vocab_file(), vocab)
    return [path, external_data_path(path), vocab]
