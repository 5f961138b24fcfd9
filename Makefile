# Two entry points for a fresh machine (see README):
#   make run   - set everything up, then serve the embedded default model (OpenAI API)
#   make test  - set everything up, then run the whole test suite
PY := .venv/bin/python
STAMP := .venv/.tightfit-installed

.PHONY: setup run chat test bench clean

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
