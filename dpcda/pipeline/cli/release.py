"""``dpcda release``: the release job's flags (the config model's fields and the mechanisms' parameters) and its
command."""

from __future__ import annotations

import json
import types
import typing

# Release flags are the config model's fields and the mechanisms' parameters (names with dashes, help from the field
# descriptions), so the CLI and the config file cannot drift; their values reach the config's edge
# (``schemas.config_keys``) as text. A few fields get a louder flag name.
FLAG_NAMES = {"allow_exact_normalization": "--i-understand-exact-normalization-is-not-dp"}


CONFIG_FILE_ONLY = {"table"}  # nested sections have no flag


CLI_ONLY_FLAGS = {
    "--config": "YAML/JSON file with the same fields (names with underscores, or grouped by section); flags override "
    "it",
    "--allow-exception-sampling": (
        "let the runner sample the input element of a failing step (off by default: for "
        "this job that element is raw private records)"
    ),
}

# The help's groups, in order, and the config file's sections each holds; the execution group also names Beam's options
HELP_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("input",),
    "privacy": ("privacy", "ledger"),
    "mechanism": ("mechanism",),
    "output": ("output", "postprocess"),
    "evaluation": ("evaluation",),
    "execution (Beam)": ("scale",),
}
GROUP_WORDS = {
    "privacy": "the guarantee, its budget and the ledger the releases of one dataset compose in",
    "mechanism": "how rows are made; each mechanism's own parameters are named after it (others are refused)",
    "output": "where the release goes, and public post-processing of its rows (privacy unchanged)",
    "execution (Beam)": (
        "how the work is cut and where it runs. The job is an Apache Beam pipeline: --runner=DirectRunner (the "
        "default) runs it on this machine; --runner=DataflowRunner on Google Cloud Dataflow (with --project, "
        "--region, --temp_location and --sdk_container_image: docs/operations.md). Any other Beam pipeline option "
        "(e.g. --direct_num_workers, --max_num_workers) is passed to Beam as it is"
    ),
}


def release_flags() -> dict[str, tuple[str, object]]:
    """flag -> (config key, pydantic FieldInfo), for every field of ReleaseConfig but a nested section (the mechanism
    by its name), every flat key of a mechanism's parameters (``schemas.config_keys.mechanism_keys``) and a table's
    flat keys (``schemas.config_keys.TableKeys``)."""
    from dpcda.schemas.config import ReleaseConfig, mechanism_keys
    from dpcda.schemas.config_keys import TableKeys

    flags = {}
    for name, field in ReleaseConfig.model_fields.items():
        if name in CONFIG_FILE_ONLY:
            continue
        flags[FLAG_NAMES.get(name, "--" + name.replace("_", "-"))] = (name, field)
        if name == "mechanism":
            for key, (model, own) in mechanism_keys().items():
                flags["--" + key.replace("_", "-")] = (key, model.model_fields[own])
    flags.update({"--" + k.replace("_", "-"): (k, f) for k, f in TableKeys.model_fields.items()})
    return flags


def help_of(field) -> tuple[str, typing.Optional[str]]:
    """(help text, metavar) of a field: its description, its choices, one default (the description's where it states
    one: a default that depends on the rest of the config)."""
    text = field.description or ""
    kind = field.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)  # Optional[X]: X
    choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
    default = None if field.is_required() else field.get_default()
    if default not in (None, "", False) and "default" not in text.lower():
        text += f" (default {default})"
    return text.replace("%", "%%"), ("{" + ",".join(choices) + "}") if choices else None


def add_parser(sub):
    from dpcda.schemas.config import SECTIONS, mechanism_keys, mechanism_names
    from dpcda.schemas.config_keys import DEFAULT_MECHANISM, SECTION_EXTRA, TABLE_MECHANISM
    from dpcda.schemas.mechanism_params import PARAMS

    p = sub.add_parser(
        "release",
        allow_abbrev=False,
        help="run a release job (Beam)",
        usage="dpcda release [--config FILE] --input GLOB --output DIR (--epsilon E | --sigma-x S) [options] "
        "[Beam pipeline options]",
    )
    p.add_argument("--config", default=None, metavar="FILE", help=CLI_ONLY_FLAGS["--config"])
    by_name = {name: (flag, field) for flag, (name, field) in release_flags().items()}
    keys = list(mechanism_keys())
    for title, sections in HELP_GROUPS.items():
        group = p.add_argument_group(f"{title} options", GROUP_WORDS.get(title))
        names = [
            n for section in sections for n in (*SECTIONS[section], *SECTION_EXTRA.get(section, ())) if n in by_name
        ]
        for name in [m for n in names for m in ([n, *keys] if n == "mechanism" else [n])]:  # its parameters follow it
            flag, field = by_name[name]
            text, metavar = help_of(field)
            if name == "mechanism":
                listed = "; ".join(f"{n}: {PARAMS[n].summary}" for n in mechanism_names())
                text = f"{listed} (default: {TABLE_MECHANISM} for a table input, {DEFAULT_MECHANISM} for other rows)"
                metavar = "{" + ",".join(mechanism_names()) + "}"
            if field.annotation is bool:
                group.add_argument(flag, dest=name, action="store_true", default=None, help=text)
                continue
            # values reach the config model as text; it parses and checks them (so '8G', '0,1', '28,28' work) and a
            # bad value ends in its one-line error
            group.add_argument(flag, dest=name, default=None, metavar=metavar or _metavar(name), help=text)
        if title == "execution (Beam)":
            group.add_argument(
                "--allow-exception-sampling",
                action="store_true",
                default=False,
                help=CLI_ONLY_FLAGS["--allow-exception-sampling"],
            )
    return p


def _metavar(name: str) -> str:
    """A short placeholder for a flag's value: the last word of its key, upper case."""
    return name.rsplit("_", 1)[-1].upper()


def register(sub) -> dict:
    """Adds this module's subcommand parsers to ``sub``; returns their handlers by name."""
    add_parser(sub)
    return {"release": cmd_release}


DEFAULT_BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


# Dataflow samples the input element of a failing step by default: for this job, a whole class of raw records.
NO_EXCEPTION_SAMPLING = "--experiments=disable_always_on_exception_sampling"


def unknown_beam_args(beam_args: list[str]) -> list[str]:
    """The arguments no Beam pipeline option accepts (Beam would drop them silently)."""
    from apache_beam.options import pipeline_options as po

    from dpcda.schemas.config import ConfigError

    class _Parser(po._BeamArgumentParser):  # what PipelineOptions.get_all_options parses with
        def error(self, message):  # a bad value of a known Beam option: one line, not argparse's usage dump
            raise ConfigError(f"Beam option: {message}")

    parser = _Parser(allow_abbrev=False)
    seen = {}
    stack = list(po.PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    for cls in seen.values():
        try:
            cls._add_argparse_args(parser)
        except Exception:  # noqa: BLE001 - a duplicate registration of one class
            continue
    _, unknown = parser.parse_known_args(beam_args)
    return unknown


def _suggest(flag: str) -> str:
    import difflib

    names = [*release_flags(), *CLI_ONLY_FLAGS]
    close = difflib.get_close_matches(flag.split("=", 1)[0], names, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def cmd_release(args, beam_args) -> int:
    from dpcda.schemas.config import ConfigError, load_config

    unknown = unknown_beam_args(beam_args) if beam_args else []
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]}{_suggest(unknown[0])} (release options are listed by "
            f"'dpcda release --help'; anything else must be a Beam pipeline option)"
        )
    sampling = [a for a in beam_args if "enable_data_sampling" in a or "enable_always_on_exception_sampling" in a]
    if sampling and not args.allow_exception_sampling:
        raise ConfigError(
            f"{sampling[0]}: data sampling stores raw private records in the runner; pass "
            f"--allow-exception-sampling to allow it"
        )
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "allow_exception_sampling")}
    cfg = load_config(args.config, overrides)
    # after the checks above: a bad flag fails before torch is imported
    from dpcda.pipeline.cli.base import published as cli_published
    from dpcda.pipeline.release import release_stages, run_release

    if not any(a.startswith("--runner") for a in beam_args):
        beam_args = DEFAULT_BEAM_ARGS + beam_args
    if not args.allow_exception_sampling:
        beam_args = beam_args + [NO_EXCEPTION_SAMPLING]
    published = run_release(
        cfg,
        beam_args,
        release_stages(cfg),
        eval_input=cfg.eval_input,
        protect=(args.config,) if args.config else (),
        on_published=lambda: cli_published(f"the release at {cfg.output}"),
    )
    from dpcda.evaluation.report import named_headline as named

    manifest = published.model_dump(mode="json")  # the summary reads what manifest.json holds
    p = manifest["privacy"]
    print(
        json.dumps(
            {
                "output": cfg.output,
                "rows": manifest["output"]["rows"],
                "epsilon": p["epsilon"],
                "delta": p["delta"],
                **published.mechanism.headline(),  # the mechanism's own headline noise (sigma_x, z or rho)
                "end_to_end_dp": p["end_to_end_dp"],
                **(
                    {"NOT_PRIVATE": "test seed: the epsilon is the mechanism's under a secret key, not this release's"}
                    if p.get("reproducible_seed")
                    else {}
                ),
                **(
                    {"accuracy": manifest["utility"]["accuracy_mean"], **named(manifest["utility"])}
                    if "accuracy_mean" in (manifest.get("utility") or {})
                    else {}
                ),
                **(
                    {"quality": manifest["utility"]["quality"]["report"]}
                    if "quality" in (manifest.get("utility") or {})
                    else {}
                ),
            }
        )
    )
    return 0
