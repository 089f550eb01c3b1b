"""Two or three setups side by side (issue 32 item 3): one stacked bar each on the same axis, and their totals.

On the page, "Compare" keeps the form's setup in the address (``cmp1``, then ``cmp2``: each the setup's form fields
that differ from the defaults, as a query string of their own) and leaves the form to change for the next one; the
form's setup is always the last one compared. So the address holds every setup: a comparison is shared and reopened
like any result. Each setup is estimated by the same request the page's own result is (page.plan_request over
page.state), and drawn as the page's bar is (page._components: the components at the peak, the allocator's slack,
the CUDA context); page.py hands those in, this module imports nothing of it.

``POST /api/compare`` takes ``{"setups": [request, request(, request)]}`` and answers the estimate JSON of each,
as /api/estimate would, and each one's difference from the first; a bad setup's error names the setup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import parse_qsl, urlencode

from cabe import api, i18n
from cabe import gpus as gpu_catalog
from cabe.errors import CabeError, InvalidValueError
from cabe.web import modes
from cabe.web.charts import PALETTE, _label_x, _nice_max, _ticks, colour_index

#: the address's keys of the kept setups, in order; the form's own setup comes after them
KEYS = ("cmp1", "cmp2")
#: the compare action's name (a submit button: the server keeps the setup and answers with the new address)
PIN = "pin"
MAX_SETUPS = len(KEYS) + 1
LETTERS = "ABC"
#: what a kept setup does not keep: the language, the units, the comparison itself, and the seed calculator's
#: fields (page.SEED_DEFAULTS: not a setup's)
_SKIP = frozenset(("lang", "units", PIN, *KEYS, "n", "b", "bc", "a"))
#: the longest kept setup read from an address (a form's query string is far shorter)
_MAX_KEPT = 4000


def slots(q: Mapping[str, str]) -> dict[str, str]:
    """The kept setups of a query string, for the page's state (empty slots left out, later ones moved up)."""
    kept = [str(q[k]) for k in KEYS if str(q.get(k, "")).strip() and len(str(q[k])) <= _MAX_KEPT]
    return dict(zip(KEYS, kept))


def kept(s: Mapping[str, str]) -> str:
    """A state's setup as a kept one: its fields that differ from the defaults, with the model and the method
    always (so that it reads as what it is), as a query string."""
    keep = {"model": s.get("model", ""), "method": s.get("method", "")}
    return urlencode(keep | {k: v for k, v in s.items() if k not in _SKIP and k not in keep and v != ""})


def minimal(s: Mapping[str, str], state: Callable[[Mapping[str, str]], dict[str, str]]) -> str:
    """:func:`kept`, shortened: only the fields whose value is not what ``state`` (page.state) gives without
    them; checked, so that ``state`` of the result is ``s`` again."""
    keep = {"model": s.get("model", ""), "method": s.get("method", "")}
    base = state(keep)
    keep |= {k: v for k, v in s.items() if k not in _SKIP and k not in keep and base.get(k) != v}
    again = state(keep)
    keep |= {k: v for k, v in s.items() if k not in _SKIP and again.get(k) != v}
    return urlencode(keep)


def pin(q: Mapping[str, str], state: Callable[[Mapping[str, str]], dict[str, str]], keys: Sequence[str]) -> str:
    """The address after "Compare": the form's setup kept in the first free slot (the last kept one replaced
    when all are taken: the first stays the baseline), the form as it was."""
    s = state(q)
    taken = [s[k] for k in KEYS if s.get(k)]
    taken = taken[: len(KEYS) - 1] + [minimal(s, state)]
    out = {k: v for k, v in s.items() if k in keys and k not in KEYS and k != PIN}
    if str(q.get("lang", "")) in i18n.LANGS:  # (the state has no language: the page's is the address's)
        out["lang"] = str(q["lang"])
    return "?" + urlencode(out | dict(zip(KEYS, taken)))


# ------------------------------------------------------------------------------ the page's comparison


def _value_text(name: str, value: str, lang: str) -> str:
    if name == "view":  # the question (train on one card, several GPUs): the page's own key, not the schema's
        return i18n.t(f"web.view.{value}", lang) if value in modes.VIEWS else value
    f = modes.field_of(name)[0]
    if f.type is bool:
        return i18n.t("web.yes" if value in ("1", "on", "true") else "web.no", lang)
    if name == "gpu":
        try:
            return gpu_catalog.gpu(value).display
        except CabeError:
            return value
    key = f"web.{name}.{value}"
    return i18n.t(key, lang) if key in i18n.catalog(i18n.DEFAULT_LANG) else value


def _field_text(name: str, lang: str) -> str:
    key = "web.view.legend" if name == "view" else f"web.plan.{name}"
    return i18n.t(key, lang) if key in i18n.catalog(i18n.DEFAULT_LANG) else name


def captions(states: Sequence[Mapping[str, str]], lang: str) -> list[str]:
    """What tells the setups apart: the fields whose values differ (one field: its value alone; else
    "field: value", three at most)."""
    keys = [k for k in states[-1] if k not in _SKIP and len({st.get(k, "") for st in states}) > 1] or ["method"]
    out = []
    for st in states:
        if len(keys) == 1:
            out.append(_value_text(keys[0], st.get(keys[0], ""), lang))
        else:
            bits = [f"{_field_text(k, lang)}: {_value_text(k, st.get(k, ''), lang)}" for k in keys[:3]]
            out.append(", ".join(bits) + (" …" if len(keys) > 3 else ""))
    return out


def view(
    s: Mapping[str, str],
    current: Mapping[str, Any],
    u: Any,
    lang: str,
    state: Callable[[Mapping[str, str]], dict[str, str]],
    request: Callable[[Mapping[str, str]], dict[str, Any]],
    segments: Callable[[Mapping[str, Any], Any, str], list[tuple[str, str, float]]],
    link: Callable[..., str],
) -> dict[str, Any]:
    """What compare.html shows: each kept setup and the form's, estimated (``current``: the form's answer), their
    chart and table; ``{"compare": None}`` when nothing is kept. ``state``, ``request``, ``segments``, ``link``:
    page.state, page.plan_request, page._components, page._link."""
    pinned = [s[k] for k in KEYS if s.get(k)]
    if not pinned:
        return {"compare": None}
    states = [state(dict(parse_qsl(p, keep_blank_values=True))) for p in pinned] + [dict(s)]
    outs: list[Any] = []
    for st in states[:-1]:
        try:
            outs.append(api.estimate_json(request(st)))
        except CabeError as err:
            outs.append(err.to_dict(lang))
    outs.append(current)
    names = captions(states, lang)
    first = outs[0].get("total_bytes") if "total_bytes" in outs[0] else None
    rows: list[dict[str, Any]] = []
    bars: list[tuple[str, list[tuple[str, str, float]], float]] = []
    cards: dict[str, tuple[str, float]] = {}
    for i, (st, out) in enumerate(zip(states, outs)):
        others = [p for j, p in enumerate(pinned) if j != i]
        # remove this one (the form's: the last kept one takes the form's place); open a kept one in the form (the
        # form's setup kept in its stead)
        gone = _slots(others) if i < len(pinned) else _slots(pinned[:-1])
        row: dict[str, Any] = {
            "letter": LETTERS[i],
            "name": names[i],
            "form": i == len(pinned),
            "remove": link(_bare(s if i < len(pinned) else states[i - 1]), lang=lang, **gone),
            "open": None if i == len(pinned) else link(_bare(st), lang=lang, **_slots(others + [minimal(s, state)])),
        }
        if "total_bytes" not in out:
            rows.append({**row, "error": out["message"]})
            continue
        fit = out.get("gpu")
        segs = segments(out, fit, lang)
        needed = sum(v for _, _, v in segs)
        diff = None if first is None or i == 0 else out["total_bytes"] - first
        rows.append(
            {
                **row,
                "error": None,
                "bytes": out["total_bytes"],
                "total": u.of(out["total_bytes"]),
                "needed": u.of(needed),
                "diff": "—" if diff is None else ("+" if diff > 0 else "−" if diff < 0 else "±") + u.of(abs(diff)),
                "fits": None if not fit else bool(fit["fits"]),
                "gpu": fit["display"] if fit else "",
            }
        )
        bars.append((f"{LETTERS[i]} · {names[i]}", [(k, lbl, v / u.div) for k, lbl, v in segs], needed))
        if fit:
            cards.setdefault(fit["gpu"], (fit["display"], gpu_catalog.gpu(fit["gpu"]).memory_bytes / u.div))
    if len({r.get("gpu") for r in rows if not r["error"]}) < 2:  # one card for all: named once, in the chart
        rows = [{**r, "gpu": ""} for r in rows]
    from markupsafe import Markup

    svg = compare_chart(
        bars, list(cards.values()), title=i18n.t("web.compare.chart_title", lang), unit=u.name, div=u.div, fmt=u.num
    )
    legend = {k: lbl for _, segs, _ in bars for k, lbl, _ in segs}
    return {
        "compare": {
            "rows": rows,
            "svg": Markup(svg),
            "legend": [(f"c{colour_index(k)}", lbl) for k, lbl in legend.items()],
            "stop": link(_bare(s), lang=lang),
            "first": LETTERS[0],
        }
    }


def _slots(kept_setups: Sequence[str]) -> dict[str, str]:
    return dict(zip(KEYS, kept_setups))


def _bare(s: Mapping[str, str]) -> dict[str, str]:
    """A state without its kept setups (a link names those it keeps)."""
    return {k: v for k, v in s.items() if k not in KEYS}


def compare_chart(
    bars: Sequence[tuple[str, Sequence[tuple[str, str, float]], float]],
    cards: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str,
    div: float,
    fmt: Callable[[float], str],
    width: int = 360,
) -> str:
    """One horizontal stacked bar per setup (``bars``: name, segments as (component, label, value in ``unit``),
    needed bytes), all on one axis, with the setups' cards as vertical lines (``cards``: name, memory in ``unit``).
    360 units wide and 13 px text, as the page's other charts."""
    if not bars:
        return ""
    values = [need / div for _, _, need in bars]
    top = _nice_max(max(values + [c for _, c in cards]) * 1.02)
    left, right, row_h, bar_h, first = 12, 16, 54, 24, 8
    plot_w = width - left - right
    sx = lambda v: left + plot_w * (v / top)  # noqa: E731
    bottom = first + row_h * len(bars)
    height = bottom + 22 + 18 * len(cards) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart compare" viewBox="0 0 {width} {height}" '
        f'role="img" aria-labelledby="compare-title"><title id="compare-title">{escape(title)}</title>'
    ]
    for i, (name, segs, need) in enumerate(bars):
        y = first + row_h * i
        value = f"{fmt(need / div)} {unit}"
        room = int((plot_w - 0.6 * 13 * len(value) - 16) / (0.66 * 13))  # characters left for the (bold) name
        shown = _shorten(name, room)
        parts.append(
            f'<g class="setup" data-bytes="{int(need)}"><title>{escape(name)}: {escape(value)}</title>'
            f'<text x="{left}" y="{y + 14}" class="setup-label">{escape(shown)}</text>'
            f'<text x="{width - right}" y="{y + 14}" class="total-label" text-anchor="end">{escape(value)}</text>'
        )
        x = 0.0
        for k, lbl, v in segs:
            if v <= 0:
                continue
            parts.append(
                f'<rect x="{sx(x):.1f}" y="{y + 20}" width="{max(plot_w * v / top, 0.5):.1f}" height="{bar_h}" '
                f'fill="{PALETTE[colour_index(k) % len(PALETTE)]}"><title>{escape(lbl)}: {escape(fmt(v))} {unit}</title></rect>'
            )
            x += v
        parts.append("</g>")
    for tv in _ticks(top):
        parts.append(
            f'<line x1="{sx(tv):.1f}" x2="{sx(tv):.1f}" y1="{bottom}" y2="{bottom + 4}" class="axis"/>'
            f'<text x="{sx(tv):.1f}" y="{bottom + 17}" class="tick" text-anchor="middle">{escape(fmt(tv))}</text>'
        )
    for j, (label, cap) in enumerate(cards):
        cx, ly = sx(cap), bottom + 22 + 18 * (j + 1)
        text = f"{label} · {fmt(cap)} {unit}"
        tx, anchor = _label_x(cx, text, width, 13)
        parts.append(
            f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{first + 16}" y2="{ly - 4}" class="marker"/>'
            f'<text x="{tx:.1f}" y="{ly}" class="marker-label" text-anchor="{anchor}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _shorten(name: str, room: int) -> str:
    """``name`` in ``room`` characters: without its last parenthesis ("QLoRA (4-bit frozen base + LoRA)" -> "QLoRA"),
    else cut with an ellipsis (the table beside the chart has it whole)."""
    if len(name) > room and name.endswith(")") and " (" in name:
        name = name[: name.rindex(" (")]
    return name if len(name) <= room else name[: max(room - 1, 1)] + "…"


# ------------------------------------------------------------------------------ POST /api/compare


class SetupError(CabeError):
    """A setup's own error, with the setup it is about (``setup``: its index) and its letter in the sentence."""

    def __init__(self, index: int, err: CabeError) -> None:
        super().__init__(err.code, err.field, **err.params)
        self.index, self.cause = index, err

    def to_dict(self, lang: str = "en") -> dict[str, Any]:
        d = self.cause.to_dict(lang)
        message = i18n.t("web.compare.setup_error", lang, letter=LETTERS[self.index], message=d["message"])
        return {**d, "setup": self.index, "message": message}


def compare_json(body: Any, estimate: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """``{"setups": [...]}`` -> each setup's estimate (``estimate``: what /api/estimate answers for one request,
    its fields checked) and its total's difference from the first setup's."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    for key in body:
        if key not in ("setups", "lang"):
            raise InvalidValueError("unknown_field", key, allowed="setups, lang")
    setups = body.get("setups")
    if not isinstance(setups, list):
        raise InvalidValueError("compare_not_list", "setups", minimum=2, maximum=MAX_SETUPS)
    if not 2 <= len(setups) <= MAX_SETUPS:
        raise InvalidValueError("compare_count", "setups", value=len(setups), minimum=2, maximum=MAX_SETUPS)
    outs = []
    for i, one in enumerate(setups):
        try:
            if not isinstance(one, Mapping):
                raise InvalidValueError("compare_setup_not_object", "setups")
            outs.append(estimate({**one, **({"lang": body["lang"]} if "lang" in body and "lang" not in one else {})}))
        except CabeError as err:
            raise SetupError(i, err) from None
    base = outs[0]["total_bytes"]
    return {"setups": outs, "difference_bytes": [o["total_bytes"] - base for o in outs]}
