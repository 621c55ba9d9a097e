"""GPUs are counted without initializing CUDA in this process (vLLM forks its engine core after `--engine auto`
has looked). No GPU here: the CUDA build is faked by patching torch's probes, and the one probe that initializes
CUDA (cudaGetDeviceCount, behind torch.cuda.is_available) fails the test if anything calls it."""

from __future__ import annotations

import pytest
import torch

from rstar2_agent import devices
from rstar2_agent.engines.spec import EngineSpec


@pytest.fixture
def fake_cuda_build(monkeypatch):
    """torch as a CUDA build with CUDA not yet initialized; NVML answers with `nvml[0]` devices."""
    def poisons_fork() -> int:
        raise AssertionError("cudaGetDeviceCount was called: it initializes CUDA in this process")

    nvml = [2]
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: nvml[0])
    monkeypatch.setattr(torch.cuda, "_device_count_amdsmi", lambda: nvml[0])
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", poisons_fork, raising=False)
    return nvml


def test_engine_auto_picks_vllm_on_gpus_without_initializing_cuda_fake_cuda_build(fake_cuda_build):
    assert devices.gpu_count() == 2
    assert EngineSpec(engine="auto").kind() == "vllm"
    fake_cuda_build[0] = 0
    assert EngineSpec(engine="auto").kind() == "hf"


def test_without_nvml_a_child_process_counts_the_gpus_fake_cuda_build(fake_cuda_build):
    fake_cuda_build[0] = -1  # NVML failed: the count comes from a fresh Python (the real one here: no GPU)
    assert devices.gpu_count() == 0


def test_a_cpu_build_has_no_gpus():
    if torch.cuda._is_compiled():
        pytest.skip("this torch is a CUDA build")
    assert devices.gpu_count() == 0 and devices.gpu_memory_bytes() == 0 and EngineSpec(engine="auto").kind() == "hf"
