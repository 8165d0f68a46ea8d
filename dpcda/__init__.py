"""dpcda: differentially private synthetic data releases on Apache Beam.

The Python API: ``dpcda.release(source, *, epsilon, ...) -> Release`` (``dpcda.api``) and ``dpcda.account(...)``,
whose errors name their keyword arguments (``dpcda.api_support``).
"""

__version__ = "0.2.0"
__all__ = ["release", "account", "Release"]


def __getattr__(name):  # the API imports Beam and torch: only when it is used
    if name in ("release", "Release"):
        from dpcda import api

        return getattr(api, name)
    if name == "account":
        from dpcda.api_support import account

        return account
    raise AttributeError(f"module 'dpcda' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
