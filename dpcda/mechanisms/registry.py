"""The mechanisms of the product, by name: the one place that lists them.

Adding a mechanism: a ``Mechanism`` subclass in its own module (``mechanisms.base`` says what it supplies), its line
in ``_ENTRIES``, its PTransform (``Mechanism.graph``), and its tests. Everything else looks the mechanism up here.
"""

from __future__ import annotations

from dpcda.mechanisms.base import Mechanism
from dpcda.mechanisms.dpcda import Dpcda
from dpcda.mechanisms.dpmix import Dpmix
from dpcda.mechanisms.local import Local
from dpcda.mechanisms.marginals import Marginals
from dpcda.mechanisms.p3gm import P3gm
from dpcda.mechanisms.randproj import Randproj
from dpcda.privacy.errors import DpcdaError

_ENTRIES: tuple[Mechanism, ...] = (Dpcda(), Dpmix(), Local(), Randproj(), P3gm(), Marginals())
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in _ENTRIES}
NAMES: tuple[str, ...] = tuple(MECHANISMS)


class UnknownMechanism(DpcdaError, ValueError):
    """A mechanism name the registry does not hold."""


def get(name: str) -> Mechanism:
    """The mechanism called ``name``; ``UnknownMechanism`` (one line, naming the choices) otherwise."""
    try:
        return MECHANISMS[name]
    except (KeyError, TypeError):
        raise UnknownMechanism(f"mechanism: {name!r} is not one of {', '.join(NAMES)}") from None
