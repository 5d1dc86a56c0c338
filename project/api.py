"""The example project's NinjaAPI: durable_agent's Router at /api/durable-agent/.

docs/openapi.json is this API's OpenAPI document; regenerate it with::

    .venv/bin/python manage.py shell -c "from project.api import write_openapi; write_openapi()"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ninja import NinjaAPI

from durable_agent.api import router

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"

api = NinjaAPI(
    title="durable_agent",
    version="1",
    description=(
        "Hosts, lanes, repairs and submissions of durable_agent. Authenticate with "
        "`Authorization: Bearer <secret>` (manage.py api_token create NAME --scope "
        "read|submit|repair) or a staff session. A read token calls every GET; a submit token "
        "submits work and reads hosts, not submissions; a repair token calls everything. "
        "Every error is {code, message, detail}."
    ),
    urls_namespace="durable_agent_api",
    docs_url="docs",
)
api.add_router("", router)


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, as served at /api/durable-agent/openapi.json."""
    return json.loads(json.dumps(api.get_openapi_schema(), default=str))  # type: ignore[no-any-return]


def write_openapi(path: Path | str = OPENAPI_PATH) -> None:
    """Write :func:`openapi_document` to ``path`` (docs/openapi.json by default)."""
    text = json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n"
    Path(path).write_text(text, encoding="utf-8")
