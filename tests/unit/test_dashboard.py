# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard and the Collector configuration in deploy/ against the sidecar's own §13
catalog (`telemetry.INSTRUMENTS`).

A dashboard query that names a series the sidecar never emits shows an empty panel and no error, so
a renamed instrument or a wrong unit suffix would go unnoticed in review. This test translates every
instrument to its Prometheus names the way the Collector's `prometheus` exporter does (the rules in
docs/observability.md, after prometheus/otlptranslator) and fails on any query outside them, on a
label its instrument does not carry, and on a required area without a panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from sie_sidecar.telemetry import INSTRUMENTS

ROOT: Final = Path(__file__).resolve().parents[2]
DASHBOARD: Final = ROOT / "deploy" / "grafana" / "sie-sidecar.json"
COLLECTOR: Final = ROOT / "deploy" / "otel-collector.yaml"
DOC: Final = ROOT / "docs" / "observability.md"

#: otlptranslator's unit map (metric_namer.go `unitMap`): the OTLP unit → the Prometheus suffix word.
UNIT_WORDS: Final[Mapping[str, str]] = {
    **{"d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds"},
    **{"us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes"},
    **{"GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes"},
    **{"TBy": "terabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts"},
    **{"g": "grams", "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent"},
}
#: otlptranslator's `perUnitMap`: the unit after a `/`.
PER_UNIT_WORDS: Final[Mapping[str, str]] = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
#: Labels every series has besides its attributes: `lane` (§13) and the resource attributes the
#: Collector's `resource_to_telemetry_conversion` adds, plus the exporter's own job/instance.
COMMON_LABELS: Final = frozenset(
    {"lane", "service_name", "service_version", "deployment_environment", "cloud_region", "job", "instance"}
)
_PROMQL_KEYWORDS: Final = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"}
)
_GROUPING: Final = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR: Final = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES: Final = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[^A-Za-z0-9:]", text) if t]


def prometheus_name(name: str, kind: str, unit: str) -> str:
    """The Collector's name for one instrument (add_metric_suffixes: true; otlptranslator
    `normalizeName`): tokens joined by `_`, unit words appended unless annotated `{...}` or already
    there, `_total` for counters, `_ratio` for unit-`1` gauges."""
    tokens = _tokens(name)
    main, _, per = unit.partition("/")
    main = main.strip()
    if main and not re.search(r"[{}]", main):
        word = "_".join(_tokens(UNIT_WORDS.get(main, main)))
        if word and word not in tokens:
            tokens.append(word)
    per = per.strip()
    if per and not re.search(r"[{}]", per):
        word = "_".join(_tokens(PER_UNIT_WORDS.get(per, per)))
        if word and word not in tokens:
            tokens += ["per", word]
    if kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def series_labels() -> dict[str, frozenset[str]]:
    """Every Prometheus series name the sidecar's instruments become → the labels it carries."""
    out: dict[str, frozenset[str]] = {}
    for name, (kind, unit, attrs) in INSTRUMENTS.items():
        base = prometheus_name(name, kind, unit)
        labels = COMMON_LABELS | {a.replace(".", "_") for a in attrs}
        if kind == "histogram":
            out[f"{base}_bucket"] = labels | {"le"}
            out[f"{base}_sum"] = labels
            out[f"{base}_count"] = labels
        else:
            out[base] = labels
    return out


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression selects: identifiers that are not functions, keywords, labels
    (in matchers or grouping clauses), strings, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = _GROUPING.sub("", text)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group(0) in _PROMQL_KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries() -> Iterator[tuple[str, str, str]]:
    """(where, PromQL, legend) of every panel target and every query variable."""
    dashboard = _dashboard()
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"], target.get("legendFormat", "")
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found = _LABEL_VALUES.match(query)
            assert found, f"variable {var['name']}: only label_values(<series>, <label>) queries are used"
            yield f"${var['name']}", found.group(1), "{{" + found.group(2) + "}}"


# --- the translator itself -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "unit", "expected"),
    [
        # otlptranslator's own examples (metric_namer.go doc comments)
        ("http.server.duration", "histogram", "s", "http_server_duration_seconds"),
        ("requests.count", "counter", "1", "requests_count_total"),
        ("memory.usage", "gauge", "By", "memory_usage_bytes"),
        # the sidecar's shapes
        ("sie.worker.batch.size", "histogram", "{item}", "sie_worker_batch_size"),
        ("sie.worker.batch.fill_ratio", "gauge", "1", "sie_worker_batch_fill_ratio"),
        ("sie.worker.saturated", "gauge", "1", "sie_worker_saturated_ratio"),
        ("sie.worker.ipc.requests", "counter", "{request}", "sie_worker_ipc_requests_total"),
        (
            "sie.worker.scheduler.request_batch.total",
            "histogram",
            "s",
            "sie_worker_scheduler_request_batch_total_seconds",
        ),
        ("sie.worker.payload.size", "histogram", "By", "sie_worker_payload_size_bytes"),
        ("x.rate", "gauge", "By/s", "x_rate_bytes_per_second"),
    ],
)
def test_prometheus_names_follow_the_collectors_translator(name: str, kind: str, unit: str, expected: str) -> None:
    assert prometheus_name(name, kind, unit) == expected


def test_metric_names_skips_functions_labels_and_variables() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{lane=~"$lane", x="y{z}"}[$__rate_interval])))'
        " / on(lane) group_left b_total offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total"}
    assert grouping_labels(expr) == {"le", "method", "lane"}


# --- the dashboard ---------------------------------------------------------------------------------


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_variable() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "sie-sidecar" and 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["lane"]["type"] == variables["model"]["type"] == "query"
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert panel["targets"] and panel.get("description"), panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_every_query_names_only_series_the_sidecar_emits() -> None:
    emitted = series_labels()
    for where, expr, _ in _queries():
        names = metric_names(expr)
        assert names, f"{where}: {expr!r} selects no series"
        unknown = names - emitted.keys()
        assert not unknown, f"{where}: {sorted(unknown)} are not Prometheus names of the §13 catalog"


def test_every_label_a_query_uses_is_one_its_series_carries() -> None:
    emitted = series_labels()
    for where, expr, legend in _queries():
        for name, matchers in _SELECTOR.findall(re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
            missing = set(_MATCHER.findall(matchers)) - emitted[name]
            assert not missing, f"{where}: {name} has no label {sorted(missing)}"
        common = frozenset.intersection(*(emitted[n] for n in metric_names(expr)))
        missing = grouping_labels(expr) - common
        assert not missing, f"{where}: {expr!r} groups by {sorted(missing)}, which not every series in it has"
        legend_labels = set(re.findall(r"\{\{\s*([^}\s]+)\s*\}\}", legend))
        kept = grouping_labels(expr) if _GROUPING.search(expr) else common
        assert legend_labels <= kept, f"{where}: the legend names {sorted(legend_labels - kept)}, which the query drops"


#: The areas the dashboard must cover: each needs a panel whose queries select one of these series.
REQUIRED_AREAS: Final[Mapping[str, frozenset[str]]] = {
    "queue depth": frozenset({"sie_worker_queue_depth"}),
    "batch size": frozenset({"sie_worker_batch_size_bucket", "sie_worker_batch_size_sum"}),
    "batch fill": frozenset({"sie_worker_batch_fill_ratio"}),
    "IPC latency": frozenset({"sie_worker_ipc_request_duration_seconds_bucket"}),
    "settlement": frozenset({"sie_worker_nats_operations_total"}),
    "config": frozenset({"sie_worker_config_epoch", "sie_worker_config_degraded_ratio"}),
    "config applies": frozenset({"sie_worker_config_applies_total"}),
    "result transport": frozenset({"sie_worker_result_transport_attempts_total"}),
    "payload fetches": frozenset({"sie_worker_payload_fetches_total"}),
    "shutdown drain": frozenset({"sie_worker_shutdown_drain_duration_seconds_count"}),
}


def test_the_dashboard_covers_the_required_areas() -> None:
    by_panel: dict[str, set[str]] = {}
    for where, expr, _ in _queries():
        by_panel.setdefault(where, set()).update(metric_names(expr))
    for area, wanted in REQUIRED_AREAS.items():
        assert any(names & wanted for names in by_panel.values()), f"no panel for {area}"
    latency = [e for _, e, _ in _queries() if "sie_worker_ipc_request_duration_seconds_bucket" in metric_names(e)]
    quantiles = {m for e in latency for m in re.findall(r"histogram_quantile\(\s*([0-9.]+)", e)}
    assert {"0.5", "0.99"} <= quantiles, "IPC latency shows p50 and p99"


# --- the doc's catalog table and the Collector configuration ---------------------------------------


def _doc_catalog() -> dict[str, tuple[str, str, tuple[str, ...], str]]:
    text = DOC.read_text()
    header = "| instrument | kind | unit | attributes | Prometheus name |"
    assert header in text, "docs/observability.md has the catalog table"
    rows: dict[str, tuple[str, str, tuple[str, ...], str]] = {}
    for line in text[text.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, kind, unit, attrs, prom = (c.strip() for c in line.strip().strip("|").split("|"))
        attributes = tuple(a.strip() for a in attrs.split(",")) if attrs != "\u2013" else ()  # an en dash: none
        rows[name.strip("`")] = (kind, unit, attributes, prom.strip("`"))
    return rows


def test_the_docs_catalog_table_is_the_code_catalog_translated() -> None:
    rows = _doc_catalog()
    assert rows.keys() == INSTRUMENTS.keys()
    for name, (kind, unit, attrs) in INSTRUMENTS.items():
        assert rows[name] == (kind, unit, attrs, prometheus_name(name, kind, unit)), name


def test_the_docs_reference_and_quote_the_deploy_files() -> None:
    text = DOC.read_text()
    assert "(../deploy/otel-collector.yaml)" in text and "(../deploy/grafana/sie-sidecar.json)" in text
    assert f"```yaml\n{COLLECTOR.read_text()}```" in text, "the doc quotes deploy/otel-collector.yaml as it is"


def test_the_collector_configuration_is_a_complete_metrics_pipeline() -> None:
    yaml = pytest.importorskip("yaml")  # PyYAML is not a dependency; the venv has it through others
    config = yaml.safe_load(COLLECTOR.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    prometheus = config["exporters"]["prometheus"]
    assert prometheus["resource_to_telemetry_conversion"]["enabled"] is True
    assert prometheus.get("add_metric_suffixes", True) is True, "the dashboard queries the suffixed names"
    pipeline = config["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and "batch" in pipeline["processors"]
    assert pipeline["exporters"] == ["prometheus"]
    for section in ("receivers", "processors", "exporters"):
        assert set(pipeline[section]) <= set(config[section]), f"the pipeline uses undefined {section}"
    assert set(config["service"].get("extensions", [])) <= set(config.get("extensions") or {})
    assert "# prometheusremotewrite:" in COLLECTOR.read_text()
