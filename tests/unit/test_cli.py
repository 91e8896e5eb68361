import pytest

from gpuenv.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "gpuenv" in capsys.readouterr().out


def test_unknown_command_is_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2


def test_building_the_parser_imports_no_engine():
    """Every command (`gpuenv check` on a node too) parses its arguments without importing the
    checks or the cluster runner: their defaults come from small modules of constants."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpuenv.cli import build_parser\n"
        "build_parser()\n"
        "engines = ('gpuenv.checks', 'gpuenv.cluster.pipeline', 'gpuenv.cluster.fanout')\n"
        "print(sorted(set(sys.modules) & set(engines)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
