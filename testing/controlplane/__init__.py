"""A real Kubernetes control plane for the API-facing tests and `aether dev-api --control-plane real`: etcd,
kube-apiserver and kube-controller-manager at the version `k8s/go.mod` pins, built by `make k8s` (cluster.py).

    cp = start()            # -> ControlPlane: .kubeconfig_path, .url, .version, .kubectl(...), .stop()
"""

from aether.testing.controlplane.binaries import ControlPlaneMissing, available, bin_dir
from aether.testing.controlplane.cluster import CHANNELS, SERVICE_CIDR, ControlPlane, start

__all__ = ["CHANNELS", "SERVICE_CIDR", "ControlPlane", "ControlPlaneMissing", "available", "bin_dir", "start"]
