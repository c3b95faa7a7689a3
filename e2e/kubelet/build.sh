#!/usr/bin/env bash
# What e2e/kubelet needs beyond `make k8s` and `make images`: the kubelet and kube-scheduler of the pinned Kubernetes
# (k8s/go.mod, built the way k8s/build.sh builds the control plane, from a scratch copy of that module so the repo's
# go.mod/go.sum stay as they are), and two images FROM scratch with static Go binaries: a pause for the pod sandbox
# (no registry is reachable, so containerd's sandbox_image must be local) and the UDP echo/client workload.
# The binaries land in a cache keyed by the version (AETHER_K8S_CACHE as k8s/build.sh); prints the bin dir last.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$repo/k8s/go.mod")"
root="${AETHER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aether/k8s}"
bin="$root/node-kubernetes-$k8s_version/bin"
if [ ! -x "$bin/kubelet" ] || [ ! -x "$bin/kube-scheduler" ]; then
  mod="$(mktemp -d)"
  trap 'rm -rf "$mod"' EXIT
  cp "$repo/k8s/go.mod" "$repo/k8s/go.sum" "$mod/"
  printf '//go:build tools\n\npackage k8s\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n)\n' \
    > "$mod/tools.go"
  minor="${k8s_version#v1.}"; minor="${minor%%.*}"
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  mkdir -p "$bin"
  echo "kubelet: building kubelet and kube-scheduler $k8s_version into $bin"
  # -mod=mod: the control plane's go.sum may lack a module only the kubelet imports
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" go build -trimpath -ldflags "$ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler)
fi
for image in pause udp; do
  out="$(mktemp -d)"
  (cd "$here/images/$image" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/$image" .)
  cp "$here/images/$image/Containerfile" "$out/"
  "$repo/deploy/image/podman.sh" build -q --network none -t "localhost/aether-kubelet-$image:0.1" "$out" >/dev/null
  rm -rf "$out"
done
echo "$bin"
