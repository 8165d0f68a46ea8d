"""The product's one error type. Every error a user can cause is a DpcdaError: the CLI prints its first line after
``dpcda: error:`` and exits with status 2, never a traceback. Anything else is a bug and keeps its traceback.

It lives at the bottom layer (privacy imports nothing above it) so that every package can subclass it.
"""

from __future__ import annotations


class DpcdaError(Exception):
    """A user error: bad input, config or options, or a release that cannot be made as asked."""
