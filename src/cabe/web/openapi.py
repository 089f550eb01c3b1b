"""The OpenAPI 3.1 document of the JSON API.

The request schemas are generated from :mod:`cabe.schema` (the fields each endpoint takes, their
types, choices and ranges, :func:`cabe.schema.json_schema`), so that the document, the server's
validation and the command line agree; the responses are described here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from cabe import schema
from cabe.i18n import t

#: the endpoints, by request schema name: (schema command, description, examples)
REQUESTS: dict[str, tuple[str, str, list[dict[str, Any]]]] = {
    "EstimateRequest": (
        "api.estimate",
        "Give `params` (billions) or `model` / `config`. `params` + `bytes_per_param` is the "
        "seed calculator: M = N·B, V = M + A.",
        [
            {"params": 7, "bytes_per_param": 16, "activations_gb": 20},
            {"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048, "gpu": "rtx-4090"},
        ],
    ),
    "FitRequest": (
        "api.fit",
        "An estimate request plus the card (`gpu`, required) and what to solve.",
        [{"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090"}],
    ),
    "InferRequest": (
        "api.infer",
        "Inference / serving: `model` or `config`, the weight format, the KV-cache dtype and the shapes.",
        [{"model": "llama-3.1-8b", "weights": "awq-4bit", "kv_dtype": "fp8", "context": 32768, "gpu": "rtx-4090"}],
    ),
    "LoraRequest": (
        "api.lora",
        "LoRA adapter sizes for `model` / `config`. `rank` and `targets` are deprecated aliases of "
        "`lora_rank` and `lora_targets`.",
        [{"model": "llama-3.1-8b", "lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]}],
    ),
}

#: descriptions where the HTTP API differs from the command line's help text (``option.*``)
_HTTP_DESCRIPTIONS = {
    "model": "A preset name (/api/models) or a Hugging Face id.",
    "gpu": "A card name from /api/gpus.",
    "lang": "Language of error messages (default: Accept-Language, else English).",
}


def _description(f: schema.Field) -> str:
    text = _HTTP_DESCRIPTIONS.get(f.name) or t(f.key, "en")
    if f.type is tuple:
        text += " (a list, or one comma-separated string)"
    return text[:1].upper() + text[1:]


def request_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one request (``EstimateRequest`` ...): :func:`cabe.schema.json_schema` with
    descriptions and examples."""
    command, description, examples = REQUESTS[name]
    out = schema.json_schema(command)
    fields = {f.name: f for f in schema.fields_for(command)}
    for key, prop in out["properties"].items():
        canonical = schema.aliases(command).get(key)
        prop["description"] = f"Deprecated alias of `{canonical}`." if canonical else _description(fields[key])
    return {**out, "description": description, "examples": examples}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json_response(description: str, ref: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {name: request_schema(name) for name in REQUESTS}
    schemas.update(_RESPONSES)
    return schemas


_RESPONSES: dict[str, Any] = {
    "Report": {
        "type": "object",
        "required": ["mode", "total_bytes", "components", "steps"],
        "properties": {
            "mode": {"type": "string", "enum": ["simple", "lesson", "architecture"]},
            "total_bytes": {"type": "integer"},
            "total_gb": {"type": "number"},
            "total_gib": {"type": "number"},
            "components": {"type": "object", "additionalProperties": {"type": "integer"}},
            "parameters": {"type": "integer"},
            "trainable_parameters": {"type": "integer"},
            "peak_phase": {"type": "string"},
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string"},
                        "formula": {"type": "string"},
                        "bytes": {"type": ["integer", "null"]},
                        "params": {"type": "object"},
                    },
                },
            },
            "gpu": {"type": "object"},
            "fits_on": {"type": "array", "items": {"type": "string"}},
            # with ``explain: true`` only (cabe.knob_effects): each memory knob against the request without it
            "knobs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "value": {},
                        "without": {},
                        "with_bytes": {"type": "integer"},
                        "without_bytes": {"type": "integer"},
                        "delta_bytes": {"type": "integer"},
                        "effect": {"type": "string", "enum": ["saves", "costs", "nothing"]},
                        "saver": {"type": "boolean"},
                        "components": {"type": "object", "additionalProperties": {"type": "integer"}},
                        "reasons": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
        },
    },
    "LoraResponse": {
        "type": "object",
        "required": ["per_target", "total_parameters"],
        "properties": {
            "model": {"type": "string"},
            "rank": {"type": "integer"},
            "targets": {"type": "array", "items": {"type": "string"}},
            "num_layers": {"type": "integer"},
            "per_target": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "in_features": {"type": "integer"},
                        "out_features": {"type": "integer"},
                        "per_layer": {"type": "integer"},
                        "parameters": {"type": "integer"},
                    },
                },
            },
            "total_parameters": {"type": "integer"},
            "model_parameters": {"type": ["integer", "null"]},
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "field": {"type": ["string", "null"]},
                    "params": {"type": "object"},
                    "message": {"type": "string"},
                },
            }
        },
    },
    "Models": {
        "type": "object",
        "properties": {
            "models": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "display": {"type": ["string", "null"]},
                        "hf_id": {"type": ["string", "null"]},
                        "parameters": {"type": ["integer", "null"]},
                    },
                },
            }
        },
    },
    "Gpus": {
        "type": "object",
        "properties": {
            "gpus": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "display": {"type": "string"},
                        "memory_bytes": {"type": "integer"},
                    },
                },
            }
        },
    },
    "Health": {"type": "object", "properties": {"status": {"type": "string"}, "version": {"type": "string"}}},
    "Object": {"type": "object"},
}


_BODY_ERRORS = {
    "408": _error_response("The body stopped short of its Content-Length (nothing for 3 s, or not all in 15 s)."),
    "413": _error_response("Body larger than 256 KiB."),
    "422": _error_response("Invalid input; `field` and a `message` in the asked language."),
}

#: POST endpoints: path -> (operationId, summary, request schema, response description, response schema)
_POSTS = {
    "/api/estimate": ("estimate", "Estimate the memory of a training run.", "EstimateRequest", "The report.", "Report"),
    "/api/lora": (
        "lora",
        "LoRA adapter parameters per target module.",
        "LoraRequest",
        "Adapter sizes.",
        "LoraResponse",
    ),
    "/api/fit": (
        "fit",
        "Make it fit: largest micro-batch, longest sequence, fewest GPUs, and the changes that fit the card, ranked.",
        "FitRequest",
        "The plan.",
        "Object",
    ),
    "/api/infer": (
        "infer",
        "Inference memory: weights by format, KV cache, serving pool.",
        "InferRequest",
        "The inference estimate.",
        "Object",
    ),
}

#: GET endpoints: path -> (operationId, summary, response description, response schema)
_GETS = {
    "/api/models": ("models", "Model presets with metadata.", "Presets.", "Models"),
    "/api/gpus": ("gpus", "The GPU catalog, smallest first.", "Cards.", "Gpus"),
    "/api/health": ("health", "Liveness.", "OK.", "Health"),
}


def _post(operation: str, summary: str, request: str, description: str, response: str) -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}}
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            "requestBody": {"required": True, "content": body},
            "responses": {"200": _json_response(description, response), **_BODY_ERRORS},
        }
    }


def _get(operation: str, summary: str, description: str, response: str) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation,
            "summary": summary,
            "responses": {"200": _json_response(description, response)},
        }
    }


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    paths = {path: _post(*spec) for path, spec in _POSTS.items()}
    paths.update({path: _get(*spec) for path, spec in _GETS.items()})
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cabe — ¿cabe en mi GPU?",
            "version": "1",
            "description": "GPU memory planner for training LLMs. Errors answer in `lang` or Accept-Language.",
        },
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
