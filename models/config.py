"""Model configuration, one place for each fact.

A field of a model's config dataclass (or a parameter of an estimator's `__init__`) annotated as
`Annotated[type, Field(description=..., bounds...)]` is a pipeline parameter: its default, bounds
and description live there only. The pipeline's pydantic sections (the Prefect UI form, the
`--set` names, the config file) derive from these annotations (`lexiflow.tasks.params.section`),
a stage builds the model's config from its section with `from_section`, and `check` validates a
config against the same bounds, so Python users and the pipeline accept the same values.
Unannotated fields (ids of special tokens, paths) are the library's only.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import MISSING, fields, is_dataclass
from typing import Annotated, Any, get_origin, get_type_hints

from lexiflow.models.errors import ParameterError
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo


def parameters(source: Any) -> dict[str, tuple[Any, Any]]:
    """{name: (Annotated type, default)} of the pipeline parameters a config dataclass (its fields)
    or an estimator class or function (its parameters) declares, in declaration order."""
    if is_dataclass(source):
        target, defaults = source, {f.name: _default(f) for f in fields(source)}
    else:
        target = source.__init__ if inspect.isclass(source) else source
        defaults = {name: p.default for name, p in inspect.signature(target).parameters.items()}
    hints = get_type_hints(target, include_extras=True)
    return {name: (hints[name], defaults[name]) for name in defaults
            if name in hints and get_origin(hints[name]) is Annotated
            and any(isinstance(m, FieldInfo) for m in hints[name].__metadata__)}


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def from_section(source: Any, section: BaseModel | dict[str, Any], **fixed: Any) -> Any:
    """`source(...)` (a config dataclass or an estimator) with the values its parameters take from a
    pipeline section, plus `fixed` arguments (vocabulary sizes, kinds) the pipeline decides itself."""
    values = section if isinstance(section, dict) else section.model_dump()
    return source(**{name: values[name] for name in parameters(source) if name in values}, **fixed)


@functools.cache
def _validator(source: Any) -> type[BaseModel]:
    return create_model(f"{source.__name__}Check", __config__=ConfigDict(allow_inf_nan=False),
                        **parameters(source))


def check(config: Any) -> None:
    """Validate a config's annotated fields against their bounds and choices: a ParameterError
    naming the field, the value and the rule."""
    source = type(config)
    values = {name: getattr(config, name) for name in parameters(source)}
    try:
        _validator(source).model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = ".".join(map(str, error["loc"]))
        raise ParameterError(f"{source.__name__}.{name}={values.get(name)!r} is invalid: {error['msg']}") from None
