"""The quality report's pictures (``evaluation.quality``), drawn from quality.json's content only, for readers without
code: one panel per column, full column names, category names or a numeric column's codes in value order (spikes
bold and hatched, bins by their lower edges) on the x axis, a legend that names each source ("synthetic", "noisy
measurement (DP)", "real held-out (not DP)") and a note under the figure saying what the noisy and the real figures
are.

- ``quality.png``: each column's shares (bars, side by side; the noisy measurement with one noise std as error bar);
- ``quality_label.png``: per feature column, the share of the label's class (binary label: its second class; more
  classes: each class but the first) among the rows of each code of the column (lines with markers).
"""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np

from dpcda.storage.paths import open_file

STYLE = {  # source -> (colour, line style, marker)
    "synthetic": ("#1f77b4", "-", "o"),
    "noisy_measurement": ("#ff7f0e", "--", "s"),
    "real": ("#2ca02c", ":", "^"),
}
PER_ROW = 4
DPI = 90
FEW = 0.005  # a label trend's point is not drawn where its code holds under 0.5 % of that source's rows


def _sources(report: dict) -> list[str]:
    return [s for s in STYLE if "legend" in report["sources"].get(s, {})]


def _value(v: float) -> str:
    """A tick's number: a whole number below 10^7 in full, else 4 significant digits."""
    return str(int(v)) if v == int(v) and abs(v) < 1e7 else f"{v:.4g}"


def _code_values(entry: dict) -> tuple[list[float], int]:
    """A numeric column's code values in quality.json's order (its spikes, then each bin's lower edge) and how many
    of them are spikes; the codes after them (null) have none."""
    spikes = [float(v) for v in entry.get("spikes") or []]
    return spikes + [float(a) for a in (entry.get("edges") or [])[:-1]], len(spikes)


def _order(entry: dict) -> np.ndarray:
    """The order a column's codes are drawn in: a numeric column's spikes and bins by value (a spike after the bin
    that holds its value, before a bin whose lower edge it is), then its other codes (null) as listed; any other
    column's codes as listed."""
    values, spikes = _code_values(entry)
    keys = [(v, i >= spikes) for i, v in enumerate(values)]
    rest = range(len(values), len(entry["codes"]))
    return np.array(sorted(range(len(keys)), key=keys.__getitem__) + list(rest), dtype=np.int64)


def _spike_codes(entry: dict) -> set:
    """The codes (quality.json's positions) drawn as spikes: the first ``len(spikes)`` of a column that has bins too
    (a column of spikes only, a 0/1 flag, is drawn as categories are)."""
    return set(range(len(entry.get("spikes") or []))) if entry.get("edges") else set()


def _ticks(ax, entry: dict, rotate: bool, order: np.ndarray) -> None:
    """Category names (wrapped) or, for a numeric column, each code in value order by its value (a spike, in bold) or
    its bin's lower edge (a few of them where the bins are many), and the axis label."""
    names = entry["codes"]
    if entry.get("edges"):
        values, spikes = _code_values(entry)
        step = 1 if len(values) <= 36 else math.ceil(len(values) / 24)
        shown, labels, bold = [], [], []
        for at, code in enumerate(order):
            spike = code < spikes
            if code >= len(values):
                label = names[code]  # null
            elif spike or (code - spikes) % step == 0:
                label = _value(values[code])
            else:
                continue
            shown.append(at)
            labels.append(label)
            bold.append(spike)
        ax.set_xticks(shown, labels, fontsize=7, rotation=90)
        for tick, b in zip(ax.get_xticklabels(), bold):
            if b:
                tick.set_fontweight("bold")
        what = "a bin by its lower edge" + ("; bold and hatched: a value with a code of its own" if spikes else "")
        ax.set_xlabel(f"{entry['name']} ({what})", fontsize=8)
    else:
        wrapped = [textwrap.fill(str(n), 14) for n in names]
        ax.set_xticks(np.arange(len(names)), wrapped, fontsize=8, rotation=30 if rotate else 0,
                      ha="right" if rotate else "center")  # fmt: skip
        ax.set_xlabel(entry["name"], fontsize=8)


def _grid(plt, panels: int):
    cols = min(PER_ROW, max(panels, 1))
    rows = math.ceil(max(panels, 1) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.9 * rows + 2.0), squeeze=False)
    for ax in list(axes.flat)[panels:]:
        fig.delaxes(ax)
    return fig, list(axes.flat)[:panels]


def _finish(plt, fig, report: dict, title: str, note: str, path: str) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=STYLE[s][0], linestyle=STYLE[s][1], marker=STYLE[s][2], linewidth=2)
        for s in _sources(report)
    ]
    labels = [report["sources"][s]["legend"] for s in _sources(report)]
    rel = report.get("release") or {}
    what = ", ".join(f"{k} {rel[k]:.4g}" if isinstance(rel[k], float) else f"{k} {rel[k]}" for k in rel)
    height = fig.get_figheight()
    fig.suptitle(f"{title}\n{what}", fontsize=13, y=1.0 - 0.1 / height, va="top")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.0 - 0.75 / height), ncol=len(handles),
               fontsize=11, frameon=True)  # fmt: skip
    fig.text(0.01, 0.1 / height, textwrap.fill(note, 190), fontsize=9, va="bottom")
    top = 1.0 - 1.1 / height
    bottom = 0.75 / height
    fig.tight_layout(rect=(0, bottom, 1, top), h_pad=2.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    with open_file(path, "wb") as fh:
        fh.write(buf.getvalue())


def _panels(fig) -> list[str]:
    """The column each drawn panel names (its title's first line), in order: what quality.json lists."""
    return [ax.get_title().split("\n")[0].removesuffix(" (label)") for ax in fig.axes]


def _note(report: dict) -> str:
    parts = [
        "Shares: each code's share of the rows.",
        "noisy measurement (DP): " + report["sources"]["noisy_measurement"].get("what", "") + "."
        if "legend" in report["sources"]["noisy_measurement"]
        else "No noisy measurement: " + report["sources"]["noisy_measurement"]["absent"] + ".",
    ]
    if report["real_data"]:
        parts.append("real held-out (not DP): computed on real rows, outside the privacy guarantee.")
    return " ".join(parts)


def draw_distributions(path: str, report: dict) -> list[str]:
    """quality.png: one panel per column (the label last); returns the panels' column names, in order."""
    from dpcda.evaluation.report import _pyplot

    plt = _pyplot()
    entries = report["columns"]
    fig, axes = _grid(plt, len(entries))
    sources = _sources(report)
    for ax, e in zip(axes, entries):
        present = [s for s in sources if e.get(s) is not None]
        order = _order(e)
        pos = np.arange(len(e["codes"]))
        spike_codes = _spike_codes(e)
        spikes = [at for at, code in enumerate(order) if code in spike_codes]
        width = 0.8 / max(len(present), 1)
        for i, s in enumerate(present):
            colour = STYLE[s][0]
            err = None
            if s == "noisy_measurement" and e.get("noisy_measurement_std") is not None:
                err = np.full(len(pos), e["noisy_measurement_std"])
            bars = ax.bar(pos + (i - (len(present) - 1) / 2) * width, np.asarray(e[s], np.float64)[order], width,
                          color=colour, yerr=err, capsize=1.5, error_kw={"elinewidth": 0.8},
                          label=report["sources"][s]["legend"])  # fmt: skip
            for at in spikes:
                bars[at].set_hatch("///")
        distances = " · ".join(
            f"TVD vs {'noisy' if k.endswith('noisy_measurement') else 'real'} {v:.3f}"
            for k, v in e["tvd"].items()
            if k.startswith("synthetic_vs")
        )
        role = " (label)" if e["role"] == "label" else ""
        ax.set_title(f"{e['name']}{role}\n{distances or 'synthetic only'}", fontsize=10)
        ax.set_ylabel("share of rows", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        _ticks(ax, e, rotate=len(e["codes"]) > 2 or any(len(str(c)) > 10 for c in e["codes"]), order=order)
    title = "Release quality: each column's distribution"
    panels = _panels(fig)
    note = _note(report) + " Error bars: one noise std over the column's noisy total."
    _finish(plt, fig, report, title, note, path)
    return panels


def draw_label_trends(path: str, report: dict) -> list[str]:
    """quality_label.png: one panel per feature column, the label's class shares by the column's codes; returns the
    panels' column names, in order."""
    from dpcda.evaluation.report import _pyplot

    plt = _pyplot()
    trends = report["label_trends"]
    classes = trends["classes"]
    shown = [1] if len(classes) == 2 else list(range(1, len(classes)))
    fig, axes = _grid(plt, len(trends["columns"]))
    sources = _sources(report)
    one_way = {e["name"]: e for e in report["columns"]}
    for ax, t in zip(axes, trends["columns"]):
        order = _order(t)
        pos = np.arange(len(t["codes"]))
        top = 0.0
        for s in sources:
            rates = t.get(s)
            if rates is None:
                continue
            rates = [rates[code] for code in order]
            colour, style, _ = STYLE[s]
            few = np.asarray(one_way[t["name"]][s], np.float64)[order] < FEW  # rates of a handful of rows: not drawn
            err = t.get("noisy_measurement_std") if s == "noisy_measurement" else None
            err = None if err is None else [err[code] for code in order]
            for n, c in enumerate(shown):
                y = np.array([np.nan if r is None or r[c] is None else r[c] for r in rates], np.float64)
                y[few] = np.nan
                top = max(top, float(np.nanmax(y)) if np.isfinite(y).any() else 0.0)
                marker = "osD^v<>"[n % 7] if len(shown) > 1 else STYLE[s][2]
                yerr = None if err is None else np.array([np.nan if v is None else v for v in err], np.float64)
                ax.errorbar(pos, y, yerr=yerr, color=colour, linestyle=style, marker=marker, markersize=4,
                            linewidth=1.5, elinewidth=0.8, capsize=2)  # fmt: skip
        distances = " · ".join(
            f"TVD vs {'noisy' if k.endswith('noisy_measurement') else 'real'} {v:.3f}"
            for k, v in t["tvd"].items()
            if v is not None
        )
        if "why_no_noisy_measurement" in t:
            distances = (distances + " · " if distances else "") + "pair not measured"
        ax.set_title(f"{t['name']}\n{distances or 'synthetic only'}", fontsize=10)
        ax.set_ylim(0.0, min(1.0, top * 1.15 + 0.05))
        label = (
            f"share with {trends['label']} = {classes[1]}" if len(shown) == 1 else f"share in each {trends['label']}"
        )
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        _ticks(ax, t, rotate=len(t["codes"]) > 2 or any(len(str(c)) > 10 for c in t["codes"]), order=order)
        ax.grid(axis="y", alpha=0.3)
    what = (
        f"share of rows with {trends['label']} = {classes[1]}"
        if len(shown) == 1
        else f"share of each {trends['label']} class ({', '.join(classes[1:])}: markers o s D ^ v < > in that order)"
    )
    title = f"Release quality: {what}, by each column's categories or bins"
    note = _note(report) + (
        " A point is missing where its code holds under 0.5 % of that source's rows (a rate of a handful of rows; "
        "quality.json has it), or the noisy measurement merged the code with others. Error bars: one noise std "
        "over the code's noisy total."
    )
    panels = _panels(fig)
    _finish(plt, fig, report, title, note, path)
    return panels
