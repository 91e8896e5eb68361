"""The bootstrap script run under bash against a scratch root, with fakes for apt-get, the venv,
ansible-playbook and gpuenv check, and a real git repository for the fetch stage."""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from gpuenv.cloud import userdata
from gpuenv.floor import sources as floor

SCRIPT = resources.files("gpuenv.cloud").joinpath("templates/bootstrap.sh")


def _fake(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A scratch root laid out like an instance after cloud-init's write_files."""
    root = tmp_path / "root"
    (root / "etc" / "gpuenv").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=debian\nVERSION_ID=12\n")
    (root / "etc" / "apt" / "sources.list.d").mkdir(parents=True)
    (root / "etc" / "apt" / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    )
    bin_dir = tmp_path / "bin"
    _fake(bin_dir / "apt-get", 'echo "apt-get $*" >>"$GPUENV_ROOT/apt.log"')
    venv = root / "opt" / "gpuenv-bootstrap" / "venv" / "bin"
    _fake(venv / "python", 'echo "python $*" >>"$GPUENV_ROOT/venv-python.log"')
    _fake(venv / "ansible-playbook", 'echo "ansible-playbook $*"; echo "PLAY RECAP"')
    _fake(root / "opt" / "gpuenv" / "bin" / "gpuenv", "echo '{}' >\"$5\"; exit 0")
    # The project at a real tag in a real repository.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "site.yml").write_text("---\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "site.yml"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    return root, bin_dir, repo


def _env_file(root, repo, ref, **extra):
    values = {
        "GPUENV_GROUP": "cloud_nodes",
        "GPUENV_SOURCE": f"file://{repo}",
        "GPUENV_REF": ref,
        "GPUENV_PLAYBOOK": "site.yml",
        "GPUENV_SKIP_TAGS": "ssh,validate",
        "GPUENV_ANSIBLE": "ansible==12.3.0",
        "GPUENV_ANSIBLE_PY310": "ansible==10.7.0",
        "GPUENV_SETUPTOOLS": userdata.SETUPTOOLS_REQUIREMENT,
        "GPUENV_NODE_VENV": f"{root}/opt/gpuenv",
        "GPUENV_HTTP_PROXY": "",
        "GPUENV_HTTPS_PROXY": "",
        "GPUENV_NO_PROXY": "",
        "GPUENV_APT_CONF_FILE": floor.APT_CONF,
        "GPUENV_APT_CONF": "",
        "GPUENV_APT_SED_DEBIAN": "",
        "GPUENV_APT_SED_UBUNTU": "",
        **extra,
    }
    text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    (root / "etc" / "gpuenv" / "bootstrap.env").write_text(text)


def _run(root, bin_dir):
    env = {**os.environ, "GPUENV_ROOT": str(root), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    marker = json.loads((root / "var" / "lib" / "gpuenv" / "ready.json").read_text())
    return done, marker


def test_a_ref_that_does_not_exist_fails_the_fetch_stage_and_says_so(node):
    root, bin_dir, repo = node
    _env_file(root, repo, "v9.9-missing")
    done, marker = _run(root, bin_dir)
    assert done.returncode == 1
    assert marker["status"] == "failed"
    assert marker["stage"] == "fetch"
    assert "couldn't find remote ref v9.9-missing" in marker["reason"]
    assert marker["ref"] == "v9.9-missing"
    assert marker["verdict"] is None
    assert marker["finished"] is not None
    assert marker["log"] == "/var/log/gpuenv-bootstrap.log"
    # The earlier stages ran; nothing after the fetch did.
    assert "install -y --no-install-recommends python3-venv git" in (root / "apt.log").read_text()
    assert "stage converge" not in (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()


def test_a_failing_git_fails_the_fetch_stage(node):
    root, bin_dir, repo = node
    _fake(bin_dir / "git", 'echo "fatal: unable to access the source: proxy refused" >&2; exit 128')
    _env_file(root, repo, "v1")
    done, marker = _run(root, bin_dir)
    assert done.returncode == 1
    assert (marker["status"], marker["stage"]) == ("failed", "fetch")
    assert "stage fetch failed (exit 128)" in marker["reason"]
    assert "proxy refused" in marker["reason"]


def test_a_converged_node_records_the_commit_and_the_check_verdict(node):
    root, bin_dir, repo = node
    # What `gpuenv cloud-init` renders from the node floor for these sources.
    rules = floor.apt_rules(
        "official",
        "debian",
        "https://mirrors.example.cn/debian",
        "https://mirrors.example.cn/debian-security",
    )
    apt_conf = floor.apt_conf(
        "http://proxy.example:3128", "http://proxy.example:3128", "http://cache.example:3142"
    )
    _env_file(
        root,
        repo,
        "v1",
        GPUENV_APT_SED_DEBIAN=floor.sed_script(rules),
        GPUENV_HTTP_PROXY="http://proxy.example:3128",
        GPUENV_HTTPS_PROXY="http://proxy.example:3128",
        GPUENV_APT_CONF=apt_conf,
        GPUENV_CHECK_PROFILE="cpu",
    )
    args = root / "check-args"
    _fake(
        root / "opt" / "gpuenv" / "bin" / "gpuenv",
        f'echo "$*" >{args}; echo \'{{}}\' >"$5"; exit 1',
    )
    done, marker = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (marker["status"], marker["stage"], marker["verdict"]) == ("done", "done", "fail")
    assert marker["commit"] == head
    assert marker["check_report"].endswith("/var/lib/gpuenv/check.json")
    # The node judges itself by the group's validate_profile.
    assert args.read_text().split()[-2:] == ["--profile", "cpu"]
    sources = (root / "etc" / "apt" / "sources.list.d" / "debian.sources").read_text()
    assert "URIs: https://mirrors.example.cn/debian\n" in sources
    assert "URIs: https://mirrors.example.cn/debian-security\n" in sources
    # The sed script gave what the sources_node module gives for the same rules.
    before = (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    )
    assert sources == floor.repoint(before, floor.compile_rules(rules))
    # The one apt settings file, the sources role's: the apt-only proxy (a site cache) for plain
    # HTTP, HTTPS through the proxy.
    proxy = (root / floor.APT_CONF.lstrip("/")).read_text()
    assert proxy == (
        'Acquire::http::Proxy "http://cache.example:3142";\n'
        'Acquire::https::Proxy "http://proxy.example:3128";\n'
        'Acquire::http::Proxy-Auto-Detect "";\n'
    )
    assert not list((root / "etc" / "apt" / "apt.conf.d").glob("*gpuenv-proxy"))
    log = (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()
    inventory = f"{root}/etc/gpuenv/inventory/hosts.yml"
    assert f"ansible-playbook site.yml -i {inventory} --skip-tags ssh,validate" in log
    assert "ansible_connection: local" in (root / "etc/gpuenv/inventory/hosts.yml").read_text()


def test_a_failed_converge_names_the_failed_task(node):
    root, bin_dir, repo = node
    _env_file(root, repo, "v1")
    venv = root / "opt" / "gpuenv-bootstrap" / "venv" / "bin"
    _fake(
        venv / "ansible-playbook",
        '[ "$1" != --version ] || exit 0\n'
        'echo "TASK [nvidia_driver : Check the driver branch]"\n'
        "echo \"fatal: [node]: FAILED! => nvidia_driver_branch='999' is not packaged\"\n"
        'echo "PLAY RECAP"; exit 2',
    )
    done, marker = _run(root, bin_dir)
    assert done.returncode == 1
    assert (marker["status"], marker["stage"]) == ("failed", "converge")
    assert "nvidia_driver_branch='999' is not packaged" in marker["reason"]


def test_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("apt-get install -y shellcheck")
    done = subprocess.run(
        ["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout


@pytest.fixture
def tarball(node, tmp_path):
    """A release tarball of the project (one top folder, as GitHub's archives have), served by a
    fake curl that records the URL it was asked for."""
    _, bin_dir, _ = node
    top = tmp_path / "tree" / "gpuenv-v1"
    top.mkdir(parents=True)
    (top / "site.yml").write_text("---\n")
    archive = tmp_path / "gpuenv-v1.tar.gz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(top.parent), top.name], check=True)
    _fake(
        bin_dir / "curl",
        'while [ "$#" -gt 1 ]; do [ "$1" != -o ] || out=$2; shift; done\n'
        f'echo "$1" >"$GPUENV_ROOT/curl.url"; cp {archive} "$out"',
    )
    return hashlib.sha256(archive.read_bytes()).hexdigest()


def test_a_tarball_with_the_right_sha256_is_unpacked_and_converged(node, tarball):
    root, bin_dir, _ = node
    source = "https://git.example.org/gpuenv/archive/{ref}.tar.gz"
    _env_file(root, "", "v1", GPUENV_SOURCE=source, GPUENV_SHA256=tarball)
    done, marker = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    assert (marker["status"], marker["verdict"]) == ("done", "pass")
    assert (root / "curl.url").read_text() == "https://git.example.org/gpuenv/archive/v1.tar.gz\n"
    log = (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()
    assert f"SHA-256 of the tarball checked: {tarball}" in log


def test_a_tarball_with_a_wrong_sha256_stops_before_anything_runs(node, tarball):
    root, bin_dir, _ = node
    source = "https://git.example.org/gpuenv/archive/{ref}.tar.gz"
    wrong = "0" * 64
    _env_file(root, "", "v1", GPUENV_SOURCE=source, GPUENV_SHA256=wrong)
    done, marker = _run(root, bin_dir)
    assert done.returncode == 1
    assert (marker["status"], marker["stage"]) == ("failed", "fetch")
    assert f"SHA-256 of {source} is {tarball}, expected {wrong}" in marker["reason"]
    # Nothing of it was unpacked, let alone run.
    assert not (root / "opt" / "gpuenv-bootstrap" / "project").exists()
    assert not (root / "opt" / "gpuenv-bootstrap" / "project.new" / "site.yml").exists()
    log = (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()
    assert "stage converge" not in log and "ansible-playbook site.yml" not in log


def test_the_pinned_commit_is_fetched_not_where_the_ref_points_now(node):
    root, bin_dir, repo = node
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    pinned = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "moved on"], check=True)
    _env_file(root, repo, "master", GPUENV_COMMIT=pinned.stdout.strip())
    done, marker = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    assert marker["commit"] == pinned.stdout.strip()


def test_secrets_come_from_the_command_to_a_root_only_file_passed_as_extra_vars(node):
    root, bin_dir, repo = node
    _env_file(
        root, repo, "v1", GPUENV_SECRETS_COMMAND="printf 'gpu_env_extra_env: {HF_TOKEN: hf_s3}\\n'"
    )
    done, _ = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    secrets = root / "etc" / "gpuenv" / "secrets.yml"
    assert secrets.read_text() == "gpu_env_extra_env: {HF_TOKEN: hf_s3}\n"
    assert secrets.stat().st_mode & 0o777 == 0o600
    log = (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()
    assert f"--skip-tags ssh,validate --extra-vars @{secrets}" in log
    assert "hf_s3" not in log


def test_a_secrets_file_the_user_placed_is_passed_and_none_is_fine(node):
    root, bin_dir, repo = node
    _env_file(root, repo, "v1")
    done, _ = _run(root, bin_dir)
    log = (root / "var" / "log" / "gpuenv-bootstrap.log").read_text()
    assert done.returncode == 0 and "--extra-vars" not in log
    secrets = root / "etc" / "gpuenv" / "secrets.yml"
    secrets.write_text("wandb_api_key: placed\n")
    secrets.chmod(0o644)
    done, _ = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    assert f"--extra-vars @{secrets}" in (root / "var/log/gpuenv-bootstrap.log").read_text()
    assert secrets.stat().st_mode & 0o777 == 0o600


def test_the_ca_bundle_is_given_to_curl_for_the_tarball_and_nothing_else(node, tarball):
    root, bin_dir, _ = node
    (root / "etc" / "gpuenv" / "source-ca.pem").write_text("CA\n")
    args = root / "curl.args"
    _fake(
        bin_dir / "curl",
        f'echo "$*" >{args}\n' + (bin_dir / "curl").read_text().split("\n", 1)[1],
    )
    source = "https://apt-cache:8443/bootstrap/gpuenv-{ref}.tar.gz"
    _env_file(
        root, "", "v1", GPUENV_SOURCE=source, GPUENV_SHA256=tarball,
        GPUENV_SOURCE_CA="/etc/gpuenv/source-ca.pem",
    )  # fmt: skip
    done, marker = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    assert (marker["status"], marker["verdict"]) == ("done", "pass")
    assert f"--cacert {root}/etc/gpuenv/source-ca.pem -o " in args.read_text()


def test_the_ca_bundle_is_given_to_git_for_the_fetch(node):
    root, bin_dir, repo = node
    (root / "etc" / "gpuenv" / "source-ca.pem").write_text("CA\n")
    calls = root / "git.args"
    real_git = shutil.which("git")
    _fake(bin_dir / "git", f'echo "$*" >>{calls}; exec {real_git} "$@"')
    _env_file(root, repo, "v1", GPUENV_SOURCE_CA="/etc/gpuenv/source-ca.pem")
    done, marker = _run(root, bin_dir)
    assert done.returncode == 0, done.stderr
    assert marker["status"] == "done" and marker["commit"]
    fetches = [c for c in calls.read_text().splitlines() if " fetch " in c]
    assert fetches and all(
        f"-c http.sslCAInfo={root}/etc/gpuenv/source-ca.pem" in c for c in fetches
    )


def test_the_venv_gets_the_setuptools_pyproject_builds_with(node):
    """The gpu_env role builds gpuenv's wheel with the bootstrap venv and no build isolation: an
    older setuptools than [build-system] asks for fails that build on the node."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # no tomllib on 3.10
    requires = re.search(r"^\[build-system\][^\[]*?^requires = ([^\n]*)$", pyproject, re.M | re.S)
    assert requires and requires.group(1) == f'["{userdata.SETUPTOOLS_REQUIREMENT}"]'
    root, bin_dir, repo = node
    _env_file(root, repo, "v1")
    _run(root, bin_dir)
    installs = (root / "venv-python.log").read_text()
    assert f"install --quiet ansible==12.3.0 {userdata.SETUPTOOLS_REQUIREMENT} wheel" in installs
