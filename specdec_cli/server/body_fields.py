"""A request body's scalar fields read and checked: a 400 naming the field when it has the wrong type. Shared by
the modules that read bodies (requests.py, shaping_fields.py); nothing here knows what a field means."""

from __future__ import annotations

import math
from typing import Any, Optional

from .api_errors import ApiError


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(body: dict, name: str) -> Optional[float]:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a number", param=name)
    return float(value)


def integer(body: dict, name: str) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise ApiError(400, f"'{name}' must be an integer", param=name)
    return int(value)
