"""Parsing and printing of bandwidths, sizes and latencies. Internally: bytes/s, bytes, seconds.

Bandwidth strings: a number and a unit, space optional: "100Gbps", "100 Gb/s", "25 GB/s", "25GBps",
"800 Mbit/s", "12.5e9 B/s", "10 GiB/s". The case of the b decides: lower-case b (or "bit") is bits,
upper-case B (or "byte") is bytes. Prefixes K/M/G/T are decimal (networking convention), Ki/Mi/Gi/Ti
binary; the prefix letter itself is case-insensitive.
Size strings: "16GiB", "16 GB" (decimal), "512MiB", "1024 B".
Latency strings: "5us", "5 µs", "0.1ms", "2e-5 s", "300ns".
Plain numbers take the caller's default unit (see `tag_tf.topology.parse`).
"""
from __future__ import annotations

import math
import re

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_BW_RE = re.compile(rf"^{_NUM}\s*([kKmMgGtT]i?)?(bit|byte|b|B)(?:ps|/s|/sec)$")
_SIZE_RE = re.compile(rf"^{_NUM}\s*([kKmMgGtT]i?)?(B|byte|bytes)$")
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}
_TIME_RE = re.compile(rf"^{_NUM}\s*(s|ms|us|µs|μs|ns)$")

# Units a file may name in its `units:` section, and what one of them is worth.
BANDWIDTH_UNITS = {"B/s": 1.0, "Gbps": 1e9 / 8, "Mbps": 1e6 / 8, "GB/s": 1e9, "MB/s": 1e6}
SIZE_UNITS = {"B": 1.0, "GB": 1e9, "GiB": 2.0 ** 30, "MB": 1e6, "MiB": 2.0 ** 20}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class UnitError(ValueError):
    """A value that is not a number or a number with a known unit."""


def _plain(value: object, default_unit: float) -> float | None:
    """A bare number (or numeric string) in `default_unit`, else None (it must carry a unit)."""
    if isinstance(value, bool):   # YAML `yes` is not a bandwidth
        return None
    if isinstance(value, (int, float)):
        return float(value) * default_unit
    if isinstance(value, str):
        try:
            return float(value.strip()) * default_unit
        except ValueError:
            return None
    return None


def parse_bandwidth(value: object, default_unit: float) -> float:
    """bytes/s from a number (times `default_unit`, bytes/s per unit) or a string with a unit."""
    n = _plain(value, default_unit)
    if n is not None:
        return n
    if isinstance(value, str):
        s = value.strip()
        m = _BW_RE.match(s)
        if m:
            num, prefix, unit = m.groups()
            scale = _PREFIX[(prefix or "").lower()]
            per = 1.0 if unit in ("B", "byte") else 1.0 / 8
            return float(num) * scale * per
    raise UnitError(f"expected a bandwidth such as 100Gbps or 25GB/s, got {value!r}")


def parse_size(value: object, default_unit: float) -> float:
    """bytes from a number (times `default_unit`) or a string such as "16GiB"."""
    n = _plain(value, default_unit)
    if n is not None:
        return n
    if isinstance(value, str):
        s = value.strip()
        m = _SIZE_RE.match(s)
        if m:
            num, prefix, _ = m.groups()
            return float(num) * _PREFIX[(prefix or "").lower()]
    raise UnitError(f"expected a size such as 16GiB, got {value!r}")


def parse_time(value: object, default_unit: float) -> float:
    """seconds from a number (times `default_unit`) or a string such as "5us"."""
    n = _plain(value, default_unit)
    if n is not None:
        return n
    if isinstance(value, str):
        s = value.strip()
        m = _TIME_RE.match(s)
        if m:
            return float(m.group(1)) * _TIME[m.group(2)]
    raise UnitError(f"expected a latency such as 5us, got {value!r}")


def _trim(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def format_bandwidth(bytes_per_s: float) -> str:
    """e.g. "100 Gbps (12.5 GB/s)"."""
    if math.isinf(bytes_per_s):
        return "unlimited"
    bits = bytes_per_s * 8
    for scale, name in ((1e12, "Tbps"), (1e9, "Gbps"), (1e6, "Mbps"), (1e3, "Kbps"), (1.0, "bps")):
        if bits >= scale or scale == 1.0:
            net = f"{_trim(bits / scale)} {name}"
            break
    for scale, name in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1.0, "B/s")):
        if bytes_per_s >= scale or scale == 1.0:
            return f"{net} ({_trim(bytes_per_s / scale)} {name})"
    return net  # pragma: no cover


def format_bytes(n: float) -> str:
    """e.g. "32 GiB", "1.5 MiB"."""
    for scale, name in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if n >= scale:
            return f"{_trim(n / scale)} {name}"
    return f"{n:.0f} B"


def format_time(s: float) -> str:
    """e.g. "25 us", "1.2 ms"."""
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if s >= scale:
            return f"{_trim(s / scale)} {name}"
    return f"{_trim(s / 1e-9)} ns"
