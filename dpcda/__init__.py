"""dpcda: differentially private synthetic data releases on Apache Beam.

The Python API: ``dpcda.release(source, *, epsilon, ...) -> Release`` (``dpcda.api``), ``dpcda.account(...)``
(``dpcda.api.account``) and ``dpcda.load(DIR).sample(n)`` (more rows from a table release's model), whose errors name
their keyword arguments (``dpcda.api_support``).
"""

from dpcda._version import __version__ as __version__  # the one place it is written

__all__ = ["release", "account", "Release", "load"]


def __getattr__(name):  # the API imports Beam and torch: only when it is used
    if name in ("release", "Release", "load"):
        from dpcda import api

        return getattr(api, name)
    if name == "account":
        globals()["account"] = _python_account()  # made once
        return globals()["account"]
    raise AttributeError(f"module 'dpcda' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})


def _python_account():
    """``dpcda.api.account`` (what ``dpcda account`` prints, as a dict), its errors naming the keyword arguments
    (``epsilon=``, ``samples_per_class=``) rather than the command's flags, which ``dpcda account`` keeps."""
    import functools

    from dpcda import api
    from dpcda.api_support import python_errors

    @functools.wraps(api.account)
    def account(*args, **kwargs) -> dict:
        with python_errors([]):
            return api.account(*args, **kwargs)

    return account
