# The README's two commands:
#   make demo   set up a fresh Debian 12 machine (as root) and run the main job, `aether demo`
#   make test   set up and run the tests: ruff, mypy, unit, golden, API-contract and privileged integration
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-packages demo test lint unit bench clean

system-packages:
	@if command -v nft >/dev/null && command -v ip >/dev/null && $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null; then \
	  echo "setup: nftables, iproute2 and python venv present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "setup: apt-get install nftables iproute2 python3-venv"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 python3-venv >/dev/null; \
	else \
	  echo "setup: need nftables, iproute2 and python3-venv (run as root on Debian 12 to install them)"; exit 1; \
	fi

$(STAMP): pyproject.toml | system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

setup: system-packages $(STAMP)

demo: setup
	$(BIN)/aether demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest

test: lint unit

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
