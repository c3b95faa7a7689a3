"""A parentRef that looks meant for a mesh Service but is not one of ours gets a hint: a Warning Event on the route
(reason NotAServiceParent), and never a status.parents entry under our controllerName (the Gateway API: status is
only for the parents a controller is responsible for). A Gateway parent of another name stays silent."""

from __future__ import annotations

from functools import partial
from typing import Any

from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, unique
from aether.testing.wait import wait_for

REASON = "NotAServiceParent"


def route(ns: str, name: str, parent: dict[str, Any]) -> dict[str, Any]:
    r = o.udproute(ns, name, "front", [o.backend("front", 53)], version="v1")
    r["spec"]["parentRefs"] = [parent]
    return r


def hints(k: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    events = k.res("v1", "Event").get(namespace=ns).to_dict()["items"]
    return [e for e in events if e["involvedObject"]["name"] == name and e["reason"] == REASON]


def ours(k: Cluster, ns: str, name: str) -> list[Any]:
    parents = ((k.route(ns, name, "v1") or {}).get("status") or {}).get("parents") or []
    return [p for p in parents if p.get("controllerName") == CONTROLLER_NAME]


def test_near_miss_parent_refs_get_a_warning_event_and_no_status(cluster: Cluster) -> None:
    ns = unique("hint")
    cluster.apply(o.namespace(ns))
    cluster.apply(o.service(ns, "front", None, [("dns", 53, "UDP")]))
    cases = {
        "no-group": ({"kind": "Service", "name": "front"}, 'group: ""'),  # the CRD defaults the group
        "gateway-named-like-a-service": ({"name": "front"}, "mesh Service"),  # kind and group defaulted
    }
    for name, (parent, _) in cases.items():
        cluster.apply(route(ns, name, parent))
    cluster.apply(route(ns, "a-real-gateway", {"name": "some-gateway"}))  # another controller's: silent
    stored = (cluster.route(ns, "no-group", "v1") or {})["spec"]["parentRefs"][0]
    assert stored["group"] == "gateway.networking.k8s.io"  # what the user did not see they wrote
    for name, (_, words) in cases.items():
        found = wait_for(partial(hints, cluster, ns, name), what=f"{name}: a hint Event", ignore=READ_ERRORS)
        assert found[0]["type"] == "Warning" and words in found[0]["message"]
        assert ours(cluster, ns, name) == []
    assert hints(cluster, ns, "a-real-gateway") == [] and ours(cluster, ns, "a-real-gateway") == []
