"""word2vec's configuration, apart from its gensim trainer (models/word2vec.py): the pipeline derives its
parameters without importing gensim or torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.errors import ParameterError
from pydantic import Field

Which = Annotated[Literal["u", "v", "u+v"], Field(
    description="Which vectors are the embeddings: input/center u (word2vec's usual), output/context v, or u + v.")]


@dataclass(frozen=True)
class Word2VecConfig:
    """Annotated fields are pipeline parameters (models/config.py); `sg` is the method (sgns or cbow)."""

    sg: bool = True  # True: skip-gram, False: CBOW (mean of context vectors)
    dim: Annotated[int, Field(ge=2, le=2000, description="Embedding dimension (skip-gram and CBOW).")] = 100
    window: Annotated[int, Field(ge=1, le=50, description="Context words on each side.")] = 5
    negative: Annotated[int, Field(ge=1, le=50, description="Noise words per positive pair (negative "
                                                            "sampling).")] = 5
    sample: Annotated[float, Field(ge=0, le=1, description="Subsampling threshold of frequent words "
                                                           "(0 = off).")] = 1e-3
    # small corpora need many passes (dev pairs peak near 25 at 1 M tokens); gensim: 5
    epochs: Annotated[int, Field(ge=1, le=200, description="Passes over the corpus (25 tuned on dev pairs for ~1M-"
                                                           "token corpora; gensim's 5 suits 100M+ tokens).")] = 25
    # Mikolov et al. 2013
    ns_exponent: Annotated[float, Field(ge=0, le=1, description="Noise distribution ∝ count^exponent.")] = 0.75
    seed: Annotated[int, Field(ge=0, description="Random seed.")] = 0
    # 2: ~1.6x faster on 2 cores (make run's SGNS: 49 s, not 78 s), the scores within seed noise; 1 repeats bit for bit
    workers: Annotated[int, Field(ge=1, le=64, description="gensim threads: 1 gives the same vectors every run "
                                                           "(for a seed); more train faster, varying like a seed.")] = 2
    min_count: int = 1  # words of the vocabulary with a lower count are left out (zero rows)
    vectors: Which = "u"  # the notes' u (gensim's wv), v (its syn1neg output vectors) or u + v

    def validate(self) -> None:
        check(self)
        if self.min_count < 1:
            raise ParameterError(f"Word2Vec min_count={self.min_count!r}: must be at least 1")
