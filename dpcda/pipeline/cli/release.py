"""``dpcda release``: the release job's flags (the config model's fields) and its command."""

from __future__ import annotations

import json

# Release flags are the config model's fields (names with dashes, help from the field descriptions), so the CLI and
# the config file cannot drift. A few fields get a louder flag name.
FLAG_NAMES = {"allow_exact_normalization": "--i-understand-exact-normalization-is-not-dp"}


CONFIG_FILE_ONLY = {"table"}  # nested sections have no flag


CLI_ONLY_FLAGS = {
    "--config": "YAML/JSON file with the same fields (names with underscores); flags override it",
    "--allow-exception-sampling": (
        "let the runner sample the input element of a failing step (off by default: for "
        "this job that element is raw private records)"
    ),
}


def release_flags() -> dict[str, tuple[str, object]]:
    """flag -> (config field, pydantic FieldInfo), for every field of ReleaseConfig."""
    from dpcda.schemas.config import ReleaseConfig

    return {
        FLAG_NAMES.get(name, "--" + name.replace("_", "-")): (name, field)
        for name, field in ReleaseConfig.model_fields.items()
        if name not in CONFIG_FILE_ONLY
    }


def add_parser(sub):
    import typing

    from dpcda.schemas.config import SECTIONS

    p = sub.add_parser("release", allow_abbrev=False, help="run a release job (Beam)")
    p.add_argument("--config", default=None, help=CLI_ONLY_FLAGS["--config"])
    flags = {name: (flag, field) for flag, (name, field) in release_flags().items()}
    groups = {section: p.add_argument_group(f"{section} options") for section in SECTIONS}
    for group, name in ((groups[section], n) for section, names in SECTIONS.items() for n in names):
        if name not in flags:  # a section of the config file only (table)
            continue
        flag, field = flags[name]
        text = (field.description or "").replace("%", "%%")  # argparse formats help with %
        if field.annotation is bool:
            group.add_argument(flag, dest=name, action="store_true", default=None, help=text)
            continue
        choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else ()
        default = field.get_default() if not field.is_required() else None
        shown = f" (default {default})" if default not in (None, "") else (" (required)" if field.is_required() else "")
        shown = (f"; one of {', '.join(choices)}" if choices else "") + shown
        # values reach the config model as text; it parses and checks them (so '8G', '0,1', '28,28' work) and a bad
        # value ends in its one-line error
        group.add_argument(flag, dest=name, default=None, help=text + shown.replace("%", "%%"))
    p.add_argument(
        "--allow-exception-sampling",
        action="store_true",
        default=False,
        help=CLI_ONLY_FLAGS["--allow-exception-sampling"],
    )
    return p


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
    from dpcda.pipeline.release import release_stages, run_release

    if not any(a.startswith("--runner") for a in beam_args):
        beam_args = DEFAULT_BEAM_ARGS + beam_args
    if not args.allow_exception_sampling:
        beam_args = beam_args + [NO_EXCEPTION_SAMPLING]
    published = run_release(
        cfg, beam_args, release_stages(cfg), eval_input=cfg.eval_input, protect=(args.config,) if args.config else ()
    )
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
                **({"accuracy": manifest["utility"]["accuracy_mean"]} if manifest.get("utility") else {}),
            }
        )
    )
    return 0
