"""The in-kernel UDP path's nft transactions in nft's own text syntax, rendered from the JSON the builder and the diff
make: what `KernelUdpKernel` hands libnftables.

Why text: libnftables 1.0.6 (the nft on these machines) drops a `ct timeout` object's `policy` when the object comes
in JSON (it loads with `policy = { }`, so the kernel's default UDP timeouts apply), while the same object in text
loads with its policy (measured here, `nft list ct timeout`). The JSON form stays the builder's and the tests'
(goldens, canonical read-back: nft's JSON *output* does show the policy); only the input to the kernel is text, in
one buffer, which nft still applies as one transaction. The renderer covers exactly the vocabulary the builder
uses and raises on anything else.
"""

from __future__ import annotations

from typing import Any

from aether.netns.kernel_udp import Json
from aether.netns.rules import RulesetError


def _expr(e: Any) -> str:
    if isinstance(e, bool):
        raise RulesetError(f"no nft text for {e!r}")
    if isinstance(e, int):
        return str(e)
    if isinstance(e, str):
        return e
    if "payload" in e:
        return f"{e['payload']['protocol']} {e['payload']['field']}"
    if "meta" in e:
        return f"meta {e['meta']['key']}"
    if "ct" in e:
        return f"ct {e['ct']['dir']} {e['ct']['key']}"
    if "numgen" in e:
        return f"numgen {e['numgen']['mode']} mod {e['numgen']['mod']}"
    if "concat" in e:
        return " . ".join(_expr(x) for x in e["concat"])
    if "range" in e:
        return f"{e['range'][0]}-{e['range'][1]}"
    raise RulesetError(f"no nft text for expression {e!r}")


def _verdict(v: Json) -> str:
    if "goto" in v:
        return f"goto {v['goto']['target']}"
    if "drop" in v:
        return "drop"
    raise RulesetError(f"no nft text for verdict {v!r}")


def _map_data(data: Any) -> str:
    if isinstance(data, str):
        return data
    return "{ " + ", ".join(f"{_expr(k)} : {_verdict(v)}" for k, v in data["set"]) + " }"


def _dnat(d: Json) -> str:
    addr = d["addr"]
    return f"dnat to [{addr}]:{d['port']}" if ":" in addr else f"dnat to {addr}:{d['port']}"


def _stmt(s: Json) -> str:
    if "match" in s:
        m = s["match"]
        if m["op"] != "==":
            raise RulesetError(f"no nft text for {m!r}")
        right = m["right"]
        return f"{_expr(m['left'])} {right:#x}" if isinstance(right, int) else f"{_expr(m['left'])} {right}"
    if "counter" in s:
        c = s["counter"]  # anonymous: {"packets", "bytes"}, or None in the canonical form
        named = isinstance(c, dict) and "map" in c
        return f"counter name {_expr(c['map']['key'])} map {c['map']['data']}" if named else "counter"
    if "mangle" in s:
        return f"{_expr(s['mangle']['key'])} set {s['mangle']['value']:#x}"
    if "vmap" in s:
        return f"{_expr(s['vmap']['key'])} vmap {_map_data(s['vmap']['data'])}"
    if "dnat" in s:
        return _dnat(s["dnat"])
    if "ct timeout" in s:
        return f'ct timeout set "{s["ct timeout"]}"'
    return _verdict(s)


def _element(body: Json, with_values: bool) -> str:
    parts = []
    for e in body["elem"]:
        if isinstance(e, list) and with_values:
            value = e[1]
            data = f'"{value}"' if isinstance(value, str) else _verdict(value)
            parts.append(f"{_expr(e[0])} : {data}")
        else:
            parts.append(_expr(e))
    return "{ " + ", ".join(parts) + " }"


def _object(op: str, kind: str, b: Json) -> str:
    where = f"{b['family']} {b.get('table', b.get('name'))}"
    if kind == "table":
        return f"{op} table {b['family']} {b['name']}"
    if kind == "rule":
        return f"{op} rule {where} {b['chain']} " + " ".join(_stmt(s) for s in b["expr"])
    head = f"{op} {kind} {where} {b['name']}"
    if op != "add":
        return head + (f" {_element(b, False)}" if kind == "element" else "")
    if kind == "element":
        return f"{head} {_element(b, True)}"
    if kind in ("set", "map"):
        data = f" : {b['map']}" if kind == "map" else ""
        return f"{head} {{ type {' . '.join(b['type'])}{data}; }}"
    if kind == "chain" and "hook" in b:
        return f"{head} {{ type {b['type']} hook {b['hook']} priority {b['prio']}; policy {b['policy']}; }}"
    if kind == "ct timeout":
        policy = ", ".join(f"{k} : {v}" for k, v in b["policy"].items())
        return f"{head} {{ protocol {b['protocol']}; l3proto {b['l3proto']}; policy = {{ {policy} }}; }}"
    if kind in ("chain", "counter"):
        return head
    raise RulesetError(f"no nft text for {kind} {b!r}")


def to_text(command: Json) -> str:
    """`{"nftables": [{"add"|"delete"|"flush": {kind: body}}, ...]}` as nft text, one command a line."""
    lines = []
    for item in command["nftables"]:
        ((op, obj),) = item.items()
        ((kind, body),) = obj.items()
        if op not in ("add", "delete", "flush"):
            raise RulesetError(f"no nft text for {op!r}")
        lines.append(_object(op, kind, body))
    return "\n".join(lines) + "\n"
