"""Random-init checkpoints written as micro-sam publishes and reads them, for the tests and
benchmarks that cannot download the real ones: identical weights in must give identical masks out.

The SAM is built by micro-sam's own builder (`micro_sam.util.sam_model_registry`: MobileSAM's
registry when `mobile_sam` is installed, which builds every size) with torch's default random
init from a fixed seed.
"""

from __future__ import annotations

from pathlib import Path

# How a checkpoint holds the SAM's weights (`micro_sam.util._load_checkpoint` reads all three).
PLAIN = "plain"  # the state dict itself, as the bioimage.io files and `export_custom_sam_model` write it
MODEL_STATE = "model_state"  # {"model_state": state dict} (with "decoder_state" when given)
TORCH_EM = "torch_em"  # a training checkpoint: {"model_state": {"sam.<key>": ...}}


def random_sam(model_type: str, seed: int):
    """micro-sam's SAM of `model_type` ("vit_b", "vit_t", ...) with random weights from `seed`."""
    import torch
    from micro_sam.util import sam_model_registry

    torch.manual_seed(seed)
    return sam_model_registry[model_type]().eval()


def write_checkpoint(path: Path, model_type: str, seed: int, layout: str = PLAIN, decoder_state: dict | None = None) -> Path:
    """Save a random SAM of `model_type` at `path` in `layout`; `decoder_state` (an instance
    decoder's weights) goes beside it under "decoder_state" (layouts with a "model_state" only)."""
    import torch

    state = random_sam(model_type, seed).state_dict()
    if layout == PLAIN:
        if decoder_state is not None:
            raise ValueError("a plain state dict has no place for a decoder: micro-sam publishes it as a second file")
        saved = state
    else:
        prefix = "sam." if layout == TORCH_EM else ""
        saved = {"model_state": {prefix + key: value for key, value in state.items()}}
        if decoder_state is not None:
            saved["decoder_state"] = decoder_state
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, path)
    return path


def write_decoder(path: Path, model_type: str, seed: int) -> Path:
    """Save a random instance-segmentation decoder for `model_type` at `path` as micro-sam publishes
    it (`*_decoder.pt`), torch_em's init drawn after the SAM's from `seed`."""
    import torch

    from benchmarks.instance import decoder_state

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(decoder_state(random_sam(model_type, seed)), path)
    return path
