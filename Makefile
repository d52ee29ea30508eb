.PHONY: install test test-lowest test-fast quality format main-job

install:            ## .venv with the CPU build of torch and hfzoo[dev] at the tested versions
	bash scripts/install.sh dev

test:               ## the whole suite with the newest versions, as CI runs it
	bash scripts/test.sh

test-lowest:        ## the compatibility subset with the lowest versions (.venv-lowest), as CI runs it
	bash scripts/test_lowest.sh

test-fast:          ## skip the slow real-data end-to-end runs
	. .venv/bin/activate && pytest -q -m "not slow" tests

quality:            ## lint + format check (docstring rules are enforced for hfzoo/)
	. .venv/bin/activate && ruff check . && ruff format --check .

format:
	. .venv/bin/activate && ruff format . && ruff check --fix .

main-job:           ## README command 1: tokenizer + pretraining + evaluation on real data
	bash recipes/gutenberg_decoder.sh
