"""YAML (and JSON) config text with every key given once: PyYAML keeps the last of two equal keys silently, so
``epsilon: 10`` then ``epsilon: 5`` would release at 5 without a word. A key given twice, in any mapping, and two
spellings of one top-level field (``mixing-order`` and ``mixing_order``) are refused, naming the key and its line."""

from __future__ import annotations

import yaml

from dpcda.privacy.errors import DpcdaError


class DuplicateKey(DpcdaError, yaml.YAMLError):
    """A key given twice; the message names it and its line (``load_config`` reports it as a ConfigError)."""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the safe constructor says so itself
                continue
            if first is not None:
                raise DuplicateKey(
                    f"key {key!r} is given twice (lines {first} and {key_node.start_mark.line + 1}); keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load(text: str):
    """``yaml.safe_load`` that refuses a key given twice (DuplicateKey), and two spellings of one top-level field."""
    data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    if isinstance(data, dict):
        fields: dict = {}
        for key in data:
            if isinstance(key, str):
                field = key.replace("-", "_")
                if field in fields:
                    raise DuplicateKey(f"'{fields[field]}' and '{key}' are one field ({field}); keep one")
                fields[field] = key
    return data
