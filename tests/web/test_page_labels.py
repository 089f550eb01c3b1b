"""Every field the planner's form shows has its label in both catalogs: a missing one printed its key
("web.plan.images", "web.plan.transformers") on the page."""

import pytest

from cabe import i18n
from cabe.web import page


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_form_field_has_a_label(lang):
    missing = []
    for _legend, names in page.FIELDSETS:
        for name in names:
            label = page.widget(name, lang)["label"]
            if i18n.t(label, lang) == label:
                missing.append(label)
    assert not missing
