#!/bin/sh
# podman the way it works on a Debian 12 machine without a daemon or a registry: runc (crun 1.8 fails on a hybrid
# cgroup layout), containers.conf beside this file (no default ulimits: podman's RLIMIT_NOFILE fails to set in a
# sandbox), and root's usual store, /var/lib/containers/storage. `make images` and tests/deploy/test_deploy_images.py
# go through it, so they see the same store; any other podman command too: deploy/image/podman.sh images
#
# The storage driver: the one the store was made with; for a new store, overlay (native, on ext4 or xfs), or vfs
# where the store would sit on overlayfs or tmpfs (overlay cannot put its upper layers there). vfs works anywhere
# but copies a whole image per layer and per container (about 10 s and 450 MB for each `run` of the node image,
# against 0.4 s). AETHER_STORAGE_DRIVER picks one; a store cannot change driver (podman system reset empties it).
here="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
store=/var/lib/containers/storage
driver="${AETHER_STORAGE_DRIVER:-}"
if [ -z "$driver" ]; then
  if [ -d "$store/overlay" ]; then driver=overlay
  elif [ -d "$store/vfs" ]; then driver=vfs
  else
    mkdir -p "$store"
    case "$(stat -f -c %T "$store")" in overlayfs|tmpfs) driver=vfs ;; *) driver=overlay ;; esac
  fi
fi
exec podman --runtime runc --storage-driver "$driver" "$@"
