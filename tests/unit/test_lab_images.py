"""Image caching by recipe hash, against a fake docker client."""

from types import SimpleNamespace
from unittest import mock

import pytest
from docker.errors import ImageNotFound

from gpuenv.errors import EnvironmentProblem
from gpuenv.lab import images, recipe
from gpuenv.lab.settings import Names
from gpuenv.progress import Silent

CERT = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


def _layer():
    return recipe.node_recipe("gpuenv/base:trixie", recipe.base_recipe("trixie"), [CERT])


def _client(label):
    client = mock.MagicMock()
    if label is None:
        client.images.get.side_effect = ImageNotFound("none")
    else:
        client.images.get.return_value = SimpleNamespace(
            id="sha256:old", labels={"gpuenv.recipe": label}
        )
    return client


def test_image_with_the_same_recipe_is_not_rebuilt():
    layer = _layer()
    client = _client(layer.digest())
    state = images.ensure_layer(client, Names(), "gpuenv/node:trixie", layer, Silent())
    assert not state.built
    client.api.build.assert_not_called()


def test_changed_recipe_rebuilds_with_the_new_label():
    layer = _layer()
    client = _client("0000000000000000")
    client.api.build.return_value = iter([{"stream": "Step 1/5 : FROM gpuenv/base:trixie\n"}])
    state = images.ensure_layer(client, Names(), "gpuenv/node:trixie", layer, Silent())
    assert state.built
    kwargs = client.api.build.call_args.kwargs
    assert kwargs["labels"]["gpuenv.recipe"] == layer.digest()
    assert kwargs["pull"] is False  # nothing comes from a registry


def test_build_error_is_reported_with_its_message():
    client = _client(None)
    client.api.build.return_value = iter([{"error": "apt-get failed\n"}])
    with pytest.raises(EnvironmentProblem, match="apt-get failed"):
        images.ensure_layer(client, Names(), "gpuenv/node:trixie", _layer(), Silent())


def test_base_needs_root_for_debootstrap(monkeypatch, tmp_path):
    monkeypatch.setattr(images.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(images.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    with pytest.raises(EnvironmentProblem, match="needs root"):
        images._base_tarball(recipe.base_recipe("trixie"), Names(), tmp_path, Silent(), "k")


def test_cached_tarball_skips_debootstrap(monkeypatch, tmp_path):
    base = recipe.base_recipe("bookworm")
    tarball = tmp_path / ".cache/lab" / f"gpuenv-base-bookworm-{base.digest()}.tar"
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"")
    monkeypatch.setattr(images.proc.subprocess, "Popen", mock.Mock(side_effect=AssertionError))
    assert images._base_tarball(base, Names(), tmp_path, Silent(), "k") == tarball


def test_a_base_build_that_hangs_with_its_output_open_is_killed(tmp_path):
    """debootstrap's deadline runs while it still prints, not after its output closes."""
    import sys
    import time

    from gpuenv.errors import EnvironmentProblem

    class Seen:
        def __init__(self):
            self.lines = []

        def begin(self, key, description):
            pass

        def update(self, key, detail):
            self.lines.append(detail)

        def end(self, key, detail="", status=None):
            pass

    seen = Seen()
    script = "import time\nprint('I: Retrieving Release', flush=True)\ntime.sleep(600)"
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem, match=r"did not finish within 1\.5 s"):
        images._run_logged([sys.executable, "-c", script], tmp_path / "log", seen, "k", 1.5)
    assert time.monotonic() - t0 < 1.5 + 5
    assert seen.lines == ["Retrieving Release"]
