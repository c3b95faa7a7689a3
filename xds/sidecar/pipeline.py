"""From a node's state to the snapshot the sidecar may serve, in one pure function (`gated_snapshot`).

The steps, in order (each named below):

1. the pairs: the QUIC pairs to build twins for replace the node's `status.quic.pairs` (the sidecar passes the pair
   machine's published pairs; `aether xds render` keeps the file's);
2. refuse arms: one arm no pod could be served by correctly is removed, the rest kept (`gates.refuse.refuse_arms`);
3. translate (`translate.compose.translate`), with the MeshAuthorizationPolicies in force in the options;
4. refuse listeners: one listener a gate names is removed, the rest kept (`gates.refuse.refuse_listeners`);
5. gates: whatever is still wrong refuses the whole state (`gates.core.run_gates`);
6. secrets: the SDS secrets the resources reference, then the east-west gates (`SecretKeeper.finish`), when the
   sidecar serves them.

`Gated.failures` empty: `Gated.resources` may be served. What it does not do is the sidecar's: the pair machine,
the cache, the Programmed condition (loop.py, programmed.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aether.api.meshnode import MeshNode, QuicPair
from aether.netns.records import PodRecord
from aether.xds.gates.core import GateFailure, PathExists, run_gates
from aether.xds.gates.refuse import refuse_arms, refuse_listeners
from aether.xds.resources import Resources, TranslateOptions
from aether.xds.translate.compose import translate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from aether.xds.sidecar.secrets import SecretKeeper


@dataclass(frozen=True)
class Gated:
    """What one pass made of a state."""

    node: MeshNode  # as translated: the pairs in, the refused arms out
    resources: Resources  # to serve when `failures` is empty
    refused: list[GateFailure]  # removed alone (arms, then listeners): the rest is served
    failures: list[GateFailure]  # what refuses the whole state


def with_pairs(node: MeshNode, pairs: Sequence[QuicPair] | None) -> MeshNode:
    """`node` with `pairs` as its status.quic.pairs (the builders make twins for those only); None: as it is."""
    if pairs is None:
        return node
    quic = node.status.quic.model_copy(update={"pairs": list(pairs)})
    return node.model_copy(update={"status": node.status.model_copy(update={"quic": quic})})


def gated_snapshot(
    node: MeshNode,
    records: Mapping[str, PodRecord],
    options: TranslateOptions,
    pairs: Sequence[QuicPair] | None = None,
    *,
    path_exists: PathExists = os.path.exists,
    secrets: SecretKeeper | None = None,
) -> Gated:
    """The resources for (node, records, the policies in `options.authorization`, `pairs`), with what our gates
    refused: one bad arm or listener alone, or the whole state."""
    node, refused = refuse_arms(with_pairs(node, pairs))
    resources, dropped = refuse_listeners(translate(node, records, options), path_exists)
    failures = run_gates(node, resources, path_exists)
    if not failures and secrets is not None:
        resources, failures = secrets.finish(node, records, options, resources)
    return Gated(node, resources, [*refused, *dropped], failures)
