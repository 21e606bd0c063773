"""Subword tokenizers: BPE (Sennrich et al. 2016) and WordPiece (Schuster & Nakajima 2012; Wu et al. 2016).

`from models.tokenizers import BPE, WordPiece`; see docs/tokenizers.md.
"""

from lexiflow.models.tokenizers.bpe import BPE
from lexiflow.models.tokenizers.wordpiece import WordPiece

__all__ = ["BPE", "WordPiece"]
