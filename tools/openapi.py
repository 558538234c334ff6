"""Write the server's OpenAPI document to docs/openapi.json (the committed copy that
tests/server/api/test_openapi.py compares with): `python tools/openapi.py`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY = ROOT / "docs" / "openapi.json"


def document() -> str:
    """The OpenAPI document of the application, as committed (sorted keys, indented)."""
    from zeal_server.app import create_app
    from zeal_server.settings import ServerSettings

    app = create_app(ServerSettings(database_url="sqlite://", broker=None))
    return json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    COPY.write_text(document())
    print(f"wrote {COPY.relative_to(ROOT)}", file=sys.stderr)
