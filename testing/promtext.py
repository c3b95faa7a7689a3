"""Prometheus text exposition (ours on /metrics, Envoy's on /stats/prometheus), read with prometheus_client's parser.

`parse` gives one value per sample, keyed by the sample's name (`aether_x_total`, `aether_y_seconds_count`, ...)
and its labels; `value`, `by_label` and `named` look samples up; `scrape` reads a URL. The parser names a
counter's samples `<family>_total` even where the text does not (Envoy's `envoy_udp_idle_timeout` is read as
`envoy_udp_idle_timeout_total`).
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[tuple[str, Labels], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """The samples `url` serves (raises OSError while nothing answers, HTTPError on a status other than 200)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse(resp.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0.0 when there is none (a labelled counter not incremented yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def named(samples: Samples, name: str) -> Samples:
    """Every sample of `name`, whatever its labels."""
    return {key: v for key, v in samples.items() if key[0] == name}


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """`name`'s samples by the value of their `label` (e.g. a counter by `reason`)."""
    return {dict(key[1])[label]: v for key, v in named(samples, name).items() if label in dict(key[1])}
