#!/usr/bin/env python3
"""The query API Grafana speaks, called by real clients that are not Smolder's: the messages of
Grafana Pyroscope's own protos (pyroscope-api/ beside this file, copied unchanged from
grafana/pyroscope) compiled at run time by grpcio-tools, carried by Google's protobuf runtime
and connect-python's Connect client, over binary protobuf and JSON, with and without gzip.

Usage: querier_connect.py <base url> <start ms> <end ms>
       querier_connect.py <base url> <start ms> <end ms> spans <label selector> <span id>...

Makes the calls of Grafana's Pyroscope datasource against data the test pushed: ProfileTypes
(its health check), LabelNames and LabelValues with matchers, Series, SelectSeries with a step
and group_by, SelectMergeStacktraces with max_nodes, SelectMergeProfile, Diff,
SelectMergeSpanProfile, GetProfileStats, SelectHeatmap and AnalyzeQuery (both
`unimplemented`), and settings.v1's Get. With `spans`, the calls of a trace's "profiles for
this span" link instead: SelectMergeSpanProfile of the span ids given (as a flame graph and as tree bytes) and
SelectMergeStacktraces with the same span_selector, of CPU profiles matching the selector.
Prints one JSON object: for each mode (proto, proto-gzip, json, json-gzip) the answers,
reduced to plain values (a flame graph's names and levels, a pprof profile's or tree's folded
stacks) so that the test can compare them with /render of the same data; a call that fails is
reported as its Connect code and message.
"""

import json
import os
import re
import shutil
import sys
import tempfile

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
HERE = os.path.dirname(os.path.abspath(__file__))


PROTOS = ["querier/v1/querier.proto", "types/v1/types.proto", "google/v1/profile.proto",
          "settings/v1/setting.proto"]
# The OpenAPI annotations of Pyroscope's protos: an import, method options and field options
# whose YAML examples may hold brackets and escaped quotes.
GNOSTIC = [
    re.compile(r'^import "gnostic/[^"]*";\n', re.M),
    re.compile(r'^\s*option \(gnostic\.[^;]*;\n', re.M),
    re.compile(r'\s*\[\(gnostic\.[a-z0-9.]+\)\.example = \{yaml: "(?:[^"\\]|\\.)*"\}\]'),
]


class Messages:
    """The generated modules of querier.v1, types.v1 and settings.v1 as one namespace: each
    name is defined in exactly one of them."""

    def __init__(self, *modules):
        self.modules = modules

    def __getattr__(self, name):
        for module in self.modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


def compile_proto():
    """Generates the messages and Connect clients of Pyroscope's own protos (pyroscope-api/,
    copied unchanged from grafana/pyroscope) into a temporary directory and imports them. The
    copies compiled lose their OpenAPI annotations and have their imports rooted under
    `pyroscope_api` (see pyroscope-api/README.md); nothing else changes."""
    from grpc_tools import protoc

    plugin = shutil.which("protoc-gen-connect-python")
    if plugin is None:
        sys.exit("protoc-gen-connect-python is not installed (scripts/test installs it)")
    work = tempfile.mkdtemp(prefix="smolder-querier-")
    src, out = os.path.join(work, "src"), os.path.join(work, "out")
    for name in PROTOS:
        with open(os.path.join(HERE, "pyroscope-api", name)) as f:
            text = f.read()
        for pattern in GNOSTIC:
            text = pattern.sub("", text)
        if "gnostic" in text:
            sys.exit(f"{name}: an OpenAPI annotation this script does not know how to remove")
        text = re.sub(r'^import "((?:google|types)/v1/[^"]*)";', r'import "pyroscope_api/\1";',
                      text, flags=re.M)
        path = os.path.join(src, "pyroscope_api", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    os.makedirs(out)
    status = protoc.main([
        "grpc_tools.protoc",
        f"-I{src}",
        f"--python_out={out}",
        f"--plugin=protoc-gen-connect-python={plugin}",
        f"--connect-python_out={out}",
        *[os.path.join(src, "pyroscope_api", name) for name in PROTOS],
    ])
    if status != 0:
        sys.exit(f"protoc failed on Pyroscope's protos with status {status}")
    sys.path.insert(0, out)
    from pyroscope_api.querier.v1 import querier_connect, querier_pb2
    from pyroscope_api.settings.v1 import setting_connect, setting_pb2
    from pyroscope_api.types.v1 import types_pb2

    return Messages(querier_pb2, types_pb2, setting_pb2), querier_connect, setting_connect


def flamegraph(fg):
    return {
        "names": list(fg.names),
        "levels": [list(level.values) for level in fg.levels],
        "total": fg.total,
        "maxSelf": fg.max_self,
    }


def diff(fg):
    return {**flamegraph(fg), "leftTicks": fg.leftTicks, "rightTicks": fg.rightTicks}


def folded(profile):
    """A pprof profile's first sample type as folded stacks (root first) and their values."""
    strings = list(profile.string_table)
    functions = {f.id: strings[f.name] for f in profile.function}
    locations = {}
    for location in profile.location:
        # A location's lines run from the inlined callee out to its caller.
        locations[location.id] = [functions[line.function_id] for line in reversed(location.line)]
    stacks = {}
    for sample in profile.sample:
        frames = []
        for location_id in reversed(sample.location_id):
            frames.extend(locations[location_id])
        key = ";".join(frames)
        stacks[key] = stacks.get(key, 0) + sample.value[0]
    return {
        "sampleType": [[strings[t.type], strings[t.unit]] for t in profile.sample_type],
        "periodType": [strings[profile.period_type.type], strings[profile.period_type.unit]],
        "period": profile.period,
        "folded": dict(sorted(stacks.items())),
    }


def tree_bytes(data):
    """Pyroscope's tree bytes (pkg/model/tree.go) as folded stacks and their self values: per
    node depth first, a varint name length, the name, a varint self value, a varint child
    count."""
    def varint(at):
        value, shift = 0, 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at

    stacks, at, open_nodes = {}, 0, []
    while at < len(data):
        length, at = varint(at)
        name = data[at:at + length].decode()
        at += length
        value, at = varint(at)
        children, at = varint(at)
        while open_nodes and open_nodes[-1][1] == 0:
            open_nodes.pop()
        if open_nodes:
            open_nodes[-1][1] -= 1
            path = open_nodes[-1][0] + [name]
        else:
            path = []
        if value:
            key = ";".join(path)
            stacks[key] = stacks.get(key, 0) + value
        open_nodes.append([path, children])
    return dict(sorted(stacks.items()))


def span_calls(pb, client, start, end, selector, spans):
    """The calls a trace's "profiles for this span" link makes."""
    from connectrpc.errors import ConnectError

    out = {}

    def record(name, call):
        try:
            out[name] = call()
        except ConnectError as error:
            out[name] = {"code": error.code.value, "message": error.message}

    def span_profile(fmt):
        return client.select_merge_span_profile(pb.SelectMergeSpanProfileRequest(
            profile_typeID=CPU, label_selector=selector, span_selector=spans,
            start=start, end=end, format=fmt))

    record("SelectMergeSpanProfile", lambda: flamegraph(
        span_profile(pb.PROFILE_FORMAT_FLAMEGRAPH).flamegraph))
    record("SelectMergeSpanProfile tree", lambda: tree_bytes(
        span_profile(pb.PROFILE_FORMAT_TREE).tree))
    record("SelectMergeStacktraces span_selector", lambda: flamegraph(
        client.select_merge_stacktraces(pb.SelectMergeStacktracesRequest(
            profile_typeID=CPU, label_selector=selector, span_selector=spans,
            start=start, end=end, format=pb.PROFILE_FORMAT_FLAMEGRAPH)).flamegraph))
    return out


def calls(pb, client, start, end):
    """Grafana's calls, in the order its datasource makes them."""
    from connectrpc.errors import ConnectError

    checkout = '{service_name="checkout"}'
    out = {}

    def record(name, call):
        try:
            out[name] = call()
        except ConnectError as error:
            out[name] = {"code": error.code.value, "message": error.message}

    record("ProfileTypes", lambda: [
        {"ID": t.ID, "name": t.name, "sampleType": t.sample_type, "sampleUnit": t.sample_unit,
         "periodType": t.period_type, "periodUnit": t.period_unit}
        for t in client.profile_types(pb.ProfileTypesRequest(start=start, end=end)).profile_types
    ])
    record("LabelNames", lambda: list(client.label_names(
        pb.LabelNamesRequest(matchers=[checkout], start=start, end=end)).names))
    record("LabelValues service_name", lambda: list(client.label_values(
        pb.LabelValuesRequest(name="service_name", start=start, end=end)).names))
    record("LabelValues region", lambda: list(client.label_values(
        pb.LabelValuesRequest(name="region", matchers=[checkout], start=start, end=end)).names))
    record("Series", lambda: [
        {pair.name: pair.value for pair in labels.labels}
        for labels in client.series(pb.SeriesRequest(
            matchers=[checkout], label_names=["service_name", "region"], start=start, end=end)).labels_set
    ])
    record("SelectSeries", lambda: [
        {"labels": {pair.name: pair.value for pair in series.labels},
         "points": [[point.timestamp, point.value] for point in series.points]}
        for series in client.select_series(pb.SelectSeriesRequest(
            profile_typeID=CPU, label_selector=checkout, start=start, end=end,
            group_by=["region"], step=10.0)).series
    ])
    for max_nodes in (16, 2):
        record(f"SelectMergeStacktraces max_nodes={max_nodes}", lambda: flamegraph(
            client.select_merge_stacktraces(pb.SelectMergeStacktracesRequest(
                profile_typeID=CPU, label_selector=checkout, start=start, end=end,
                max_nodes=max_nodes, format=pb.PROFILE_FORMAT_FLAMEGRAPH)).flamegraph))
    record("SelectMergeProfile", lambda: folded(client.select_merge_profile(
        pb.SelectMergeProfileRequest(profile_typeID=CPU, label_selector=checkout, start=start, end=end))))
    record("Diff", lambda: diff(client.diff(pb.DiffRequest(
        left=pb.SelectMergeStacktracesRequest(
            profile_typeID=CPU, label_selector='{service_name="checkout", region="eu"}',
            start=start, end=end),
        right=pb.SelectMergeStacktracesRequest(
            profile_typeID=CPU, label_selector='{service_name="checkout", region="us"}',
            start=start, end=end))).flamegraph))
    record("SelectMergeSpanProfile", lambda: flamegraph(client.select_merge_span_profile(
        pb.SelectMergeSpanProfileRequest(
            profile_typeID=CPU, label_selector=checkout, span_selector=["9a517183f26a089d"],
            start=start, end=end, format=pb.PROFILE_FORMAT_FLAMEGRAPH)).flamegraph))
    record("GetProfileStats", lambda: (lambda stats: {
        "dataIngested": stats.data_ingested, "oldest": stats.oldest_profile_time,
        "newest": stats.newest_profile_time,
    })(client.get_profile_stats(pb.GetProfileStatsRequest())))
    # What Smolder does not serve must fail as Connect's `unimplemented`, so that Grafana
    # degrades; an answer here would be a surprise the test reports.
    record("SelectHeatmap", lambda: str(client.select_heatmap(pb.SelectHeatmapRequest(
        profile_typeID=CPU, label_selector=checkout, start=start, end=end, step=10.0))))
    record("AnalyzeQuery", lambda: str(client.analyze_query(pb.AnalyzeQueryRequest(
        start=start, end=end, query=f"{CPU}{checkout}"))))
    return out


def settings_calls(pb, client):
    """Grafana's settings read."""
    from connectrpc.errors import ConnectError

    try:
        return [[s.name, s.value] for s in client.get(pb.GetSettingsRequest()).settings]
    except ConnectError as error:
        return {"code": error.code.value, "message": error.message}


def main():
    base, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    spans = sys.argv[4:5] == ["spans"]
    pb, connect, settings = compile_proto()
    from connectrpc.compression.gzip import GzipCompression

    report = {}
    for mode, proto_json, gzip in [
        ("proto", False, False),
        ("proto-gzip", False, True),
        ("json", True, False),
        ("json-gzip", True, True),
    ]:
        options = {
            "proto_json": proto_json,
            "send_compression": GzipCompression() if gzip else None,
            "timeout_ms": 30_000,
        }
        with connect.QuerierServiceClientSync(base, **options) as client:
            if spans:
                report[mode] = span_calls(pb, client, start, end, sys.argv[5], sys.argv[6:])
            else:
                report[mode] = calls(pb, client, start, end)
        if not spans:
            with settings.SettingsServiceClientSync(base, **options) as client:
                report[mode]["settings Get"] = settings_calls(pb, client)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
