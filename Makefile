# Every target creates or reuses the virtualenv itself: nothing is installed by hand first.
# It holds the developer tools (the dev extra: linters, pytest, the Helm engine); a user who
# only wants the CLI needs none of them: `pip install -e .` (README.md, Try it).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3
# Kubernetes minor of the e2e tier (tests/e2e/versions.toml pins the patch).
K8S ?= 1.37

.PHONY: venv lint test e2e e2e-build oracles bench demo chart image proto clean gpu-check \
    nvidia-plugin

# Silent, with one line on stderr: `make chart > out.yaml` must hold only the chart.
$(STAMP): pyproject.toml
	@echo "make: installing the developer tools into $(VENV) (once; about 90 s)" >&2
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >&2
	@$(PY) -m pip install -q -e '.[dev]' >&2
	@touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Workers: most tests wait on real processes and sockets, so even 2 cores gain.
test: lint
	$(PY) -m pytest -n auto --maxprocesses=4

# The differential tests against upstream's allocator and CEL (needs Go; builds once, cached).
oracles: $(STAMP)
	$(PY) -m tests.e2e.build oracles
	$(PY) -m pytest -o addopts="-q -ra" tests/oracles

# The real Kubernetes components, built from their Go modules once per machine and version
# (cached in ~/.cache/gpu-dra-e2e, or $$GPU_DRA_E2E_CACHE).
e2e-build: $(STAMP)
	bash tests/e2e/deps.sh
	$(PY) -m tests.e2e.build --k8s $(K8S) kubernetes etcd containerd runc helm nvidia-ctk oracles images

# The e2e tier against those components; pytest's addopts exclude it from `make test`.
# Level 3 (the chart installed, the plugin as the DaemonSet's pod) runs in network and mount
# namespaces of its own (tests/e2e/netns.py): a pod network, kube-proxy, an rshared root.
E2E_PYTEST := $(PY) -m pytest -o addopts="-q -ra" -p no:cacheprovider
# Level 3's modules in CI (test_level3_health.py: a pod's device health through the real
# kubelet, 1.36+; it skips, saying why, on an older one). One alone: `make e2e LEVEL3=...`.
LEVEL3 ?= tests/e2e/test_level3.py tests/e2e/test_level3_computedomain.py \
    tests/e2e/test_level3_health.py
e2e: e2e-build
	K8S=$(K8S) $(E2E_PYTEST) tests/oracles tests/e2e --ignore-glob='tests/e2e/test_level3*'
	K8S=$(K8S) $(PY) -m tests.e2e.netns $(E2E_PYTEST) $(LEVEL3)

# The real-GPU suite (tests/gpu/): on a machine with an NVIDIA GPU and driver; skips, with the
# reason, where there is none. It changes no GPU setting and prints one table. On a machine
# without this virtualenv, GPU_CHECK_PY=python3 runs it with that interpreter's packages.
GPU_CHECK_PY ?= $(PY)
gpu-check: $(if $(filter $(PY),$(GPU_CHECK_PY)),$(STAMP))
	$(GPU_CHECK_PY) -m pytest -o addopts="-q -ra" -p no:cacheprovider tests/gpu

# By hand, never in CI: NVIDIA's own GPU kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu,
# from a mirror of its repository: its module is not on the Go module proxy) built once into
# ~/.cache/gpu-dra-e2e, then run on simulated nodes against a real kube-apiserver to record its
# slices, NVML calls and CDI specs into tests/data/nvidia-plugin, which make test holds ours to.
NVIDIA_MIRROR ?= /work/.mirror/kubernetes-sigs+dra-driver-nvidia-gpu/repo
nvidia-plugin: $(STAMP)
	$(PY) -m tests.e2e.nvidia_plugin build --mirror $(NVIDIA_MIRROR)
	GPU_DRA_E2E_RUN=$${GPU_DRA_E2E_RUN:-/tmp/nv-run} flock /tmp/gpu-dra-e2e.lock \
	    $(PY) -m tests.e2e.nvidia_plugin record

bench: $(STAMP)
	@set -e; for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

# The plugin's image, for linux/amd64 and linux/arm64, without Docker or a registry
# (image/contents.toml lists what goes in): dist/gpu-dra-driver-<version>.oci.tar.
image: $(STAMP)
	$(PY) image/build.py $(IMAGE_ARGS)

demo: $(STAMP)
	$(VENV)/bin/gpu-dra demo $(DEMO_ARGS)

# The chart as `helm template` renders it, on stdout alone: make chart VALUES=FILE SET='a=1 b=2'.
VALUES ?= charts/gpu-dra-driver/values.yaml
SET ?=
chart: $(STAMP)
	@$(PY) -m tests.chart_render -f $(VALUES) $(foreach pair,$(SET),--set $(pair))

# The generated tables of docs/reference.md, from the flag table, chart schema, attribute
# tables and metrics registry (tests/test_docs_reference.py fails when they drift), and the
# devices each instance profile publishes, which validate reads (tests/test_validate_profiles.py).
.PHONY: docs
docs: $(STAMP)
	$(PY) -m tests.docs_reference
	$(PY) -m tests.profile_devices

proto: $(STAMP)
	$(PY) -m api.protogen

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
