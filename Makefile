# Bootseer — the two commands of the README, and the benchmarks.
#   make demo   set up and run the main job end to end on the embedded local store
#   make test   set up everything (apt packages when root, Python packages) and run the suite
#   make test-fast  the unit tier only (tests/unit): no root, no apt, no services, < 1 minute
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-gpu lint system-deps venv clean bench-ckpt bench-ckpt-gpu bench-fuse bench-hdfs bench-blocksize \
	bench-image bench-image-cuda bench-env bench-env-cuda bench-restart bench-restart-env \
	bench-p2p-read

$(STAMP): pyproject.toml dev/pyproject.toml agents/bootseer-runtime  # the sh front is copied in
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	# torch pinned first: 2.13.0 is the CPU build on disk; an open range would pull CUDA
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,torch,report]'
	$(BIN)/pip install --quiet --no-deps -e dev  # bootseer_dev: the HDFS dev cluster, test images
	touch $@

# Byte-compiled as a wheel install is (pip compiles on install; an editable install does
# not, and where PYTHONDONTWRITEBYTECODE is set nothing ever writes the cache): every shim,
# hook, server and CLI start would otherwise compile Bootseer's modules again (a mount
# server's imports: 0.44 s against 0.29 s, measured). Up-to-date files are skipped.
venv: $(STAMP)
	$(BIN)/python -m compileall -q -j0 bootseer agents prefetch snapshot stripedfs dev/bootseer_dev

system-deps:
	@bash scripts/install-system-deps.sh

demo: system-deps venv
	bash scripts/demo.sh

# Every tier; the slowest tests and the seconds of every file close the output.
test: system-deps venv lint
	$(BIN)/python -m pytest --durations=25

test-fast: venv
	$(BIN)/python -m pytest tests/unit

# On a machine with a CUDA GPU and its own torch (see benchmarks/bench_ckpt_gpu.py): only
# the GPU test files are collected, since the other modules import what such a machine lacks.
test-gpu:
	PYTHONPATH=$(CURDIR):$(CURDIR)/dev:$(PYTHONPATH) python3 -m pytest -p no:cacheprovider -m gpu \
		$(wildcard tests/unit/*_gpu.py)

lint: venv
	$(BIN)/ruff check --no-cache .
	$(BIN)/lint-imports --no-logo --no-cache

# Benchmarks: real HDFS clusters with capped links; results in bench-results/<name>.json.
bench-hdfs: system-deps venv
	$(BIN)/python benchmarks/bench_hdfs.py --out bench-results/hdfs.json

bench-ckpt: system-deps venv
	$(BIN)/python benchmarks/bench_ckpt.py --out bench-results/ckpt.json

# On a GPU machine, with its own python3, torch and safetensors (no venv, no network):
# Bootseer's two missing dependencies travel as wheels (benchmarks/bench_ckpt_gpu.py).
bench-ckpt-gpu:
	PYTHONPATH=$(CURDIR):$(CURDIR)/dev:$(CURDIR)/benchmarks:$(PYTHONPATH) \
		python3 benchmarks/bench_ckpt_gpu.py --out bench-results/ckpt-gpu.json

bench-fuse: system-deps venv
	$(BIN)/python benchmarks/bench_fuse.py --out bench-results/fuse.json

bench-blocksize: system-deps venv
	$(BIN)/python benchmarks/bench_blocksize.py --out bench-results/blocksize.json

bench-image: system-deps venv
	$(BIN)/python benchmarks/bench_image.py --out bench-results/image.json

# The same on a training image's size: torch 2.14.1's CUDA build (~6 GB of files, built once).
bench-image-cuda: system-deps venv
	$(BIN)/python benchmarks/bench_image.py --image cuda --out bench-results/image-cuda.json

# pip vs uv vs `bootseer env run` restore of a torch/scipy/pandas venv; uv goes into the
# benchmark's own tool venv (~/.cache/bootseer/bench-env), not the project's dependencies.
bench-env: system-deps venv
	$(BIN)/python benchmarks/bench_env.py --out bench-results/env.json

# The same with torch 2.14.1's CUDA build and its nvidia-* libraries (~5.5 GB in the venv).
bench-env-cuda: system-deps venv
	$(BIN)/python benchmarks/bench_env.py --requirements cuda --out bench-results/env-cuda.json

# The same with JupyterLab and its extensions: many small files, no torch (124 wheels).
bench-env-jupyter: system-deps venv
	$(BIN)/python benchmarks/bench_env.py --requirements jupyter --out bench-results/env-jupyter.json

# Demand reads served by a peer vs the same reads from an idle store (two lab nodes).
bench-p2p-read: system-deps venv
	$(BIN)/python benchmarks/bench_p2p_read.py --out bench-results/p2p-read.json

# A job restarting on 1, 4 and 16 nodes of the fleet lab (network namespaces, tc caps; root),
# each case 3 times, every node at one fixed CPU budget, the same at every N (a cgroup
# quota of 0.1 core: 16 nodes fit in 2 cores), every origin at 0.5: baseline vs Bootseer
# cases, origin bytes, each node's CPU. First the same lab at twice the artifacts' size,
# N = 1 (restart-scale2.json): the fleet simulator fits each step's fixed and per-byte CPU
# on both, validates against every lab point and prices production with it (~80 min).
RESTART_LAB = --node-cpu 0.1 --origin-cpu 0.5 \
	--cases baseline,bootseer_cold,bootseer_prestaged,bootseer,bootseer_p2p
bench-restart: system-deps venv
	$(BIN)/python benchmarks/bench_restart.py --nodes 1 $(RESTART_LAB) --artifact-scale 2 \
		--no-simulate --out bench-results/restart-scale2.json
	$(BIN)/python benchmarks/bench_restart.py --nodes 1,4,16 $(RESTART_LAB),bootseer_fanout \
		--fit-with bench-results/restart-scale2.json \
		--out bench-results/restart.json --png bench-results/restart.png

# What the node agent's mount of a warmed environment saves each lab node (~40 min): the
# prestaged start with it and with the environment extracted on the node, at N = 1, 4, 16.
bench-restart-env: system-deps venv
	$(BIN)/python benchmarks/bench_restart.py --nodes 1,4,16 --no-simulate \
		--cases bootseer_cold,bootseer_prestaged,bootseer_prestaged_env_extracted \
		--out bench-results/restart-env.json --png bench-results/restart-env.png

# bench-results/ is tracked (the measured figures, and the fleet simulator's calibration):
# clean never deletes it.
clean:
	rm -rf $(VENV) build .pytest_cache
