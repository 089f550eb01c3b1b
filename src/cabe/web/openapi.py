"""The OpenAPI 3.1 document of the JSON API.

The request schemas are generated from :mod:`cabe.schema` (the fields each endpoint takes, their
types, choices and ranges, :func:`cabe.schema.json_schema`), so that the document, the server's
validation and the command line agree; the responses are described here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from cabe import schema
from cabe.configs import FORMATS
from cabe.configs._base import MAX_BYTES
from cabe.i18n import t
from cabe.web.config_upload import MAX_FILES, MAX_UPLOAD_BYTES

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
    schemas["FromConfigRequest"] = from_config_schema()
    schemas.update(_COMPARE)
    schemas.update(_RESPONSES)
    return schemas


def from_config_schema() -> dict[str, Any]:
    """``POST /api/from-config``: the files' texts (``cabe from-config FILE...``), ``format`` (``--format``) and the
    fields ``cabe from-config`` takes as overrides (:func:`cabe.schema.json_schema` of ``from-config``)."""
    out = schema.json_schema("from-config")
    fields = {f.name: f for f in schema.fields_for("from-config")}
    for key, prop in out["properties"].items():
        prop["description"] = _description(fields[key]) + " Overrides what the files say."
    file_item = {
        "type": "object",
        "required": ["name", "text"],
        "additionalProperties": False,
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "description": "The file's name (its suffix and name help tell the format).",
            },
            "text": {"type": "string", "description": f"The file's text (UTF-8, at most {MAX_BYTES} bytes)."},
        },
    }
    out["properties"] = {
        "files": {"type": "array", "minItems": 1, "maxItems": MAX_FILES, "items": file_item},
        "format": {"type": "string", "description": "Read every file as this format: " + ", ".join(FORMATS) + "."},
        **out["properties"],
    }
    out["required"] = ["files"]
    return {
        **out,
        "description": "Your own configs (TrainingArguments / SFTConfig, adapter_config.json, BitsAndBytesConfig, "
        "DeepSpeed, accelerate, axolotl, LLaMA-Factory, torchtune, unsloth, requirements), read with `cabe from-config`'s "
        "readers and limits; also as multipart/form-data (`files` parts, the other fields as text parts).",
        "examples": [
            {
                "files": [{"name": "adapter_config.json", "text": '{"peft_type": "LORA", "r": 16}'}],
                "model": "llama-3.1-8b",
            }
        ],
    }


def _from_config_post() -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/FromConfigRequest"}
    form = {
        "type": "object",
        "properties": {"files": {"type": "array", "items": {"type": "string", "format": "binary"}}},
    }
    return {
        "post": {
            "operationId": "from_config",
            "summary": "Estimate from your own training configs, as `cabe from-config --json`.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref}, "multipart/form-data": {"schema": form}},
            },
            "responses": {
                "200": _json_response(
                    "The report, with `from_config`: the files, what was used and ignored, the request "
                    "and what each file set (`sets`).",
                    "Report",
                ),
                **_BODY_ERRORS,
                "413": _error_response(f"Body larger than {MAX_UPLOAD_BYTES} bytes."),
                "422": _error_response(
                    "A file that cannot be read (its typed error), or a request whose estimate fails "
                    "(then `from_config` says what the files set)."
                ),
            },
        }
    }


#: /api/compare (cabe.web.compare): a list of estimate requests, each answered as /api/estimate answers it
_COMPARE: dict[str, Any] = {
    "CompareRequest": {
        "type": "object",
        "description": "Two or three estimate requests, compared on one axis (the page's \"Compare\"). A setup's error "
        "names the setup (`setup`: its index; the sentence starts with its letter, A to C).",
        "required": ["setups"],
        "additionalProperties": False,
        "properties": {
            "setups": {
                "type": "array",
                "minItems": 2,
                "maxItems": 3,
                "items": {"$ref": "#/components/schemas/EstimateRequest"},
            },
            "lang": {"type": "string", "description": "Language of error messages (each setup's own `lang` first)."},
        },
        "examples": [
            {
                "setups": [
                    {"model": "llama-3.1-8b", "method": m, "seq": 2048, "gpu": "rtx-4090"}
                    for m in ("lora", "qlora", "full")
                ]
            }
        ],
    },
    "CompareResponse": {
        "type": "object",
        "required": ["setups", "difference_bytes"],
        "properties": {
            "setups": {"type": "array", "items": {"$ref": "#/components/schemas/Report"}},
            "difference_bytes": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "Each setup's total_bytes minus the first's.",
            },
        },
    },
}


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
    "/api/compare": (
        "compare",
        "Two or three training estimates side by side, each as /api/estimate answers it, and their differences.",
        "CompareRequest",
        "Each setup's report, in order, and each total's difference from the first's.",
        "CompareResponse",
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
    paths["/api/from-config"] = _from_config_post()
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
