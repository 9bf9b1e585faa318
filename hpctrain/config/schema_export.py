"""Export the site-profile and job-spec models as JSON Schema and a Markdown reference page.

The pydantic models are the one source: ``hpctrain schema export docs/`` regenerates
``docs/site-profile.schema.json``, ``docs/job-spec.schema.json`` and ``docs/reference.md`` (which also lists
the built-in model plug-ins' ``model_args`` and ``data``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hpctrain.config.catalog import MODELS
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile
from hpctrain.files import write_atomic


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def _type_text(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "anyOf" in prop:
        return " or ".join(_type_text(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        items = prop["items"]
        if isinstance(items, dict):
            return f"list of {_type_text(items, defs)}"
        return "list"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"mapping of {_type_text(prop['additionalProperties'], defs)}"
    return str(kind)


def _section(title: str, schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    lines = [f"### {title}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    lines += ["| key | type | default | required | description |", "|---|---|---|---|---|"]
    required = set(schema.get("required", []))
    for key, prop in schema.get("properties", {}).items():
        default = json.dumps(prop["default"]) if "default" in prop else ""
        desc = (prop.get("description") or "").replace("|", "\\|").replace("\n", " ")
        kind = _type_text(prop, defs).replace("|", "\\|")
        lines.append(f"| `{key}` | {kind} | {default} | {'yes' if key in required else ''} | {desc} |")
    return lines + [""]


def reference_markdown() -> str:
    out = ["# Configuration reference", "",
           "Generated from the pydantic models by `hpctrain schema export docs/`; do not edit by hand.", ""]
    for title, model in (("Site profile (site_configs/*.yaml)", SiteProfile), ("Job spec (jobs/*.yaml)", JobSpec)):
        schema = json_schema(model)
        defs = schema.get("$defs", {})
        out += [f"## {title}", ""]
        out += _section(model.__name__, schema, defs)
        for name, sub in defs.items():
            if sub.get("type") == "object" and "properties" in sub:
                out += _section(name, sub, defs)
    out += ["## Model plug-ins (`model_args` and `data` of jobs/*.yaml)", "",
            "Checked on the laptop by `hpctrain jobs validate`, `render` and `submit`, and by the ranks at start.", ""]
    for name, builtin in MODELS.items():
        out += [f"**`model: {name}`**", ""]
        for model in (builtin.schema.model_args, builtin.schema.data):
            schema = json_schema(model)
            defs = schema.get("$defs", {})
            out += _section(model.__name__, schema, defs)
            for sub_name, sub in defs.items():
                if sub.get("type") == "object" and "properties" in sub:
                    out += _section(sub_name, sub, defs)
    return "\n".join(out).rstrip() + "\n"


def export(directory: str | Path) -> list[Path]:
    """Write the two JSON Schemas and the reference page; returns the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, content in (
        ("site-profile.schema.json", json.dumps(json_schema(SiteProfile), indent=2) + "\n"),
        ("job-spec.schema.json", json.dumps(json_schema(JobSpec), indent=2) + "\n"),
        ("reference.md", reference_markdown()),
    ):
        path = out / filename
        write_atomic(path, content)
        written.append(path)
    return written
