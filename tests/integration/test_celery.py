"""Celery (py-amqp transport, rpc:// result backend) against a real warren-server.

A real worker subprocess consumes from its own queue; the test process sends
tasks and reads results through the rpc:// backend, which replies to the
client over AMQP. The worker is terminated (then killed) at the end. Celery's
quorum-queue setup (its native delayed delivery for countdown tasks) is run too.
"""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from celery import group

from tests.integration.quorum_cluster import wait_for

pytestmark = pytest.mark.timeout(120)

RESULT_TIMEOUT_SECONDS = 30.0
# Celery notices SIGTERM at its next event-loop wake-up, at most 10 s later
# (kombu's Hub.fire_timers max_delay), independent of the broker.
WORKER_WARM_SHUTDOWN_SECONDS = 15.0
WORKER_TERMINATE_GRACE_SECONDS = 3.0
WORKER_STOP_TIMEOUT_SECONDS = 10.0

TASKS_SOURCE = textwrap.dedent('''
    import os
    from pathlib import Path

    from celery import Celery
    from kombu import Exchange, Queue

    app = Celery(__name__, broker=os.environ["WARREN_TEST_BROKER_URL"], backend="rpc://")
    app.conf.update(
        task_default_queue=os.environ["WARREN_TEST_QUEUE"],
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=3,
        worker_hijack_root_logger=False,
        task_acks_late=True,
        result_expires=None,
    )
    if os.environ.get("WARREN_TEST_QUEUE_TYPE") == "quorum":
        # Celery's own quorum setup: a topic exchange, so that countdown tasks take its
        # native delayed delivery (the celery_delayed_* quorum queues), and confirmed publishes.
        queue = os.environ["WARREN_TEST_QUEUE"]
        app.conf.update(
            task_queues=[Queue(queue, Exchange(queue, type="topic"), routing_key=queue,
                               queue_arguments={"x-queue-type": "quorum"})],
            task_default_exchange=queue,
            task_default_exchange_type="topic",
            task_default_routing_key=queue,
            broker_transport_options={"confirm_publish": True},
        )


    @app.task
    def add(x, y):
        return x + y


    @app.task
    def write_file(path, content):
        Path(path).write_text(content)
        return len(content)


    @app.task(bind=True)
    def route_taken(self):
        """The exchange the message last came from, and the queues it was dead-lettered from."""
        deaths = getattr(self.request, "x-death", None) or []
        return self.request.delivery_info.get("exchange"), sorted(death["queue"] for death in deaths)


    @app.task
    def fail(message):
        raise ValueError(message)
''')


class Worker:
    def __init__(self, process: subprocess.Popen, log_path: Path, module_name: str):
        self.process = process
        self.log_path = log_path
        self.module_name = module_name

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def state(self) -> str:
        return "running" if self.process.poll() is None else f"exited with {self.process.returncode}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(WORKER_TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(WORKER_STOP_TIMEOUT_SECONDS)


def start_worker(amqp_port: int, directory: Path, queue_type: str = "classic", queue: str | None = None,
                 module_name: str | None = None):
    """Write a uniquely named task module to ``directory``, import it here, start a solo worker for it
    (on the given queue and module: a task's name is its module's)."""
    module_name = module_name or f"warren_celery_tasks_{uuid.uuid4().hex[:8]}"
    (directory / f"{module_name}.py").write_text(TASKS_SOURCE)
    queue = queue or f"celery-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
    env.update({
        "WARREN_TEST_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{amqp_port}//",
        "WARREN_TEST_QUEUE": queue,
        "WARREN_TEST_QUEUE_TYPE": queue_type,
        "PYTHONPATH": os.pathsep.join([str(directory), env.get("PYTHONPATH", "")]),
    })
    # The module reads its broker URL and queue at import time, in this process too.
    saved = {key: os.environ.get(key) for key in ("WARREN_TEST_BROKER_URL", "WARREN_TEST_QUEUE",
                                                  "WARREN_TEST_QUEUE_TYPE")}
    os.environ.update({key: env[key] for key in saved})
    sys.path.insert(0, str(directory))
    try:
        tasks = importlib.import_module(module_name)
    finally:
        sys.path.remove(str(directory))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    log_path = directory / f"{module_name}.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", module_name, "worker", "--pool=solo", "--concurrency=1",
             "--without-heartbeat", "--without-gossip", "--without-mingle", "-Q", queue, "--loglevel=INFO",
             "--hostname", f"{queue}@localhost"],
            cwd=directory, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    return tasks, Worker(process, log_path, module_name)


def stop_worker(tasks, worker: "Worker") -> None:
    worker.stop()
    tasks.app.close()
    sys.modules.pop(worker.module_name, None)


@pytest.fixture(scope="module")
def celery_setup(server, tmp_path_factory):
    """(tasks module, worker) shared by this module's tests; each test uses its own task arguments."""
    tasks, worker = start_worker(server.amqp_port, tmp_path_factory.mktemp("celery"))
    yield tasks, worker
    stop_worker(tasks, worker)


def get_result(async_result, what: str, worker: Worker):
    try:
        return async_result.get(timeout=RESULT_TIMEOUT_SECONDS)
    except Exception as error:
        if type(error).__name__ in ("TimeoutError",):
            pytest.fail(f"no result for {what} within {RESULT_TIMEOUT_SECONDS}s (worker {worker.state()}); "
                        f"worker log:\n{worker.log()}")
        raise


def test_tasks_run_and_results_come_back_over_rpc_backend(celery_setup):
    tasks, worker = celery_setup
    results = [tasks.add.delay(i, i * 10) for i in range(8)]
    values = [get_result(result, f"add({i}, {i * 10})", worker) for i, result in enumerate(results)]
    assert values == [i + i * 10 for i in range(8)], f"wrong task results: {values}"
    assert all(result.successful() for result in results)


def test_task_side_effect_happens(celery_setup, tmp_path):
    tasks, worker = celery_setup
    target = tmp_path / "side-effect.txt"
    content = f"written by the worker {uuid.uuid4().hex}"
    written = get_result(tasks.write_file.delay(str(target), content), "write_file", worker)
    assert written == len(content)
    assert target.read_text() == content, "the task returned but its side effect is missing"


def test_task_exception_propagates_to_caller(celery_setup):
    tasks, worker = celery_setup
    result = tasks.fail.delay("boom-42")
    with pytest.raises(ValueError, match="boom-42"):
        get_result(result, "fail('boom-42')", worker)
    # The worker is still serving after a failed task.
    assert get_result(tasks.add.delay(2, 3), "add(2, 3) after a failure", worker) == 5


def test_group_of_tasks(celery_setup):
    tasks, worker = celery_setup
    group_result = group(tasks.add.s(i, 1) for i in range(10)).apply_async()
    values = get_result(group_result, "a group of 10 add tasks", worker)
    assert values == [i + 1 for i in range(10)]


def test_worker_stops_cleanly_on_sigterm(server, tmp_path):
    tasks, worker = start_worker(server.amqp_port, tmp_path)
    try:
        assert get_result(tasks.add.delay(1, 1), "add(1, 1)", worker) == 2
        started = time.monotonic()
        worker.process.terminate()
        try:
            code = worker.process.wait(WORKER_WARM_SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"celery worker did not finish its warm shutdown within {WORKER_WARM_SHUTDOWN_SECONDS}s "
                        f"of SIGTERM:\n{worker.log()}")
        assert code == 0, f"worker exited with {code} after {time.monotonic() - started:.1f}s:\n{worker.log()}"
        assert "Traceback" not in worker.log(), f"the worker logged an error:\n{worker.log()}"
    finally:
        stop_worker(tasks, worker)


def test_countdown_tasks_on_quorum_queues_wait_in_celery_delay_queues(fresh_server, tmp_path):
    """Celery 5.5+ with quorum queues delays a countdown task in the broker: through its 28
    celery_delayed_* quorum queues (per-queue TTL, dead-lettering into the next level, reject-publish),
    not in the worker's memory. (It asks for at-least-once dead-lettering, which Warren accepts
    and does at most once: README, Status.)"""
    tasks, worker = start_worker(fresh_server.amqp_port, tmp_path, queue_type="quorum")
    try:
        assert get_result(tasks.add.delay(1, 1), "add(1, 1)", worker) == 2
        exchange, dead_lettered_from = get_result(tasks.route_taken.apply_async(countdown=3), "countdown=3", worker)
        # 3 s = 2 + 1: two seconds in celery_delayed_1 (its TTL), then one in celery_delayed_0
        assert (exchange, dead_lettered_from) == ("celery_delayed_delivery", ["celery_delayed_0", "celery_delayed_1"])
        with tasks.app.connection_for_write() as connection:
            _, count, _ = connection.default_channel.queue_declare("celery_delayed_1", passive=True)
        assert count == 0, f"celery_delayed_1 still holds {count} messages after the task ran"
        assert "native delayed delivery" not in worker.log(), worker.log()
        assert "Traceback" not in worker.log(), f"the worker logged an error:\n{worker.log()}"
    finally:
        stop_worker(tasks, worker)


def test_a_confirmed_countdown_task_survives_a_broker_kill(fresh_server, tmp_path):
    """The task's message is confirmed into a delay queue, the broker is killed (SIGKILL) and
    started again on its data, then a new worker runs the task once its time has come."""
    tasks, worker = start_worker(fresh_server.amqp_port, tmp_path, queue_type="quorum")
    queue, module_name = tasks.app.conf.task_default_queue, worker.module_name
    target = tmp_path / "delayed.txt"
    content = f"written after a broker kill {uuid.uuid4().hex}"
    try:
        # The worker's start declares the delay queues and binds the task queue to them.
        assert get_result(tasks.add.delay(1, 1), "add(1, 1)", worker) == 2
        worker.stop()
        tasks.write_file.apply_async((str(target), content), countdown=3)   # returns once confirmed
    finally:
        stop_worker(tasks, worker)
    assert fresh_server.stop(signal.SIGKILL) == -signal.SIGKILL, fresh_server.log()
    fresh_server.start()
    tasks, worker = start_worker(fresh_server.amqp_port, tmp_path, queue_type="quorum", queue=queue,
                                 module_name=module_name)
    try:
        try:
            wait_for(target.exists, "the countdown task confirmed before the kill", RESULT_TIMEOUT_SECONDS)
        except AssertionError as error:
            pytest.fail(f"{error} (worker {worker.state()}); worker log:\n{worker.log()}")
        assert target.read_text() == content
    finally:
        stop_worker(tasks, worker)
