#!/usr/bin/env bash
# The e2e scenarios on a real cluster (kind): UDP per-service selection across two nodes, a UDPRoute re-pointing
# a Service, and the REDIRECT negative control. Needs docker (or podman as `docker`), kind, kubectl.
#
#   e2e/kind/run.sh            create the cluster, build and load the image, install, run, delete the cluster
#   KEEP=1 e2e/kind/run.sh     leave the cluster up afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=e2e/kind
CLUSTER=aether-e2e
NS=aether-e2e
GATEWAY_API=${GATEWAY_API:-https://github.com/kubernetes-sigs/gateway-api/releases/download/v1.2.1/experimental-install.yaml}

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
for tool in docker kind kubectl; do command -v "$tool" >/dev/null || fail "$tool is not installed"; done
docker info >/dev/null 2>&1 || fail "no container engine answers (docker info failed)"

cleanup() { [ "${KEEP:-0}" = 1 ] || kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "cluster"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --config "$HERE/kind-config.yaml" --wait 120s
kubectl config use-context "kind-$CLUSTER" >/dev/null

step "image"
make images   # localhost/aether-node:<version> in root's podman store (deploy/README.md#images)
node_image="$(deploy/image/build.sh --names | awk '$1 == "node" {print $2}')"
deploy/image/podman.sh tag "$node_image" localhost/aether:e2e
deploy/image/podman.sh save -o "${TMPDIR:-/tmp}/aether-e2e.tar" localhost/aether:e2e
kind load image-archive "${TMPDIR:-/tmp}/aether-e2e.tar" --name "$CLUSTER"

step "install: Gateway API (experimental: UDPRoute), then aether"
kubectl apply --server-side -f "$GATEWAY_API" >/dev/null
kubectl apply -k "$HERE"
kubectl -n aether-system rollout status daemonset/aether-node --timeout=300s
kubectl -n aether-system rollout status deployment/aether-operator --timeout=300s

step "workloads (created after the CNI is chained, so they are captured)"
kubectl apply -f "$HERE/workloads.yaml"
kubectl -n "$NS" wait --for=condition=Ready pod --all --timeout=300s

vip() { kubectl -n "$NS" get service "$1" -o jsonpath='{.spec.clusterIP}'; }
ask() { kubectl -n "$NS" exec client -- python3 /app/ask.py "$1" "${2:-3}"; }
expect() { # expect <vip> <answer> <what>: retried while the operator and the sidecar converge
  local got="" i
  for i in $(seq 1 30); do got=$(ask "$1" 2>/dev/null || true); [ "$got" = "$2" ] && break; sleep 2; done
  [ "$got" = "$2" ] || fail "$3: $1:18082 answered '$got', want '$2'"
  printf 'ok   %-44s %s:18082 -> %s\n' "$3" "$1" "$got"
}
VIP_A=$(vip dns-a); VIP_B=$(vip dns-b)
CLIENT_NODE=$(kubectl -n "$NS" get pod client -o jsonpath='{.spec.nodeName}')

step "S1: per-service selection (client and backends on different nodes)"
kubectl get meshnodes
kubectl get meshserviceslices
expect "$VIP_A" dns-a "VIP A reaches backend A"
expect "$VIP_B" dns-b "VIP B reaches backend B"

step "S2: a UDPRoute re-points Service dns-a at dns-b"
kubectl apply -f - <<YAML
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata: {name: dns-a, namespace: $NS}
spec:
  parentRefs: [{group: "", kind: Service, name: dns-a, port: 18082}]
  rules: [{backendRefs: [{name: dns-b, port: 18082}]}]
YAML
expect "$VIP_A" dns-b "route: VIP A now reaches backend B"
expect "$VIP_B" dns-b "VIP B still reaches backend B"
kubectl -n "$NS" delete udproute dns-a
expect "$VIP_A" dns-a "route deleted: VIP A back to backend A"

step "S3: negative control: REDIRECT capture in the client's netns loses the VIP"
NODE_POD=$(kubectl -n aether-system get pod -l app.kubernetes.io/name=aether-node \
  --field-selector "spec.nodeName=$CLIENT_NODE" -o jsonpath='{.items[0].metadata.name}')
UID_=$(kubectl -n "$NS" get pod client -o jsonpath='{.metadata.uid}')
NETNS=$(kubectl -n aether-system exec "$NODE_POD" -c envoy -- \
  python3 -c "import json; print(json.load(open('/run/aether/pods/$UID_.json'))['netns'])")
kubectl -n aether-system exec "$NODE_POD" -c envoy -- aether capture install --netns "$NETNS" --mode redirect
got=$(ask "$VIP_A" 3 || true)
[ "$got" != dns-a ] || fail "REDIRECT still reached backend A: the selection check cannot see a lost VIP"
printf 'ok   %-44s %s:18082 -> %s\n' "REDIRECT: VIP A no longer selects backend A" "$VIP_A" "$got"
kubectl -n aether-system exec "$NODE_POD" -c envoy -- aether capture install --netns "$NETNS" --mode tproxy
expect "$VIP_A" dns-a "tproxy restored: VIP A reaches backend A"

step "PASS"
