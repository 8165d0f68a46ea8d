"""CLI, options and graph wiring of the DP-CDA release job."""

from dpcda.storage.build import VERSION as __version__  # noqa: F401
from dpcda.storage.build import build_commit  # noqa: F401
