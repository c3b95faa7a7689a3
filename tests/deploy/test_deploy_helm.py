"""deploy/helm/aether, the Helm form of deploy/: `helm lint --strict` passes, the default values render exactly what
`kubectl kustomize deploy/` renders (object by object), each value changes the field it names and nothing else (and
the flags it writes are the ones `aether xds` and the CNI installer take), the render is accepted by the real
control plane (`kubectl apply --server-side`, `--dry-run=server` once the namespace exists), and the "Install with
Helm" commands of docs/operations.md run as written against it.
Long because: every value of the chart is a case of one render check here (CASES), sharing its render helpers.

helm is the pinned build of `make k8s` (k8s/helm/go.mod): without it these tests skip naming `make k8s`, and fail under
AETHER_REQUIRE_PRIVILEGED=1 (CI), as the control plane's tests do."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from aether.testing import controlplane
from aether.testing.apiserver import Kind
from aether.testing.controlplane import binaries
from aether.xds.sidecar.cli import _serve_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "aether"
NS = "aether-system"
# what Helm itself adds, and nothing else, is left out of the comparison with deploy/
HELM_ANNOTATIONS = ("helm.sh/resource-policy",)
MESH_CRDS = ("meshnodes", "meshserviceslices", "meshauthorizationpolicies", "meshpeers")
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
DS = "DaemonSet/aether-node"
POD = "spec.template.spec"
XDS = f"{POD}.containers[0]"
CNI = f"{POD}.initContainers[0]"


def tool(name: str) -> str:
    with binaries.or_skip("the chart's tests must run"):
        return binaries.tool(name)


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm with its own config, cache and data directories (never the user's)."""
    home = tmp_path_factory.mktemp("helm-home")
    env = dict(os.environ)
    for var in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    env.pop("KUBECONFIG", None)
    return env


def helm(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([tool("helm"), *args], capture_output=True, text=True, env=env, timeout=120)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {shlex.join(args)} exited {out.returncode}:\n{out.stderr}{out.stdout}")
    return out


def template(env: dict[str, str], *args: str, namespace: str = NS) -> str:
    return helm(env, "template", "aether", str(CHART), "--namespace", namespace, *args).stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(env: dict[str, str], values: dict[str, Any] | None = None, namespace: str = NS) -> list[dict[str, Any]]:
    args = ["--set-json", json.dumps(values)] if values else []
    return objects(template(env, *args, namespace=namespace))


def key(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def normal(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server stores it, less Helm's own metadata: a cluster-scoped object has no namespace
    (kustomize stamps one on kinds it does not know: the ValidatingAdmissionPolicy and its binding)."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    if out["kind"] in CLUSTER_SCOPED:
        meta.pop("namespace", None)
    for name in HELM_ANNOTATIONS:
        (meta.get("annotations") or {}).pop(name, None)
    if meta.get("annotations") == {}:
        del meta["annotations"]
    return out


def by_key(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {key(o): normal(o) for o in objs}
    assert len(out) == len(objs), "two rendered objects share a kind and name"
    return out


def changes(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where `a` and `b` differ (a list of another length, or a key present in one only, is one change)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [c for k in sorted(set(a) | set(b)) for c in changes(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [c for i, (x, y) in enumerate(zip(a, b, strict=True)) for c in changes(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def diff(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> set[str]:
    x, y = by_key(base), by_key(other)
    out = {k for k in set(x) ^ set(y)}
    for k in set(x) & set(y):
        out |= {f"{k}:{p}" for p in changes(x[k], y[k])}
    return out


def find(objs: list[dict[str, Any]], k: str) -> dict[str, Any]:
    return by_key(objs)[k]


def container(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec = find(objs, DS)["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers"] + spec["containers"] if c["name"] == name)


def xds_args(objs: list[dict[str, Any]]) -> Any:
    """The xds container's args as `aether xds` parses them (a flag it does not take is a SystemExit)."""
    args = [a.replace("$(NODE_NAME)", "node-a") for a in container(objs, "xds")["args"]]
    return _serve_parser().parse_args(args)


@pytest.fixture(scope="module")
def default(helm_env: dict[str, str]) -> list[dict[str, Any]]:
    return render(helm_env)


# -- the chart itself --------------------------------------------------------------------------------------------


def test_helm_is_the_pinned_version(helm_env: dict[str, str]) -> None:
    pin = re.search(r"^require helm\.sh/helm/v\d+ (\S+)$", (REPO / "k8s" / "helm" / "go.mod").read_text(), re.M)
    assert pin, "k8s/helm/go.mod requires no helm"
    assert helm(helm_env, "version", "--short").stdout.startswith(pin.group(1))


def test_lint_strict(helm_env: dict[str, str], tmp_path: Path) -> None:
    out = helm(helm_env, "lint", "--strict", str(CHART), "--namespace", NS)
    assert "0 chart(s) failed" in out.stdout, out.stdout
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NON_DEFAULT))
    helm(helm_env, "lint", "--strict", str(CHART), "--namespace", NS, "-f", str(values))


def test_the_chart_files_are_copies_of_deploy() -> None:
    crds = sorted(p.name for p in (CHART / "files" / "crds").iterdir())
    assert crds == sorted(p.name for p in (DEPLOY / "crds").glob("*.yaml"))
    for name in crds:
        assert (CHART / "files" / "crds" / name).read_bytes() == (DEPLOY / "crds" / name).read_bytes(), name
    bootstrap = CHART / "files" / "envoy-bootstrap.json"
    assert bootstrap.read_bytes() == (DEPLOY / "node" / "envoy-bootstrap.json").read_bytes()


def test_the_default_values_render_the_kustomize_tree(default: list[dict[str, Any]]) -> None:
    kustomized = subprocess.run(
        [tool("kubectl"), "kustomize", str(DEPLOY)], capture_output=True, text=True, check=True
    ).stdout
    theirs, ours = by_key(objects(kustomized)), by_key(default)
    assert sorted(ours) == sorted(theirs)
    for k, obj in theirs.items():
        assert ours[k] == obj, (k, changes(obj, ours[k]))
    crds = [o for o in default if o["kind"] == "CustomResourceDefinition"]
    assert crds and all(o["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"} for o in crds)


def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in values.items():
        out += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def test_the_readme_lists_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [v for v in leaves(values) if f"`{v}`" not in readme]
    assert not missing, f"deploy/helm/aether/README.md does not list {missing}"
    tested = {leaf for case, _ in CASES.values() for leaf in leaves(case)}
    assert set(leaves(values)) == tested, f"values without a case in CASES: {set(leaves(values)) - tested}"


# each value, and exactly the fields of the default render it changes
CASES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "operator image": (
        {"images": {"operator": {"repository": "registry.example/aether-operator", "tag": "1.2.3"}}},
        {f"Deployment/aether-operator:{POD}.containers[0].image"},
    ),
    "node image": (
        {"images": {"node": {"repository": "registry.example/aether-node", "tag": "1.2.3"}}},
        {f"{DS}:{CNI}.image", f"{DS}:{XDS}.image", f"{DS}:{POD}.containers[1].image"},
    ),
    "pull policy": (
        {"images": {"pullPolicy": "Always"}},
        {
            f"Deployment/aether-operator:{POD}.containers[0].imagePullPolicy",
            f"{DS}:{CNI}.imagePullPolicy",
            f"{DS}:{XDS}.imagePullPolicy",
            f"{DS}:{POD}.containers[1].imagePullPolicy",
        },
    ),
    "mesh domain": ({"meshDomain": "mesh.example.org"}, {f"{DS}:{XDS}.args"}),
    "inbound mode": ({"inbound": {"mode": "PERMISSIVE"}}, {f"{DS}:{CNI}.args"}),
    "mesh sources": ({"inbound": {"meshSources": ["10.0.0.0/16", "fd00::/64"]}}, {f"{DS}:{CNI}.env[1].value"}),
    "udp max sessions": ({"udp": {"maxSessions": 2500000}}, {f"{DS}:{XDS}.args"}),
    "udp idle timeout": ({"udp": {"idleTimeout": 120}}, {f"{DS}:{XDS}.args"}),
    "udp dataplane envoy": ({"udp": {"dataplane": "envoy"}}, {f"{DS}:{XDS}.args"}),
    "udp dataplane kernel": (
        {"udp": {"dataplane": "kernel"}},
        {f"{DS}:{XDS}.args", f"{DS}:{XDS}.securityContext.capabilities.add"},
    ),
    "east-west gateway quic": ({"eastWestGateway": {"quic": "off"}}, {f"{DS}:{XDS}.args"}),
    "certificates under /run/aether": ({"certificates": {"dir": "/run/aether/spire/"}}, {f"{DS}:{XDS}.args[7]"}),
    "certificates elsewhere": (
        {"certificates": {"dir": "/var/lib/spire/svids"}},
        {f"{DS}:{XDS}.args[7]", f"{DS}:{XDS}.volumeMounts", f"{DS}:{POD}.volumes"},
    ),
    "no namespace": ({"namespace": {"create": False}}, {f"Namespace/{NS}"}),
    "no crds": (
        {"crds": {"enabled": False}},
        {f"CustomResourceDefinition/{n}.mesh.aether.dev" for n in MESH_CRDS},
    ),
}
NON_DEFAULT: dict[str, Any] = {
    "images": {"operator": {"repository": "registry.example/aether", "tag": "1.2.3"}, "pullPolicy": "Always"},
    "inbound": {"mode": "PERMISSIVE", "meshSources": ["10.0.0.0/16"]},
    "udp": {"maxSessions": 2500000, "idleTimeout": 120},
    "certificates": {"dir": "/var/lib/spire/svids"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_value_changes_its_field_only(helm_env: dict[str, str], default: list[dict[str, Any]], case: str) -> None:
    values, fields = CASES[case]
    assert diff(default, render(helm_env, values)) == fields


def test_images(helm_env: dict[str, str]) -> None:
    node = {"repository": "registry.example/aether-node", "tag": "1.2.3"}
    objs = render(helm_env, {"images": {"node": node, "operator": {"repository": "op", "tag": ""}}})
    assert find(objs, "Deployment/aether-operator")["spec"]["template"]["spec"]["containers"][0]["image"] == "op:0.1.0"
    assert {container(objs, n)["image"] for n in ("install-cni", "xds", "envoy")} == {
        "registry.example/aether-node:1.2.3"
    }


def test_inbound_values_reach_the_cni_entry(helm_env: dict[str, str], cni_install: ModuleType) -> None:
    objs = render(helm_env, {"inbound": {"mode": "PERMISSIVE", "meshSources": ["10.0.0.0/16", "fd00::/64"]}})
    cni = container(objs, "install-cni")
    env = {e["name"]: e["value"] for e in cni["env"]}
    assert env["AETHER_MESH_SOURCES"] == "10.0.0.0/16,fd00::/64"
    args = cni_install.make_parser().parse_args([*cni["args"], f"--mesh-sources={env['AETHER_MESH_SOURCES']}"])
    sources = ["10.0.0.0/16", "fd00::/64"]
    assert cni_install.entry_from(args) == {
        **cni_install.DEFAULT_ENTRY,
        "inbound": "permissive",
        "meshSources": sources,
    }
    strict = container(render(helm_env, {"inbound": {"mode": "STRICT"}}), "install-cni")
    assert not [a for a in strict["args"] if a.startswith(("--entry", "--inbound"))]  # the default entry is strict
    assert cni_install.entry_from(cni_install.make_parser().parse_args(strict["args"]))["inbound"] == "strict"


def test_udp_and_certificate_values_are_flags_the_sidecar_takes(
    helm_env: dict[str, str], default: list[dict[str, Any]]
) -> None:
    parsed = xds_args(default)  # eastWestGateway.quic auto renders no flag: the sidecar's default
    assert (parsed.udp_max_sessions, parsed.udp_idle_timeout, parsed.certs_dir) == (100_000, 60.0, "/run/aether/certs")
    assert parsed.east_west_gateway_quic == "auto"
    values = {"udp": {"maxSessions": 2500000, "idleTimeout": 120}, "certificates": {"dir": "/var/lib/spire/svids"}}
    objs = render(helm_env, {**values, "eastWestGateway": {"quic": "off"}})
    svids = "/var/lib/spire/svids"
    parsed = xds_args(objs)
    assert (parsed.udp_max_sessions, parsed.udp_idle_timeout, parsed.certs_dir) == (2_500_000, 120.0, svids)
    assert parsed.east_west_gateway_quic == "off"
    mount = next(m for m in container(objs, "xds")["volumeMounts"] if m["name"] == "aether-certs")
    volume = next(v for v in find(objs, DS)["spec"]["template"]["spec"]["volumes"] if v["name"] == "aether-certs")
    assert mount == {"name": "aether-certs", "mountPath": "/var/lib/spire/svids", "readOnly": True}
    assert volume["hostPath"] == {"path": "/var/lib/spire/svids", "type": "Directory"}


def test_the_udp_dataplane_is_a_flag_the_sidecar_takes_with_the_capabilities_to_enter_pods(
    helm_env: dict[str, str], default: list[dict[str, Any]]
) -> None:
    assert xds_args(default).udp_dataplane == "envoy"
    assert container(default, "xds")["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    objs = render(helm_env, {"udp": {"dataplane": "kernel"}})
    assert xds_args(objs).udp_dataplane == "kernel"
    caps = container(objs, "xds")["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}


def test_the_mesh_domain_is_a_flag_the_sidecar_takes(helm_env: dict[str, str]) -> None:
    objs = render(helm_env, {"meshDomain": "mesh.example.org"})
    assert container(objs, "xds")["args"][-2:] == ["--mesh-domain", "mesh.example.org"]
    assert xds_args(objs).mesh_domain == "mesh.example.org"


def test_the_release_namespace_is_the_mesh_namespace(helm_env: dict[str, str]) -> None:
    objs = render(helm_env, namespace="mesh-system")
    assert find(objs, "Namespace/mesh-system")
    namespaced = [o for o in objs if o["kind"] not in CLUSTER_SCOPED]
    assert namespaced and {o["metadata"]["namespace"] for o in namespaced} == {"mesh-system"}
    for binding in ("aether-operator", "aether-node"):
        assert find(objs, f"ClusterRoleBinding/{binding}")["subjects"][0]["namespace"] == "mesh-system"
    policy = find(objs, "ValidatingAdmissionPolicy/aether-node-own-meshnode")
    assert "'system:serviceaccount:mesh-system:aether-node'" in policy["spec"]["matchConditions"][0]["expression"]


BAD = [("inbound.mode=LOOSE", "inbound/mode"), ("udp.maxSessions=0", "udp/maxSessions")]  # (value, error names)
BAD += [("certificates.dir=rel", "dir"), ("eastWestGateway.quic=maybe", "eastWestGateway/quic")]
BAD += [("udp.dataplane=ebpf", "udp/dataplane")]


@pytest.mark.parametrize(("value", "refused"), BAD)
def test_the_schema_refuses_bad_values(helm_env: dict[str, str], value: str, refused: str) -> None:
    out = helm(helm_env, "template", "aether", str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and refused in out.stderr, out.stderr


# -- on the real control plane -----------------------------------------------------------------------------------


@pytest.fixture
def cp(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    """A control plane of its own for each test (the rendered objects and a Helm release cannot share one)."""
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the chart is applied to the real server")
    tool("helm")
    plane = controlplane.start(crds=False)  # the chart's CRDs are the ones the server gets
    try:
        yield plane
    finally:
        plane.stop()


def apply(cp: controlplane.ControlPlane, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(
        "apply", "--server-side", "--field-manager", "helm-render", "-f", "-", *extra, input=manifest, check=False
    )


def test_the_rendered_chart_is_accepted_by_the_server(cp: controlplane.ControlPlane, helm_env: dict[str, str]) -> None:
    manifest = template(helm_env)
    dry = apply(cp, manifest, "--dry-run=server")  # on a new cluster: nothing namespaced can be checked before its
    assert dry.returncode != 0 and f'namespaces "{NS}" not found' in dry.stderr, dry.stderr  # namespace exists
    namespace = yaml.safe_dump(find(objects(manifest), f"Namespace/{NS}"))
    assert apply(cp, namespace).returncode == 0
    dry = apply(cp, manifest, "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    out = apply(cp, manifest)
    assert out.returncode == 0, out.stderr
    applied = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    assert len(applied) == len(objects(manifest)), out.stdout
    assert {"deployment.apps/aether-operator", "daemonset.apps/aether-node"} <= applied, applied
    policy = json.loads(cp.kubectl("get", "validatingadmissionpolicy", "aether-node-own-meshnode", "-o", "json").stdout)
    assert (policy.get("status") or {}).get("typeChecking", {}).get("expressionWarnings") in (None, []), policy
    crd = json.loads(cp.kubectl("get", "crd", "meshnodes.mesh.aether.dev", "-o", "json").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # non-default values are accepted too (the certificates' hostPath volume, the PERMISSIVE entry, the UDP flags)
    values = ["--set-json", json.dumps(NON_DEFAULT)]
    dry = apply(cp, template(helm_env, *values), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr


def doc_commands() -> list[str]:
    """The commands of docs/operations.md's "Install with Helm" block (continued lines joined, comments left out)."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("### Install with Helm\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return [line for line in lines if not line.lstrip().startswith("#")]


def test_the_documented_install_commands_run(cp: controlplane.ControlPlane, helm_env: dict[str, str]) -> None:
    commands = doc_commands()
    verbs = [shlex.split(c)[:2] for c in commands]
    assert verbs == [["helm", "install"], ["helm", "status"], ["helm", "upgrade"], ["helm", "uninstall"]], commands
    env = helm_env | {"KUBECONFIG": str(cp.kubeconfig_path), "PATH": f"{binaries.bin_dir()}:{os.environ['PATH']}"}
    for command, (_, verb) in zip(commands, verbs, strict=True):
        out = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, f"{command}\n{out.stderr}{out.stdout}"
        if verb == "install":
            ds = json.loads(cp.kubectl("get", "daemonset", "aether-node", "-n", NS, "-o", "json").stdout)
            assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/aether-node:0.1.0"
            namespace = json.loads(cp.kubectl("get", "namespace", NS, "-o", "json").stdout)
            assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        if verb == "upgrade":
            ds = json.loads(cp.kubectl("get", "daemonset", "aether-node", "-n", NS, "-o", "json").stdout)
            cni = ds["spec"]["template"]["spec"]["initContainers"][0]
            assert {"name": "AETHER_MESH_SOURCES", "value": "10.0.0.0/16"} in cni["env"]
            assert cni["image"] == "registry.example/aether-node:0.1.0"  # --reuse-values kept the images
    assert json.loads(helm(env, "list", "--all-namespaces", "--output", "json").stdout) == []
    kept = cp.kubectl("get", "crd", "-o", "name").stdout.split()
    assert {f"customresourcedefinition.apiextensions.k8s.io/{n}.mesh.aether.dev" for n in MESH_CRDS} <= set(kept)
    assert cp.kubectl("get", "clusterrole", "aether-node", check=False).returncode != 0  # the rest is gone
