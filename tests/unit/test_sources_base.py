"""The node's base apt sources pointed at a mirror and put back: the rules (the node floor's
plugins/module_utils/sources.py, read through plugins/filter/sources.py), held to the cloud-init
bootstrap's sed script rendered from them, and the sources_node module
(plugins/modules/sources_node.py) on files in a temporary folder."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gpuenv.floor import sources as floor

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "gpuenv" / "cloud" / "templates" / "bootstrap.sh"
# The module imports its deadline from module_utils as the collection gpuenv.cluster.
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


flt = SimpleNamespace(
    **_load("gpuenv_sources_filter_base", ROOT / "plugins" / "filter" / "sources.py")
    .FilterModule()
    .filters()
)
sn = _load("sources_node", ROOT / "plugins" / "modules" / "sources_node.py")

TUNA = "https://mirrors.tuna.tsinghua.edu.cn"
DEBIAN_LIST = """\
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
deb [arch=amd64] https://download.docker.com/linux/debian bookworm stable
"""
DEBIAN_SOURCES = """\
Types: deb
URIs: http://deb.debian.org/debian/
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.debian.org/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
UBUNTU_SOURCES = """\
Types: deb
URIs: http://us.archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse

Types: deb
URIs: http://security.ubuntu.com/ubuntu/
Suites: noble-security
Components: main restricted universe multiverse
"""


def rules(preset: str, family: str, mirror: str = "", security: str = "") -> list:
    return sn.compile_rules(flt.sources_apt_rules(preset, family, mirror, security))


# --- the rules -------------------------------------------------------------------------------


def test_the_official_archive_gives_no_rule_so_the_sources_stay_as_they_are():
    assert flt.sources_apt_rules("official", "debian") == []
    assert flt.sources_apt_rules("official", "ubuntu") == []
    assert flt.sources_apt_rules("tuna", "rocky") == []


def test_a_preset_points_the_archive_and_the_security_entries_at_its_roots():
    assert sn.repoint(DEBIAN_SOURCES, rules("tuna", "debian")) == DEBIAN_SOURCES.replace(
        "http://deb.debian.org/debian/", f"{TUNA}/debian/"
    ).replace("http://security.debian.org/debian-security", f"{TUNA}/debian-security")
    ubuntu = sn.repoint(UBUNTU_SOURCES, rules("ustc", "ubuntu"))
    assert "URIs: https://mirrors.ustc.edu.cn/ubuntu/\nSuites: noble noble-updates" in ubuntu
    assert "URIs: https://mirrors.ustc.edu.cn/ubuntu/\nSuites: noble-security" in ubuntu


def test_a_mirror_override_alone_leaves_the_official_security_archive():
    mine = sn.repoint(DEBIAN_LIST, rules("official", "debian", "http://apt.site/debian/"))
    assert mine.splitlines() == [
        "deb http://apt.site/debian bookworm main",
        # deb.debian.org/debian is a prefix of the security root: a rule stops where a root ends.
        "deb http://deb.debian.org/debian-security bookworm-security main",
        "deb [arch=amd64] https://download.docker.com/linux/debian bookworm stable",
    ]


@pytest.mark.skipif(not shutil.which("sed"), reason="no sed on this machine")
@pytest.mark.parametrize(
    ("family", "text", "mirror"),
    [
        ("debian", DEBIAN_LIST, ""),
        ("debian", DEBIAN_SOURCES, ""),
        ("ubuntu", UBUNTU_SOURCES, ""),
        ("debian", DEBIAN_LIST + "deb http://deb.debian.org/debian\n", "http://apt.site/debian/"),
        ("ubuntu", UBUNTU_SOURCES.replace("us.archive", "archive"), "http://apt.site/ubuntu"),
    ],
)
def test_push_mode_points_the_sources_where_the_cloud_bootstrap_does(family, text, mirror):
    # The bootstrap runs the floor's rules as sed_script renders them (gpuenv cloud-init).
    preset = "official" if mirror else "tuna"
    table = floor.apt_rules(preset, family, mirror)
    script = floor.sed_script(table)
    pulled = subprocess.run(
        ["sed", "-E", "-e", script], input=text, capture_output=True, text=True, check=True
    ).stdout
    assert pulled != text
    assert sn.repoint(text, rules(preset, family, mirror)) == pulled


def test_the_bootstrap_carries_no_rule_of_its_own():
    bootstrap = BOOTSTRAP.read_text()
    for family, rows in floor.UPSTREAM.items():
        for row in rows:
            assert row["url"] not in bootstrap, (family, row)
    assert "$GPUENV_APT_SED_DEBIAN" in bootstrap


def test_a_mirror_url_that_would_break_the_sed_script_is_refused():
    with pytest.raises(floor.SourcesError, match="plain archive URL"):
        floor.sed_script([{"match": "x", "url": "http://a/b#c"}])


# --- the module ------------------------------------------------------------------------------


class Failed(Exception):
    pass


class FakeModule:
    """Enough of AnsibleModule for run(): params, check and diff modes, a fake apt-get."""

    def __init__(self, params: dict[str, Any], check: bool = False, apt_rc: int = 0) -> None:
        defaults = {
            "absent": [],
            "keep": [],
            "apt_rules": [],
            "apt_sources": [],
            "apt_exclude": ["gpuenv-*", "nvidia-cuda.*"],
            "ca_dir": None,
            "ini_absent": None,
            "update_cache": True,
            "update_retries": 1,
            "update_delay": 0,
        }
        self.params = {**defaults, **params}
        self.check_mode = check
        self._diff = True
        self.apt_rc = apt_rc
        self.commands: list[list[str]] = []
        self.warnings: list[str] = []
        self.result: dict[str, Any] = {}

    def get_bin_path(self, name: str, required: bool = False) -> str:
        return "/usr/bin/" + name

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        self.commands.append(argv)
        if "apt-get" not in argv:
            return (0, "", "")
        if self.apt_rc == 124:  # coreutils' timeout stopped it: it says nothing
            return (124, "", "")
        if self.apt_rc:
            return (self.apt_rc, "", "E: Failed to fetch http://apt.site/debian/dists/x/InRelease")
        return (0, "Hit:1 http://apt.site/debian bookworm InRelease\n", "")

    def atomic_move(self, src: str, dest: str) -> None:
        # AnsibleModule's keeps an existing file's attributes; here only the content matters.
        os.replace(src, dest)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def exit_json(self, **result: Any) -> None:
        self.result = result

    def fail_json(self, **result: Any) -> None:
        self.result = result
        raise Failed(result["msg"])


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text(DEBIAN_LIST)
    (apt / "sources.list.d" / "debian.sources").write_text(DEBIAN_SOURCES)
    # The roles' own entries and a third party's: never touched.
    (apt / "sources.list.d" / "gpuenv-debian-nonfree.sources").write_text(DEBIAN_SOURCES)
    (apt / "sources.list.d" / "nvidia-cuda.sources").write_text(
        "URIs: http://deb.debian.org/debian\n"
    )
    (apt / "sources.list.d" / "docker.list").write_text(DEBIAN_LIST.splitlines()[2] + "\n")
    return tmp_path


def converge(etc: Path, preset: str, mirror: str = "", **kw: Any) -> FakeModule:
    apt = etc / "apt"
    module = FakeModule(
        {
            "apt_rules": flt.sources_apt_rules(preset, "debian", mirror) if preset else [],
            "apt_sources": [f"{apt}/sources.list", f"{apt}/sources.list.d/*.list",
                            f"{apt}/sources.list.d/*.sources"],
            "record": str(etc / "record" / "apt-base.json"),
        },
        **kw,
    )  # fmt: skip
    sn.run(module)
    return module


def test_repointed_recorded_updated_then_quiet_then_put_back(etc: Path):
    apt = etc / "apt"
    theirs = {
        p: p.read_text() for p in (apt / "sources.list.d").iterdir() if p.name != "debian.sources"
    }
    first = converge(etc, "tuna")
    assert first.result["changed"] and first.result["updated"]
    assert first.result["repointed"] == [
        f"{apt}/sources.list",
        f"{apt}/sources.list.d/debian.sources",
    ]
    assert first.commands == [
        ["/usr/bin/timeout", "-k", "5", "300", "apt-get", "-o", "DPkg::Lock::Timeout=120", "update"]
    ]
    assert f"deb {TUNA}/debian bookworm main" in (apt / "sources.list").read_text()
    assert (
        f"URIs: {TUNA}/debian-security" in (apt / "sources.list.d" / "debian.sources").read_text()
    )
    assert {p: p.read_text() for p in theirs} == theirs
    record = json.loads((etc / "record" / "apt-base.json").read_text())["files"]
    assert record[f"{apt}/sources.list"]["original"] == DEBIAN_LIST

    again = converge(etc, "tuna")
    assert (again.result["changed"], again.commands) == (False, [])

    # Another mirror: worked out from what the files held first, not from TUNA's lines.
    ustc = converge(etc, "ustc")
    assert ustc.result["changed"]
    assert "deb https://mirrors.ustc.edu.cn/debian bookworm" in (apt / "sources.list").read_text()

    off = converge(etc, "official")
    assert off.result["changed"] and off.result["updated"]
    assert (apt / "sources.list").read_text() == DEBIAN_LIST
    assert (apt / "sources.list.d" / "debian.sources").read_text() == DEBIAN_SOURCES
    assert not (etc / "record" / "apt-base.json").exists()
    assert converge(etc, "official").result["changed"] is False


def test_check_mode_reports_and_writes_nothing(etc: Path):
    check = converge(etc, "tuna", check=True)
    assert check.result["changed"] and check.result["repointed"]
    assert check.result["diff"] and check.commands == []
    assert (etc / "apt" / "sources.list").read_text() == DEBIAN_LIST
    assert not (etc / "record").exists()


def test_a_file_changed_since_is_left_as_it_is_with_a_warning(etc: Path):
    converge(etc, "tuna")
    listed = etc / "apt" / "sources.list"
    edited = listed.read_text() + "deb http://deb.debian.org/debian bookworm-backports main\n"
    listed.write_text(edited)
    off = converge(etc, "official")
    assert off.warnings and str(listed) in off.warnings[0]
    assert listed.read_text() == edited
    assert (etc / "apt" / "sources.list.d" / "debian.sources").read_text() == DEBIAN_SOURCES


def test_a_failed_update_puts_the_files_back_and_names_apts_error(etc: Path):
    with pytest.raises(Failed, match=r"apt-get update failed after pointing .*Failed to fetch"):
        converge(etc, "official", mirror="http://apt.site/debian", apt_rc=100)
    assert (etc / "apt" / "sources.list").read_text() == DEBIAN_LIST
    assert not (etc / "record").exists()


def test_an_update_past_its_deadline_puts_the_files_back_and_says_so(etc: Path):
    with pytest.raises(Failed, match=r"apt-get update failed after pointing .*within 300 s"):
        converge(etc, "official", mirror="http://apt.site/debian", apt_rc=124)
    assert (etc / "apt" / "sources.list").read_text() == DEBIAN_LIST


def test_removes_the_unwanted_files_but_keeps_the_wanted_ones(tmp_path: Path):
    ca = tmp_path / "ca"
    ca.mkdir()
    for name in ("site-000.crt", "site-001.crt", "other.crt"):
        (ca / name).write_text("x")
    proxy = tmp_path / "90gpuenv-proxy"
    proxy.write_text("x")
    module = FakeModule(
        {
            "absent": [str(proxy), str(tmp_path / "pip.conf"), f"{ca}/site-*.crt"],
            "keep": [str(ca / "site-000.crt")],
            "ca_dir": str(ca),
            "record": str(tmp_path / "record.json"),
        }
    )
    sn.run(module)
    assert module.result["removed"] == sorted([str(proxy), str(ca / "site-001.crt")])
    assert sorted(p.name for p in ca.iterdir()) == ["other.crt", "site-000.crt"]
    # The system bundle is rebuilt without the removed certificate, in the same module run.
    assert (
        module.commands == [["update-ca-certificates", "--fresh"]] and module.result["ca_rebuilt"]
    )
    sn.run(again := FakeModule(module.params))
    assert (again.result["changed"], again.commands) == (False, [])


def test_a_record_it_did_not_write_is_named(tmp_path: Path):
    record = tmp_path / "record.json"
    record.write_text("[1, 2]")
    with pytest.raises(Failed, match="is not a record this module wrote"):
        sn.run(FakeModule({"record": str(record)}))


def test_the_keys_an_older_site_cache_set_in_pip_conf_are_removed_the_rest_kept() -> None:
    text = (
        "# the lab's\n[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
        "find-links = http://cache:8080/wheels/\n    http://other/wheels/\ntrusted-host=cache\n"
        "no-index = true\n\n[install]\nno-index = kept\n"
    )
    assert floor.without_keys(text, "global", list(floor.STALE_PIP_KEYS)) == (
        "# the lab's\n[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n\n"
        "[install]\nno-index = kept\n"
    )
    clean = "[global]\ncert = x\n"
    assert floor.without_keys(clean, "global", ["find-links"]) == clean


def test_the_module_cleans_pip_conf_once_and_leaves_a_missing_file_missing(tmp_path: Path) -> None:
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\ncert = x\nfind-links = http://cache:8080/wheels/\n")
    ini = {"path": str(pip_conf), "section": "global", "keys": list(floor.STALE_PIP_KEYS)}
    params = {"record": str(tmp_path / "record.json"), "ini_absent": ini}
    first = _run(FakeModule(params))
    assert first["changed"] and first["ini_cleaned"]
    assert pip_conf.read_text() == "[global]\ncert = x\n"
    assert not _run(FakeModule(params))["changed"]
    missing = {**params, "ini_absent": {**ini, "path": str(tmp_path / "none.conf")}}
    assert not _run(FakeModule(missing))["changed"]
    assert not (tmp_path / "none.conf").exists()


def _run(module: FakeModule) -> dict[str, Any]:
    sn.run(module)
    return module.result
