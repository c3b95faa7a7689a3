"""The images `make images` builds (deploy/image/), for the tests that run them: their names as the build script
prints them (`deploy/image/build.sh --names`, the one place they are defined), podman as it runs on these machines
(`deploy/image/podman.sh`), whether the images are there, and a container started the way a kubelet starts
one of the manifests' (`pod_container`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path

from aether.testing.controlplane.binaries import repository_root

# where a kubelet mounts a pod's ServiceAccount token, the cluster CA and the namespace (client libraries read them)
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Set in CI (.ci/run): a missing image (or podman) is a failure, not a skip.
REQUIRE_ENV = "AETHER_REQUIRE_IMAGES"


def image_dir() -> Path:
    return repository_root() / "deploy" / "image"


def podman() -> str:
    return str(image_dir() / "podman.sh")


@cache
def names() -> dict[str, str]:
    """{"operator": "localhost/aether-operator:<version>", "node": ...}: what the build script builds."""
    out = subprocess.run(
        [str(image_dir() / "build.sh"), "--names"], capture_output=True, text=True, check=True, timeout=60
    )
    pairs = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return {which: ref for which, ref in pairs}


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable() -> str | None:
    """Why the image tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "the images live in root's podman store: run as root"
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman/runc missing: make image-packages"
    for image in names().values():
        if subprocess.run([podman(), "image", "exists", image], capture_output=True).returncode != 0:
            return f"{image} not built: make images"
    return None


def needed() -> None:
    """For a test that runs the images: a skip naming what is missing, a failure under AETHER_REQUIRE_IMAGES=1."""
    import pytest  # test support only: the tests that call this run under pytest

    reason = unavailable()
    if reason is None:
        return
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)


def service_account_files(directory: Path, token: str, ca: Path, namespace: str) -> Path:
    """`token`, `ca.crt` and `namespace` in `directory` as a kubelet projects them (readable by the container's
    non-root user); returns the directory, to mount at SERVICE_ACCOUNT_DIR."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("token", token), ("ca.crt", ca.read_text()), ("namespace", namespace)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o644)
    directory.chmod(0o755)
    return directory


def rotate_token(directory: Path, token: str) -> None:
    """Replace the token in a service_account_files directory atomically, as a kubelet refreshes a projected token."""
    new = directory / ".token.new"
    new.write_text(token)
    new.chmod(0o644)
    os.replace(new, directory / "token")


@contextlib.contextmanager
def pod_container(
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    service_account: Path,
    user: str,
    volumes: Mapping[Path, str] | None = None,
) -> Iterator[str]:
    """`image` running `command` in the host network namespace, as `user`, with a read-only root filesystem and no
    capabilities (the manifests' securityContext), `env`, `volumes` (host path -> path inside, a trailing `:ro` kept)
    and `service_account` mounted read-only where a kubelet mounts the projected ServiceAccount volume. Yields the
    container's name; it is removed on exit."""
    name = f"aether-test-pod-{uuid.uuid4().hex[:8]}"
    cmd = [podman(), "run", "--detach", "--name", name, "--network", "host", "--read-only", "--cap-drop", "all"]
    # --passwd=false: podman would otherwise add an /etc/passwd line for `user`, which no kubelet's runtime does
    # (containerd runs the image's files as they are: a USER without a passwd line failed kopf there)
    cmd += ["--security-opt", "no-new-privileges", "--user", user, "--passwd=false", "--entrypoint", command[0]]
    cmd += ["--volume", f"{service_account}:{SERVICE_ACCOUNT_DIR}:ro"]
    for host, inside in (volumes or {}).items():
        cmd += ["--volume", f"{host}:{inside}"]
    for key, value in env.items():
        cmd += ["--env", f"{key}={value}"]
    subprocess.run([*cmd, image, *command[1:]], capture_output=True, text=True, check=True, timeout=120)
    try:
        yield name
    finally:
        subprocess.run([podman(), "rm", "--force", "--time", "5", name], capture_output=True, timeout=120)


def logs(name: str) -> str:
    out = subprocess.run([podman(), "logs", name], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr
