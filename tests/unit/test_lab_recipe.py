import io
import tarfile

import pytest

from gpuenv.errors import BadInput
from gpuenv.lab import recipe, settings

CERT_A = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
CERT_B = b"-----BEGIN CERTIFICATE-----\r\nBBBB\r\n-----END CERTIFICATE-----\r\n"


def _node(certs, distro="trixie"):
    base = recipe.base_recipe(distro)
    return recipe.node_recipe(f"gpuenv/base:{distro}", base, certs)


def test_ca_bundle_is_split_into_one_certificate_a_file():
    certs = recipe.split_ca_bundle(b"junk\n" + CERT_A + b"# comment\n" + CERT_B, "b.pem")
    assert len(certs) == 2
    assert b"\r" not in certs[1]
    files = {f.path for f in _node(certs).files}
    assert "usr/local/share/ca-certificates/gpuenv/controller-001.crt" in files


def test_bundle_without_certificates_is_bad_input(tmp_path):
    empty = tmp_path / "empty.pem"
    empty.write_text("nothing here\n")
    with pytest.raises(BadInput, match="no PEM certificate"):
        recipe.read_ca_bundle(empty)
    with pytest.raises(BadInput, match="cannot read"):
        recipe.read_ca_bundle(tmp_path / "missing.pem")


def test_recipe_hash_is_stable_and_follows_every_input():
    assert _node([CERT_A]).digest() == _node([CERT_A]).digest()
    assert _node([CERT_A]).digest() != _node([CERT_A, CERT_B]).digest()
    assert _node([CERT_A]).digest() != _node([CERT_A], "bookworm").digest()
    assert recipe.base_recipe("trixie").digest() != recipe.base_recipe("bookworm").digest()
    changed = recipe.BaseRecipe("trixie", (*recipe.NODE_PACKAGES, "vim"))
    assert changed.digest() != recipe.base_recipe("trixie").digest()


def test_debootstrap_uses_minbase_and_the_debian_archive(tmp_path):
    argv = recipe.base_recipe("bookworm").debootstrap_argv(tmp_path / "root")
    assert argv[:2] == ["debootstrap", "--variant=minbase"]
    assert argv[-3:] == ["bookworm", str(tmp_path / "root"), "http://deb.debian.org/debian"]
    included = argv[2].removeprefix("--include=").split(",")
    for package in ("systemd", "systemd-sysv", "openssh-server", "python3", "python3-apt", "sudo"):
        assert package in included


def test_build_context_holds_dockerfile_and_files_with_modes():
    layer = _node([CERT_A])
    with tarfile.open(fileobj=io.BytesIO(layer.context())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert dockerfile.startswith("FROM gpuenv/base:trixie\n")
    assert members["rootfs/usr/local/lib/gpuenv/apt-proxy-detect"].mode == 0o755
    assert members["rootfs/etc/sudoers.d/admin"].mode == 0o440
    # Same recipe, same bytes: docker can reuse its build cache.
    assert layer.context() == _node([CERT_A]).context()


def test_node_image_generates_host_keys_per_container_not_at_build():
    layer = _node([CERT_A])
    assert "rm -f /etc/ssh/ssh_host_*" in layer.dockerfile
    unit = next(f for f in layer.files if f.path.endswith("gpuenv-ssh-hostkeys.service"))
    text = unit.content.decode()
    assert "Before=ssh.service" in text
    assert "ExecStart=/usr/bin/ssh-keygen -A" in text


def test_apt_proxy_detection_falls_back_to_direct():
    layer = _node([CERT_A])
    detect = next(f for f in layer.files if f.path.endswith("apt-proxy-detect")).content.decode()
    assert "echo http://apt-cache:3142" in detect
    assert "echo DIRECT" in detect
    conf = next(f for f in layer.files if f.path == "etc/apt/apt.conf.d/01gpuenv-proxy")
    assert b"Acquire::http::Proxy-Auto-Detect" in conf.content


def test_cache_image_installs_apt_cacher_ng_and_serves_wheels():
    layer = recipe.cache_recipe("gpuenv/base:trixie", recipe.base_recipe("trixie"))
    assert "apt-cacher-ng" in layer.dockerfile
    entry = layer.files[0].content.decode()
    assert "http.server 8080" in entry
    assert "/srv/wheels" in entry


def test_base_is_debootstrapped_from_the_presets_debian_mirror(tmp_path):
    tuna = settings.debian_mirror("tuna")
    assert tuna == "https://mirrors.tuna.tsinghua.edu.cn/debian"
    base = recipe.base_recipe("bookworm", mirror=tuna)
    assert base.debootstrap_argv(tmp_path)[-1] == tuna
    # A different mirror is a different image: its apt sources name the mirror.
    assert base.digest() != recipe.base_recipe("bookworm").digest()
    assert recipe.base_recipe("bookworm").mirror == "http://deb.debian.org/debian"


def test_demo_script_refuses_an_unknown_preset_before_anything_runs():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        ["bash", str(root / "scripts/demo.sh")],
        env={"PATH": "/usr/bin:/bin", "GPUENV_MIRROR": "tsinghua"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2
    assert "GPUENV_MIRROR='tsinghua' is not a known mirror preset" in out.stderr
    assert "venv" not in out.stdout
    ok = subprocess.run(
        ["python3", str(root / "scripts/mirror.py"), "aliyun", "pip"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert ok.stdout.strip() == "https://mirrors.aliyun.com/pypi/simple/"


def test_lab_nodes_unpack_without_fsync_and_without_manuals():
    files = {f.path: f.content.decode() for f in _node([CERT_A]).files}
    dpkg = files["etc/dpkg/dpkg.cfg.d/gpuenv-lab"].splitlines()
    assert "force-unsafe-io" in dpkg
    assert "path-exclude=/usr/share/doc/*" in dpkg
    # Licences stay: only the copyright files are kept of /usr/share/doc.
    assert "path-include=/usr/share/doc/*/copyright" in dpkg
    assert dpkg.index("path-include=/usr/share/doc/*/copyright") > dpkg.index(
        "path-exclude=/usr/share/doc/*"
    )
    assert "path-exclude=/usr/share/man/*" in dpkg
    assert files["etc/apt/apt.conf.d/02gpuenv-lab"] == 'Acquire::Languages "none";\n'
    # Image settings, so the recipe (and the image) changes with them.
    assert recipe.LAB_DPKG_CFG.encode() in {f.content for f in _node([CERT_A]).files}


def test_the_cache_takes_over_a_volume_left_by_an_image_of_another_distribution():
    """apt-cacher-ng's uid differs between Debian 12 and 13 images; the cache volume outlives
    them: the entry point hands the volume's files to this image's apt-cacher-ng before it
    starts (seen: every index fetch failed with 'Cannot create cache files')."""
    from gpuenv.lab import recipe

    text = recipe._CACHE_ENTRYPOINT
    takeover = "find /var/cache/apt-cacher-ng ! -user apt-cacher-ng -exec chown -h"
    assert takeover in text
    assert text.index(takeover) < text.index("exec setpriv")
