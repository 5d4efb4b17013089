"""Celery (py-amqp transport, rpc:// result backend) against a real warren-server.

A real worker subprocess consumes from its own queue; the test process sends
tasks and reads results through the rpc:// backend, which replies to the
client over AMQP. The worker is terminated (then killed) at the end.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from celery import group

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

    app = Celery(__name__, broker=os.environ["WARREN_TEST_BROKER_URL"], backend="rpc://")
    app.conf.update(
        task_default_queue=os.environ["WARREN_TEST_QUEUE"],
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=3,
        worker_hijack_root_logger=False,
        task_acks_late=True,
        result_expires=None,
    )


    @app.task
    def add(x, y):
        return x + y


    @app.task
    def write_file(path, content):
        Path(path).write_text(content)
        return len(content)


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

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(WORKER_TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(WORKER_STOP_TIMEOUT_SECONDS)


def start_worker(amqp_port: int, directory: Path):
    """Write a uniquely named task module to ``directory``, import it here, start a solo worker for it."""
    module_name = f"warren_celery_tasks_{uuid.uuid4().hex[:8]}"
    (directory / f"{module_name}.py").write_text(TASKS_SOURCE)
    queue = f"celery-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
    env.update({
        "WARREN_TEST_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{amqp_port}//",
        "WARREN_TEST_QUEUE": queue,
        "PYTHONPATH": os.pathsep.join([str(directory), env.get("PYTHONPATH", "")]),
    })
    # The module reads its broker URL and queue at import time, in this process too.
    saved = {key: os.environ.get(key) for key in ("WARREN_TEST_BROKER_URL", "WARREN_TEST_QUEUE")}
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
            alive = "running" if worker.process.poll() is None else f"exited with {worker.process.returncode}"
            pytest.fail(f"no result for {what} within {RESULT_TIMEOUT_SECONDS}s (worker {alive}); "
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
