"""The mask logits a Triton server keeps for this client as later mask inputs, as far as the
client knows (`contract.KEEP_LOGITS`): their keys, and how to make the server keep them again."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..prompts import DecodeRequest
from ..registry import ModelSpec
from ..server.models.triton_sam_arrays import logits_signature


@dataclass(frozen=True)
class Recipe:
    """The decode that made kept logits this client received only as a crop, and which of its
    masks they are: run again, it makes the server keep them again. Where it refined such logits,
    `parent` holds their signature and recipe (a chain of clicks outlives the client's bound)."""

    request: DecodeRequest
    multimask_output: bool
    candidate: int
    parent: tuple[str, Recipe] | None = None


@dataclass(frozen=True)
class _Kept:
    key: str  # the server's signature of the logits
    recipe: Recipe | None  # None: the client holds the logits themselves


class KeptLogits:
    """The mask logits the server keeps for this client as mask inputs, as far as it knows: the
    newest `capacity` (the server's own bound; other clients may make it evict sooner), each
    under the signature of the mask input this client would send for them (clamped as
    `spec.as_mask_input` does): the server's key and, for those received only as a crop, their
    `Recipe`. Older mask inputs are sent as they are."""

    def __init__(self, spec: ModelSpec, capacity: int) -> None:
        self.spec = spec
        self.capacity = max(1, capacity)
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()

    def _signatures(self, masks: np.ndarray) -> list[str]:
        """Signatures of the mask inputs the logits of `masks` ([..., S, S], as decoded) would make."""
        return [logits_signature(logits) for logits in self.spec.as_mask_input(masks).reshape(-1, *masks.shape[-2:])]

    def add(self, masks: np.ndarray, keys: np.ndarray | None = None, made_by: tuple[DecodeRequest, bool] | None = None) -> None:
        """Note the logits of one decode's `masks` ([1, C, S, S], as received) as kept: under the
        server's `keys` ([1, C] bytes) and the decode that `made_by` them (request, multimask)
        where `masks` are rebuilt from a crop, else under their own signatures."""
        signatures = self._signatures(masks)
        server_keys = signatures if keys is None else [key.decode() for key in keys.reshape(-1)]
        with self._lock:
            recipes = [None if made_by is None else Recipe(*made_by, c, self._parent(made_by[0])) for c in range(len(signatures))]
            for signature, key, recipe in zip(signatures, server_keys, recipes, strict=True):
                self._kept[signature] = _Kept(key, recipe)
                self._kept.move_to_end(signature)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def _parent(self, request: DecodeRequest) -> tuple[str, Recipe] | None:
        """The signature and recipe of `request`'s mask input, if it is kept logits received as a crop (lock held)."""
        if request.mask_input is None:
            return None
        signature = logits_signature(request.mask_input[0, 0])
        kept = self._kept.get(signature)
        return None if kept is None or kept.recipe is None else (signature, kept.recipe)

    def keys(self, mask_input: np.ndarray) -> np.ndarray | None:
        """The server's keys for a request's `mask_input` [B, 1, S, S] as its bytes tensor [B, 1]; None unless all are kept."""
        signatures = [logits_signature(logits) for logits in mask_input[:, 0]]
        with self._lock:
            if not all(signature in self._kept for signature in signatures):
                return None
            for signature in signatures:
                self._kept.move_to_end(signature)
            return np.array([[self._kept[signature].key.encode()] for signature in signatures], dtype=np.object_)

    def recall(self, signature: str, recipe: Recipe) -> None:
        """Note logits the client bound dropped as kept again, under no key the server knows:
        naming them fails, and `recipe` runs again (a chain of refinements being restored)."""
        with self._lock:
            self._kept.setdefault(signature, _Kept(signature, recipe))

    def lost(self, mask_input: np.ndarray) -> list[tuple[str, Recipe]]:
        """The server forgot some of `mask_input`'s logits: forget those this client holds itself
        (it sends them now), and return the signatures and recipes of the others."""
        recipes = []
        with self._lock:
            for signature in {logits_signature(logits) for logits in mask_input[:, 0]}:
                kept = self._kept.get(signature)
                if kept is not None and kept.recipe is not None:
                    recipes.append((signature, kept.recipe))
                else:
                    self._kept.pop(signature, None)
        return recipes

    def rebind(self, signature: str, recipe: Recipe, masks: np.ndarray) -> None:
        """`recipe` ran again and made `masks` ([S, S]), kept: the mask input of `signature` names
        them now (the same logits, unless the server's decoder is not deterministic)."""
        (again,) = self._signatures(masks)
        with self._lock:
            if again in self._kept:
                self._kept[signature] = _Kept(self._kept[again].key, recipe)
                self._kept.move_to_end(signature)
