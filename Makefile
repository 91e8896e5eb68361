# The two commands a newcomer needs: `make demo` (the main job on a local lab) and `make test`.
.PHONY: demo test lint unit clean

demo:
	scripts/demo.sh

test:
	scripts/test.sh

lint:
	GPUENV_TEST_STEPS="ruff ruff-format yamllint ansible-lint syntax" scripts/test.sh

unit:
	GPUENV_TEST_STEPS="unit integration" scripts/test.sh

clean:
	rm -rf .venv .cache
