"""Language models: n-gram and neural (feed-forward, recurrent, Transformer), with decoding."""
