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
