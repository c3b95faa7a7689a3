"""What e2e/kubelet applies: deploy/ as `kubectl kustomize` renders it, moved onto this host's spike directories, and
the workload (a meshed namespace, a UDP echo behind a Service, a client dialling the Service's VIP on the mesh port
and a control dialling it on the Service's own port). Pure: documents in, documents out."""

from __future__ import annotations

from typing import Any

from aether.netns.contract import L4_OUTBOUND_PORT

Doc = dict[str, Any]
NAMESPACE = "kubelet-e2e"
ECHO_PORT = 5353
UDP_IMAGE = "localhost/aether-kubelet-udp:0.1"
# host paths the DaemonSet's install-cni writes, moved under the spike's root: this host's /etc/cni/net.d holds
# podman's own conflist, which the installer would otherwise chain aether-cni into
MOVED_HOST_PATHS = ("/opt/cni/bin", "/etc/cni/net.d", "/opt/aether")


def for_this_host(docs: list[Doc], root: str, private_root_mount: bool) -> list[Doc]:
    """deploy/ with the CNI and bundle host paths under `root`. With `private_root_mount` (no systemd: `/` is not a
    shared mount, and /var/run is a link to /run), the DaemonSet's /var/run/netns volume is left out: containerd
    refuses HostToContainer on it ("path /var/run/netns is mounted on / but it is not a shared or slave mount"),
    and /run/netns, a shared mount, is the same directory."""
    out: list[Doc] = []
    for doc in docs:
        if doc.get("kind") == "DaemonSet":
            doc = _moved(doc, root, private_root_mount)
        out.append(doc)
    return out


def _moved(daemonset: Doc, root: str, private_root_mount: bool) -> Doc:
    spec = daemonset["spec"]["template"]["spec"]
    for volume in spec["volumes"]:
        host = volume.get("hostPath")
        if host is not None and host["path"] in MOVED_HOST_PATHS:
            host["path"] = root + host["path"]
    for init in spec.get("initContainers", []):
        init["args"] = [
            a.replace("--host-bundle-path=/opt/aether/", f"--host-bundle-path={root}/opt/aether/")
            for a in init.get("args", [])
        ]
    if private_root_mount:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "var-run-netns"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] != "var-run-netns"]
    return daemonset


def workload_service() -> list[Doc]:
    """The meshed namespace, the echo pod and its UDP Service."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"mesh.aether.dev/enabled": "true"}},
        },
        _pod("udp-echo", ["echo", str(ECHO_PORT)], {"app": "udp-echo"}),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "udp-echo", "namespace": NAMESPACE},
            "spec": {
                "selector": {"app": "udp-echo"},
                "ports": [{"name": "echo", "port": ECHO_PORT, "targetPort": ECHO_PORT, "protocol": "UDP"}],
            },
        },
    ]


def workload_clients(vip: str) -> list[Doc]:
    """`udp-client` dials VIP:18082 (the capture's port); `udp-control` dials VIP:5353, which only kube-proxy
    would answer, and this node has none."""
    return [
        _pod("udp-client", ["client", f"{vip}:{L4_OUTBOUND_PORT}"], {}),
        _pod("udp-control", ["client", f"{vip}:{ECHO_PORT}"], {}),
    ]


def _pod(name: str, args: list[str], labels: dict[str, str]) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "udp", "image": UDP_IMAGE, "imagePullPolicy": "Never", "args": args}],
        },
    }
