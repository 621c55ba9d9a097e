"""The sandbox works from wherever the Python environment lives: a venv under /tmp (hidden by the sandbox's own
/tmp unless bound elsewhere), a venv in a home folder, a `pip install --target` folder on PYTHONPATH. Each
environment is real: its own interpreter starts a real isolated pool, and numpy and sympy load from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGES = ("numpy", "numpy.libs", "sympy", "mpmath")
CODE = """
import os, numpy, sympy
print(numpy.__file__)
print(int(numpy.arange(10).sum()), sympy.factorint(360))
print(os.path.exists(SECRET))
"""
POOL = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from rstar2_agent.sandbox import LocalSandbox, SandboxConfig

async def main():
    sb = LocalSandbox(SandboxConfig(workers=1, templates=(("numpy", "sympy"),)))
    await sb.start()
    try:
        print(json.dumps((await sb.run(sys.argv[2])).to_dict()))
    finally:
        await sb.close()

asyncio.run(main())
"""


def _link_packages(dest: Path) -> None:
    """Hard links (a copy across filesystems) of this environment's numpy, sympy and mpmath into `dest`."""
    src = Path(sysconfig.get_path("purelib"))
    dest.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        if (src / name).exists():
            try:
                shutil.copytree(src / name, dest / name, copy_function=os.link)
            except OSError:
                shutil.rmtree(dest / name, ignore_errors=True)
                shutil.copytree(src / name, dest / name)


def _venv(where: Path, with_packages: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    if with_packages:
        _link_packages(Path(subprocess.check_output(
            [where / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            text=True).strip()))
    return where / "bin" / "python"


@pytest.fixture
def home_dir():
    d = Path.home() / ".cache" / "rstar2-test-envs" / uuid.uuid4().hex[:8]
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("layout", ["venv under /tmp", "venv in a home folder", "pip --target under /tmp"])
def test_numpy_and_sympy_load_from_the_environment_wherever_it_lives(layout, tmp_path, home_dir):
    base = home_dir if "home" in layout else tmp_path
    assert str(tmp_path).startswith("/tmp/"), "pytest's tmp_path is expected under /tmp"
    secret = base / "beside-the-env.txt"
    base.mkdir(parents=True, exist_ok=True)
    secret.write_text("the host's file")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if layout.startswith("pip --target"):
        python = _venv(base / "bare", with_packages=False)
        _link_packages(base / "target")
        env["PYTHONPATH"] = str(base / "target")
    else:
        python = _venv(base / "venv", with_packages=True)
    code = CODE.replace("SECRET", repr(str(secret)))
    p = subprocess.run([python, "-c", POOL, str(ROOT), code], capture_output=True, text=True, env=env,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok", result
    numpy_file, sums, seen_secret = result["stdout"].splitlines()
    assert sums == "45 {2: 3, 3: 2, 5: 1}"
    assert seen_secret == "False"  # only the environment's package folders are visible, not their neighbours
    if str(base).startswith("/tmp/"):
        assert numpy_file.startswith("/opt/rstar2/host/")  # bound outside the sandbox's private /tmp
    else:
        assert numpy_file.startswith(str(base))  # visible at its own path
