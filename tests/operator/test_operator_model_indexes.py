"""The reconcile model's indexes hold what is live (issue 28, the operator's RSS slope in the soak): pods roll with
labels of their own (a pod-template hash, a per-pod label) and EndpointSlices come and go with generated names, and
a key whose last name left stayed in its index as an empty set, one per roll, for the life of the operator."""

from __future__ import annotations

from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import PodView, SliceView


def _pod(i: int) -> PodView:
    labels = frozenset({("app", "web"), ("pod-template-hash", f"h{i}"), ("pod", f"web-{i}")})
    return PodView(f"u{i}", "shop", f"web-{i}", "node-a", f"10.200.0.{i % 250 + 1}", "web", "Running", False, labels)


def test_pod_rolls_and_slice_churn_leave_no_empty_index_entries() -> None:
    model = ClusterModel()
    for i in range(300):  # a roll per step: the new pod, then the old one leaves; its slice with it
        model.apply("pod", ("shop", f"web-{i}"), _pod(i))
        model.apply("slice", ("shop", f"web-{i}"), SliceView("shop", f"web-{i}", f"svc-{i}", (), ()))
        if i >= 3:
            model.apply("pod", ("shop", f"web-{i - 3}"), None)
            model.apply("slice", ("shop", f"web-{i - 3}"), None)
    live = {("shop", "app", "web")} | {("shop", k, v) for i in range(297, 300) for k, v in _pod(i).labels}
    assert set(model.pods_by_label) == live, f"{len(model.pods_by_label)} label keys for 3 live pods"
    assert model.pods_by_label[("shop", "app", "web")] == {"web-297", "web-298", "web-299"}
    assert set(model.slices_by_service) == {("shop", f"svc-{i}") for i in range(297, 300)}
