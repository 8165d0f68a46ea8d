"""Launch options of a release job that the launcher completes or refuses before any work.

- A job that would end without anyone publishing it is refused on every runner: ``--template_location`` (Dataflow
  writes a template and runs nothing), ``--dry_run``, ``--output_executable_path``. The launcher's run directory
  would be deleted and nothing published, or a template launched later would write a release no launcher checks,
  publishes or records in the ledger. Any value given is refused (Beam reads them as strings: ``--dry_run=False``
  runs dry).
- On Dataflow, one SDK process per worker VM (``--experiments=no_use_multiple_sdk_containers``) and one harness
  thread (``--number_of_worker_harness_threads=1``) unless given: the in-memory mixer's per-class budget
  (``--max-class-bytes``, by default 40 % of the worker's memory) and the worker's one GPU are sized for one class at
  a time per VM. Dataflow's default is one SDK process per vCPU, up to 8 on a ``g2-standard-8``, several large classes
  at once, and one CUDA context each on one card. More than one at a time needs an explicit ``--max-class-bytes``
  (the VM's share divided by the processes times threads); several processes on a GPU worker are refused.
- On Dataflow, ``--staging_location`` is required and must lie outside ``--temp_location``: the staged pipeline must
  outlive a job that runs longer than the temp bucket's one-day deletion rule (docs/operations.md).
- On Dataflow, the launcher runs the image's Python (3.11): the pickled pipeline does not load across versions.
"""

from __future__ import annotations

import sys
from typing import Optional

from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions, StandardOptions

from dpcda.pipeline.errors import ReleaseError

IMAGE_PYTHON = (3, 11)  # the Dockerfile's base image: apache/beam_python3.11_sdk
ONE_SDK_PROCESS = "no_use_multiple_sdk_containers"
NO_JOB_OPTIONS = ("template_location", "dry_run", "output_executable_path")


def _given(value) -> bool:
    """Whether the option was given at all. Beam reads these options as strings and acts on any non-empty one
    (``--dry_run=False`` runs dry, ``--template_location=0`` writes a template to ./0), so every given value is
    refused, whatever it says; only the defaults (None, and dry_run's False) pass."""
    return value is not None and value is not False


GPU_MACHINE_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")  # Compute Engine types that come with GPUs attached


def _gpu_workers(flags: dict) -> bool:
    """Whether the workers have a GPU: an accelerator asked for as a service option or an experiment
    (``--experiments=worker_accelerator=...``), or a machine type with GPUs attached (``g2-standard-8``)."""
    asked = []
    for name in ("dataflow_service_options", "experiments"):
        given = flags.get(name) or []
        asked += [given] if isinstance(given, str) else list(given)
    machine = str(flags.get("machine_type") or "").lower()
    return (
        any("worker_accelerator" in str(s) for s in asked)
        or "gpu" in machine
        or machine.startswith(GPU_MACHINE_FAMILIES)
    )


def sdk_processes(flags: dict) -> int:
    """SDK processes per worker VM the job asks for (1 with ``no_use_multiple_sdk_containers``; otherwise Dataflow
    runs one per vCPU: taken as 'more than one', the count depending on the machine type)."""
    experiments = flags.get("experiments") or []
    if ONE_SDK_PROCESS in experiments and int(flags.get("sdk_worker_parallelism") or 1) <= 1:
        return 1
    return max(2, int(flags.get("sdk_worker_parallelism") or 1))


def check_job_options(options: PipelineOptions, *, max_class_bytes: Optional[int] = None) -> None:
    """Refuses what leaves a job nobody publishes (every runner); completes and checks Dataflow's worker options in
    place (see the module docstring). ``max_class_bytes``: the release's explicit per-class budget, if any.
    Raises ReleaseError (one line)."""
    flags = options.get_all_options()
    for name in NO_JOB_OPTIONS:
        if _given(flags.get(name)):
            raise ReleaseError(
                f"--{name}: the release job must run under this launcher, which publishes the release and records "
                f"it in the ledger; a job that only writes a template or runs dry publishes nothing. Drop the flag"
            )
    if "dataflow" not in str(options.view_as(StandardOptions).runner or "").lower():
        return
    if sys.version_info[:2] != IMAGE_PYTHON:
        raise ReleaseError(
            f"DataflowRunner: the launcher runs Python {sys.version_info[0]}.{sys.version_info[1]}, the worker "
            f"image Python {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}; launch from a Python {IMAGE_PYTHON[0]}."
            f"{IMAGE_PYTHON[1]} environment (the pickled pipeline does not load across Python versions)"
        )
    temp, staging = flags.get("temp_location"), flags.get("staging_location")
    if not temp or not staging:
        raise ReleaseError(
            "DataflowRunner: pass --temp_location and --staging_location (a prefix outside the temp one: the temp "
            "bucket's one-day deletion rule must not remove the staged pipeline under a worker of a longer job)"
        )
    if staging.rstrip("/") == temp.rstrip("/") or staging.startswith(temp.rstrip("/") + "/"):
        raise ReleaseError(
            f"--staging_location {staging}: lies inside --temp_location {temp}, whose objects are deleted after a "
            f"day; stage outside it"
        )
    debug = options.view_as(DebugOptions)
    experiments = flags.get("experiments") or []
    if "use_multiple_sdk_containers" not in experiments and int(flags.get("sdk_worker_parallelism") or 1) <= 1:
        debug.add_experiment(ONE_SDK_PROCESS)
    if flags.get("number_of_worker_harness_threads") is None:
        debug.number_of_worker_harness_threads = 1
    flags = options.get_all_options()
    processes = sdk_processes(flags)
    threads = int(flags["number_of_worker_harness_threads"])
    if processes > 1 and _gpu_workers(flags):
        raise ReleaseError(
            "DataflowRunner: several SDK processes per GPU worker would each open the one GPU and hold a class; "
            f"drop use_multiple_sdk_containers/--sdk_worker_parallelism (the launcher then runs one, {ONE_SDK_PROCESS})"
        )
    if processes * threads > 1 and max_class_bytes is None:
        raise ReleaseError(
            f"DataflowRunner: {'several' if processes > 1 else threads} classes at once per worker VM "
            f"({'several SDK processes' if processes > 1 else 'harness threads'}), but the default per-class budget "
            f"is 40 % of the VM's memory for one; pass --max-class-bytes at most that share divided by the classes "
            f"held at once, or drop the option (one SDK process, one harness thread)"
        )
