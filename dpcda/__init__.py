"""dpcda: differentially private synthetic data releases on Apache Beam.

The Python API (``dpcda.api``): ``dpcda.release(source, *, epsilon, ...) -> Release`` and ``dpcda.account(...)``.
"""

from dpcda._version import __version__ as __version__  # the one place it is written

__all__ = ["release", "account", "Release"]


def __getattr__(name):  # the API imports Beam and torch: only when it is used
    if name in __all__:
        from dpcda import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpcda' has no attribute {name!r}")
