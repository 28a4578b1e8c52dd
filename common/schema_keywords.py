"""The JSON Schema keywords beyond the core every grammar engine here enforces, so
that a schema is never half honoured in silence.

llama-cpp-python's JSON-schema converter builds no rule for these: the grammar is the
same with and without them (checked against 0.3.36), so an output could break them.
A llama.cpp worker refuses a schema that uses one, with the keyword and where it is,
as OpenAI's strict structured outputs refuse what they do not support; a request
using one needs the ``json_schema_full`` capability (MLX's llguidance enforces the
bounds, counts, patternProperties and formats, and itself refuses ``not`` and
``uniqueItems``), so the router sends it where it can be served (docs/OPENAI.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

UNENFORCED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "not",
    }
)
# String formats the converter has rules for (STRING_FORMAT_RULES, and uuid1-5).
ENFORCED_FORMATS = re.compile(r"^(date|time|date-time|uuid[1-5]?)$")
# Keywords whose value maps names to subschemas (the names are not keywords).
NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
# Non-schema values: nothing below them is a keyword.
DATA = frozenset({"enum", "const", "default", "examples", "description", "title"})


def unenforced(schema: Any, where: str = "") -> str | None:
    """The first keyword of ``schema`` the grammar would not enforce, as
    "'KEYWORD' at /path", or None."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            found = unenforced(item, f"{where}/{i}")
            if found:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        at = f"{where}/{key}"
        if key in UNENFORCED:
            return f"'{key}' at {where or '/'}"
        if key == "format" and isinstance(value, str) and not ENFORCED_FORMATS.match(value):
            return f"'format: {value}' at {where or '/'}"
        if key in DATA:
            continue
        if key in NAMED_SCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                found = unenforced(sub, f"{at}/{name}")
                if found:
                    return found
            continue
        found = unenforced(value, at)
        if found:
            return found
    return None


def beyond_core(schema_text: str) -> bool:
    """Whether a schema (its JSON text) uses a keyword beyond the core; False for text
    that is not JSON (the router's door refuses that on its own)."""
    try:
        return unenforced(json.loads(schema_text)) is not None
    except ValueError:
        return False
