#!/usr/bin/env python3
"""Independent decoder of TensorBoard event files, used to check megatron-cpp's writer.

Reads events.out.tfevents.* files (one file, or every such file directly inside a directory, in
name order, as TensorBoard orders them), verifies the TFRecord framing and both masked CRC-32Cs of
every record, decodes the protobuf Event messages and prints one JSON line per scalar:
{"step": s, "tag": t, "value": v, "wall_time": w}. A truncated last record is tolerated with a
warning, as TensorBoard tolerates a file still being written; a bad CRC or a malformed record
exits 1. Unknown protobuf fields are skipped, so files from other writers decode too.

It shares no code with the C++ writer: the CRC comes from crcmod's table for 'crc-32c', the
protobuf parsing is written here from the wire-format spec. It is not a TensorBoard reader: only
simple_value scalars are reported (histograms, images and tensor-valued summaries are skipped).

Usage: decode_tfevents.py FILE_OR_DIR [--expect-tags TAG1,TAG2]
       decode_tfevents.py --self-test
"""

import argparse
import json
import os
import struct
import sys

import crcmod.predefined

_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


class DecodeError(Exception):
    """A record that is corrupt or malformed (not merely truncated at the end of the file)."""


def masked_crc(data):
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(data, name):
    """Yields the payload of each TFRecord in data; warns on a truncated last record."""
    pos = 0
    index = 0
    while pos < len(data):
        if len(data) - pos < 12:
            print(f"warning: {name}: record {index} at byte {pos}: truncated header "
                  f"({len(data) - pos} bytes), ignored", file=sys.stderr)
            return
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        if length_crc != masked_crc(data[pos:pos + 8]):
            raise DecodeError(f"{name}: record {index} at byte {pos}: bad length CRC "
                              f"(stored {length_crc:#010x}, computed "
                              f"{masked_crc(data[pos:pos + 8]):#010x})")
        start = pos + 12
        if len(data) - start < length + 4:
            print(f"warning: {name}: record {index} at byte {pos}: truncated data "
                  f"({len(data) - start} of {length + 4} bytes), ignored", file=sys.stderr)
            return
        payload = data[start:start + length]
        (data_crc,) = struct.unpack_from("<I", data, start + length)
        if data_crc != masked_crc(payload):
            raise DecodeError(f"{name}: record {index} at byte {pos}: bad data CRC "
                              f"(stored {data_crc:#010x}, computed {masked_crc(payload):#010x})")
        yield payload
        pos = start + length + 4
        index += 1


def read_varint(buf, pos):
    value = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def fields(buf):
    """Yields (field_number, wire_type, value) of a protobuf message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            if len(buf) - pos < 8:
                raise DecodeError("truncated 64-bit field")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = read_varint(buf, pos)
            if len(buf) - pos < n:
                raise DecodeError(f"length-delimited field {number} needs {n} bytes, "
                                  f"{len(buf) - pos} left")
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            if len(buf) - pos < 4:
                raise DecodeError("truncated 32-bit field")
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise DecodeError(f"unsupported wire type {wire} (field {number})")
        yield number, wire, value


def expect_wire(number, wire, want, what):
    if wire != want:
        raise DecodeError(f"{what} (field {number}) has wire type {wire}, expected {want}")


def decode_event(payload):
    """Returns dict(wall_time, step, file_version, scalars=[(tag, value)])."""
    event = {"wall_time": 0.0, "step": 0, "file_version": "", "scalars": []}
    for number, wire, value in fields(payload):
        if number == 1:
            expect_wire(number, wire, 1, "Event.wall_time")
            (event["wall_time"],) = struct.unpack("<d", value)
        elif number == 2:
            expect_wire(number, wire, 0, "Event.step")
            event["step"] = value - (1 << 64) if value >= (1 << 63) else value
        elif number == 3:
            expect_wire(number, wire, 2, "Event.file_version")
            event["file_version"] = value.decode("utf-8")
        elif number == 5:
            expect_wire(number, wire, 2, "Event.summary")
            for s_number, s_wire, s_value in fields(value):
                if s_number != 1:
                    continue
                expect_wire(s_number, s_wire, 2, "Summary.value")
                tag, simple = None, None
                for v_number, v_wire, v_value in fields(s_value):
                    if v_number == 1:
                        expect_wire(v_number, v_wire, 2, "Summary.Value.tag")
                        tag = v_value.decode("utf-8")
                    elif v_number == 2:
                        expect_wire(v_number, v_wire, 5, "Summary.Value.simple_value")
                        (simple,) = struct.unpack("<f", v_value)
                if simple is not None:
                    if tag is None:
                        raise DecodeError("Summary.Value with simple_value but no tag")
                    event["scalars"].append((tag, simple))
    return event


def decode_bytes(data, name):
    """Returns the list of decoded events of one file's contents."""
    events = []
    for index, payload in enumerate(read_records(data, name)):
        try:
            events.append(decode_event(payload))
        except (DecodeError, UnicodeDecodeError) as e:
            raise DecodeError(f"{name}: record {index}: malformed Event: {e}") from None
    return events


def read_file(path):
    with open(path, "rb") as stream:
        return stream.read()


def event_files(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.startswith("events.out.tfevents."))
        files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        if not files:
            raise DecodeError(f"{path}: no events.out.tfevents.* files in this directory")
        return files
    if not os.path.isfile(path):
        raise DecodeError(f"{path}: no such file or directory")
    return [path]


def scalar_lines(events):
    for event in events:
        for tag, value in event["scalars"]:
            yield json.dumps({"step": event["step"], "tag": tag, "value": value,
                              "wall_time": event["wall_time"]})


VECTOR_FILE_VERSION = ("1800000000000000a37f4b220900000040fc54d9411a0d627261696e2e4576656e743a32"
                       "eced8f9d")
VECTOR_SCALAR = ("1d00000000000000602fdf230900004040fc54d94110012a100a0e0a076c6d206c6f7373150000"
                 "2841e4aefb74")


def self_test():
    import io
    import tempfile

    def check(cond, what):
        if not cond:
            raise AssertionError(what)

    check(_crc32c(b"123456789") == 0xE3069283, "crc-32c check value")

    first = decode_bytes(bytes.fromhex(VECTOR_FILE_VERSION), "vector 1")
    check(len(first) == 1, "vector 1: one event")
    check(first[0]["wall_time"] == 1700000000.0, "vector 1: wall_time")
    check(first[0]["step"] == 0, "vector 1: step")
    check(first[0]["file_version"] == "brain.Event:2", "vector 1: file_version")
    check(first[0]["scalars"] == [], "vector 1: no scalars")

    second = decode_bytes(bytes.fromhex(VECTOR_SCALAR), "vector 2")
    check(len(second) == 1, "vector 2: one event")
    check(second[0]["wall_time"] == 1700000001.0, "vector 2: wall_time")
    check(second[0]["step"] == 1, "vector 2: step")
    check(second[0]["scalars"] == [("lm loss", 10.5)], "vector 2: scalar")

    whole = bytes.fromhex(VECTOR_FILE_VERSION + VECTOR_SCALAR)

    # Every single-bit flip is caught by one of the two CRCs (or, in the length, as truncation
    # or a CRC mismatch), never decoded silently as something else.
    for i in range(len(whole) * 8):
        bad = bytearray(whole)
        bad[i // 8] ^= 1 << (i % 8)
        saved, sys.stderr = sys.stderr, io.StringIO()
        try:
            decode_bytes(bytes(bad), "flipped")
            raise AssertionError(f"bit flip {i} not detected")
        except DecodeError:
            pass
        finally:
            sys.stderr = saved

    # A truncated last record is dropped with a warning; the records before it survive.
    for cut in (1, 4, 12, 20, len(bytes.fromhex(VECTOR_SCALAR)) - 1):
        saved, sys.stderr = sys.stderr, io.StringIO()
        try:
            events = decode_bytes(whole[:len(whole) - cut], "truncated")
            warning = sys.stderr.getvalue()
        finally:
            sys.stderr = saved
        check(len(events) == 1 and events[0]["file_version"] == "brain.Event:2",
              f"truncated by {cut}: first record kept")
        check("truncated" in warning, f"truncated by {cut}: warning printed")

    # The directory path: files found by name, scalars printed as JSON lines.
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "events.out.tfevents.1700000000.host.1.0"), "wb") as f:
            f.write(whole)
        with open(os.path.join(d, "unrelated.txt"), "wb") as f:
            f.write(b"not an event file")
        lines = [json.loads(line) for f in event_files(d)
                 for line in scalar_lines(decode_bytes(read_file(f), f))]
        check(lines == [{"step": 1, "tag": "lm loss", "value": 10.5,
                         "wall_time": 1700000001.0}], f"directory decode: {lines}")
    print("decode_tfevents self-test passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", nargs="?", help="an event file, or a directory of them")
    parser.add_argument("--expect-tags", default="",
                        help="comma-separated tags that must each appear at least once")
    parser.add_argument("--self-test", action="store_true",
                        help="decode the built-in test vectors and check them")
    args = parser.parse_args()

    if args.self_test:
        try:
            self_test()
        except (AssertionError, DecodeError) as e:
            print(f"decode_tfevents self-test FAILED: {e}", file=sys.stderr)
            return 1
        return 0
    if not args.path:
        parser.error("give an event file or directory, or --self-test")

    seen = set()
    try:
        for f in event_files(args.path):
            events = decode_bytes(read_file(f), f)
            for line in scalar_lines(events):
                print(line)
            seen.update(tag for e in events for tag, _ in e["scalars"])
    except (DecodeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    expected = [t for t in args.expect_tags.split(",") if t]
    missing = [t for t in expected if t not in seen]
    if missing:
        print(f"error: {args.path}: expected tags not found: {', '.join(missing)} "
              f"(found: {', '.join(sorted(seen)) or 'none'})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
