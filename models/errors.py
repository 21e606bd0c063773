"""Errors a user can cause and fix. Messages name the file, line or parameter and what to do."""


class LexiflowError(Exception):
    """Base class of every user-facing lexiflow error (never retried: the input will not change)."""


class InputError(LexiflowError):
    """Bad input data: a missing or unreadable file, a malformed line, an empty corpus."""


class ParameterError(LexiflowError, ValueError):
    """A parameter value that cannot work (out of range, inconsistent with the data)."""


def shown(name: object) -> str:
    """A file name (or any user-given text) as it goes into a one-line message: as it is when every
    character prints, else quoted repr-style, so a newline or a terminal escape code in a name can
    neither break the line nor recolour the terminal."""
    text = str(name)
    return text if text.isprintable() else repr(text)
