#!/usr/bin/env bash
# Build the pinned test control plane (kube-apiserver, kube-controller-manager, kubectl, etcd) and helm from the Go
# module proxy into a cache outside the repository, keyed by the pinned versions (k8s/go.mod, k8s/etcd/go.mod,
# k8s/helm/go.mod): a second run is a no-op. When only the helm pin changed, the control plane of the earlier key is
# linked in instead of rebuilt.
# Prints the bin directory on its last line; `--where` prints only that, building nothing.
# AETHER_K8S_CACHE overrides the cache root.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")"
etcd_version="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")"
helm_module="$(awk '$1 == "require" && $2 ~ /^helm\.sh\/helm\/v[0-9]+$/ {print $2}' "$here/helm/go.mod")"
helm_version="$(awk '$1 == "require" && $2 ~ /^helm\.sh\/helm\/v[0-9]+$/ {print $3}' "$here/helm/go.mod")"
control_key="kubernetes-${k8s_version}+etcd-${etcd_version}"
key="${control_key}+helm-${helm_version}"
root="${AETHER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aether/k8s}"
bin="$root/$key/bin"
control=(kube-apiserver kube-controller-manager kubectl etcd)
tools=("${control[@]}" helm)
if [ "${1:-}" = --where ]; then
  echo "$bin"
  exit 0
fi
if [ -f "$bin/.complete" ]; then
  echo "k8s: $key already built"
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
has_control() { for t in "${control[@]}"; do test -x "$1/$t" || return 1; done; }
start=$(date +%s)
reused=""
for prev in "$root/$control_key/bin" "$root/$control_key"+helm-*/bin; do
  if [ "$prev" != "$bin" ] && [ -f "$prev/.complete" ] && has_control "$prev"; then
    for t in "${control[@]}"; do cp -l "$prev/$t" "$bin/$t" 2>/dev/null || cp "$prev/$t" "$bin/$t"; done
    reused="$prev"
    break
  fi
done
if [ -n "$reused" ]; then
  echo "k8s: $control_key linked from $reused"
else
  minor="${k8s_version#v1.}"; minor="${minor%%.*}"
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  echo "k8s: building $control_key into $bin"
  (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" .)
fi
control_s=$(( $(date +%s) - start ))
echo "k8s: building helm $helm_version into $bin"
helm_start=$(date +%s)
hv="$helm_module/internal/version"
(cd "$here/helm" && go build -trimpath -ldflags "-s -w -X $hv.version=$helm_version -X $hv.gitTreeState=clean" \
  -o "$bin/helm" "$helm_module/cmd/helm")
helm_s=$(( $(date +%s) - helm_start ))
for t in "${tools[@]}"; do test -x "$bin/$t"; done
echo "$key built in $(( $(date +%s) - start )) s (control plane ${reused:+linked, }$control_s s, helm $helm_s s)" \
  > "$bin/.complete"
echo "k8s: $(cat "$bin/.complete")"
echo "$bin"
