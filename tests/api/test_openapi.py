from __future__ import annotations

import json

from durable_agent.models.tokens import ApiTokenScope
from project.api import OPENAPI_PATH, openapi_document

REGENERATE = (
    '.venv/bin/python manage.py shell -c "from project.api import write_openapi; write_openapi()"'
)


def test_openapi__the_committed_document_matches_the_code() -> None:
    committed = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    assert committed == openapi_document(), (
        f"docs/openapi.json is out of date; regenerate it with: {REGENERATE}"
    )


def test_openapi__docs_name_the_regeneration_command() -> None:
    docs = (OPENAPI_PATH.parent / "api.md").read_text(encoding="utf-8")
    assert REGENERATE in docs


def test_openapi__every_operation_declares_its_error_statuses() -> None:
    document = openapi_document()
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            statuses = set(operation["responses"])
            assert {"400", "401", "403", "413", "503"} <= statuses, (method, path)
            if "{" in path:
                assert {"404", "422"} <= statuses, (method, path)
            if method == "post":
                assert "422" in statuses, (method, path)
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (path, status)


def test_openapi__both_security_schemes_are_documented() -> None:
    schemes = openapi_document()["components"]["securitySchemes"]
    assert schemes["TokenAuth"] == {"type": "http", "scheme": "bearer"}
    assert schemes["StaffSessionAuth"]["in"] == "cookie"


def test_openapi__the_description_lists_every_token_scope() -> None:
    description = openapi_document()["info"]["description"]
    assert f"--scope {'|'.join(ApiTokenScope.values)}" in description
