"""Transient storage errors and their retries: a storage or network hiccup is tried again, anything else raised."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

RETRY_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0)  # seconds between attempts of one storage operation
# OSErrors that another attempt would meet again: the path is missing, taken, forbidden or not a folder.
NOT_TRANSIENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """A storage or network hiccup worth retrying (TimeoutError and ConnectionError are OSErrors)."""
    return isinstance(exc, OSError) and not isinstance(exc, NOT_TRANSIENT)


def retry_transient(fn: Callable) -> Callable:
    """Retry one whole storage operation (open and parse a file, upload a file) on transient I/O
    errors, as object-store clients do; the stage task's retries are the outer layer. Every
    operation wrapped here is idempotent."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return retrying(functools.partial(fn, *args, **kwargs), RETRY_DELAYS)

    return wrapper


def retrying(fn: Callable[[], Any], delays: Sequence[float], worth: Callable[[BaseException], bool] = is_transient,
             on_retry: Callable[[BaseException, float], None] | None = None) -> Any:
    """fn(), run again after each of `delays` while it fails with an error `worth` another attempt
    (`on_retry(error, delay)` told first); the last failure, or one not worth it, is raised."""
    for delay in (*delays, None):
        try:
            return fn()
        except Exception as exc:
            if delay is None or not worth(exc):
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")
