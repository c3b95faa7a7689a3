"""A delta-ADS client that speaks like Envoy 1.40 (no Envoy): tests of the server and of the sidecar's hooks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2


class Client:
    def __init__(self, port: int, node: str = "node-a") -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.out: queue.Queue[discovery_pb2.DeltaDiscoveryRequest | None] = queue.Queue()
        self.node = node
        self.first = True
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.responses = stub.DeltaAggregatedResources(self._requests())
        self.inbox: queue.Queue[discovery_pb2.DeltaDiscoveryResponse] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[discovery_pb2.DeltaDiscoveryRequest]:
        while (req := self.out.get()) is not None:
            yield req

    def _read(self) -> None:
        try:
            for resp in self.responses:
                self.inbox.put(resp)
        except grpc.RpcError:
            pass

    def send(self, type_url: str, **kw: object) -> None:
        req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, **kw)
        if self.first:
            req.node.CopyFrom(base_pb2.Node(id=self.node))
            self.first = False
        self.out.put(req)

    def recv(self, timeout: float = 10.0) -> discovery_pb2.DeltaDiscoveryResponse:
        return self.inbox.get(timeout=timeout)

    def nothing(self, wait: float = 0.5) -> bool:
        try:
            self.inbox.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.out.put(None)
        self.channel.close()
