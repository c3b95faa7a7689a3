"""The CNI plugin: the pure request parser, then the real `aether-cni` script against real network namespaces.

Every bad invocation must answer a CNI error object on stdout (cniVersion, code, msg, details), exit non-zero and
leave the pod netns untouched (no nft table, no ip rule, no route) and no record behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aether.netns import cni, cni_request
from aether.netns import install as inst
from aether.netns import rules as nftrules
from aether.netns.cni_request import CniError, Command, parse_request
from aether.netns.contract import CAPTURE_ROUTE_TABLE, CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import check_capture
from aether.netns.records import load_records, read_record
from aether.testing.netlab import Lab, Pod, sh

CNI_BIN = str(Path(sys.executable).parent / "aether-cni")
UID = "6f1c0c7e-1111-4e5b-9d1a-000000000001"
PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
    "ips": [{"address": "10.200.1.2/32", "gateway": "169.254.1.1", "interface": 0}],
    "routes": [{"dst": "0.0.0.0/0"}],
}


# what ADD installs for PREV by default: STRICT, the pod's gateway as the one mesh source
STRICT_HERE = InboundPolicy(InboundMode.STRICT, ("169.254.1.1",))


def conf(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"cniVersion": "1.0.0", "name": "aether-net", "type": "aether-cni", "prevResult": PREV}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def env(netns: str, command: str = "ADD", **over: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee01",
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=client-0;K8S_POD_UID={UID}",
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


# -- pure ---------------------------------------------------------------------------------------------------------


def test_parse_good_add() -> None:
    req = parse_request(env("/run/netns/p"), json.dumps(conf()).encode())
    assert req.command is Command.ADD
    assert req.pod is not None and (req.pod.namespace, req.pod.name, req.pod.uid) == ("default", "client-0", UID)
    assert req.pod_ips() == ["10.200.1.2"]
    assert req.prev_result == PREV


def test_parse_a_0_3_1_add_from_kindnet() -> None:
    """kindnet and stock Calico conflists say 0.3.1; their prevResult carries `version` on each address."""
    prev = {
        "cniVersion": "0.3.1",
        "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"version": "4", "address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
    }
    req = parse_request(env("/run/netns/p"), json.dumps(conf(cniVersion="0.3.1", prevResult=prev)).encode())
    assert req.cni_version == "0.3.1" and req.pod_ips() == ["10.244.1.5"] and req.prev_result == prev


def test_check_is_refused_before_0_4_0() -> None:
    with pytest.raises(CniError, match=r"CHECK is not defined for cniVersion 0\.3\.1") as info:
        parse_request(env("/run/netns/p", "CHECK"), json.dumps(conf(cniVersion="0.3.1")).encode())
    assert info.value.code == 1


def test_parse_del_needs_no_netns_prevresult_or_pod() -> None:
    req = parse_request(env("", "DEL", CNI_ARGS=None), json.dumps(conf(prevResult=None)).encode())
    assert req.command is Command.DEL and req.pod is None and req.netns == ""


def test_version_ignores_stdin() -> None:
    assert parse_request({"CNI_COMMAND": "VERSION"}, b"not json").command is Command.VERSION
    assert cni_request.version_result() == {
        "cniVersion": "1.0.0",
        "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"],
    }


PURE_BAD: list[tuple[str, dict[str, str], bytes, int, str]] = [
    ("bad json", env("/x"), b"{not json", 6, "not valid JSON"),
    ("not an object", env("/x"), b"[1, 2]", 6, "must be a JSON object"),
    ("not utf-8", env("/x"), b"\xff\xfe", 6, "not valid JSON"),
    (
        "wrong cniVersion",
        env("/x"),
        json.dumps(conf(cniVersion="0.2.0")).encode(),
        1,
        "cniVersion 0.2.0 is not supported",
    ),
    ("no cniVersion", env("/x"), json.dumps(conf(cniVersion=None)).encode(), 7, "no cniVersion"),
    ("no name", env("/x"), json.dumps(conf(name=None)).encode(), 7, "no 'name'"),
    ("no CNI_COMMAND", env("/x", CNI_COMMAND=None), json.dumps(conf()).encode(), 4, "CNI_COMMAND is required"),
    ("unknown command", env("/x", "FROB"), json.dumps(conf()).encode(), 4, "unknown CNI_COMMAND 'FROB'"),
    ("no CNI_NETNS", env("", "ADD"), json.dumps(conf()).encode(), 4, "CNI_NETNS is required for ADD"),
    (
        "no CNI_CONTAINERID",
        env("/x", CNI_CONTAINERID=None),
        json.dumps(conf()).encode(),
        4,
        "CNI_CONTAINERID is required",
    ),
    ("no prevResult", env("/x"), json.dumps(conf(prevResult=None)).encode(), 7, "chained plugin: ADD needs prevResult"),
    (
        "prevResult not object",
        env("/x"),
        json.dumps(conf(prevResult=[1])).encode(),
        7,
        "prevResult must be a JSON object",
    ),
    (
        "no K8S_POD_UID",
        env("/x", CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=c"),
        json.dumps(conf()).encode(),
        4,
        "CNI_ARGS lacks K8S_POD_UID",
    ),
    ("bad CNI_ARGS", env("/x", CNI_ARGS="K8S_POD_UID"), json.dumps(conf()).encode(), 4, "is not KEY=VALUE"),
    (
        "uid with a slash",
        env("/x", CNI_ARGS="K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_UID=../etc"),
        json.dumps(conf()).encode(),
        4,
        "is not a pod uid",
    ),
]


@pytest.mark.parametrize(("why", "environ", "stdin", "code", "msg"), PURE_BAD, ids=[c[0] for c in PURE_BAD])
def test_parse_bad(why: str, environ: dict[str, str], stdin: bytes, code: int, msg: str) -> None:
    with pytest.raises(CniError) as info:
        parse_request(environ, stdin)
    assert info.value.code == code
    assert msg in info.value.msg
    out = info.value.to_json()
    assert set(out) == {"cniVersion", "code", "msg", "details"}


# -- against real namespaces --------------------------------------------------------------------------------------


def run_cni(environ: dict[str, str], stdin: bytes, state: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [CNI_BIN],
        input=stdin,
        capture_output=True,
        env={"PATH": os.environ.get("PATH", ""), "AETHER_STATE_DIR": str(state), **environ},
        timeout=60,
    )
    return proc.returncode, proc.stdout.decode()


def untouched(pod: Pod) -> bool:
    tables = json.loads(sh("nft", "-j", "list", "tables", netns=pod.netns))["nftables"]
    rules = json.loads(sh("ip", "-j", "rule", "show", netns=pod.netns))
    routes = sh("ip", "route", "show", "table", str(CAPTURE_ROUTE_TABLE), netns=pod.netns, check=False)
    return (
        not any("table" in t for t in tables)
        and not any(r.get("priority") == 100 for r in rules)
        and not routes.strip()
    )


@pytest.fixture
def pod(lab: Lab) -> Pod:
    node = lab.add_node("n")
    return lab.add_pod(node, "p", "10.200.1.2")


def assert_cni_error(code: int, out: str, want_code: int, want_msg: str) -> dict[str, Any]:
    assert code != 0
    err = json.loads(out)
    assert set(err) == {"cniVersion", "code", "msg", "details"}, err
    assert err["code"] == want_code, err
    assert want_msg in err["msg"], err
    return dict(err)


@pytest.mark.privileged
def test_script_bad_inputs_leave_the_netns_untouched(pod: Pod, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    good = json.dumps(conf()).encode()
    cases: list[tuple[dict[str, str], bytes, int, str]] = [
        (env(pod.path), b"{oops", 6, "not valid JSON"),
        (env(pod.path), json.dumps(conf(cniVersion="2.0.0")).encode(), 1, "cniVersion 2.0.0 is not supported"),
        (env("", "ADD"), good, 4, "CNI_NETNS is required"),
        (env(str(plain)), good, 4, "is not a network namespace"),
        (env("/proc/self/ns/mnt"), good, 4, "is not a network namespace"),
        (env(str(tmp_path / "gone")), good, 3, "does not exist"),
        (env(pod.path, "ADDD"), good, 4, "unknown CNI_COMMAND"),
        (env(pod.path), json.dumps(conf(prevResult=None)).encode(), 7, "needs prevResult"),
        (env(pod.path, CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=c"), good, 4, "lacks K8S_POD_UID"),
        (env(pod.path, CNI_IFNAME=None), good, 4, "CNI_IFNAME is required"),
        (env(pod.path, "CHECK"), good, 101, "drifted"),  # CHECK before any ADD: nothing is installed
    ]
    state = tmp_path / "state"
    for environ, stdin, want_code, want_msg in cases:
        code, out = run_cni(environ, stdin, state)
        assert_cni_error(code, out, want_code, want_msg)
        assert untouched(pod), (environ, want_msg)
        assert not state.exists() or not list(state.iterdir())


@pytest.mark.privileged
def test_add_check_del_with_the_script(pod: Pod, tmp_path: Path) -> None:
    state = tmp_path / "pods"
    stdin = json.dumps(conf()).encode()
    code, out = run_cni(env(pod.path), stdin, state)
    assert code == 0, out
    assert json.loads(out) == PREV  # prevResult, unchanged
    check_capture(pod.path, inbound=STRICT_HERE)
    rec = read_record(state / f"{UID}.json")  # the pydantic model accepts what the stdlib writer wrote
    assert (rec.uid, rec.namespace, rec.name, rec.netns, rec.ips) == (
        UID,
        "default",
        "client-0",
        pod.path,
        ["10.200.1.2"],
    )
    assert (rec.container_id, rec.ifname) == ("c0ffee01", "eth0")
    assert list(load_records(state)) == [UID]
    # ADD again (runtime retry): still one copy
    assert run_cni(env(pod.path), stdin, state)[0] == 0
    check_capture(pod.path, inbound=STRICT_HERE)
    assert run_cni(env(pod.path, "CHECK"), stdin, state) == (0, "")
    # drift: a rule deleted by hand
    sh("ip", "rule", "del", "pref", "100", netns=pod.netns)
    err = assert_cni_error(*run_cni(env(pod.path, "CHECK"), stdin, state), 101, "drifted")
    assert "missing ip rule" in err["details"]
    assert run_cni(env(pod.path), stdin, state)[0] == 0
    # CHECK sees a record of another container
    assert_cni_error(*run_cni(env(pod.path, "CHECK", CNI_CONTAINERID="other"), stdin, state), 102, "does not match")
    # DEL of another (older) sandbox of the same pod keeps this one's record
    assert run_cni(env("", "DEL", CNI_CONTAINERID="older"), stdin, state) == (0, "")
    assert (state / f"{UID}.json").exists()
    # DEL, twice
    assert run_cni(env(pod.path, "DEL"), stdin, state) == (0, "")
    assert untouched(pod) and not (state / f"{UID}.json").exists()
    assert run_cni(env(pod.path, "DEL"), stdin, state) == (0, "")


@pytest.mark.privileged
def test_del_tolerates_a_vanished_netns_and_missing_pod_args(lab: Lab, tmp_path: Path) -> None:
    node = lab.add_node("n")
    pod = lab.add_pod(node, "gone", "10.200.1.3")
    state = tmp_path / "pods"
    stdin = json.dumps(conf()).encode()
    assert run_cni(env(pod.path), stdin, state)[0] == 0
    sh("ip", "netns", "del", pod.netns)
    # no CNI_ARGS: the record is found by container id
    assert run_cni(env(pod.path, "DEL", CNI_ARGS=None), json.dumps(conf(prevResult=None)).encode(), state) == (0, "")
    assert list(state.iterdir()) == []
    assert run_cni(env(pod.path, "DEL"), stdin, state) == (0, "")
    assert run_cni(env("", "DEL"), stdin, state) == (0, "")


@pytest.mark.privileged
def test_version_with_the_script(tmp_path: Path) -> None:
    code, out = run_cni({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}', tmp_path)
    assert code == 0 and json.loads(out)["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]


@pytest.mark.privileged
def test_failed_add_leaves_nothing_when_nft_rejects(pod: Pod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def counter_after_mark(mode: CaptureMode, ports: Any = None, inbound: Any = None) -> dict[str, Any]:
        rs = nftrules.build_ruleset(CaptureMode.REDIRECT)
        for cmd in rs["nftables"]:
            if "rule" in cmd["add"]:
                cmd["add"]["rule"]["expr"].append({"counter": None})
        return rs

    monkeypatch.setattr(inst, "build_ruleset", counter_after_mark)
    code, out = cni.invoke(env(pod.path), json.dumps(conf()).encode(), tmp_path / "pods")
    assert_cni_error(code, out, 100, "installing the capture")
    assert untouched(pod) and not (tmp_path / "pods").exists()


@pytest.mark.privileged
def test_failed_record_write_removes_the_capture(pod: Pod, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    code, out = run_cni(env(pod.path), json.dumps(conf()).encode(), blocker)
    assert_cni_error(code, out, 102, "capture removed again")
    assert untouched(pod)


def _policy(**over: Any) -> InboundPolicy:
    return parse_request(env("/run/netns/p"), json.dumps(conf(**over)).encode()).inbound_policy()


def test_inbound_policy_strict_by_default_with_the_gateway_as_mesh_source() -> None:
    assert _policy() == STRICT_HERE
    both = _policy(meshSources=["10.199.0.0/24", "169.254.1.1"])
    assert both == InboundPolicy(InboundMode.STRICT, ("10.199.0.0/24", "169.254.1.1"))


def test_inbound_policy_from_the_pod_annotation_then_the_entry() -> None:
    annotated = {"io.kubernetes.cri.pod-annotations": {"mesh.aether.dev/inbound": "PERMISSIVE"}}
    assert _policy(runtimeConfig=annotated).mode is InboundMode.PERMISSIVE
    assert _policy(inbound="permissive").mode is InboundMode.PERMISSIVE
    # the pod's annotation wins over the node-wide default, both ways
    strict_pod = {"io.kubernetes.cri.pod-annotations": {"mesh.aether.dev/inbound": "strict"}}
    assert _policy(inbound="permissive", runtimeConfig=strict_pod).mode is InboundMode.STRICT
    assert _policy(runtimeConfig={"io.kubernetes.cri.pod-annotations": {"other": "x"}}).mode is InboundMode.STRICT


def test_an_unknown_inbound_value_fails_the_add(pod: Pod, tmp_path: Path) -> None:
    typo = {"io.kubernetes.cri.pod-annotations": {"mesh.aether.dev/inbound": "permisive"}}
    code, out = run_cni(env(pod.path), json.dumps(conf(runtimeConfig=typo)).encode(), tmp_path)
    err = assert_cni_error(code, out, 7, "pod annotation mesh.aether.dev/inbound is 'permisive'")
    assert "strict, permissive" in err["details"]
    code, out = run_cni(env(pod.path), json.dumps(conf(meshSources="10.0.0.0/8")).encode(), tmp_path)
    assert_cni_error(code, out, 7, "'meshSources' must be a list")


def test_add_permissive_installs_no_inbound_chain(pod: Pod, tmp_path: Path) -> None:
    stdin = json.dumps(conf(inbound="permissive")).encode()
    assert run_cni(env(pod.path), stdin, tmp_path)[0] == 0
    # the capture and the egress source check, no inbound_in chain
    check_capture(pod.path, inbound=InboundPolicy(InboundMode.PERMISSIVE))
    assert run_cni(env(pod.path, "CHECK"), stdin, tmp_path) == (0, "")
    # CHECK with the STRICT default sees the missing enforcement as drift
    err = assert_cni_error(*run_cni(env(pod.path, "CHECK"), json.dumps(conf()).encode(), tmp_path), 101, "drifted")
    assert "missing chain 'inbound_in'" in err["details"]


# -- a dual-stack pod (issue 27) -----------------------------------------------------------------------------
PREV6 = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
    "ips": [
        {"address": "10.200.1.2/32", "gateway": "169.254.1.1", "interface": 0},
        {"address": "fd00:200:1::2/128", "gateway": "fe80::1", "interface": 0},
    ],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
}
SOURCES = ["10.250.0.0/16", "fd00:250::/64"]
STRICT6 = InboundPolicy(InboundMode.STRICT, (*SOURCES, "169.254.1.1"))


def conf6(**over: Any) -> dict[str, Any]:
    base = {"cniVersion": "1.0.0", "name": "aether-net", "type": "aether-cni", "prevResult": PREV6}
    return {**base, "meshSources": SOURCES, **over}


def test_a_link_local_ipv6_gateway_is_not_a_mesh_source() -> None:
    policy = parse_request(env("/run/netns/p"), json.dumps(conf6()).encode()).inbound_policy()
    assert policy == STRICT6
    global_gw = json.loads(json.dumps(PREV6))
    global_gw["ips"][1]["gateway"] = "fd00:200:1::1"
    policy = parse_request(env("/run/netns/p"), json.dumps(conf6(prevResult=global_gw)).encode()).inbound_policy()
    assert policy.mesh_sources == (*SOURCES, "169.254.1.1", "fd00:200:1::1")


@pytest.mark.privileged
def test_add_check_del_on_a_dual_stack_pod(lab: Lab, tmp_path: Path) -> None:
    """A dual-stack pod: both families' divert routing, both addresses in the record, the mesh sources of both
    families (not the link-local IPv6 gateway), CHECK finding an IPv6 drift alone, DEL removing both."""
    pod = lab.add_pod(lab.add_node("n"), "p", "10.200.1.2", ip6="fd00:200:1::2")
    state = tmp_path / "pods"
    stdin = json.dumps(conf6()).encode()
    code, out = run_cni(env(pod.path), stdin, state)
    assert code == 0, out
    check_capture(pod.path, inbound=STRICT6)
    assert read_record(state / f"{UID}.json").ips == ["10.200.1.2", "fd00:200:1::2"]
    inbound = sh("nft", "list", "chain", "inet", "aether", "inbound_in", netns=pod.netns)
    assert "ip6 saddr fd00:250::/64" in inbound and "fe80::1" not in inbound
    assert run_cni(env(pod.path, "CHECK"), stdin, state) == (0, "")
    sh("ip", "-6", "rule", "del", "pref", "100", netns=pod.netns)
    err = assert_cni_error(*run_cni(env(pod.path, "CHECK"), stdin, state), 101, "drifted")
    assert "missing ip -6 rule" in err["details"] and "missing ip rule" not in err["details"]
    assert run_cni(env(pod.path), stdin, state)[0] == 0
    assert run_cni(env(pod.path, "DEL"), stdin, state) == (0, "")
    assert untouched(pod)
    assert sh("ip", "-6", "rule", "show", "pref", "100", netns=pod.netns).strip() == ""
    assert sh("ip", "-6", "route", "show", "table", "44657", netns=pod.netns, check=False).strip() == ""
