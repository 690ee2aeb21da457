"""How `make test-image` turns the host's pip settings into `make image` arguments (no podman needed)."""

from __future__ import annotations

from pathlib import Path

from tests.image import host

TORCH = "2.13.0"
WHEEL = f"torch-{TORCH}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_pip_settings_take_the_environment_over_the_files() -> None:
    listed = """\
:env:.cert='/env/ca.crt'
:env:.find-links='/opt/wheels'
global.cert='/global/ca.crt'
global.extra-index-url='file:///opt/pypi/simple https://mirror.example/simple'
global.find-links='/global/wheels'
user.index-url='https://pypi.example/simple'
"""
    settings = host.PipSettings.parse(listed)
    assert settings.cert == "/env/ca.crt" and settings.find_links == ("/opt/wheels",)
    assert settings.index_url == "https://pypi.example/simple"
    assert settings.extra_index_urls == ("file:///opt/pypi/simple", "https://mirror.example/simple")
    assert host.PipSettings.parse("") == host.PipSettings()


def test_torch_comes_from_the_find_links_folder_that_has_its_cpu_wheel(tmp_path: Path) -> None:
    empty, other, wheels = tmp_path / "empty", tmp_path / "other", tmp_path / "wheels"
    for folder in (empty, other, wheels):
        folder.mkdir()
    (other / f"torch-{TORCH}-cp311-cp311-manylinux_2_28_x86_64.whl").touch()  # the CUDA build: not this one
    (wheels / WHEEL).touch()
    links = (str(tmp_path / "missing"), str(empty), str(other), f"file://{wheels}")
    assert host.torch_wheels_dir(host.PipSettings(find_links=links), TORCH) == str(wheels)
    assert host.torch_wheels_dir(host.PipSettings(find_links=links[:3]), TORCH) is None
    assert host.torch_wheels_dir(host.PipSettings(find_links=links), "2.14.0") is None


def test_make_image_gets_the_ca_bundle_the_wheel_and_a_reachable_index(tmp_path: Path) -> None:
    (tmp_path / WHEEL).touch()
    cert = tmp_path / "ca.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = host.PipSettings(index_url="https://pypi.example/simple", find_links=(str(tmp_path),), cert=str(cert))
    make_vars = host.image_make_vars(settings, TORCH, ("--network", "host"))
    assert make_vars == {
        "DEVICE": "cpu",
        "PIP_CERT": str(cert),
        "TORCH_WHEELS": str(tmp_path),
        "IMAGE_BUILD_FLAGS": "--network host --build-arg PIP_INDEX_URL=https://pypi.example/simple",
    }
    # a file:// index and a missing CA bundle are this machine's: the build cannot use them
    local = host.PipSettings(index_url="file:///opt/pypi/simple", cert=str(tmp_path / "missing.crt"))
    assert host.image_make_vars(local, TORCH, ()) == {"DEVICE": "cpu", "IMAGE_BUILD_FLAGS": ""}
    # the CUDA image's torch is the index's CUDA build: never the CPU wheel of a find-links folder
    cuda = host.image_make_vars(settings, TORCH, (), device="cuda")
    assert cuda["DEVICE"] == "cuda" and "TORCH_WHEELS" not in cuda and cuda["PIP_CERT"] == str(cert)


def test_the_base_is_the_dockerfiles_default() -> None:
    base = host.dockerfile_base()
    assert base.startswith("python:3.11") and base.endswith("-bookworm")
    assert host.make_command("image", {"DOCKER": "podman"})[-2:] == ["image", "DOCKER=podman"]
