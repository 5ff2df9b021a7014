"""The two JSON encodings of the lake: signed bytes, and stored documents.

Both sort keys, so equal values always give identical bytes: a re-run writes no spurious diff,
and a SHA-256 recorded at write time (manifests, gate reports, certificates) can be checked by
hashing the stored object. A hash or signature is always over stored or canonical bytes, never
over a re-encoding, so the *document* form may change without breaking old records; the
*canonical* form may not: existing signatures cover exactly those bytes.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """The bytes a signature covers: sorted keys, no whitespace, UTF-8.

    Frozen: certificates already on the lake were signed over this form. Strict (no ``default``)
    so that a value with no JSON meaning fails instead of being signed as its ``str()``.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def json_document(value: Any) -> bytes:
    """A stored JSON document (manifest, report, state, pointer): sorted, indented, newline-ended.

    Indented because people read these objects in the lakeFS UI; ``default=str`` because
    reports carry timestamps and paths. Readers parse it back; nothing re-encodes and compares.
    """
    text = json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, default=str)
    return (text + "\n").encode()
