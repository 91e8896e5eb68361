"""Against a running lab: the sources role on a real node (push mode, from this controller).

A proxy, a no-proxy host and a site CA bundle are configured, the files appear as documented and
the CA joins the system bundle; a second run changes nothing; without them the role removes what
it wrote. A mirror on the lab's network that refuses connections (another node's port 9) stops
the run naming its URL after the retries. The proxy is never used for a download here (no probe
goes through it), so nothing leaves the lab's network. With a preset, the node's base apt sources
are pointed at the mirror (the lab's apt cache stands in for it, as apt-cacher-ng serves
http://apt-cache:3142/deb.debian.org/debian, reached directly through gpuenv_no_proxy) and apt's
lists read from it; a second run and check
mode change nothing; gpuenv_apt_base_repoint false, and then the official preset again, put the
files back as they were.

Opt-in, because it needs docker and a running lab (a minute or two):

    GPUENV_LAB_PREFIX=gpuenv-hs gpuenv lab up --nodes 3 --distro bookworm --name hs
    GPUENV_SOURCES_LAB=hs python -m pytest -q tests/lab/test_sources_lab.py
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuenv.lab.cluster import ssh_argv

LAB = os.environ.get("GPUENV_SOURCES_LAB", "")
pytestmark = pytest.mark.skipif(not LAB, reason="opt-in: set GPUENV_SOURCES_LAB to a lab's name")
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventory" / f"lab-{LAB}" / "hosts.yml"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", re.M)
PROXY = "http://proxy.lab.invalid:3128"


def hosts():
    return yaml.safe_load(INVENTORY.read_text())["all"]["children"]["gpu_nodes"]["hosts"]


def node():
    return sorted(hosts())[0]


def on_node(command):
    argv = ssh_argv(ROOT, LAB, node(), ["sudo", "sh", "-c", shlex.quote(command)])
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def sources(extra, *options):
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/sources.yml"]
    argv += ["-i", str(INVENTORY), "-l", node(), "-e", json.dumps(extra), *options]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    recap = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in RECAP.finditer(done.stdout)}
    return done, recap.get(node(), (-1, -1))


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory):
    """A throwaway self-signed CA certificate (its key is deleted at once)."""
    work = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=gpuenv sources lab test CA", "-keyout", str(work / "key.pem"),
         "-out", str(work / "ca.pem")],
        capture_output=True, check=True,
    )  # fmt: skip
    (work / "key.pem").unlink()
    return work / "ca.pem"


def test_proxy_and_ca_are_written_then_removed(ca_bundle):
    wanted = {
        "gpuenv_http_proxy": PROXY,
        "gpuenv_https_proxy": PROXY,
        "gpuenv_no_proxy": "apt-cache,.lab.invalid",
        "gpuenv_ca_bundle": str(ca_bundle),
    }
    mine = ca_bundle.read_text().split("-----BEGIN CERTIFICATE-----")[1].split()[0]
    try:
        done, (changed, failed) = sources(wanted)
        assert (done.returncode, failed) == (0, 0), done.stdout[-3000:]
        assert changed > 0
        apt = on_node("cat /etc/apt/apt.conf.d/90gpuenv-sources").stdout
        assert f'Acquire::http::Proxy "{PROXY}";' in apt
        assert f'Acquire::https::Proxy "{PROXY}";' in apt
        # A plain host goes DIRECT; a domain suffix is beyond apt's settings.
        assert 'Acquire::http::Proxy::apt-cache "DIRECT";' in apt
        assert "Proxy::.lab.invalid" not in apt
        pip = on_node("cat /etc/xdg/pip/pip.conf").stdout
        assert f"proxy = {PROXY}" in pip and "cert = /etc/ssl/certs/ca-certificates.crt" in pip
        bundle = on_node("cat /etc/ssl/certs/ca-certificates.crt").stdout
        assert mine in bundle, "the site CA did not join the system bundle"
        again, (changed, failed) = sources(wanted)
        assert (again.returncode, changed, failed) == (0, 0, 0), again.stdout[-3000:]
    finally:
        gone, (_, failed) = sources({})
    assert (gone.returncode, failed) == (0, 0), gone.stdout[-3000:]
    left = on_node(
        "ls /etc/apt/apt.conf.d/90gpuenv-sources /etc/xdg/pip/pip.conf "
        "/usr/local/share/ca-certificates/gpuenv-site/*.crt 2>/dev/null; true"
    )
    assert left.stdout.strip() == ""
    assert mine not in on_node("cat /etc/ssl/certs/ca-certificates.crt").stdout


def test_a_mirror_that_refuses_connections_is_named_after_the_retries():
    other = hosts()[sorted(hosts())[1]]["ansible_host"]
    url = f"http://{other}:9/debian"
    done, (changed, failed) = sources({"gpuenv_apt_mirror": url, "sources_delay": 1})
    assert done.returncode != 0 and failed == 1
    flat = " ".join(done.stdout.split())
    assert f"these sources did not answer after 3 retries: {url}/dists/" in flat, flat[-2000:]
    assert "Connection refused" in flat
    assert changed == 0


# The lab's apt cache as the site's mirror: apt-cacher-ng serves an archive under /<host>/<path>.
CACHE = "http://apt-cache:3142/deb.debian.org"
SECURITY_SOURCES = """Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {release}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# A file named as the roles name theirs: never the sources role's to change.
ROLES_OWN = "deb http://deb.debian.org/debian {release}-updates main\n"
BASE_FILES = (
    "/etc/apt/sources.list",
    "/etc/apt/sources.list.d/lab-security.sources",
    "/etc/apt/sources.list.d/gpuenv-lab-test.list",
)


def test_a_preset_points_the_base_apt_sources_at_the_mirror_and_official_puts_them_back():
    release = (
        hosts()[node()].get("gpuenv_lab_distro")
        or on_node(". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    )
    security = SECURITY_SOURCES.format(release=release).replace("\n", "\\n")
    setup = on_node(
        f"printf '{security}' > {BASE_FILES[1]} && "
        f"printf '{ROLES_OWN.format(release=release)}' > {BASE_FILES[2]} && "
        f"md5sum {' '.join(BASE_FILES)}"
    )
    assert setup.returncode == 0, setup.stderr
    before = setup.stdout
    mirror = {
        "gpuenv_sources_preset": "tuna",
        "gpuenv_apt_mirror": f"{CACHE}/debian",
        "gpuenv_apt_security_mirror": f"{CACHE}/debian-security",
        # The cache as apt's proxy and, by name, reached directly as the mirror (apt-cacher-ng
        # refuses a proxied request for its own address: "confusing proxy mode").
        "gpuenv_apt_proxy": "http://apt-cache:3142",
        "gpuenv_no_proxy": "apt-cache",
        # Only the lab's own addresses: the preset's PyPI index is not probed from here.
        "sources_probe_urls": [f"{CACHE}/debian/dists/{release}/Release"],
    }
    try:
        done, (changed, failed) = sources(mirror)
        assert (done.returncode, failed) == (0, 0), done.stdout[-3000:]
        assert changed > 0
        listed = on_node(f"cat {' '.join(BASE_FILES)}").stdout
        assert f"deb {CACHE}/debian {release} main" in listed
        assert f"URIs: {CACHE}/debian-security" in listed
        assert ROLES_OWN.format(release=release) in listed
        # apt-get update ran in the same step: the lists come from the mirror now.
        lists = on_node("ls /var/lib/apt/lists").stdout
        assert f"apt-cache:3142_deb.debian.org_debian_dists_{release}_InRelease" in lists
        assert f"apt-cache:3142_deb.debian.org_debian-security_dists_{release}-security" in lists
        again, (changed, failed) = sources(mirror)
        assert (again.returncode, changed, failed) == (0, 0, 0), again.stdout[-3000:]
        check, (changed, failed) = sources(mirror, "--check")
        assert (check.returncode, changed, failed) == (0, 0, 0), check.stdout[-3000:]
        # A site that keeps its own base sources: what gpuenv changed there is put back.
        kept, (changed, failed) = sources({**mirror, "gpuenv_apt_base_repoint": False})
        assert (kept.returncode, failed) == (0, 0), kept.stdout[-3000:]
        assert changed > 0 and on_node(f"md5sum {' '.join(BASE_FILES)}").stdout == before
        again, (changed, failed) = sources(mirror)
        assert (again.returncode, failed) == (0, 0) and changed > 0, again.stdout[-3000:]
        off, (changed, failed) = sources({})
        assert (off.returncode, failed) == (0, 0), off.stdout[-3000:]
        assert changed > 0
        assert on_node(f"md5sum {' '.join(BASE_FILES)}").stdout == before
        assert on_node("ls /var/lib/gpuenv/sources 2>/dev/null; true").stdout.strip() == ""
        assert "apt-cache:3142_deb.debian.org" not in on_node("ls /var/lib/apt/lists").stdout
        quiet, (changed, failed) = sources({})
        assert (quiet.returncode, changed, failed) == (0, 0, 0), quiet.stdout[-3000:]
    finally:
        sources({})
        on_node(f"rm -f {BASE_FILES[1]} {BASE_FILES[2]} && apt-get update -qq")
