"""Which failures are worth another attempt: one rule for a stage's retries (Prefect's, `tasks.stage`) and a
shard's (where it ran, `tasks.parallel`). Apart from `tasks.stage` because a pool's workers need it and must not
import Prefect (tasks/shards.py)."""

from __future__ import annotations

from lexiflow.models.errors import LexiflowError
from lexiflow.storage import StoreError
from lexiflow.storage.store import is_transient

USER_ERRORS = (LexiflowError, StoreError)


def worth_retrying(exc: BaseException) -> bool:
    """A storage/network hiccup (the store's own definition); never bad input or a path that cannot work
    (it would fail the same way again)."""
    return not isinstance(exc, USER_ERRORS) and is_transient(exc)
