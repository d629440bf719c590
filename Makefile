# The two commands of the README: `make run` and `make test`. Both set themselves up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= out
FASHION_DIR := /usr/share/datasets/fashion-mnist
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' trainer/__init__.py)
TAG ?= kfp-tf-multiworker:$(VERSION)
# The GPU image beside it: the pipelines' training tasks run REPO:TAG-gpu when they ask for GPUs (docs/gpus.md).
GPU_TAG ?= $(TAG)-gpu
EXAMPLE_TAG ?= kfp-tf-diagnosis-example:$(VERSION)
TFJOB_TAG ?= kfp-tf-tfjob-example:$(VERSION)
# The plain TensorFlow image pipelines/tfjob_example/Dockerfile builds on: empty for the local stand-in (Python and
# `pip install tensorflow==2.21.0`, .ci/containers/tensorflow/Dockerfile); TF_BASE=tensorflow/tensorflow:2.21.0 after
# a `docker pull` of it.
TF_BASE ?=
TF_STAND_IN := kfp-tf-ci/tensorflow-stand-in:2.21.0
# Its build context: the Dockerfile, train.py and this project's wheel, built from a copy of the sources (setuptools
# leaves build/ in the tree it builds) with fixed timestamps (the same sources give the same wheel: a warm build).
TFJOB_CONTEXT := $(OUT)/tfjob-example-image

.PHONY: run run-trainer test test-fast e2e compile fashion bench image image-gpu image-gpu-check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[pipeline,test]'
	touch $(STAMP)

$(FASHION_DIR):
	@if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else echo "error: $(FASHION_DIR) is missing; install Debian's dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist)"; exit 1; fi

## Run the whole pipeline locally (kfp.local) on the shipped sample: prepare -> 2 workers -> evaluate + serving
## check -> gate -> publish; TensorBoard event files under $(OUT)/tensorboard.
run: $(STAMP)
	$(PY) pipelines/mnist.py --local --num-workers 2 --output-dir $(OUT)/pipeline --publish-uri $(OUT)/published \
		--tensorboard-dir $(OUT)/tensorboard

## The trainer alone, without kfp: prepare the sample, 2 workers through the launcher, evaluate.
run-trainer: $(STAMP)
	$(PY) -m trainer.prepare --source sample --output $(OUT)/data/mnist-sample
	$(PY) -m trainer.launch --workers 2 -- --data $(OUT)/data/mnist-sample --model-dir $(OUT)/model --epochs 12
	$(PY) -m trainer.evaluate --model-dir $(OUT)/model --data $(OUT)/data/mnist-sample --output $(OUT)/metrics.json
	@echo "model: $(OUT)/model  metrics: $(OUT)/metrics.json"

## ruff, then the suite in one run on two pytest-xdist processes, by files, the longest files first
## (tests/support/schedule.py; refresh the record with ARGS=--record-durations=tests/durations.json). Two tiers, the
## tests that time peers, restarts, start-ups or kills after the rest, took 10% longer: each tier ended on one
## process while the other was idle.
test: $(STAMP) $(FASHION_DIR)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not image and not e2e and not gpu_image" \
		--durations=15 $(ARGS)

## The fast tier: everything but multi-process training (marked slow), the image and the containers (about two
## minutes), one file per pytest-xdist worker on 2 processes.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not image and not e2e and not gpu_image"

## The pipeline YAML for a cluster: make compile IMAGE=registry.example.com/team/kfp-tf-multiworker:0.1.0
compile: $(STAMP)
	$(PY) pipelines/mnist.py --compile $(if $(IMAGE),--image $(IMAGE)) --output $(OUT)/mnist_pipeline.yaml

## Full Fashion-MNIST from Debian's package, 2 workers, 5 epochs (a few minutes on 2 cores).
fashion: $(STAMP) $(FASHION_DIR)
	$(PY) -m trainer.prepare --source idx:$(FASHION_DIR) --output $(OUT)/data/fashion \
		--class-names "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
	/usr/bin/time -f "training wall time %es" $(PY) -m trainer.launch --workers 2 -- --data $(OUT)/data/fashion --model-dir $(OUT)/fashion-model --epochs 5
	$(PY) -m trainer.evaluate --model-dir $(OUT)/fashion-model --data $(OUT)/data/fashion --output $(OUT)/fashion-metrics.json

## Benchmarks (docs/benchmarks.md); `make bench ARGS=--quick` for the 3-minute version.
bench: $(STAMP) $(FASHION_DIR)
	$(PY) bench/run.py $(ARGS)

## The image, then the whole pipeline in containers of it in Kubernetes mode (root, or a running Docker Engine). The
## CI tooling in .ci/containers builds it where `make image` cannot run as it is: it starts a Docker Engine as root
## when none answers and builds on a local stand-in base when Docker Hub is out of reach. Besides the tabular example's
## image (FROM ours) it builds the worked TFJob example's image the way a user without our image would: a plain
## TensorFlow image, this project's wheel with its `task` extra and train.py (pipelines/tfjob_example/Dockerfile).
e2e: $(STAMP)
	$(PYTHON) .ci/containers/build.py build --tag $(TAG)
	$(PYTHON) .ci/containers/build.py build --tag $(EXAMPLE_TAG) --dockerfile pipelines/tabular_example/Dockerfile --base $(TAG)
	$(if $(TF_BASE),,$(PYTHON) .ci/containers/build.py build --tag $(TF_STAND_IN) --dockerfile .ci/containers/tensorflow/Dockerfile)
	rm -rf $(TFJOB_CONTEXT) && mkdir -p $(TFJOB_CONTEXT)
	cp pipelines/tfjob_example/Dockerfile pipelines/tfjob_example/train.py $(TFJOB_CONTEXT)/
	mkdir $(TFJOB_CONTEXT)/src && cp -r pyproject.toml setup.cfg README.md trainer components pipelines $(TFJOB_CONTEXT)/src/
	SOURCE_DATE_EPOCH=315532800 $(PY) -m pip wheel --quiet --no-deps --wheel-dir $(TFJOB_CONTEXT) $(TFJOB_CONTEXT)/src \
		&& rm -rf $(TFJOB_CONTEXT)/src
	$(PYTHON) .ci/containers/build.py build --tag $(TFJOB_TAG) --dockerfile $(TFJOB_CONTEXT)/Dockerfile \
		--base $(or $(TF_BASE),$(TF_STAND_IN))
	KFP_TF_IMAGE=$(TAG) KFP_TF_EXAMPLE_IMAGE=$(EXAMPLE_TAG) KFP_TF_TFJOB_IMAGE=$(TFJOB_TAG) \
		$(PY) -m pytest -m "image or e2e" tests/test_image.py tests/test_e2e.py

## The one image: `docker build` of the Dockerfile with BuildKit; TAG=... names it, BASE=... the Python image to build on.
image:
	DOCKER_BUILDKIT=1 docker build $(if $(BASE),--build-arg BASE=$(BASE)) --tag $(TAG) .

## The GPU image: the same Dockerfile with tensorflow[and-cuda] (requirements/gpu); tagged $(TAG)-gpu unless GPU_TAG=...
image-gpu:
	DOCKER_BUILDKIT=1 docker build $(if $(BASE),--build-arg BASE=$(BASE)) --build-arg REQUIREMENTS=requirements/gpu \
		--tag $(GPU_TAG) .

## Both images built as `make e2e` builds them (4 GB of wheels on a cold cache; CI does not run this), then
## the GPU image's checks: TensorFlow with CUDA imports, lists no GPU on a machine without one, and the sample trains
## on CPU in it to the CPU image's accuracy; then the CPU image's checks that nothing of the build host is inside.
image-gpu-check: $(STAMP)
	$(PYTHON) .ci/containers/build.py build --tag $(TAG)
	$(PYTHON) .ci/containers/build.py build --tag $(GPU_TAG) --build-arg REQUIREMENTS=requirements/gpu
	KFP_TF_IMAGE=$(TAG) KFP_TF_GPU_IMAGE=$(GPU_TAG) $(PY) -m pytest -m gpu_image tests/test_gpu_image.py
	KFP_TF_IMAGE=$(GPU_TAG) $(PY) -m pytest -m image tests/test_image.py -k "uid or environment or history or filesystem"

clean:
	rm -rf $(OUT) .pytest_cache
