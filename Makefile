.PHONY: install test test-fast quality format main-job

install:            ## .venv with the CPU build of torch and hfzoo[dev]
	bash scripts/install.sh dev

test:               ## the whole suite, as CI runs it
	bash scripts/test.sh

test-fast:          ## skip the slow real-data end-to-end runs
	. .venv/bin/activate && pytest -q -m "not slow" tests

quality:            ## lint + format check (docstring rules are enforced for hfzoo/)
	. .venv/bin/activate && ruff check . && ruff format --check .

format:
	. .venv/bin/activate && ruff format . && ruff check --fix .

main-job:           ## README command 1: tokenizer + pretraining + evaluation on real data
	bash recipes/gutenberg_decoder.sh
