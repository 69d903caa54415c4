"""The protobuf messages of lerobot's AsyncInference service (package `transport`), coded by hand:
each is at most two fields, so vlac needs no protobuf package or generated code.

    Empty        {}
    PolicySetup  { bytes data = 1; }
    Actions      { bytes data = 1; }
    Observation  { TransferState transfer_state = 1; bytes data = 2; }
    TransferState: UNKNOWN = 0, BEGIN = 1, MIDDLE = 2, END = 3

Decoding follows protobuf's rules: fields in any order, the last one of a number wins, unknown
fields are skipped; anything malformed raises WireError.
"""
from __future__ import annotations

SERVICE = "transport.AsyncInference"

TRANSFER_UNKNOWN, TRANSFER_BEGIN, TRANSFER_MIDDLE, TRANSFER_END = 0, 1, 2, 3


class WireError(ValueError):
    pass


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def _fields(buf: bytes) -> dict:
    """{field number: int (varint) | memoryview (length-delimited)}."""
    out: dict = {}
    view = memoryview(buf)
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise WireError("field number 0")
        if wt == 0:
            out[num], pos = _read_varint(buf, pos)
        elif wt == 2:
            n, pos = _read_varint(buf, pos)
            if pos + n > len(buf):
                raise WireError(f"field {num}: {n} bytes announced, {len(buf) - pos} left")
            out[num] = view[pos : pos + n]
            pos += n
        elif wt == 1:
            pos += 8
        elif wt == 5:
            pos += 4
        else:
            raise WireError(f"field {num}: unsupported wire type {wt}")
        if pos > len(buf):
            raise WireError("truncated field")
    return out


def decode_data(buf: bytes) -> bytes:
    """PolicySetup / Actions: the bytes of field 1."""
    v = _fields(buf).get(1, b"")
    if isinstance(v, int):
        raise WireError("field 1 (data) is not length-delimited")
    return bytes(v)


def encode_data(data: bytes) -> bytes:
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_observation(buf: bytes) -> tuple[int, memoryview]:
    f = _fields(buf)
    state = f.get(1, TRANSFER_UNKNOWN)
    data = f.get(2, b"")
    if not isinstance(state, int) or isinstance(data, int):
        raise WireError("Observation fields have the wrong wire types")
    return state, memoryview(data)


def encode_observation(state: int, data: bytes) -> bytes:
    out = b""
    if state:
        out += b"\x08" + _varint(state)
    if data:
        out += b"\x12" + _varint(len(data)) + data
    return out


def identity(b: bytes) -> bytes:
    return b
