# The two set-up commands:
#   make demo   create the environment, train PolaFormer++-b0 briefly on the
#               generated ImageNet-format demo set (CPU), evaluate, print top-1
#   make test   create the environment, lint, and run the whole test suite
VENV ?= .venv
PYTHON := $(VENV)/bin/python
export PYTHON

DEMO_CONFIG := configs/classification/polapp-b0_1xb32-30e_demo-shapes.py
DEMO_DATA ?= data/demo_in1k
DEMO_WORK_DIR ?= work_dirs/demo

.PHONY: env demo lint test test-fast

env:
	bash tools/setup_env.sh

demo: env
	$(PYTHON) tools/misc/make_demo_data.py $(DEMO_DATA)
	$(PYTHON) tools/train.py $(DEMO_CONFIG) --work-dir $(DEMO_WORK_DIR) \
		--cfg-options data_root=$(DEMO_DATA) train_dataloader.dataset.data_root=$(DEMO_DATA) \
		val_dataloader.dataset.data_root=$(DEMO_DATA) test_dataloader.dataset.data_root=$(DEMO_DATA)
	$(PYTHON) tools/test.py $(DEMO_CONFIG) "$$(cat $(DEMO_WORK_DIR)/last_checkpoint)" \
		--work-dir $(DEMO_WORK_DIR) --out-json $(DEMO_WORK_DIR)/test_metrics.json \
		--cfg-options test_dataloader.dataset.data_root=$(DEMO_DATA)
	@$(PYTHON) -c "import json; m = json.load(open('$(DEMO_WORK_DIR)/test_metrics.json')); \
		print('PolaFormer++-b0 demo: top-1 = %.2f%% (chance 25%%)' % m['accuracy/top1'])"

# flake8 + isort rules through ruff (settings in ruff.toml); a few seconds.
lint: env
	$(PYTHON) -m ruff check .

# Lint, then the whole suite, end-to-end ('slow') runs included: what CI runs.
# pytest-xdist runs it on TEST_WORKERS processes (default: one per core that
# nproc reports, at most 4), one intra-op thread each, handing out one test at a
# time, end-to-end runs first. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test: lint
	$(PYTHON) -m pytest tests -m "slow or not slow" -n $(TEST_WORKERS) --dist load --maxschedchunk 1

# Default fast suite.
test-fast: env
	$(PYTHON) -m pytest tests

# On a machine with a GPU (under 8 minutes): the CUDA tests, the attention
# benchmark against SDPA and an AMP training step triton vs torch, written to
# work_dirs/gpu_check/ (summary.md, CSV, PNG). Without CUDA it prints its plan.
.PHONY: gpu-check
gpu-check: env
	$(PYTHON) tools/analysis_tools/gpu_check.py --out-dir work_dirs/gpu_check
