"""gpuenv.bytecode: an interpreter that compiles a package in every process is recognised, and
gpuenv's children then get a private bytecode cache; nothing changes otherwise."""

import importlib.util
import os
import py_compile
import stat
import sys
from types import SimpleNamespace

import pytest

from gpuenv import bytecode
from gpuenv.checks import session as session_mod
from gpuenv.progress import Silent


@pytest.fixture
def package(tmp_path, monkeypatch):
    """An importable package ``gapdemo`` without any .pyc."""
    root = tmp_path / "site"
    (root / "gapdemo").mkdir(parents=True)
    (root / "gapdemo" / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return root / "gapdemo" / "__init__.py"


def _no_writes(monkeypatch):
    flags = SimpleNamespace(dont_write_bytecode=1)
    monkeypatch.setattr(bytecode, "sys", SimpleNamespace(flags=flags, executable=sys.executable))
    monkeypatch.setenv(bytecode.DONT_WRITE, "1")


def test_no_pyc_and_no_writes_compiles_every_time(package, monkeypatch):
    _no_writes(monkeypatch)
    got = bytecode.read("gapdemo")
    assert got is not None and got.compiles_every_time
    assert got.source == str(package)
    assert got.why_not_written == "PYTHONDONTWRITEBYTECODE=1"
    text = got.describe()
    assert "compileall" in text and str(package.parent.parent) in text


def test_a_cached_pyc_is_enough(package, monkeypatch):
    _no_writes(monkeypatch)
    py_compile.compile(str(package), cfile=importlib.util.cache_from_source(str(package)))
    got = bytecode.read("gapdemo")
    assert got is not None and got.cached and not got.compiles_every_time


def test_an_interpreter_that_writes_its_pyc_pays_once(package, monkeypatch):
    monkeypatch.setattr(
        bytecode, "sys", SimpleNamespace(flags=SimpleNamespace(dont_write_bytecode=0))
    )
    got = bytecode.read("gapdemo")
    assert got is not None and not got.cached and not got.compiles_every_time


def test_a_folder_the_user_cannot_write_compiles_every_time(package, monkeypatch):
    monkeypatch.setattr(
        bytecode, "sys", SimpleNamespace(flags=SimpleNamespace(dont_write_bytecode=0))
    )
    monkeypatch.setattr(bytecode.os, "access", lambda path, mode: False)
    got = bytecode.read("gapdemo")
    assert got is not None and got.compiles_every_time
    assert "is not writable" in got.why_not_written


def test_a_missing_package_reads_none():
    assert bytecode.read("gpuenv_no_such_package_here") is None


def _compiling(package):
    return bytecode.Reading("gapdemo", str(package), False, "PYTHONDONTWRITEBYTECODE=1")


def test_children_get_a_private_cache_and_may_write_it(package, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), bytecode.DONT_WRITE: "1", "KEEP": "x"}
    got = bytecode.child_env(env, _compiling(package))
    folder = tmp_path / "cache" / "gpuenv" / "pycache"
    assert got[bytecode.PREFIX] == str(folder)
    assert bytecode.DONT_WRITE not in got and got["KEEP"] == "x"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert env[bytecode.DONT_WRITE] == "1"  # the caller's mapping is left alone


def test_nothing_changes_when_nothing_compiles_or_the_user_chose_a_prefix(package, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path), bytecode.DONT_WRITE: "1"}
    assert bytecode.child_env(env, None) == env
    cached = bytecode.Reading("gapdemo", str(package), True, "PYTHONDONTWRITEBYTECODE=1")
    assert bytecode.child_env(env, cached) == env
    mine = {**env, bytecode.PREFIX: "/elsewhere"}
    assert bytecode.child_env(mine, _compiling(package)) == mine


def test_an_unwritable_cache_folder_leaves_the_environment_alone(package, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {"XDG_CACHE_HOME": str(blocker)}
    assert bytecode.child_env(env, _compiling(package)) == env


def test_the_check_session_hands_the_cache_to_its_children(package, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(bytecode.DONT_WRITE, "1")
    s = session_mod._Session(None, {}, tmp_path, Silent(), pyc=_compiling(package))
    env = s.env({"EXTRA": "1"})
    assert env[bytecode.PREFIX] == str(tmp_path / "cache" / "gpuenv" / "pycache")
    assert bytecode.DONT_WRITE not in env and env["EXTRA"] == "1"
    plain = session_mod._Session(None, {}, tmp_path, Silent(), pyc=None).env()
    assert bytecode.PREFIX not in plain or plain[bytecode.PREFIX] == os.environ.get(bytecode.PREFIX)
