"""Run the cluster simulation over many seeds: python -m tests.sim --seeds 1000 [--scenario faults] [--seed N]."""
from __future__ import annotations

import argparse
import sys
import time

from tests.sim.history import SimulationFailure
from tests.sim.world import SCENARIOS, World


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="faults")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds, from --first")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seed", type=int, help="replay this one seed")
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failures, steps, started = 0, 0, time.perf_counter()
    for seed in seeds:
        world = World(SCENARIOS[args.scenario], seed)
        try:
            world.run()
        except SimulationFailure as failure:
            failures += 1
            print(f"FAIL {failure}", flush=True)
        steps += world.steps
    elapsed = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {failures} failed, {steps} steps in {elapsed:.1f} s "
          f"({steps / elapsed:.0f} steps/s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
