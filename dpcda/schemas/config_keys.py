"""The config's edge: every spelling a release setting may arrive in, translated here, in one place, into the model's
own shape (``schemas.config.ReleaseConfig``).

- A config file may group its fields by section (``privacy: {epsilon: 2}``; ``flatten_sections``), or name them at
  its top level.
- The mechanism's parameters belong to its model (``schemas.mechanism_params``): ``mechanism: {name: p3gm, epochs:
  3}``. Older files, the flags (``--p3gm-epochs``, ``--mixing-order``) and ``dpcda.release(mixing_order=16)`` give
  them flat, the name with the mechanism's prefix (``p3gm_epochs``); ``nest`` moves them into the model, flags over
  the file. A parameter of another mechanism given a value other than its default is refused (it would be ignored);
  at its default it is no choice, and is dropped (flags and older files name defaults).
- A table's label and dropped columns may be given flat (``--label``, ``--drop-columns``: the one-command path, with
  no ``table:`` section); ``table_fields`` moves them into the section (``TableKeys``: they are not config fields).
- Which mechanism and mode a release takes when none is named: ``default_mechanism`` (a table: marginals), then the
  mechanism's own ``default_mode``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import BaseModel, Field, ValidationError

from dpcda.privacy.errors import DpcdaError
from dpcda.schemas.mechanism_params import PARAMS, MechanismParams, owner_of, parse
from dpcda.schemas.table import TableSchema

DEFAULT_MECHANISM = "dpcda"


class ConfigError(DpcdaError, ValueError):
    """A configuration problem, with a message that names the field."""


TABLE_MECHANISM = "marginals"


def default_mechanism(config: Mapping) -> str:
    """The mechanism a release takes when its config names none (the raw ``config`` at hand): a table input (a
    ``table:`` section, or the one-command path's ``label``) takes the table mechanism, marginals, under add/remove
    (its only mode: no exact class size is published); image and vector rows take DP-CDA mixing."""
    if config.get("table") is not None or config.get("label") is not None:
        return TABLE_MECHANISM
    return DEFAULT_MECHANISM


def mechanism_keys() -> dict[str, tuple[type[MechanismParams], str]]:
    """Every flat key of a mechanism parameter -> (its model, its field): the shared mixing parameters first, then
    each mechanism's own, in ``PARAMS``' order (the flags' order)."""
    out = {n: (MechanismParams, n) for n in MechanismParams.model_fields if n != "name"}
    for cls in PARAMS.values():
        out.update({cls.flat_name(f): (cls, f) for f in cls.own()})
    return out


def _is_default(cls: type[MechanismParams], field: str, value: Any) -> bool:
    """Whether ``value``, read as ``cls``'s ``field``, is its default (a flag or an older file naming a default)."""
    try:
        return getattr(cls.model_validate({field: value}), field) == cls.model_fields[field].get_default()
    except ValidationError:
        return False


def _message(err: ValidationError, cls: type[MechanismParams]) -> str:
    """pydantic's errors of a mechanism model in the config's words: each field by its flat key (``p3gm_epochs``)."""
    parts = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else "mechanism"
        key = cls.flat_name(field) if field in cls.own() else field
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(msg if msg.split(":")[0] == key else f"{key}: {msg}")
    return "; ".join(parts)


def nest(data: Mapping) -> dict:
    """``data`` (the raw config: flat keys, a mechanism name, a mechanism mapping or model, or all of them) with the
    mechanism's parameters in its validated model under ``mechanism`` and the mode filled in. ValueError (the
    config's one line) for another mechanism's parameter, a bad name or a bad parameter."""
    data = dict(data)
    given = data.pop("mechanism", None)
    if isinstance(given, BaseModel):
        params = given.model_dump(exclude_unset=True)
        params["name"] = given.name
    elif isinstance(given, Mapping):
        params = _spelled_once(given)
    elif given is None:
        params = {}
    else:
        params = {"name": given}
    name = params.pop("name", None) or params.pop("mechanism", None) or default_mechanism(data)
    if not isinstance(name, str) or name not in PARAMS:
        parse({"name": name})  # the one-line refusal naming the choices
    cls = PARAMS[name]
    for key in [k for k in params if k != "name"]:
        if key in cls.model_fields:
            continue
        owner = owner_of(key)  # a prefixed key inside the mapping: its own, or another's (refused below)
        if owner is not None and owner[0] is cls:
            if owner[1] in params:  # as a config file's mechanism section (``flatten_sections``) refuses it
                raise ValueError(f"{key} is given twice (mechanism.{owner[1]} and mechanism.{key})")
            params[owner[1]] = params.pop(key)
    for key in [k for k in data if isinstance(k, str)]:
        owner = owner_of(key)
        if owner is None:
            continue
        value = data.pop(key)
        model, field = owner
        if model is MechanismParams or model is cls:
            params[field] = value  # a flat key (a flag) over the same parameter in a mechanism mapping (a file)
        elif not _is_default(model, field, value):
            raise ValueError(
                f"{key}: a {model.model_fields['name'].default} parameter; this release's mechanism is {name}"
            )
    params["name"] = name
    params = cls.defaults({k: v for k, v in params.items() if v is not None}, data)
    try:
        data["mechanism"] = parse(params)
    except ValidationError as err:
        raise ValueError(_message(err, cls)) from None
    if data.get("mode") is None:
        data["mode"] = cls.default_mode()
    return data


def _spelled_once(given: Mapping) -> dict:
    """A mechanism mapping's keys with ``-`` read as ``_``; ValueError where two keys spell one."""
    out: dict = {}
    for k, v in given.items():
        key = k.replace("-", "_") if isinstance(k, str) else k
        if key in out:
            raise ValueError(f"{key} is given twice in the mechanism mapping; keep one")
        out[key] = v
    return out


class TableKeys(BaseModel):
    """A table's fields a release takes flat (flags, the API's keywords, a file's input section); ``table_fields``
    moves them into the ``table:`` section, so they are not fields of the config."""

    label: Optional[str] = Field(
        None,
        description="the label column of a table input: with it and no table: section, the release derives every "
        "column's domain with its DP domain step (docs/tables.md)",
    )
    drop_columns: Optional[list[str]] = Field(
        None, description="a table's input columns left out of the release (comma-separated; they are not read)"
    )


def table_fields(data: Mapping) -> dict:
    """A raw release config's table keys (``TableKeys``) moved into its ``table:`` section: ``label`` (the one-command
    path) becomes a section with that label and nothing else declared (a section given with it must name the same
    label), ``drop_columns`` (a list or 'a,b') joins the section's ``drop``; a section naming a ``domain`` is refused
    (the release writes it). ValueError (the config's one line) for a key of the wrong shape."""
    data = dict(data)
    label, drop, table = data.pop("label", None), data.pop("drop_columns", None), data.get("table")
    if isinstance(drop, str):
        drop = [p.strip() for p in drop.split(",") if p.strip()]
    if drop is not None and not (isinstance(drop, list) and all(isinstance(d, str) for d in drop)):
        raise ValueError("drop_columns: a list of column names, or 'a,b'")
    if label is not None and not isinstance(label, str):
        raise ValueError("label: a column name")
    if isinstance(table, dict) and table.get("domain") is not None:
        raise ValueError("table.domain: written by a release's DP domain step, never declared")
    if label is None and table is None:
        return data
    if table is None:
        table = {"label": {"name": label}}
    if isinstance(table, TableSchema):
        name, dropped = table.label.name, table.drop
    elif (
        isinstance(table, dict) and isinstance(table.get("label", {}), dict) and isinstance(table.get("drop", []), list)
    ):
        name, dropped = table.get("label", {}).get("name"), table.get("drop", [])
    else:
        return data  # not a section: the model says what is wrong with it
    if label is not None and isinstance(name, str) and name != label:
        raise ValueError(f"label: {label}, but the table: section's label is {name}")
    if drop:
        more = [*dropped, *(d for d in drop if d not in dropped)]
        table = (
            TableSchema(**{**dict(table), "drop": more}) if isinstance(table, TableSchema) else {**table, "drop": more}
        )
    return {**data, "table": table}


# The config's sections, in the order ``dpcda release --help`` shows them: every field is in exactly one
# (tests/test_config.py checks). The mechanism section's keys are its model's fields.
SECTIONS: dict[str, tuple[str, ...]] = {
    "input": (
        "input", "input_format", "features_column", "label_column", "num_classes", "feature_bounds", "out_of_bounds",
        "table",
    ),
    "privacy": (
        "epsilon", "delta", "sigma_x", "mode", "clip", "normalization", "normalization_file",
        "allow_exact_normalization", "normalization_budget_share", "histogram_budget_share", "pca_budget_share",
        "domain_budget_share", "min_std", "seed",
    ),
    "mechanism": ("mechanism",),
    "postprocess": ("soft_labels", "lowpass", "image_shape", "denoise"),
    "scale": ("chunk_rows", "max_class_bytes", "mixing_path", "join_block_rows", "device", "noise_threads"),
    "evaluation": ("eval_input", "eval_input_public", "eval_runs", "eval_epochs", "audit", "membership_audit"),
    "ledger": ("ledger", "dataset_id", "budget_cap"),
    "output": ("output", "output_shards", "overwrite"),
}  # fmt: skip

# Keys a section of a config file takes besides its fields: the table's flat keys (``TableKeys``), in input.
SECTION_EXTRA: dict[str, tuple[str, ...]] = {"input": tuple(TableKeys.model_fields)}

# In a section of a config file, the field that shares the section's name may be written with this key.
SECTION_KEY = {"input": "path", "output": "path", "ledger": "path", "mechanism": "name"}


def flatten_sections(data: dict, where: str) -> dict:
    """A config file's mapping as flat keys. A top-level key that names a section (``SECTIONS``) and holds a mapping
    is that section: its keys are the section's fields (``path`` or ``name`` for the field that shares the section's
    name; in ``mechanism:``, the mechanism's own parameters without their prefix, e.g. ``epochs`` for
    ``p3gm_epochs``). Any other key is a field, as in a flat file. ConfigError for a key outside its section or a
    field given twice."""
    out: dict = {}
    origin: dict = {}
    keys = mechanism_keys()

    def put(field: str, value, key: str) -> None:
        if field in out:
            raise ConfigError(f"{where}: {field} is given twice ({origin[field]} and {key})")
        out[field], origin[field] = value, key

    for key, value in data.items():
        key = key.replace("-", "_")
        if key not in SECTIONS or not isinstance(value, dict):
            put(key, value, key)
            continue
        name = value.get("name", value.get("mechanism")) if key == "mechanism" else None
        params = PARAMS.get(name) if isinstance(name, str) else None
        for inner, v in value.items():
            if not isinstance(inner, str):
                raise ConfigError(f"{where}: section {key} must map field names to values")
            inner = inner.replace("-", "_")
            field = key if inner == SECTION_KEY.get(key) else inner
            if params is not None:
                field = params.section_field(field)
            allowed = SECTIONS[key] + (tuple(keys) if key == "mechanism" else ()) + SECTION_EXTRA.get(key, ())
            if field not in allowed:
                home = next((s for s, names in SECTIONS.items() if field in names), None)
                owner = owner_of(field) or next(
                    (owner_of(p.prefix + field) for p in PARAMS.values() if p.prefix and owner_of(p.prefix + field)),
                    None,
                )
                why = (
                    f"a {owner[0].model_fields['name'].default} parameter; this section's mechanism is {name}"
                    if owner and key == "mechanism"
                    else f"belongs in section {home}"
                    if home
                    else "no such field"
                )
                raise ConfigError(f"{where}: {key}.{inner}: {why}")
            put(field, v, f"{key}.{inner}")
    return out
