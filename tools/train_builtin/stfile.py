"""A minimal safetensors reader/writer for torch tensors (the format is 8 bytes of header length,
a JSON header, then the raw little-endian data), so the tools need no safetensors package."""
import json
import struct

import torch

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
           torch.int64: "I64", torch.uint8: "U8", torch.int16: "I16"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}
_AS_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype in _AS_INT:
        t = t.view(_AS_INT[t.dtype])
    return t.numpy().tobytes()


def save(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name]
        b = _bytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path):
    """-> (dict name -> tensor, metadata dict)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dt = _BY_NAME[info["dtype"]]
        raw = bytearray(data[base + a:base + b])
        t = torch.frombuffer(raw, dtype=_AS_INT.get(dt, dt)) if b > a else torch.empty(0, dtype=_AS_INT.get(dt, dt))
        if dt in _AS_INT:
            t = t.view(dt)
        out[name] = t.reshape(info["shape"])
    return out, meta
