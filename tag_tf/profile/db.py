"""The profile database: op profiles, communication models and calibrated cost-model constants on disk.

A directory of JSON files (no pickle: readable, diffable, safe to load):

    <root>/ops/<fingerprint>__<device type>__<b1-b2-...>.json    OpProfile, keyed by graph fingerprint,
                                                                device type and profiled batch sizes
    <root>/comm/<topology fingerprint>.json                      CommModel.to_dict() of a topology
    <root>/costmodel/<device type>.json                          CostModelConstants

Each file stores its full key next to the payload and is checked on read, so sanitising names into
file names cannot make two keys collide silently. Writers write a temporary file in the same
directory and `os.replace` it into place: concurrent writers never leave a torn file (the last one
wins) and readers see either the old or the new entry. A corrupt or foreign file reads as a miss
(logged), so the next run re-measures and replaces it.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

from tag_tf.context import default_cache_dir
from tag_tf.datafiles import write_atomic
from tag_tf.errors import ProfileError
from tag_tf.profile.costmodel import CostModel, CostModelConstants
from tag_tf.profile.op_profile import OpProfile

log = logging.getLogger(__name__)


class SupportsToDict(Protocol):
    """A model stored as the dict it gives (`profile.comm.CommModel`)."""

    def to_dict(self) -> Mapping[str, object]: ...


class OpProfileKey(TypedDict):
    """What an op profile is stored under."""

    fingerprint: str
    device_type: str
    batch_sizes: list[int]


def default_db_path() -> str:
    """Profiles live beside the plans: $TAG_TF_CACHE_DIR/profiles, default ~/.cache/tag_tf/profiles
    (never a folder relative to wherever the command happens to run)."""
    return os.path.join(default_cache_dir(), "profiles")


_FORMAT = 1


def _safe(part: str) -> str:
    s = re.sub(r"[^A-Za-z0-9.+-]+", "_", str(part)).strip("._")
    return s[:80] or "_"


class ProfileDB:
    """Profiles and models under one directory (created on first write)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else default_db_path()
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ProfileError(f"{self.path}: the profile database must be a directory, not a file")

    # -- files -----------------------------------------------------------------------------------
    def _file(self, kind: str, *parts: str) -> str:
        return os.path.join(self.path, kind, "__".join(_safe(p) for p in parts) + ".json")

    def _read(self, path: str, key: Mapping[str, object]) -> Any:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable profile database entry %s (%s)", path, e)
            return None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("key") != _jsonable(key):
            log.warning("ignoring profile database entry %s: not the entry for %s", path, dict(key))
            return None
        return doc.get("value")

    def _write(self, path: str, key: Mapping[str, object], value: object) -> str:
        try:
            write_atomic(path, json.dumps({"format": _FORMAT, "key": _jsonable(key), "value": value},
                                          default=_json_default))
        except OSError as e:
            raise ProfileError(f"{path}: cannot write the profile database ({e.strerror or e})") from None
        return path

    # -- op profiles -----------------------------------------------------------------------------
    @staticmethod
    def _op_key(fingerprint: str, device_type: str, batch_sizes: Sequence[int]) -> OpProfileKey:
        return {"fingerprint": str(fingerprint), "device_type": str(device_type),
                "batch_sizes": sorted(int(b) for b in batch_sizes)}

    def op_profile_path(self, fingerprint: str, device_type: str, batch_sizes: Sequence[int]) -> str:
        key = self._op_key(fingerprint, device_type, batch_sizes)
        return self._file("ops", key["fingerprint"], key["device_type"], "-".join(map(str, key["batch_sizes"])))

    def get_op_profile(self, fingerprint: str, device_type: str, batch_sizes: Sequence[int]) -> OpProfile | None:
        key = self._op_key(fingerprint, device_type, batch_sizes)
        value = self._read(self.op_profile_path(fingerprint, device_type, batch_sizes), key)
        if value is None:
            return None
        try:
            return OpProfile.from_dict(value)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("ignoring malformed op profile for %s (%s)", key, e)
            return None

    def put_op_profile(self, profile: OpProfile, fingerprint: str | None = None,
                       device_type: str | None = None, batch_sizes: Sequence[int] | None = None) -> str:
        """Store `profile` (key parts default to the profile's own fields); returns the file path."""
        fingerprint = fingerprint if fingerprint is not None else profile.fingerprint
        if not fingerprint:
            raise ProfileError("cannot store an op profile without a graph fingerprint")
        device_type = device_type or profile.device_type
        batch_sizes = batch_sizes or profile.batch_sizes
        key = self._op_key(fingerprint, device_type, batch_sizes)
        return self._write(self.op_profile_path(fingerprint, device_type, batch_sizes), key, profile.to_dict())

    def op_profile(self, fingerprint: str, device_type: str, batch_sizes: Sequence[int],
                   compute: Callable[[], OpProfile]) -> tuple[OpProfile, bool]:
        """The stored profile, or `compute()` stored and returned: (profile, came from the database)."""
        found = self.get_op_profile(fingerprint, device_type, batch_sizes)
        if found is not None:
            return found, True
        profile = compute()
        self.put_op_profile(profile, fingerprint, device_type, batch_sizes)
        return profile, False

    def list_op_profiles(self) -> list[OpProfileKey]:
        """Keys of the stored op profiles."""
        folder = os.path.join(self.path, "ops")
        out = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    out.append(json.load(fh)["key"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    # -- communication models --------------------------------------------------------------------
    def get_comm(self, topology_fingerprint: str) -> dict[str, Any] | None:
        """The stored communication model (the dict `CommModel.to_dict()` gave), or None."""
        key = {"topology": str(topology_fingerprint)}
        value = self._read(self._file("comm", key["topology"]), key)
        return value if isinstance(value, dict) else None

    def put_comm(self, topology_fingerprint: str, comm: SupportsToDict | Mapping[str, object]) -> str:
        """Store a communication model: a dict or an object with `to_dict()`."""
        value = comm.to_dict() if hasattr(comm, "to_dict") else comm
        if not isinstance(value, Mapping):
            raise ProfileError("a communication model must be a dict or have to_dict()")
        try:
            value = _jsonable(value)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"cannot store the communication model: {e}") from None
        key = {"topology": str(topology_fingerprint)}
        return self._write(self._file("comm", key["topology"]), key, value)

    # -- cost-model constants --------------------------------------------------------------------
    def get_constants(self, device: str) -> CostModelConstants | None:
        key = {"device": str(device)}
        value = self._read(self._file("costmodel", key["device"]), key)
        try:
            return None if value is None else CostModelConstants.from_dict(value)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("ignoring malformed cost-model constants for %s (%s)", device, e)
            return None

    def put_constants(self, constants: CostModelConstants) -> str:
        key = {"device": constants.device}
        return self._write(self._file("costmodel", constants.device), key, _jsonable(constants.to_dict()))

    def cost_model(self) -> CostModel:
        """A CostModel with every stored set of constants (datasheet defaults for the rest)."""
        folder = os.path.join(self.path, "costmodel")
        found = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if name.endswith(".json") and not name.startswith(".tmp-"):
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as fh:
                        device = json.load(fh)["key"]["device"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                c = self.get_constants(device)
                if c is not None:
                    found.append(c)
        return CostModel(found)


def _json_default(o: object) -> object:
    if hasattr(o, "tolist"):          # numpy arrays and scalars
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"cannot store {type(o).__name__} in the profile database")


def _jsonable(value: object) -> object:
    """Round-trip through JSON so stored keys compare equal to what is read back (tuples -> lists)."""
    return json.loads(json.dumps(value, default=_json_default))


__all__ = ["ProfileDB", "default_db_path"]
