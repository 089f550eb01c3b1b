from cabe.i18n import LANGS, catalog, fmt_number, placeholders


def test_catalogs_have_same_keys_and_placeholders():
    en, es = catalog("en"), catalog("es")
    assert set(en) == set(es)
    for k in en:
        assert placeholders(en[k]) == placeholders(es[k]), k


def test_every_error_code_has_a_sentence():
    import pathlib
    import re

    src = pathlib.Path(__file__).parents[1] / "src" / "cabe"
    codes = set()
    for p in src.rglob("*.py"):
        codes |= set(re.findall(r'Error\(\s*"([a-z_0-9]+)"', p.read_text()))
    missing = [c for c in codes if "error." + c not in catalog("en")]
    assert not missing, missing


def test_number_formatting():
    assert fmt_number(7.5, "en") == "7.5" and fmt_number(7.5, "es") == "7,5"
    assert fmt_number(6738415616, "en") == "6,738,415,616"
    assert fmt_number(6738415616, "es") == "6.738.415.616"
    assert set(LANGS) == {"en", "es"}


def test_no_key_is_written_in_two_files_of_a_catalog():
    """Every json file of a language is merged into one catalog (cabe.i18n): a key in two files would let the last
    file read silently win, so each key lives in one file."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "src" / "cabe" / "i18n"
    for lang in ("en", "es"):
        seen: dict[str, str] = {}
        twice = []
        for path in sorted((root / lang).glob("*.json")):
            for key in json.loads(path.read_text(encoding="utf-8")):
                if key in seen:
                    twice.append((key, seen[key], path.name))
                seen[key] = path.name
        assert not twice, (lang, twice)
