"""User-facing error types. Each message names the offending value and the fix.

The CLI prints these without a traceback; the server maps them to 4xx responses.
"""
from __future__ import annotations


class TightfitError(ValueError):
    """Base class for errors caused by user input (bad file, bad value, impossible budget)."""


class ModelFileError(TightfitError):
    """A model file or directory is missing, unreadable or corrupt."""


class UnsupportedModelError(TightfitError):
    """The model's architecture or one of its tensor types is not supported."""


class RequestError(TightfitError):
    """A request cannot be served as given (prompt too long, invalid sampling values, ...)."""
