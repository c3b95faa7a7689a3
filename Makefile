# The README's two commands:
#   make demo   set up a fresh Debian 12 machine (as root) and run the main job, `aether demo`
#   make test   set up (the venv, the control plane, the images) and run the tests: ruff, mypy, unit, golden,
#               API-contract, privileged integration and the images
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-packages k8s demo test lint unit bench clean

# Debian packages: the kernel tools (util-linux for setpriv: every process a test starts dies with the test process),
# and the real UDP programs the data-path tests run (dnsmasq, dig, dnsperf, socat, iperf3). `dnsmasq-base` is the
# server without its system service.
DEB_PACKAGES := nftables iproute2 util-linux python3-venv dnsmasq-base dnsutils dnsperf socat iperf3
DEB_COMMANDS := nft ip setpriv dnsmasq dig dnsperf socat iperf3

system-packages:
	@missing=""; for c in $(DEB_COMMANDS); do command -v $$c >/dev/null || [ -x /usr/sbin/$$c ] || missing="$$missing $$c"; done; \
	if [ -z "$$missing" ] && $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null; then \
	  echo "setup: Debian packages present ($(DEB_PACKAGES))"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "setup: apt-get install $(DEB_PACKAGES)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PACKAGES) >/dev/null; \
	else \
	  echo "setup: need$$missing: run as root on Debian 12 to install $(DEB_PACKAGES)"; exit 1; \
	fi

$(STAMP): pyproject.toml | system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

setup: system-packages $(STAMP)

# The pinned Kubernetes control plane the API-facing tests run against (kube-apiserver, kube-controller-manager,
# kubectl, etcd) and helm, built from the Go module proxy into a cache outside the repository keyed by version
# (k8s/go.mod, k8s/etcd/go.mod, k8s/helm/go.mod): a no-op once built. `k8s/build.sh --where` prints the directory.
k8s:
	@command -v go >/dev/null || { echo "k8s: needs the Go toolchain (1.26) to build the control plane"; exit 1; }
	k8s/build.sh

# The operator and node images, localhost/aether-operator:<version> and localhost/aether-node:<version>, with podman
# from Debian packages (debootstrap) and PyPI wheels, no registry (deploy/README.md#images). Debian packages for it:
# podman, runc (Debian's default crun fails on a hybrid cgroup layout), debootstrap.
.PHONY: images image-packages test-images
IMAGE_PACKAGES := podman runc debootstrap

image-packages:
	@missing=""; for c in $(IMAGE_PACKAGES); do command -v $$c >/dev/null || [ -x /usr/sbin/$$c ] || missing="$$missing $$c"; done; \
	if [ -z "$$missing" ]; then \
	  echo "images: Debian packages present ($(IMAGE_PACKAGES))"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "images: apt-get install$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(IMAGE_PACKAGES) >/dev/null; \
	else \
	  echo "images: need$$missing: run as root on Debian 12 to install $(IMAGE_PACKAGES)"; exit 1; \
	fi

images: image-packages setup
	PYTHON=$(BIN)/python deploy/image/build.sh

demo: setup
	$(BIN)/aether demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The image tests' set-up: `make images` as root (the images live in root's podman store; a no-op when nothing
# changed); not root, the image tests skip (a failure under AETHER_REQUIRE_IMAGES=1, as .ci/run sets).
test-images:
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory images; \
	else echo "images: not root: the image tests skip (make images as root builds them)"; fi

# The tests in parallel (pytest-xdist): TEST_WORKERS workers (most of the suite waits on real processes, so 3 on
# 2 cores), a module runs whole on one worker (`--dist loadfile`: its module fixtures and its test order hold),
# handed out in tests/conftest.py's order, the longest first (`--no-loadscope-reorder`: xdist's own order is by
# test count, which puts the many quick parametrized tests first and a long e2e module last).
# TEST_WORKERS=0 runs them in this process, one after another. docs/testing.md has the rules that keep tests
# parallel-safe. Everything the tests need is built first (the control plane, the images, the Envoy modules), so no
# worker builds anything.
TEST_WORKERS ?= 3

unit: setup k8s test-images envoy-modules
	@"$$(k8s/build.sh --where)/kube-apiserver" --version
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The Envoy dynamic modules in Rust (envoy-modules/: the QUIC SNI reader `quicsni` and the module aether_quic_sni,
# which the node image ships), built and tested with cargo from crates.io; `--locked` keeps Cargo.lock's versions,
# and after the first fetch both run offline.
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
.PHONY: envoy-modules envoy-modules-test

envoy-modules:
	@test -x "$(CARGO)" || { echo "envoy-modules: needs cargo (rustup's stable toolchain)"; exit 1; }
	cd envoy-modules && "$(CARGO)" build --release --locked

envoy-modules-test:
	@test -x "$(CARGO)" || { echo "envoy-modules: needs cargo (rustup's stable toolchain)"; exit 1; }
	cd envoy-modules && "$(CARGO)" fmt --check && "$(CARGO)" test --locked

test: lint unit envoy-modules-test

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info envoy-modules/target
