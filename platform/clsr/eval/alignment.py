"""Alignment and uniformity (Wang & Isola 2020), methods.md §8.4, on L2-normalised embeddings.

    ℓ_align   = E_{(x,x+)} ||f(x) − f(x+)||²           over positive pairs (STS-B pairs with gold > 4)
    ℓ_uniform = log E_{x,y} exp(−2 ||f(x) − f(y)||²)  over all unordered pairs of distinct sentences

Lower is better for both. SimCSE uses STS-B; the split is unstated, so the dev split is used.
"""

from __future__ import annotations

import numpy as np

from clsr.data.sts import STSSplit
from clsr.encoders.embed import Embedder


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)


def alignment(a: np.ndarray, b: np.ndarray, alpha: float = 2.0) -> float:
    return float(np.mean(np.linalg.norm(_normalise(a) - _normalise(b), axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    z = _normalise(x).astype(np.float64)
    sq = np.clip(2.0 - 2.0 * z @ z.T, 0.0, None)  # squared distances of unit vectors
    upper = sq[np.triu_indices(len(z), k=1)]
    return float(np.log(np.mean(np.exp(-t * upper))))


def alignment_uniformity(
    split: STSSplit, embed: Embedder, positive_threshold: float = 4.0
) -> dict[str, float]:
    sentences = list(dict.fromkeys(split.sentences1 + split.sentences2))
    row = {sentence: i for i, sentence in enumerate(sentences)}
    vectors = embed(sentences)  # each distinct sentence once: the positive pairs' are among them
    positive = np.flatnonzero(split.scores > positive_threshold)
    first = [row[split.sentences1[i]] for i in positive]
    second = [row[split.sentences2[i]] for i in positive]
    return {"align": alignment(vectors[first], vectors[second]), "uniform": uniformity(vectors)}
