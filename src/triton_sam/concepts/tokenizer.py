"""SAM3's text tokenizer (CLIP's byte-level BPE) without torch: a phrase -> 32 token ids.

The same steps as `sam3.model.tokenizer_ve.SimpleTokenizer` (itself OpenAI CLIP's): ftfy and HTML
clean-up, whitespace collapsed, lower case, byte-level BPE with CLIP's merges, start and end tokens,
zero padding, truncated to the context with the end token kept last. The merges file
(`bpe_simple_vocab_16e6.txt.gz`) is copied next to the text encoder by the export.
"""

from __future__ import annotations

import gzip
import html
from functools import lru_cache
from pathlib import Path

import ftfy
import numpy as np
import regex

from .. import contract

CONTEXT_LENGTH = 32  # SAM3's text encoder context (VETextEncoder.context_length)
VOCAB_FILE = contract.VOCABULARY_FILE
_MERGES = 49152 - 256 - 2  # merges CLIP reads from the file (after its header line)
_SPECIAL = ("<start_of_text>", "<end_of_text>")


@lru_cache
def byte_to_unicode() -> dict[int, str]:
    """CLIP's reversible map of bytes to printable characters (no whitespace or control characters)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def clean(text: str) -> str:
    """ftfy, HTML entities twice, whitespace collapsed, lower case (SimpleTokenizer's "lower")."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip().lower()


class Tokenizer:
    """Phrases to SAM3's token ids; words' merges are remembered."""

    def __init__(self, vocab: Path | bytes):
        """`vocab`: the merges file (VOCAB_FILE), or its bytes (as a server answers them)."""
        lines = gzip.decompress(vocab if isinstance(vocab, bytes) else Path(vocab).read_bytes()).decode("utf-8").split("\n")
        merges = [tuple(line.split()) for line in lines[1 : _MERGES + 1]]
        symbols = list(byte_to_unicode().values())
        vocab = [*symbols, *(s + "</w>" for s in symbols), *("".join(m) for m in merges), *_SPECIAL]
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.ranks = {merge: i for i, merge in enumerate(merges)}
        self.start, self.end = self.ids[_SPECIAL[0]], self.ids[_SPECIAL[1]]
        self.pattern = regex.compile(
            "|".join(_SPECIAL) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""", regex.IGNORECASE
        )
        self._words: dict[str, list[str]] = {}

    def merge(self, word: str) -> list[str]:
        """A word's BPE symbols: the best-ranked adjacent pair merged until none is in the merges."""
        if word in _SPECIAL:
            return [word]
        if word not in self._words:
            parts = [*word[:-1], word[-1] + "</w>"]
            while len(parts) > 1:
                pairs = set(zip(parts, parts[1:], strict=False))
                best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
                if best not in self.ranks:
                    break
                merged, i = [], 0
                while i < len(parts):
                    if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                        merged.append(parts[i] + parts[i + 1])
                        i += 2
                    else:
                        merged.append(parts[i])
                        i += 1
                parts = merged
            self._words[word] = parts
        return self._words[word]

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, without start and end tokens."""
        to_unicode = byte_to_unicode()
        ids = []
        for word in self.pattern.findall(clean(text)):
            symbols = self.merge("".join(to_unicode[b] for b in word.encode("utf-8")))
            ids.extend(self.ids[symbol] for symbol in symbols)
        return ids

    def __call__(self, phrase: str, context_length: int = CONTEXT_LENGTH) -> np.ndarray:
        """int64 [1, context_length]: start, the phrase's ids, end, zeros; truncated with end last."""
        ids = [self.start, *self.encode(phrase), self.end]
        if len(ids) > context_length:
            ids = [*ids[: context_length - 1], self.end]
        tokens = np.zeros((1, context_length), dtype=np.int64)
        tokens[0, : len(ids)] = ids
        return tokens
