"""The launcher's own error (the release module and the Dataflow option checks both raise it)."""

from __future__ import annotations

from dpcda.privacy.errors import DpcdaError


class ReleaseError(DpcdaError, RuntimeError):
    """A release that cannot go ahead (a failed pipeline, a launcher option that cannot work...)."""
