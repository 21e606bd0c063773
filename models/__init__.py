"""The NLP itself: pure Python/numpy/torch, usable without Prefect or the artifact store."""
