"""Applying and healing the faults of a schedule on a LocalCluster, each recorded
in the history as fault_start / fault_end (node: the target, detail: what)."""
from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Awaitable, Callable

from warren.verification.chaos.cluster import LocalCluster
from warren.verification.chaos.disk import SmallDisks
from warren.verification.chaos.proxy import LinkProxy
from warren.verification.chaos.schedule import PlannedFault

RESTART_LISTEN_SECONDS = 45.0
# a slow link's delay (jitter as much again): around and beyond the failure detector's 3 heartbeats
SLOW_DELAY_SECONDS = (0.05, 0.6)
# a flaky link is reset this often
FLAKY_RESET_SECONDS = (0.2, 1.5)
Heal = Callable[[], Awaitable[None]]


class FaultInjector:
    def __init__(self, cluster: LocalCluster, disks: SmallDisks, recorder, queue: str):
        self.cluster, self.disks, self.recorder, self.queue = cluster, disks, recorder, queue
        self.active: list[tuple[str, Heal]] = []   # what heal_all must undo after an interruption
        self.injected: list[str] = []

    async def inject(self, fault: PlannedFault) -> None:
        role, target = await self._pick_target(fault.choice)
        apply = getattr(self, f"_{fault.kind}")
        detail = f"kind={fault.kind} role={role} seconds={fault.duration_seconds:.1f}"
        self.recorder.record("fault_start", node=target, detail=detail)
        self.recorder.flush()
        heal, extra = await apply(target, fault.choice)
        self.active.append((detail, heal))
        self.injected.append(f"{detail} target={target} {extra}".strip())
        try:
            await asyncio.sleep(fault.duration_seconds)  # the fault's length: the schedule's clock
        finally:
            self.active.remove((detail, heal))
            await heal()
            # faults never overlap: a node down now stopped on its own during this one
            restarted = await self.cluster.restart_exited()
            if restarted:
                extra = f"{extra} restarted={','.join(restarted)}".strip()
            self.recorder.record("fault_end", node=target, detail=f"{detail} {extra}".strip())
            self.recorder.flush()

    async def heal_all(self) -> None:
        for _, heal in list(self.active):
            await heal()
        self.active.clear()

    async def _pick_target(self, choice: float) -> tuple[str, str]:
        """The queue's leader (choice < 0.5) or a follower, by the seeded choice."""
        names = sorted(self.cluster.nodes)
        leader, members = await self.cluster.queue_placement(self.queue)
        followers = sorted(set(members) - {leader}) if leader else []
        if leader and choice < 0.5:
            return "leader", leader
        if followers:
            return "follower", followers[int(choice * 2 % 1 * len(followers))]
        return "any", names[int(choice * len(names))]

    async def _kill(self, target: str, choice: float) -> tuple[Heal, str]:
        await self.cluster.kill(target)

        async def restart() -> None:
            await self.cluster.launch(target)
            await self.cluster.wait_listening(target, RESTART_LISTEN_SECONDS)
        return restart, "signal=SIGKILL"

    async def _pause(self, target: str, choice: float) -> tuple[Heal, str]:
        self.cluster.signal(target, signal.SIGSTOP)

        async def resume() -> None:
            self.cluster.signal(target, signal.SIGCONT)
        return resume, "signal=SIGSTOP"

    def _links_across(self, side: set[str]) -> list[LinkProxy]:
        """Every link between `side` and the other nodes."""
        return [p for p in self.cluster.proxies.values() if (p.dialer in side) != (p.acceptor in side)]

    @staticmethod
    def _healer(proxies: list[LinkProxy]) -> Heal:
        async def heal() -> None:
            for proxy in proxies:
                proxy.heal()
        return heal

    @staticmethod
    def _names(proxies: list[LinkProxy]) -> str:
        return ",".join(dict.fromkeys(f"{p.dialer}|{p.acceptor}" for p in proxies))   # a pair once

    async def _cut(self, side: set[str], directions=("forward", "backward")) -> tuple[Heal, str]:
        """Blackhole every link between `side` and the other nodes."""
        proxies = self._links_across(side)
        for proxy in proxies:
            proxy.block(*directions)
        return self._healer(proxies), "cut=" + self._names(proxies)

    async def _isolate(self, target: str, choice: float) -> tuple[Heal, str]:
        return await self._cut({target})

    async def _majority(self, target: str, choice: float) -> tuple[Heal, str]:
        others = sorted(set(self.cluster.nodes) - {target})
        minority = {target, *others[:(len(self.cluster.nodes) - 1) // 2 - 1]}
        return await self._cut(minority)

    async def _bridge(self, target: str, choice: float) -> tuple[Heal, str]:
        """The target still sees everyone; the others split in two halves that cannot see each other."""
        others = sorted(set(self.cluster.nodes) - {target})
        half = set(others[:len(others) // 2])
        proxies = [p for p in self.cluster.proxies.values()
                   if target not in (p.dialer, p.acceptor) and (p.dialer in half) != (p.acceptor in half)]
        for proxy in proxies:
            proxy.block("forward", "backward")
        return self._healer(proxies), "cut=" + self._names(proxies)

    async def _oneway(self, target: str, choice: float) -> tuple[Heal, str]:
        """Nothing from the target reaches one other node; the other way still works."""
        others = sorted(set(self.cluster.nodes) - {target})
        peer = others[int(choice * 4 % 1 * len(others))]
        proxies = self.cluster.links(target, peer)
        direction = "forward" if proxies[0].dialer == target else "backward"
        for proxy in proxies:
            proxy.block(direction)
        return self._healer(proxies), f"dropped={target}->{peer}"

    async def _slow(self, target: str, choice: float) -> tuple[Heal, str]:
        """Every link of the target held back a seeded delay, with as much jitter again."""
        rng = random.Random(choice)
        delay = rng.uniform(*SLOW_DELAY_SECONDS)
        proxies = self._links_across({target})
        for proxy in proxies:
            proxy.slow(delay, delay, random.Random(rng.random()))
        return self._healer(proxies), f"delay={delay:.3f}s jitter={delay:.3f}s"

    async def _flaky(self, target: str, choice: float) -> tuple[Heal, str]:
        """The target's links reset again and again, at seeded intervals, until healed."""
        rng = random.Random(choice)
        proxies = self._links_across({target})
        resets = [0]

        async def keep_resetting() -> None:
            while True:
                await asyncio.sleep(rng.uniform(*FLAKY_RESET_SECONDS))   # the fault's own clock
                resets[0] += sum(proxy.reset() for proxy in proxies)

        task = asyncio.ensure_future(keep_resetting())

        async def heal() -> None:
            task.cancel()
            print(f"warren-chaos: flaky {target}: {resets[0]} connections reset", flush=True)
        return heal, "links=" + self._names(proxies)

    async def _disk(self, target: str, choice: float) -> tuple[Heal, str]:
        data_dir = self.cluster.nodes[target].data_dir
        written = await asyncio.get_running_loop().run_in_executor(None, self.disks.fill, data_dir)

        async def heal() -> None:
            self.disks.free(data_dir)
        return heal, f"filler_bytes={written}"
