"""gpuenv bundle: the plan from pins and role tables, repository metadata, signing, bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpuenv.bundle import build as build_module
from gpuenv.bundle import plan as plan_module
from gpuenv.bundle import repo
from gpuenv.bundle.build import MOUNT, build_bundle, validate_output
from gpuenv.bundle.plan import StagePackages, parse_answer, plan_bundle
from gpuenv.cli import main
from gpuenv.errors import BadInput, GpuenvError
from gpuenv.progress import Recorder

FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
# What playbooks/bundle_packages.yml answered for these targets, recorded; the integration test
# tests/integration/test_bundle_plan.py holds the recording to the playbook's answer now.
ANSWERS = json.loads((Path(__file__).parent / "bundle" / "answers.json").read_text())


def recorded(
    pins: Path, facts: dict[str, str], modes: tuple[str, ...], gpu: bool
) -> dict[str, StagePackages]:
    """The recorded answer for the target, with the install methods the pins file sets."""
    assert facts == plan_module.target_facts(pins.stem)
    entry = ANSWERS[f"{pins.stem} {'+'.join(modes)} {'gpu' if gpu else 'cpu'}"]
    chosen = yaml.safe_load(pins.read_text()) or {}
    return {
        stage: StagePackages(
            tuple(v["debs"]),
            tuple(v["wheels"]),
            str(chosen.get(f"{stage}_install_method", v["method"])) if v["method"] else "",
            tuple(v.get("builds", [])),
        )
        for stage, v in entry.items()
    }


@pytest.fixture(autouse=True)
def _ansible_answers_from_the_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "ask_ansible", recorded)


FETCHED: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def _sources_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tarball as fetch_source would leave it (checked), without the network."""

    def fetch(url: str, sha256: str, dest: Path) -> Path:
        FETCHED.append((url, sha256))
        dest.mkdir(parents=True, exist_ok=True)
        (dest / url.rsplit("/", 1)[-1]).write_bytes(b"source")
        return dest / url.rsplit("/", 1)[-1]

    monkeypatch.setattr(build_module, "fetch_source", fetch)


def test_debian_13_plan_takes_each_stage_from_the_roles_tables() -> None:
    plan = plan_bundle("debian-13")
    assert plan.codename == "trixie"
    for name in ("nvidia-smi", "libcuda1", "nvidia-driver", "nvidia-cuda-toolkit", "libnccl2"):
        assert name in plan.debs
    for name in ("openmpi-bin", "libopenmpi-dev", "openssh-server", "python3-venv", "g++"):
        assert name in plan.debs
    assert plan.origins["libnccl2"] == "nccl"
    # The kernel headers name the node's kernel: listed, not guessed.
    assert plan.node_specific == ("linux-headers-<ansible_facts['kernel']> (nvidia_driver)",)
    assert "mpi4py==4.1.2" in plan.wheels
    assert "cupy-cuda12x==14.2.0" in plan.wheels


def test_debian_12_plan_gets_nccl_as_a_wheel_for_its_cuda_major() -> None:
    plan = plan_bundle("debian-12", driver_mode="userspace", gpu_wheels=False)
    assert "nvidia-nccl-cu11==2.21.*" in plan.wheels
    assert "libnccl2" not in plan.debs
    assert "nvidia-driver" not in plan.debs and "nvidia-smi" in plan.debs
    assert not any(w.startswith(("cupy", "nvidia-ml-py")) for w in plan.wheels)


def test_ubuntu_plan_uses_the_family_tables() -> None:
    plan = plan_bundle("ubuntu-24.04")
    assert plan.codename == "noble"
    assert "openmpi-bin" in plan.debs and "openssh-client" in plan.debs


def test_pins_file_by_path_and_nvidia_repo_refused(tmp_path: Path) -> None:
    pins = tmp_path / "debian-13.yml"
    pins.write_text("nvidia_driver_install_method: nvidia_repo\nnvidia_driver_branch: '550'\n")
    with pytest.raises(BadInput, match="NVIDIA's CUDA repository"):
        plan_bundle(str(pins))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pins_name": "debian-14"}, "unknown pins 'debian-14': choose one of debian-12"),
        ({"pins_name": "debian-13", "driver_mode": "half"}, "unknown driver mode 'half'"),
        ({"pins_name": "debian-13", "extra_debs": ("Bad Name",)}, "not a Debian package"),
        ({"pins_name": "debian-13", "extra_wheels": ("torch; rm -rf",)}, "not a pip requirement"),
    ],
)
def test_bad_plan_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        plan_bundle(**kwargs)  # type: ignore[arg-type]


def test_the_playbooks_answer_is_read_and_a_failed_role_check_is_bad_input() -> None:
    answer = {"plays": [{"tasks": [
        {"task": {"name": "Load"}, "hosts": {"localhost": {"changed": False}}},
        {"task": {"name": "Say"}, "hosts": {"localhost": {"gpuenv_bundle_packages": {
            "mpi": {"debs": ["openmpi-bin"], "wheels": []},
        }}}},
    ]}]}  # fmt: skip
    # profile_tasks or a warning may print before the JSON document.
    stages = parse_answer("Tuesday 01 December\n" + json.dumps(answer), 0)
    assert stages == {"mpi": StagePackages(("openmpi-bin",), ())}
    failed = {"plays": [{"tasks": [{"task": {"name": "Check the NCCL version"}, "hosts": {
        "localhost": {"failed": True, "msg": "localhost: nccl_install_method=tarball is bad"},
    }}]}]}  # fmt: skip
    with pytest.raises(BadInput, match="Check the NCCL version: localhost: nccl_install_method"):
        parse_answer(json.dumps(failed), 2)
    with pytest.raises(GpuenvError, match="gave no package lists"):
        parse_answer("ERROR! the playbook could not be read", 4)


def test_the_roles_must_name_real_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    def bad(*args: object) -> dict[str, StagePackages]:
        stages = recorded(*args)  # type: ignore[arg-type]
        stages["mpi"] = StagePackages(("openmpi-bin", "Bad Name"), ())
        return stages

    monkeypatch.setattr(plan_module, "ask_ansible", bad)
    with pytest.raises(GpuenvError, match="the mpi role named 'Bad Name'"):
        plan_bundle("debian-13")


def test_parse_closure_keeps_real_packages_only() -> None:
    out = (
        "openmpi-bin\n  Depends: libc6\n |Depends: <debconf-2.0>\n  Depends: debconf\n"
        "libc6\n  Depends: libgcc-s1\n<debconf-2.0>\ndebconf\nlibc6\n"
    )
    assert repo.parse_closure(out) == ["debconf", "libc6", "openmpi-bin"]
    assert repo.closure_argv(["a"])[:3] == ["apt-cache", "depends", "--recurse"]
    assert "--no-recommends" in repo.closure_argv(["a"])


def test_release_lists_every_index_with_its_hashes_and_size() -> None:
    packages = b"Package: x\nVersion: 1\n\n"
    index = {"Packages": packages, "Packages.gz": repo.gzip_bytes(packages)}
    text = repo.release_text(index, repo.Suite("bookworm"), datetime(2026, 12, 1, 10, tzinfo=UTC))
    assert "Date: Tue, 01 Dec 2026 10:00:00 UTC" in text
    assert "Codename: bookworm" in text and "Architectures: amd64 all" in text
    sha = hashlib.sha256(packages).hexdigest()
    assert f" {sha} {len(packages):>16} Packages\n" in text
    for field in ("MD5Sum:", "SHA256:", "SHA512:"):
        assert text.count(field) == 1
    assert gzip.decompress(index["Packages.gz"]) == packages
    # Reproducible: the same content gives the same gzip bytes (no time stamp inside).
    assert repo.gzip_bytes(packages) == index["Packages.gz"]


def test_signing_commands_use_the_throwaway_keyring() -> None:
    inrelease, detached = repo.sign_argvs("/bundle/apt/Release")
    assert inrelease[-4:] == [
        "--clearsign",
        "--output",
        "/bundle/apt/InRelease",
        "/bundle/apt/Release",
    ]
    assert "--detach-sign" in detached and detached[-1] == "/bundle/apt/Release"
    assert detached[detached.index("--output") + 1] == "/bundle/apt/Release.gpg"
    for argv in (*repo.sign_argvs("/r/Release"), repo.keygen_argv(), repo.export_key_argv("/k")):
        assert argv[argv.index("--homedir") + 1] == repo.GNUPGHOME
    assert repo.keygen_argv()[-3:] == ["ed25519", "sign", "never"]
    colons = f"sec:u:255:22:AAAA:1:::u:::scESC:::+:::ed25519:::0:\nfpr:::::::::{FPR}:\n"
    assert repo.parse_fingerprint(colons) == FPR
    with pytest.raises(ValueError):
        repo.parse_fingerprint("pub:u:255\n")


class FakeContainer:
    """Stands for the build container: answers commands and writes what apt/pip would."""

    def __init__(self, output: Path, fail_on: str = "", unknown: str = "") -> None:
        self.output = output
        self.fail_on = fail_on
        self.unknown = unknown  # a package the archive does not have
        self.calls: list[tuple[list[str], str]] = []

    def run(self, argv: Sequence[str], *, cwd: str = "/") -> str:
        argv = list(argv)
        self.calls.append((argv, cwd))
        if self.fail_on and self.fail_on in argv:
            raise GpuenvError(f"{self.fail_on} failed")
        host = Path(str(self.output) + cwd[len(MOUNT) :]) if cwd.startswith(MOUNT) else None
        if argv[:2] == ["apt-cache", "depends"]:
            asked = [a for a in argv[2:] if not a.startswith("--") and a != self.unknown]
            return "".join(f"{a}\n  Depends: libc6\n" for a in asked) + "libc6\n<debconf-2.0>\n"
        if argv[:2] == ["apt-get", "download"]:
            assert host is not None
            for name in argv[3:]:
                (host / f"{name}_1_amd64.deb").write_bytes(b"x" * 10)
        if argv[:2] == ["apt-ftparchive", "packages"]:
            return "Package: libc6\n\nPackage: openmpi-bin\n\n"
        if "--list-secret-keys" in argv:
            return f"sec:u:255:22:AAAA:1:::u:::scESC:::+:::ed25519:::0:\nfpr:::::::::{FPR}:\n"
        if "--export" in argv:
            (self.output / repo.KEY_FILE).write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
        if argv[:2] == ["apt-get", "update"]:
            return "Get:1 file:/bundle/apt ./ InRelease [1 kB]\n"
        if len(argv) > 1 and argv[1] == "wheel":
            (self.output / "wheels" / "numpy-2.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"w")
        if argv[0] == "sh" and argv[1].endswith("build-openmpi-cuda.sh"):
            pool = Path(str(self.output) + argv[8][len(MOUNT) :])
            (pool / f"{argv[6]}_{argv[7]}_amd64.deb").write_bytes(b"built")
        if argv[:3] == ["dpkg-deb", "-f", argv[2]] and argv[-1] == "Depends":
            return "libc6 (>= 2.34), libhwloc15, libevent-core-2.1-7 | libevent-2.1-7\n"
        if "download" in argv and "--no-binary" in argv:
            (self.output / "wheels" / "mpi4py-4.1.2.tar.gz").write_bytes(b"s")
        return ""


def test_build_writes_a_signed_repository_wheels_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    plan = plan_bundle("debian-12", driver_mode="userspace", gpu_wheels=False, with_gpuenv=False)
    fake = FakeContainer(out)
    when = datetime(2026, 12, 1, tzinfo=UTC)
    manifest = build_bundle(plan, out, fake, Recorder(), now=when, find_links=True)

    pool = sorted(p.name for p in (out / "apt" / "pool").iterdir())
    assert pool == sorted(f"{n}_1_amd64.deb" for n in {*plan.debs, "libc6"})
    release = (out / "apt" / "Release").read_text()
    assert hashlib.sha256((out / "apt" / "Packages").read_bytes()).hexdigest() in release
    assert manifest.key_fingerprint == FPR and manifest.deb_bytes == 10 * len(pool)
    data = json.loads((out / "bundle.json").read_text())
    assert data["kind"] == "gpuenv.bundle" and data["pins"] == "debian-12"
    assert data["wheels"] == ["numpy-2.0-cp311-cp311-linux_x86_64.whl"]
    argvs = [argv for argv, _ in fake.calls]
    # The container downloads from the archive the roles enable (contrib, non-free).
    sources = next(a for a in argvs if a[0] == "sh" and a[3].endswith("build.sources"))
    assert "Components: main contrib non-free non-free-firmware" in sources[4]
    assert "Suites: bookworm bookworm-updates" in sources[4]
    # The key is made before signing, and signing comes after the Release file exists.
    keygen = argvs.index(repo.keygen_argv())
    assert argvs.index(repo.sign_argvs(f"{MOUNT}/apt/Release")[0]) > keygen
    wheel = next(a for a in argvs if len(a) > 1 and a[1] == "wheel")
    assert wheel[wheel.index("--find-links") + 1] == "/find-links"
    # apt is checked with the bundle as its only source and no installed state to lean on.
    simulate = next(a for a in argvs if "--simulate" in a)
    assert "Dir::State::status=/dev/null" in simulate
    assert set(plan.debs) <= set(simulate)
    update = next(a for a in argvs if a[:2] == ["apt-get", "update"] and "-o" in a)
    assert any(o.startswith("Dir::Etc::SourceParts=") for o in update)


def test_build_stops_when_a_step_fails(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    plan = plan_bundle("debian-13", with_gpuenv=False)
    with pytest.raises(GpuenvError, match="--clearsign failed"):
        build_bundle(plan, out, FakeContainer(out, fail_on="--clearsign"), Recorder())
    assert not (out / "bundle.json").exists()


def test_build_stops_when_the_archive_lacks_a_package(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    plan = plan_bundle("debian-13", with_gpuenv=False)
    fake = FakeContainer(out, unknown="libnccl2")
    with pytest.raises(GpuenvError, match=r"not in the trixie archive .*: libnccl2"):
        build_bundle(plan, out, fake, Recorder())
    assert not any(a[:2] == ["apt-get", "download"] for a, _ in fake.calls)


def test_output_must_be_new_or_empty_with_an_existing_parent(tmp_path: Path) -> None:
    assert validate_output(tmp_path / "new") == (tmp_path / "new").resolve()
    with pytest.raises(BadInput, match=r"parent .* does not exist"):
        validate_output(tmp_path / "missing" / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(BadInput, match="exists and is not an empty folder"):
        validate_output(tmp_path / "full")


def test_cli_bad_input_exits_2_before_docker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bundle", "--pins", "debian-99", "-o", str(tmp_path / "b")]) == 2
    assert "unknown pins 'debian-99'" in capsys.readouterr().err
    assert main(["bundle", "--pins", "debian-13", "-o", str(tmp_path / "x" / "b")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cli_plan_prints_json_without_docker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bundle", "--pins", "debian-13", "-o", str(tmp_path / "b"), "--plan"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["codename"] == "trixie" and "libnccl2" in plan["debs"]
    assert not (tmp_path / "b").exists()


def test_find_links_must_be_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bundle", "--pins", "debian-12", "-o", str(tmp_path / "b")]
    assert main([*args, "--find-links", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_ubuntu_needs_an_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "--pins", "ubuntu-22.04", "-o", str(tmp_path / "b")]) == 2
    assert "give --image" in capsys.readouterr().err


class _Exec:
    """A docker container's exec_run: records the argv, answers with an exit status."""

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.argv: list[str] = []

    def exec_run(self, argv: list[str], **_: object) -> SimpleNamespace:
        self.argv = argv
        return SimpleNamespace(exit_code=self.exit_code, output=(b"", b"E: stalled"))


def test_a_build_step_runs_under_a_deadline_and_a_stalled_one_is_named() -> None:
    from gpuenv.bundle import container

    ok = _Exec(0)
    container.DockerExecutor(ok).run(["apt-get", "update"])  # type: ignore[arg-type]
    assert ok.argv == [
        "timeout",
        f"--kill-after={container.STEP_KILL_AFTER_S}",
        str(container.STEP_DEADLINE_S),
        "apt-get",
        "update",
    ]
    for code in (124, 137):
        with pytest.raises(GpuenvError, match=r"did not finish within 3600 s .*process group"):
            container.DockerExecutor(_Exec(code)).run(["apt-get", "update"])  # type: ignore[arg-type]
    with pytest.raises(GpuenvError, match=r"failed in the build container \(exit 100\)"):
        container.DockerExecutor(_Exec(100)).run(["apt-get", "update"])  # type: ignore[arg-type]


@pytest.mark.parametrize("req", ["torch===", "torch==", "", "torch==2.13.0 ; sys_platform", "==2"])
def test_a_torch_or_wheel_that_is_not_a_pip_requirement_is_bad_input(req, capsys):
    """gpuenv bundle --torch/--wheel: an operator without a version (torch===) is named, exit 2."""
    pins = str(Path(__file__).resolve().parents[2] / "inventory/pins/debian-12.yml")
    for option in ("--torch", "--wheel"):
        with pytest.raises(SystemExit) as exc:
            main(["bundle", "--plan", option, req, "--pins", pins, "-o", "/tmp/gpuenv-bx"])
        assert exc.value.code == 2
        assert f"{req!r} is not a pip requirement" in capsys.readouterr().err


@pytest.mark.parametrize("req", ["torch==2.13.0", "torch>=2,<3", "cupy-cuda12x[all]>=13", "rich"])
def test_pip_requirements_are_taken(req):
    from gpuenv.cli.argtypes import requirement

    assert requirement(req) == req


def test_a_gpu_bundle_builds_and_carries_the_cuda_aware_open_mpi(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    plan = plan_bundle("debian-12", with_gpuenv=False)
    (build,) = plan.builds
    assert build["package"] == "gpuenv-openmpi-cuda" and build["role"] == "mpi"
    assert build["url"].endswith("/pool/main/o/openmpi/openmpi_4.1.4.orig.tar.xz")
    assert build["file"] == f"gpuenv-openmpi-cuda_{build['version']}_amd64.deb"
    assert {"cython", "setuptools", "build"} <= set(plan.wheels)
    fake = FakeContainer(out)
    manifest = build_bundle(plan, out, fake, Recorder())
    # Built into the signed repository from a checked source, its dependencies in the closure.
    assert manifest.built == [build["file"]] and build["file"] in manifest.debs
    assert FETCHED[-1] == (build["url"], build["sha256"])
    argvs = [argv for argv, _ in fake.calls]
    closure = next(a for a in argvs if a[:2] == ["apt-cache", "depends"])
    assert {"libhwloc15", "libevent-core-2.1-7"} <= set(closure)
    script = next(a for a in argvs if a[0] == "sh" and a[1].endswith("build-openmpi-cuda.sh"))
    assert script[3] == build["sha256"] and script[5] == "/opt/gpuenv/openmpi"
    assert argvs.index(script) < argvs.index(repo.keygen_argv())
    simulate = next(a for a in argvs if "--simulate" in a)
    assert build["package"] in simulate
    # mpi4py's source, which GPU nodes build against it.
    assert "mpi4py-4.1.2.tar.gz" in manifest.wheels


def test_a_cpu_bundle_builds_nothing() -> None:
    plan = plan_bundle("debian-12", driver_mode="userspace", gpu_wheels=False)
    assert plan.builds == () and "cython" not in plan.wheels


def test_depends_names_drop_versions_and_alternatives() -> None:
    got = build_module.depends_names("libc6 (>= 2.34), libhwloc15, libevent-core-2.1-7 | libx\n")
    assert got == ("libc6", "libhwloc15", "libevent-core-2.1-7")


def test_a_source_that_does_not_match_its_checksum_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()
    src = tmp_path / "openmpi.tar.xz"
    src.write_bytes(b"tampered")
    with pytest.raises(GpuenvError, match=r"sha256 .* expected 00"):
        build_module.fetch_source(src.as_uri(), "00" * 32, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())
    good = hashlib.sha256(b"tampered").hexdigest()
    kept = build_module.fetch_source(src.as_uri(), good, tmp_path / "out")
    assert kept.read_bytes() == b"tampered"
