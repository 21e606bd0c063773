"""Language models: n-gram and neural (feed-forward, recurrent, Transformer), with decoding. The
kinds and one `load` for any `lm` folder: `models/lm/registry.py` (imported on demand: it pulls in torch)."""
