"""The mechanisms of the product, by name: the one place that lists them.

Adding a mechanism: a ``Mechanism`` subclass in its own module or package (``mechanisms.base`` says what it supplies:
its plan, its synthesis, its PTransform, its canary game), its parameter model (a ``MechanismParams`` subclass,
``schemas.mechanism_params``), and one line, here or from its own module: ``register(TheMechanism())``. Everything
else looks the mechanism up here; the config takes its parameters through its model.
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
from dpcda.schemas import mechanism_params

MECHANISMS: dict[str, Mechanism] = {}


class UnknownMechanism(DpcdaError, ValueError):
    """A mechanism name the registry does not hold."""


def register(mechanism: Mechanism) -> Mechanism:
    """Adds ``mechanism`` and its parameter model (``Mechanism.params``, whose ``name`` must be the mechanism's) to
    the registry and the config; ValueError where its name or a flat key of its parameters is taken."""
    name = mechanism.name
    if not name or mechanism.params.model_fields["name"].default != name:
        raise ValueError(f"mechanism {name!r}: its parameter model must be named {name!r} too")
    if name in MECHANISMS:
        raise ValueError(f"mechanism {name!r}: the name is taken")
    if mechanism_params.PARAMS.get(name) is not mechanism.params:
        mechanism_params.register(mechanism.params)
    MECHANISMS[name] = mechanism
    return mechanism


for _entry in (Dpcda(), Dpmix(), Local(), Randproj(), P3gm(), Marginals()):
    register(_entry)

NAMES: tuple[str, ...] = tuple(MECHANISMS)  # the built-in ones


def names() -> tuple[str, ...]:
    """Every registered mechanism, the built-in ones first."""
    return tuple(MECHANISMS)


def get(name: str) -> Mechanism:
    """The mechanism called ``name``; ``UnknownMechanism`` (one line, naming the choices) otherwise."""
    try:
        return MECHANISMS[name]
    except (KeyError, TypeError):
        raise UnknownMechanism(f"mechanism: {name!r} is not one of {', '.join(MECHANISMS)}") from None
