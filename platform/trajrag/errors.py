"""The errors a user can fix (a bad option, file or config value), for every layer to raise: the
command line prints them as one line and exits with status 2 (``trajrag.cli``), never a traceback.

``UserError`` is the general one; ``ConfigError`` (a config file or override that is missing,
malformed or of the wrong type) lives with the config system and is the same class here. Stages
with errors of their own (``StoreError``, ``DatasetError``, ...) keep them beside their code; the
command line lists which of them are the user's (``trajrag.cli``)."""

from __future__ import annotations

from trajrag.config import ConfigError

__all__ = ["ConfigError", "UserError"]


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit status 2."""
