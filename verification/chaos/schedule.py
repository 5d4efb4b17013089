"""The seeded fault schedule: which faults, when, for how long. Faults never
overlap; every requested kind comes once (in a shuffled order) before kinds repeat."""
from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill", "pause", "partition", "isolate", "majority", "bridge", "oneway", "disk", "slow", "flaky")
# "partition" is any of the shapes below, chosen by the seed.
PARTITION_SHAPES = ("isolate", "majority", "bridge", "oneway")


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    start_seconds: float      # from the start of the load
    duration_seconds: float
    choice: float             # a seeded number in [0, 1) that picks the target at run time


def plan(rng: random.Random, kinds: list[str], duration_seconds: float, warmup_seconds: float,
         fault_seconds: tuple[float, float], gap_seconds: tuple[float, float], max_faults: int) -> list[PlannedFault]:
    faults: list[PlannedFault] = []
    first_round = rng.sample(kinds, len(kinds))
    now = warmup_seconds
    while len(faults) < max_faults:
        kind = first_round[len(faults)] if len(faults) < len(first_round) else rng.choice(kinds)
        if kind == "partition":
            kind = rng.choice(PARTITION_SHAPES)
        length = rng.uniform(*fault_seconds)
        if now + length > duration_seconds:
            break
        faults.append(PlannedFault(kind, now, length, rng.random()))
        now += length + rng.uniform(*gap_seconds)
    return faults
