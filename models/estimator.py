"""The estimator contract of scikit-learn (`BaseEstimator`), small: what every lexiflow model that
learns from data (tokenizers, n-gram and neural LMs, word2vec, GloVe) shares.

- Parameters are the `__init__` arguments, stored under the same names and never changed by `fit`;
  `get_params()` reads their names from `__init__`'s signature, so no list is kept by hand.
- `fit(...)` learns and returns `self`.
- Learned state is in attributes whose names end in `_` (`vocab_`, `module_`, `vectors_`); an
  estimator is fitted once it has one, which `_check_fitted()` checks before a fitted-only method runs.
"""

from __future__ import annotations

import inspect
from typing import Any

from lexiflow.models.errors import ParameterError


class Estimator:
    @classmethod
    def param_names(cls) -> list[str]:
        """The `__init__` parameters, in order (no *args/**kwargs: every parameter is named)."""
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # after self
        variadic = [p.name for p in parameters if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if variadic:
            raise TypeError(f"{cls.__name__}.__init__ takes *{variadic[0]}: an estimator names every parameter")
        return [p.name for p in parameters]

    def get_params(self) -> dict[str, Any]:
        """{parameter: value} for every `__init__` parameter (`type(self)(**get_params())` is an unfitted copy)."""
        return {name: getattr(self, name) for name in self.param_names()}

    def is_fitted(self) -> bool:
        return any(name.endswith("_") and not name.startswith("_") for name in vars(self))

    def _check_fitted(self) -> None:
        if not self.is_fitted():
            name = type(self).__name__
            load = f" or {name}.load(directory)" if hasattr(type(self), "load") else ""
            raise ParameterError(f"{name} is not fitted: call fit(...){load} first")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"
