"""Version references: "MODEL", "MODEL@N" and "MODEL@ALIAS", as every Client call takes them."""
from __future__ import annotations

from typing import Optional, Tuple

from .errors import InvalidArgument


def parse_ref(text: str) -> Tuple[str, Optional[int], Optional[str]]:
    """"MODEL" / "MODEL@latest" / "MODEL@7" / "MODEL@best" -> (model, version or None, alias or
    None); a plain "MODEL" means alias "latest". Model names never contain '@'."""
    if not isinstance(text, str) or not text:
        raise InvalidArgument(f"a version reference is 'MODEL', 'MODEL@N' or 'MODEL@ALIAS', "
                              f"got {text!r}")
    model, at, ref = text.partition("@")
    if not model or "@" in ref or (at and not ref):
        raise InvalidArgument(f"bad version reference {text!r}: use 'MODEL', 'MODEL@N' or "
                              "'MODEL@ALIAS'")
    if not ref:
        return model, None, "latest"
    if ref.isdigit():
        version = int(ref)
        if version < 1:
            raise InvalidArgument(f"bad version reference {text!r}: versions start at 1")
        return model, version, None
    return model, None, ref
