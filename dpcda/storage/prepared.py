"""The folders ``dpcda prepare`` writes (``OUT/train``, ``OUT/test``), under the release's rules: a split folder is
written only when it is absent, empty, or an earlier ``prepare`` output (its marker ``.dpcda-prepared.json`` lists
every file in it); anything else (someone's shards of the same names, say) is refused before a byte is written.
Shards are written under a temporary name and renamed into place; shards of the earlier output that the new one does
not have (another shard count or format) are removed afterwards, so a glob over the folder never mixes the two."""

from __future__ import annotations

import json
import os

from dpcda.storage.publish import PublishError

MARKER = ".dpcda-prepared.json"
SPLITS = ("train", "test")


def _listed(directory: str) -> list[str]:
    try:
        with open(os.path.join(directory, MARKER)) as fh:
            files = json.load(fh).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    if not isinstance(files, list) or not all(isinstance(f, str) and "/" not in f for f in files):
        raise PublishError(f"{directory}: its {MARKER} is not one that dpcda prepare wrote; refusing to write there")
    return files


def claim(out: str) -> dict:
    """Split -> files of the earlier prepare output there ([] for an absent or empty folder); PublishError (one line)
    for a folder that holds anything else, a file or a link. Checked for every split before any is written."""
    if os.path.lexists(out) and (os.path.islink(out) or not os.path.isdir(out)):
        raise PublishError(f"--out {out}: is a file or a link, not a folder")
    previous = {}
    for split in SPLITS:
        d = os.path.join(out, split)
        if not os.path.lexists(d):
            previous[split] = []
            continue
        if os.path.islink(d) or not os.path.isdir(d):
            raise PublishError(f"--out {out}: {d} is a file or a link, not a folder")
        present = sorted(f for f in os.listdir(d) if f != MARKER and not f.endswith(".partial"))
        if not present and not os.path.exists(os.path.join(d, MARKER)):
            previous[split] = []
            continue
        listed = _listed(d) if os.path.exists(os.path.join(d, MARKER)) else None
        foreign = [f for f in present if listed is None or f not in listed]
        if foreign:
            raise PublishError(
                f"--out {out}: {d} holds files that dpcda prepare did not write (e.g. {foreign[0]}); refusing to "
                f"write there: choose a new or empty folder"
            )
        previous[split] = listed
    return previous


def record(out: str, previous: dict, written: dict, label_names: list[str] | None = None) -> None:
    """After a prepare: removes the earlier output's files that the new one does not have, and lists the new ones.
    ``label_names``: the dataset's public class names, class k first at k (what reports label rows with)."""
    for split, files in written.items():
        d = os.path.join(out, split)
        for stale in set(previous.get(split, [])) - set(files):
            path = os.path.join(d, stale)
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
        tmp = os.path.join(d, MARKER + ".partial")
        with open(tmp, "w") as fh:
            json.dump(
                {
                    "tool": "dpcda prepare",
                    "files": sorted(files),
                    **({"label_names": label_names} if label_names else {}),
                },
                fh,
            )
        os.replace(tmp, os.path.join(d, MARKER))


def shard_names(shards: int, fmt: str) -> list[str]:
    """The names ``write_shards`` gives (``pipeline.prepare``)."""
    ext = "parquet" if fmt == "parquet" else "tfrecord"
    return [f"part-{i:05d}-of-{shards:05d}.{ext}" for i in range(shards)]


def label_names(directory: str) -> list[str] | None:
    """The class names ``dpcda prepare`` recorded for the split in ``directory`` (its marker's ``label_names``), or
    None: no marker, not one of ours, or no names in it. Public metadata of the dataset, never read off the rows."""
    try:
        with open(os.path.join(directory, MARKER)) as fh:
            names = json.load(fh).get("label_names")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return names
    return None
