"""``POST /api/from-config`` (issue 32 item 1): your own configs, read with ``cabe from-config``'s readers and limits,
answer what ``cabe from-config --json`` answers, plus what each file set; a bad file is a 4xx with its typed error's
sentence, never a 5xx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cabe.configs._base import MAX_BYTES
from cabe.web.config_upload import MAX_FILES

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "tests" / "configs" / "files"


def cli_from_config(*names: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = [str(FILES / n) for n in names]
    out = subprocess.run(
        [sys.executable, "-m", "cabe", "from-config", *args, "--json"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def texts(*names: str) -> list[dict[str, str]]:
    return [{"name": n, "text": (FILES / n).read_text()} for n in names]


def _without_paths(fc: dict) -> dict:
    """The CLI names each file by its path, the API by the name it was given."""
    out = json.loads(json.dumps(fc))
    for key in ("files", "used", "ignored", "sets"):
        for item in out.get(key, []):
            for k in ("path", "file"):
                if k in item:
                    item[k] = Path(item[k]).name
    return out


@pytest.mark.parametrize(
    "names",
    [
        ("axolotl_llama3_qlora.yml",),
        ("adapter_config.json", "ds_zero2.json"),
        ("torchtune_8B_qlora_single_device.yaml",),
    ],
)
def test_json_answer_is_the_clis(client, names):
    cli = cli_from_config(*names)
    r = client.post("/api/from-config", json={"files": texts(*names)})
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    assert out["total_bytes"] == cli["total_bytes"] and out["components"] == cli["components"]
    assert _without_paths(out["from_config"]) == _without_paths(cli["from_config"])
    # what each file set, per file: the adapter's rank and targets come from adapter_config.json
    sets = {s["file"]: s for s in out["from_config"]["sets"]}
    assert set(sets) == set(names)
    if "adapter_config.json" in sets:
        a = sets["adapter_config.json"]
        assert a["format"] == "peft_config" and a["sets"]["lora_rank"] == 16 and a["sets"]["method"] == "lora"
        assert sets["ds_zero2.json"]["sets"]["shard"] == "zero2"


def test_multipart_is_read_as_json_is(client):
    names = ("adapter_config.json", "ds_zero2.json")
    files = [("files", (n, (FILES / n).read_bytes(), "application/octet-stream")) for n in names]
    r = client.post("/api/from-config", files=files, data={"gpu": "h100-sxm", "seq": "1024"})
    assert r.status_code == 200, r.text[:300]
    j = client.post("/api/from-config", json={"files": texts(*names), "gpu": "h100-sxm", "seq": 1024}).json()
    out = r.json()
    assert out["total_bytes"] == j["total_bytes"] and out["gpu"]["gpu"] == "h100-sxm"
    assert out["from_config"]["request"]["seq"] == 1024 and out["from_config"]["overridden"] == []


def test_files_without_a_model_say_what_they_set_beside_the_error(client):
    """A DeepSpeed file names no model: the estimate cannot run (422, the CLI's sentence), and the answer still
    says what the file set, for the page to fill its form."""
    r = client.post("/api/from-config", json={"files": texts("ds_zero2.json"), "lang": "es"})
    assert r.status_code == 422
    out = r.json()
    assert out["error"]["message"] and "--model" in out["error"]["message"]
    assert out["from_config"]["request"]["shard"] == "zero2"
    # with the model as an override (as --model), it answers
    ok = client.post("/api/from-config", json={"files": texts("ds_zero2.json"), "model": "llama-3.1-8b"})
    assert ok.status_code == 200 and ok.json()["distributed"]["strategy"] == "zero2"


BIG = "a: " + "x" * MAX_BYTES
BAD = [
    ({"files": []}, "cfg_no_files", "files"),
    ({}, "cfg_no_files", "files"),
    ({"files": "ds.json"}, "cfg_bad_upload", "files"),
    ({"files": [{"name": "x.json"}]}, "cfg_bad_upload", "files"),
    ({"files": [{"name": "", "text": "{}"}]}, "cfg_bad_upload", "files"),
    ({"files": [{"name": "x.json", "text": 3}]}, "cfg_bad_upload", "files"),
    ({"files": [{"name": "x.json", "text": "{}", "path": "/etc/passwd"}]}, "cfg_bad_upload", "files"),
    ({"files": [{"name": f"{i}.json", "text": "{}"} for i in range(MAX_FILES + 1)]}, "cfg_too_many_files", "files"),
    ({"files": [{"name": "big.yaml", "text": BIG}]}, "cfg_too_large", "file"),
    ({"files": [{"name": "x.json", "text": "{not json"}]}, "cfg_malformed", "file"),
    ({"files": [{"name": "x.yaml", "text": "a: [1, 2"}]}, "cfg_malformed", "file"),
    ({"files": [{"name": "x.yaml", "text": "- 1\n- 2\n"}]}, "cfg_not_mapping", "file"),
    ({"files": [{"name": "x.json", "text": '{"a": 1e999}'}]}, "cfg_not_finite", "file"),
    ({"files": [{"name": "x.json", "text": '{"hello": 1}'}]}, "cfg_unknown_format", "file"),
    ({"files": texts("ds_zero2.json"), "format": "nope"}, "cfg_bad_format", "format"),
    ({"files": texts("ds_zero2.json"), "format": 7}, "cfg_bad_format", "format"),
    ({"files": texts("ds_zero2.json"), "model": "llama-3.1-8b", "batch": 0}, "out_of_range", "batch"),
    ({"files": texts("ds_zero2.json"), "nope": 1}, "unknown_field", "nope"),
    ({"files": texts("ds_zero2.json"), "method": "lora"}, "unknown_field", "method"),
    ([1, 2], "body_not_object", None),
]


@pytest.mark.parametrize("body,code,field", BAD)
def test_bad_files_are_422_with_the_typed_sentence(client, body, code, field):
    r = client.post("/api/from-config", json=body)
    assert r.status_code == 422, r.text[:300]
    err = r.json()["error"]
    assert (err["code"], err["field"]) == (code, field) and err["message"]


def test_yaml_bomb_is_refused(client):
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    r = client.post("/api/from-config", json={"files": [{"name": "bomb.yaml", "text": bomb}]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "cfg_too_many_items"


@pytest.mark.parametrize(
    "raw,ctype,status,code",
    [
        ("{nope", "application/json", 422, "invalid_json"),
        ('{"files": [{"name": "a", "text": NaN}]}', "application/json", 422, "not_finite"),
        ("--x\r\nnot a part", "multipart/form-data; boundary=x", 422, "invalid_request"),
        ("", "multipart/form-data", 422, "invalid_request"),
        (
            '--x\r\nContent-Disposition: form-data; name="files"; filename="a.json"\r\n\r\n\xff\xfe\r\n--x--\r\n',
            "multipart/form-data; boundary=x",
            422,
            "cfg_malformed",
        ),
        (
            '--x\r\nContent-Disposition: form-data; name="bogus"\r\n\r\n1\r\n--x--\r\n',
            "multipart/form-data; boundary=x",
            422,
            "unknown_field",
        ),
    ],
)
def test_bodies_that_do_not_parse_are_4xx(client, raw, ctype, status, code):
    r = client.post("/api/from-config", content=raw.encode("latin-1"), headers={"content-type": ctype})
    assert r.status_code == status, r.text[:300]
    assert r.json()["error"]["code"] == code


def test_a_body_past_the_limit_is_413(client):
    from cabe.web.config_upload import MAX_UPLOAD_BYTES

    r = client.post(
        "/api/from-config", content=b"x" * (MAX_UPLOAD_BYTES + 1), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_the_endpoint_is_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/api/from-config"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    req = doc["components"]["schemas"]["FromConfigRequest"]
    assert req["required"] == ["files"] and req["properties"]["files"]["maxItems"] == MAX_FILES
    from cabe import schema

    assert set(req["properties"]) == {"files", "format"} | set(schema.names("from-config", output=True))


# Negative data: the real configs with any JSON value in any of their keys, or any text, answer 200 or 422, never 5xx.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_REAL = ["adapter_config.json", "ds_zero2.json", "sft_config.json", "bnb_config.json", "ds_zero3_offload.json"]
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def _mutated(draw):
    name = draw(st.sampled_from(_REAL))
    data = json.loads((FILES / name).read_text())
    for key in draw(st.lists(st.sampled_from(sorted(data)), max_size=4)):
        data[key] = draw(_values)
    return {"name": name, "text": json.dumps(data)}


_texts = st.fixed_dictionaries({"name": st.sampled_from(["a.json", "b.yaml", "requirements.txt", "c"]),
                                "text": st.text(max_size=200)})  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=st.lists(_mutated() | _texts, min_size=1, max_size=3))
def test_any_config_content_never_5xx(client, files):
    r = client.post("/api/from-config", json={"files": files, "model": "llama-3.2-1b"})
    assert r.status_code in (200, 422), (files, r.text[:300])
    if r.status_code == 422:
        assert r.json()["error"]["message"]
