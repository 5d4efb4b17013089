"""One chaos run: cluster up, load on, faults by the schedule, heal, drain, clean up."""
from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from pathlib import Path

from warren.verification.chaos import schedule
from warren.verification.chaos.cluster import LocalCluster
from warren.verification.chaos.disk import SmallDisks
from warren.verification.chaos.drain import drain_everything
from warren.verification.chaos.faults import FaultInjector
from warren.verification.chaos.perfload import PerfLoad
from warren.verification.recorder import HistoryRecorder

HEALTHY_TIMEOUT_SECONDS = 60.0


class ChaosRun:
    def __init__(self, args):
        self.args = args
        self.run_dir = Path(args.run_dir).resolve()
        self.history = self.run_dir / "history"
        self.run_id = args.run_id or f"chaos-{args.seed}-{uuid.uuid4().hex[:8]}"
        self.recorder = HistoryRecorder(self.history, "chaos", self.run_id)
        self.disks = SmallDisks()
        env = {"WARREN_CLUSTER_NODE_GONE_SECONDS": str(args.node_gone_seconds)}
        if args.wal_max_bytes:   # small: rollovers (WAL to segments) happen under the faults
            env["WARREN_WAL_MAX_SIZE_BYTES"] = str(args.wal_max_bytes)
        self.cluster = LocalCluster(self.run_dir, args.nodes, args.heartbeat, env, args.node_processes)
        self.kinds = list(args.faults)
        self.injector = FaultInjector(self.cluster, self.disks, self.recorder, self._queues()[0])
        self.perf = PerfLoad(self.run_dir, self.cluster.urls, self.history, self.run_id, args)
        self.report: dict = {"run_dir": str(self.run_dir), "run_id": self.run_id, "seed": args.seed}

    def _queues(self) -> list[str]:
        a = self.args
        return [f"{a.queue}-{n}" for n in range(a.queues)] if a.queues > 1 else [a.queue]

    async def run(self) -> dict:
        try:
            await self._set_up()
            await self._load_with_faults()
            await self._heal_and_drain()
        finally:
            await self._clean_up()
        return self.report

    async def _set_up(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if "disk" in self.kinds:
            for node in self.cluster.nodes.values():
                if reason := self.disks.mount(node.data_dir):
                    print(f"warren-chaos: skipping the disk fault: {reason}", flush=True)
                    self.kinds.remove("disk")
                    break
        await self.cluster.start()
        await self._wait_healthy()

    async def _load_with_faults(self) -> None:
        a = self.args
        plan = schedule.plan(random.Random(a.seed), self.kinds, a.duration, a.warmup,
                             (a.fault_min, a.fault_max), (a.gap_min, a.gap_max), a.max_faults)
        self.report["planned_faults"] = len(plan)
        await self.perf.start()
        started = time.monotonic()
        for fault in plan:
            if (wait := fault.start_seconds - (time.monotonic() - started)) > 0:
                await asyncio.sleep(wait)  # the schedule's clock
            print(f"warren-chaos: t={time.monotonic() - started:.1f}s {fault.kind} for {fault.duration_seconds:.1f}s",
                  flush=True)
            await self.injector.inject(fault)
        await self.perf.wait()
        self.report["faults"] = self.injector.injected
        self.report["perf"] = self.perf.summary()

    async def _heal_and_drain(self) -> None:
        await self._heal_everything()
        await self._wait_healthy()
        urls = {name: node.url for name, node in self.cluster.nodes.items()}
        started = time.monotonic()
        self.report["drained"] = await drain_everything(urls, self._queues(), self.recorder,
                                                        self.args.drain_idle, self.args.drain_max)
        self.report["drain_seconds"] = round(time.monotonic() - started, 1)

    async def _heal_everything(self) -> None:
        await self.injector.heal_all()
        for proxy in self.cluster.proxies.values():
            proxy.heal()
        for mount_point in self.disks.mounts:
            self.disks.free(mount_point)
        for name, node in self.cluster.nodes.items():
            if node.paused:
                self.cluster.signal(name, signal.SIGCONT)
            if not node.running:
                await self.cluster.launch(name)
        await asyncio.gather(*(self.cluster.wait_listening(name) for name in self.cluster.nodes))

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTHY_TIMEOUT_SECONDS
        while not await self.cluster.all_see_each_other():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come together in time; see the nodes' server.log")
            await self.cluster.restart_exited()
            await asyncio.sleep(0.2)  # polling the nodes' views, with a deadline

    async def _clean_up(self) -> None:
        """Everything this run started goes, whatever happened (also on Ctrl-C / SIGTERM)."""
        for step in (self.perf.stop, self.injector.heal_all, self.cluster.stop_all):
            try:
                await asyncio.shield(step())
            except Exception as error:  # noqa: BLE001 -- cleaning up the rest matters more
                print(f"warren-chaos: cleanup step {step.__name__} failed: {error!r}", flush=True)
        self.disks.unmount_all()
        self.recorder.close()
