"""Errors a user can cause and fix. Messages name the file, line or parameter and what to do."""


class LexiflowError(Exception):
    """Base class of every user-facing lexiflow error (never retried: the input will not change)."""


class InputError(LexiflowError):
    """Bad input data: a missing or unreadable file, a malformed line, an empty corpus."""


class ParameterError(LexiflowError, ValueError):
    """A parameter value that cannot work (out of range, inconsistent with the data)."""
