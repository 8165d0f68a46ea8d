"""Where an AIM release's time goes on wa_churn: the wall and CPU time of each selection round (the round's log line),
printed as the rounds run, for the first ``--rounds`` rounds (a large ``--rounds`` times the whole release).

    python -m benchmarks.studies.aim_rounds --data /tmp/aim-data/wa_churn --eps 1 --rounds 12
    python -m benchmarks.studies.aim_rounds --data DIR --rounds 12 --xla-o0   # XLA's cheapest compile (see below)

Each round refits the model between rounds with ``mechanisms.pgm`` (numpy: nothing is compiled); the release's last
fit is mbi's, which compiles its XLA programs once. ``--xla-o0`` sets ``XLA_FLAGS=--xla_backend_optimization_level=0
--xla_llvm_disable_expensive_passes=true`` before JAX starts, trading that last fit's speed for compile time. TEST seed
(reproducible, not private). Prints one line per round: round, wall s, CPU s (process, all threads), the pick.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

XLA_O0 = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


class _Rounds(logging.Handler):
    def __init__(self, rounds: int):
        super().__init__()
        self.rounds, self.seen = rounds, 0
        self.t0 = self.last = time.time()
        self.c0 = self.clast = time.process_time()

    def emit(self, record):
        msg = record.getMessage()
        if "stage=marginals aim round=" not in msg:
            return
        now, cpu = time.time(), time.process_time()
        self.seen += 1
        pick = msg.split("clique=")[1]
        print(f"| {self.seen} | {now - self.last:.1f} | {cpu - self.clast:.1f} | {pick} |", flush=True)
        self.last, self.clast = now, cpu
        if self.seen >= self.rounds:
            total = f"wall {now - self.t0:.1f} s, cpu {cpu - self.c0:.1f} s"
            print(f"{self.seen} rounds: {total} (from the release's start)")
            sys.stdout.flush()
            os._exit(0)  # the rest of the release is not timed here


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--xla-o0", action="store_true")
    args = p.parse_args(argv)
    if args.xla_o0:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + XLA_O0).strip()
    import dpcda  # noqa: F401  (JAX starts here, after XLA_FLAGS)

    logging.getLogger().addHandler(_Rounds(args.rounds))
    logging.getLogger().setLevel(logging.INFO)
    print(f"eps {args.eps:g}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print("| round | wall s | cpu s | clique, std, annealed |\n|---|---|---|---|")
    aim_release(args.data, args.eps, args.seed)


def aim_release(data: str, eps: float, seed: int):
    """An AIM release of the wa_churn table prepared under ``data`` (examples/wa_churn.yaml's schema), TEST seed."""
    import dpcda

    return dpcda.release(
        os.path.join(data, "train", "*.parquet"),
        epsilon=eps,
        mechanism="marginals",
        config="examples/wa_churn.yaml",
        seed=seed,
        marginals_selection="aim",
    )


if __name__ == "__main__":
    main()
