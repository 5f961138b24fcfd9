# Two entry points for a fresh machine (see README):
#   make run   - set everything up, then serve the embedded default model (OpenAI API)
#   make test  - set everything up, then run the whole test suite
PY := .venv/bin/python
STAMP := .venv/.tightfit-installed

.PHONY: setup run chat test bench clean llamacpp

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

run: setup
	.venv/bin/tightfit serve

test: setup
	$(PY) -m pytest -q

bench: setup
	.venv/bin/tightfit bench

clean:
	rm -rf .venv build *.egg-info

chat: setup
	.venv/bin/tightfit chat

# Optional benchmark baseline: llama.cpp's llama-bench, llama-server and llama-cpp-python,
# built once from the same sources (~20 min on 2 cores). Then: .venv/bin/tightfit bench --vs llamacpp
llamacpp: setup
	bash scripts/build-llama-cpp.sh
