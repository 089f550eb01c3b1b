"""The OpenAPI 3.1 document of the JSON API, built from the core's own lists of choices."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from cabe import training


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


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    num = {"type": "number"}
    pos_int = lambda hi: {"type": "integer", "minimum": 1, "maximum": hi}  # noqa: E731
    lang = {"type": "string", "enum": ["en", "es"], "description": "Language of error messages."}
    estimate_props: dict[str, Any] = {
        "params": {
            **num,
            "exclusiveMinimum": 0,
            "maximum": 1e6,
            "description": "Parameters in billions (seed/lesson mode).",
        },
        "bytes_per_param": {
            **num,
            "exclusiveMinimum": 0,
            "maximum": 1024,
            "description": "Bytes per parameter (16 = mixed-precision Adam, 12, 8).",
        },
        "activations_gb": {**num, "minimum": 0, "maximum": 1e6, "description": "Activation memory in GB."},
        "model": {"type": "string", "maxLength": 200, "description": "A preset name or a Hugging Face id."},
        "config": {"type": "object", "description": "A config.json (Hugging Face transformers) as an object."},
        "gpu": {"type": "string", "maxLength": 100, "description": "A card name from /api/gpus."},
        "method": {"type": "string", "enum": list(training.METHODS)},
        "precision": {"type": "string", "enum": list(training.PRECISIONS)},
        "optimizer": {"type": "string", "enum": list(training.OPTIMIZERS)},
        "optimizer_impl": {"type": "string", "enum": list(training.OPTIMIZER_IMPLS)},
        "batch": pos_int(training.MAX_BATCH),
        "seq": pos_int(training.MAX_SEQ),
        "grad_accum": pos_int(training.MAX_BATCH),
        "checkpointing": {"type": "boolean"},
        "attention": {"type": "string", "enum": list(training.ATTENTIONS)},
        "lora_rank": pos_int(training.MAX_RANK),
        "lora_alpha": {**num, "exclusiveMinimum": 0, "maximum": 1e6},
        "lora_targets": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "quant": {"type": "string", "enum": list(training.QUANTS)},
        "double_quant": {"type": "boolean"},
        "compute_dtype": {"type": "string", "enum": list(training.COMPUTE_DTYPES)},
        "trainable_layers": {"type": "integer", "minimum": 0, "maximum": 1 << 12},
        "prompt_tokens": pos_int(training.MAX_SEQ),
        "lang": lang,
        "units": {"type": "string", "enum": ["GB", "GiB"]},
    }
    schemas: dict[str, Any] = {
        "EstimateRequest": {
            "type": "object",
            "description": "Give `params` (billions) or `model` / `config`. `params` + `bytes_per_param` is the "
            "seed calculator: M = N·B, V = M + A.",
            "properties": estimate_props,
            "additionalProperties": False,
            "examples": [
                {"params": 7, "bytes_per_param": 16, "activations_gb": 20},
                {"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048, "gpu": "rtx-4090"},
            ],
        },
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
            },
        },
        "LoraRequest": {
            "type": "object",
            "properties": {
                "model": {"type": "string", "maxLength": 200},
                "config": {"type": "object"},
                "rank": pos_int(training.MAX_RANK),
                "targets": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "lang": lang,
            },
            "additionalProperties": False,
            "examples": [{"model": "llama-3.1-8b", "rank": 16, "targets": ["q_proj", "v_proj"]}],
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
        "FitRequest": {
            "type": "object",
            "description": "An estimate request plus the card (`gpu`, required) and what to solve.",
            "properties": {
                **estimate_props,
                "solve": {
                    "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                    "description": "batch, seq, gpus, changes (comma list); default all",
                },
            },
            "required": ["gpu"],
            "additionalProperties": False,
        },
        "InferRequest": {
            "type": "object",
            "properties": {
                "model": {"type": "string"},
                "config": {"type": "object"},
                "weights": {
                    "type": "string",
                    "description": "fp32, fp16, bf16, int8, nf4, gptq-4bit, awq-4bit, fp8, gguf-q4_k_m, ...",
                },
                "kv_dtype": {"type": "string"},
                "context": {"type": "integer"},
                "batch": {"type": "integer"},
                "mode": {"type": "string"},
                "prefill_chunk": {"type": "integer"},
                "group_size": {"type": "integer"},
                "gpu": {"type": "string"},
                "gpu_memory_utilization": {"type": "number"},
                "lang": {"type": "string"},
                "units": {"type": "string"},
            },
            "additionalProperties": False,
        },
    }
    body_errors = {
        "413": _error_response("Body larger than 256 KiB."),
        "422": _error_response("Invalid input; `field` and a `message` in the asked language."),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cabe — ¿cabe en mi GPU?",
            "version": "1",
            "description": "GPU memory planner for training LLMs. Errors answer in `lang` or Accept-Language.",
        },
        "paths": {
            "/api/estimate": {
                "post": {
                    "operationId": "estimate",
                    "summary": "Estimate the memory of a training run.",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EstimateRequest"}}},
                    },
                    "responses": {"200": _json_response("The report.", "Report"), **body_errors},
                }
            },
            "/api/lora": {
                "post": {
                    "operationId": "lora",
                    "summary": "LoRA adapter parameters per target module.",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/LoraRequest"}}},
                    },
                    "responses": {"200": _json_response("Adapter sizes.", "LoraResponse"), **body_errors},
                }
            },
            "/api/fit": {
                "post": {
                    "operationId": "fit",
                    "summary": "Make it fit: largest micro-batch, longest sequence, fewest GPUs, "
                    "and the changes that fit the card, ranked.",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FitRequest"}}},
                    },
                    "responses": {"200": _json_response("The plan.", "Object"), **body_errors},
                }
            },
            "/api/infer": {
                "post": {
                    "operationId": "infer",
                    "summary": "Inference memory: weights by format, KV cache, serving pool.",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}},
                    },
                    "responses": {"200": _json_response("The inference estimate.", "Object"), **body_errors},
                }
            },
            "/api/models": {
                "get": {
                    "operationId": "models",
                    "summary": "Model presets with metadata.",
                    "responses": {"200": _json_response("Presets.", "Models")},
                }
            },
            "/api/gpus": {
                "get": {
                    "operationId": "gpus",
                    "summary": "The GPU catalog, smallest first.",
                    "responses": {"200": _json_response("Cards.", "Gpus")},
                }
            },
            "/api/health": {
                "get": {
                    "operationId": "health",
                    "summary": "Liveness.",
                    "responses": {"200": _json_response("OK.", "Health")},
                }
            },
        },
        "components": {"schemas": schemas},
    }
