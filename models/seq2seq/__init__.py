"""Sequence to sequence: RNN and Transformer encoder–decoders, greedy/beam decoding, the Translator estimator."""
