#!/usr/bin/env python3
"""OTLP profiles sent to a Smolder aggregator by PyPI's opentelemetry-proto classes.

Usage: otlp_export.py <base url> <service prefix> [grpc]

Checks first that the installed opentelemetry-proto has the profiles/v1development field
numbers Smolder reads (those of opentelemetry-proto v1.10). Then sends one valid request that
uses every dictionary table over HTTP as binary protobuf, as JSON (json_format, which writes ids
in base64) and gzipped, each under its own service name (<prefix>-proto, <prefix>-json,
<prefix>-gzip), and twenty malformed requests. Prints one JSON object: the status of each
valid request and of each malformed one, by name. With `grpc`, the same over gRPC with grpcio
instead (plain and gzip-compressed calls, and three malformed ones), statuses as gRPC code names.
"""

import gzip
import http.client
import json
import sys
import time
import urllib.parse

from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc
from opentelemetry.proto.common.v1 import common_pb2 as common
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1 import resource_pb2 as resource


def check_schema():
    """The field numbers Smolder's reader relies on: a package of another release fails here."""
    expected = {
        pb.Sample: {"stack_index": 1, "attribute_indices": 2, "link_index": 3, "values": 4,
                    "timestamps_unix_nano": 5},
        pb.Profile: {"sample_type": 1, "samples": 2, "time_unix_nano": 3, "duration_nano": 4,
                     "period_type": 5, "period": 6, "profile_id": 7, "attribute_indices": 11},
        pb.ProfilesDictionary: {"mapping_table": 1, "location_table": 2, "function_table": 3,
                                "link_table": 4, "string_table": 5, "attribute_table": 6,
                                "stack_table": 7},
        pb.Location: {"mapping_index": 1, "address": 2, "lines": 3, "attribute_indices": 4},
        pb.Line: {"function_index": 1, "line": 2, "column": 3},
        pb.Function: {"name_strindex": 1, "system_name_strindex": 2, "filename_strindex": 3},
        pb.Mapping: {"memory_start": 1, "memory_limit": 2, "file_offset": 3,
                     "filename_strindex": 4},
        pb.Stack: {"location_indices": 1},
        pb.Link: {"trace_id": 1, "span_id": 2},
        pb.KeyValueAndUnit: {"key_strindex": 1, "value": 2, "unit_strindex": 3},
        svc.ExportProfilesServiceRequest: {"resource_profiles": 1, "dictionary": 2},
    }
    for message, fields in expected.items():
        numbers = {f.name: f.number for f in message.DESCRIPTOR.fields}
        for name, number in fields.items():
            assert numbers.get(name) == number, f"{message.DESCRIPTOR.name}.{name} is {numbers.get(name)}, expected {number}"


def request(service):
    """A CPU profile as the OpenTelemetry eBPF profiler writes one (samples/count, period cpu/
    nanoseconds at 100 Hz): main;work 30 samples in thread `worker` inside a span, and
    main;work;libfoo.so+0x234 10 samples outside any span."""
    strings = ["", "samples", "count", "cpu", "nanoseconds", "main", "work", "/usr/lib/libfoo.so",
               "thread.name", "app.py"]
    s = {text: i for i, text in enumerate(strings)}
    d = pb.ProfilesDictionary(string_table=strings)
    d.mapping_table.extend([pb.Mapping(), pb.Mapping(memory_start=0x1000, memory_limit=0x9000,
                                                     file_offset=0, filename_strindex=s["/usr/lib/libfoo.so"])])
    d.function_table.extend([pb.Function(),
                             pb.Function(name_strindex=s["main"], filename_strindex=s["app.py"]),
                             pb.Function(name_strindex=s["work"], filename_strindex=s["app.py"])])
    d.location_table.extend([pb.Location(),
                             pb.Location(lines=[pb.Line(function_index=1, line=3)]),
                             pb.Location(lines=[pb.Line(function_index=2, line=9)]),
                             pb.Location(mapping_index=1, address=0x1234)])
    d.stack_table.extend([pb.Stack(), pb.Stack(location_indices=[2, 1]),
                          pb.Stack(location_indices=[3, 2, 1])])
    d.link_table.extend([pb.Link(), pb.Link(trace_id=bytes(range(16)), span_id=bytes([0, 0, 0, 0, 0, 0, 0, 9]))])
    d.attribute_table.extend([pb.KeyValueAndUnit(),
                              pb.KeyValueAndUnit(key_strindex=s["thread.name"],
                                                 value=common.AnyValue(string_value="worker"))])
    now = time.time_ns()
    profile = pb.Profile(
        sample_type=pb.ValueType(type_strindex=s["samples"], unit_strindex=s["count"]),
        period_type=pb.ValueType(type_strindex=s["cpu"], unit_strindex=s["nanoseconds"]),
        period=10_000_000, time_unix_nano=now - 30_000_000_000, duration_nano=10_000_000_000,
        samples=[pb.Sample(stack_index=1, values=[30], attribute_indices=[1], link_index=1),
                 pb.Sample(stack_index=2, values=[10])])
    attributes = [common.KeyValue(key="service.name", value=common.AnyValue(string_value=service))]
    return svc.ExportProfilesServiceRequest(
        dictionary=d,
        resource_profiles=[pb.ResourceProfiles(
            resource=resource.Resource(attributes=attributes),
            scope_profiles=[pb.ScopeProfiles(scope=common.InstrumentationScope(name="test"),
                                             profiles=[profile])])])


def post(url, body, content_type, encoding=None):
    """POSTs `body` and returns the status. The body goes in pieces, and a server that answers
    before reading all of it (413 on a declared length past its cap) may close the connection
    meanwhile: its answer is read all the same."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    conn.putrequest("POST", "/v1development/profiles")
    conn.putheader("Content-Type", content_type)
    conn.putheader("Content-Length", str(len(body)))
    if encoding:
        conn.putheader("Content-Encoding", encoding)
    conn.endheaders()
    try:
        for start in range(0, len(body), 1 << 16):
            conn.send(body[start:start + (1 << 16)])
    except (BrokenPipeError, ConnectionResetError):
        pass
    response = conn.getresponse()
    answer = response.read()
    if response.status == 200 and content_type == "application/x-protobuf":
        svc.ExportProfilesServiceResponse.FromString(answer)
    conn.close()
    return response.status


def raw_field(number, wire_type, payload=b""):
    """One protobuf field, encoded by hand."""
    def varint(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def with_raw_sample(prefix, sample_bytes):
    """The valid request with its samples replaced by one sample written by hand."""
    r = request(prefix)
    profile = r.resource_profiles[0].scope_profiles[0].profiles[0]
    del profile.samples[:]
    profile_bytes = profile.SerializeToString() + raw_field(2, 2, sample_bytes)
    scope = raw_field(1, 2, r.resource_profiles[0].scope_profiles[0].scope.SerializeToString()) + raw_field(2, 2, profile_bytes)
    res = raw_field(1, 2, r.resource_profiles[0].resource.SerializeToString()) + raw_field(2, 2, scope)
    return raw_field(1, 2, res) + raw_field(2, 2, r.dictionary.SerializeToString())


def malformed(prefix):
    """Twenty requests that must each be refused with 400 or 413, none stored."""
    def edit(change):
        r = request(prefix)
        change(r, r.resource_profiles[0].scope_profiles[0].profiles[0], r.dictionary)
        return r.SerializeToString()

    proto = "application/x-protobuf"
    cases = {
        "missing dictionary": (edit(lambda r, p, d: r.ClearField("dictionary")), proto),
        "string_table[0] not empty": (edit(lambda r, p, d: d.string_table.__setitem__(0, "x")), proto),
        "stack index out of range": (edit(lambda r, p, d: setattr(p.samples[0], "stack_index", 40)), proto),
        "negative stack index": (edit(lambda r, p, d: setattr(p.samples[0], "stack_index", -1)), proto),
        "location index out of range": (edit(lambda r, p, d: d.stack_table[1].location_indices.append(77)), proto),
        "function index out of range": (edit(lambda r, p, d: setattr(d.location_table[1].lines[0], "function_index", 9)), proto),
        "string index out of range": (edit(lambda r, p, d: setattr(d.function_table[1], "name_strindex", 999)), proto),
        "attribute index out of range": (edit(lambda r, p, d: p.samples[0].attribute_indices.append(5)), proto),
        "link index out of range": (edit(lambda r, p, d: setattr(p.samples[0], "link_index", 7)), proto),
        "span id of 4 bytes": (edit(lambda r, p, d: setattr(d.link_table[1], "span_id", b"\x01\x02\x03\x04")), proto),
        "no values or timestamps": (edit(lambda r, p, d: p.samples[1].ClearField("values")), proto),
        "values and timestamps differ": (edit(lambda r, p, d: p.samples[0].timestamps_unix_nano.extend([1, 2])), proto),
        "negative value": (edit(lambda r, p, d: p.samples[0].values.__setitem__(0, -5)), proto),
        "sample counts without a cpu period": (edit(lambda r, p, d: p.ClearField("period_type")), proto),
        "missing sample type": (edit(lambda r, p, d: p.ClearField("sample_type")), proto),
        "v1.9 sample (link_index in field 4)": (with_raw_sample(prefix, raw_field(1, 0, b"\x01") + raw_field(2, 2, b"\x1e") + raw_field(4, 0, b"\x01")), proto),
        "unknown sample field": (with_raw_sample(prefix, raw_field(1, 0, b"\x01") + raw_field(4, 2, b"\x1e") + raw_field(9, 0, b"\x01")), proto),
        "not protobuf": (b"\x0a\xff\xff\xff\xff\x0f garbage", proto),
        "invalid json": (b'{"resourceProfiles": [', "application/json"),
        "json of the wrong types": (b'{"resourceProfiles": [{"scopeProfiles": "x"}], "dictionary": {}}', "application/json"),
    }
    return cases


def grpc_main(url, prefix):
    import grpc
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as rpc

    target = urllib.parse.urlsplit(url).netloc
    with grpc.insecure_channel(target) as channel:
        stub = rpc.ProfilesServiceStub(channel)
        raw = channel.unary_unary(
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)

        def call(method, message, **options):
            try:
                method(message, timeout=30, **options)
                return "OK"
            except grpc.RpcError as error:
                return error.code().name

        valid = {
            "grpc": call(stub.Export, request(prefix + "-grpc")),
            "grpc gzip": call(stub.Export, request(prefix + "-grpcgz"), compression=grpc.Compression.Gzip),
        }
        cases = malformed(prefix + "-bad")
        refused = {name: call(raw, cases[name][0]) for name in
                   ["missing dictionary", "stack index out of range", "v1.9 sample (link_index in field 4)"]}
    print(json.dumps({"valid": valid, "malformed": refused}))


def main():
    url, prefix = sys.argv[1], sys.argv[2]
    check_schema()
    if sys.argv[3:] == ["grpc"]:
        grpc_main(url, prefix)
        return
    statuses = {
        "proto": post(url, request(prefix + "-proto").SerializeToString(), "application/x-protobuf"),
        "json": post(url, json_format.MessageToJson(request(prefix + "-json")).encode(), "application/json"),
        "gzip": post(url, gzip.compress(request(prefix + "-gzip").SerializeToString()),
                     "application/x-protobuf", "gzip"),
    }
    refused = {name: post(url, body, content_type)
               for name, (body, content_type) in malformed(prefix + "-bad").items()}
    refused["oversize"] = post(url, request(prefix + "-bad").SerializeToString() + b"\x00" * (2 << 20), "application/x-protobuf")
    refused["gzip bomb"] = post(url, gzip.compress(b"\x00" * (64 << 20)), "application/x-protobuf", "gzip")
    print(json.dumps({"valid": statuses, "malformed": refused}))


if __name__ == "__main__":
    main()
