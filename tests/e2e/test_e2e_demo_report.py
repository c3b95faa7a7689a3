"""The demo's tables (pure): what counts as the expected answer, and what a row says."""

from __future__ import annotations

from aether.e2e.demo_report import (
    AccessRow,
    IdentityRow,
    PairRow,
    Row,
    access_table,
    identity_table,
    keep_instructions,
    pair_table,
    split_ok,
    split_table,
    table,
)
from aether.testing.probe import Answer, HttpAnswer

VIP = "10.96.77.10"


def test_a_row_is_ok_only_when_the_expected_backend_answers_from_the_vip() -> None:
    assert Row("c", "s", Answer(VIP, "echo-a", (VIP, 18082)), "echo-a").ok
    assert not Row("c", "s", Answer(VIP, "echo-b", (VIP, 18082)), "echo-a").ok  # wrong backend
    assert not Row("c", "s", Answer(VIP, "echo-a", ("10.200.1.4", 5353)), "echo-a").ok  # reply not from VIP:18082
    assert not Row("c", "s", Answer(VIP, None, None), "echo-a").ok
    assert Row("c", "s", Answer(VIP, None, None), None).ok  # the negative control expects silence
    assert not Row("c", "s", Answer(VIP, "echo-a", (VIP, 18082)), None).ok


def test_table_shows_backend_source_and_changes() -> None:
    rows = [
        Row(
            "demo/client", "demo/bravo", Answer(VIP, "echo-charlie", (VIP, 18082)), "echo-charlie", before="echo-bravo"
        ),
        Row("demo/client", "demo/alpha", Answer(VIP, "echo-b", (VIP, 18082)), "echo-alpha"),
        Row("demo/client-redirect", "demo/alpha", Answer(VIP, None, None), None),
    ]
    lines = table(rows).splitlines()
    assert lines[0].split() == ["client", "pod", "dials", "service", "VIP:port", "answered", "by", "reply", "from"]
    assert set(lines[1].strip()) <= {"-", " "}
    assert lines[2].split() == [
        "demo/client",
        "demo/bravo",
        f"{VIP}:18082",
        "echo-charlie",
        f"{VIP}:18082",
        "as",
        "expected",
        "(was",
        "echo-bravo)",
    ]
    assert lines[3].split()[-1] == "UNEXPECTED"
    assert lines[4].split() == [
        "demo/client-redirect",
        "demo/alpha",
        f"{VIP}:18082",
        "no",
        "reply",
        "-",
        "as",
        "expected",
    ]


def test_keep_instructions_name_the_kubeconfig_and_a_datagram_command() -> None:
    text = keep_instructions("/tmp/x/kubeconfig", "ae1234-client", VIP, "/venv/bin/python", "/venv/bin/aether")
    assert "export KUBECONFIG=/tmp/x/kubeconfig" in text and "kubectl get meshnodes" in text
    assert "ip netns exec ae1234-client /venv/bin/python -c" in text and f"('{VIP}', 18082)" in text
    assert "Ctrl-C" in text


def test_an_identity_row_needs_the_sources_own_id_over_http3() -> None:
    sid = "spiffe://cluster.local/ns/demo/sa/client"
    good = HttpAnswer(200, "web-0", sid)
    assert IdentityRow("demo/client", "web", good, sid, "quic:demo/web@client", over_http3=True).ok
    assert not IdentityRow("demo/client", "web", good, sid, "quic:demo/web@client", over_http3=False).ok  # h2
    other = HttpAnswer(200, "web-0", "spiffe://cluster.local/ns/demo/sa/reporter")
    assert not IdentityRow("demo/client", "web", other, sid, "quic:demo/web@client", over_http3=True).ok  # leak
    assert not IdentityRow("demo/client", "web", HttpAnswer(503, None, None), sid, "t", over_http3=True).ok
    text = identity_table([IdentityRow("demo/client", "web", good, sid, "quic:demo/web@client", over_http3=True)])
    assert text.splitlines()[2].split() == [
        "demo/client",
        "web",
        "web-0",
        "(200)",
        "quic:demo/web@client",
        "HTTP/3",
        sid,
        "as",
        "expected",
    ]


def test_access_rows_expect_the_status_and_say_what_decided() -> None:
    sid = "spiffe://cluster.local/ns/demo/sa/client"
    rows = [
        AccessRow("demo/reporter", "10.200.1.9:8080 directly", HttpAnswer(None, None, None), None, "STRICT"),
        AccessRow("demo/client", "web (mesh)", HttpAnswer(200, "web-0", sid), 200, "allowed by web-callers"),
        AccessRow("demo/reporter", "web (mesh)", HttpAnswer(403, None, None), 403, "not in web-callers: RBAC"),
        AccessRow("demo/reporter", "10.200.1.9:8080 directly", HttpAnswer(200, "web-0", None), None, "STRICT"),
    ]
    assert [r.ok for r in rows] == [True, True, True, False]  # a direct call that answers is the failure
    lines = access_table(rows).splitlines()
    assert lines[2].split()[-4:] == ["answer", "STRICT", "as", "expected"]
    assert f"200 (app saw {sid})" in lines[3] and lines[4].split()[3] == "403"
    assert lines[5].endswith("UNEXPECTED")


def test_a_pair_row_is_ok_when_expected_admitted_on_evidence_and_not_dormant() -> None:
    sid = "spiffe://cluster.local/ns/demo/sa/client"
    good = PairRow(sid, "demo/web", "quic:demo/web@client", "Fetch", "Fetch", expected=True)
    assert good.ok
    assert not PairRow(sid, "demo/web", "quic:demo/web@client", "Fetch", "Fetch", expected=False).ok  # not dialled
    assert not PairRow(sid, "demo/web", "quic:demo/web@client", None, None, expected=True).ok  # no evidence
    assert not PairRow(sid, "demo/web", "quic:demo/web@client", "Fetch", "Held", True, dormant=True).ok
    text = pair_table([good])
    assert text.splitlines()[2].split() == [sid, "demo/web", "quic:demo/web@client", "Fetch", "Fetch", "as", "expected"]


def test_split_table_and_its_verdict() -> None:
    weights = {"echo-charlie": 70, "echo-alpha": 30, "echo-bravo": 0}
    assert split_ok(weights, {"echo-charlie": 140, "echo-alpha": 60}, 200)
    assert split_ok(weights, {"echo-charlie": 148, "echo-alpha": 52}, 200)  # 74/26: within 5 points
    assert not split_ok(weights, {"echo-charlie": 160, "echo-alpha": 40}, 200)  # 80/20
    assert not split_ok(weights, {"echo-charlie": 120, "echo-alpha": 60, "<no reply>": 20}, 200)  # lost sessions
    assert not split_ok(weights, {}, 0)
    lines = split_table(weights, {"echo-charlie": 140, "echo-alpha": 60}, 200).splitlines()
    assert lines[0].split() == ["backend", "weight", "expected", "sessions", "observed"]
    assert lines[2].split() == ["echo-charlie", "70", "70%", "140", "70.0%", "as", "expected"]
    assert lines[4].split() == ["echo-bravo", "0", "0%", "0", "0.0%", "as", "expected"]
    bad = split_table(weights, {"echo-charlie": 100, "<no reply>": 100}, 200)
    assert "UNEXPECTED" in bad and "<no reply>" in bad
