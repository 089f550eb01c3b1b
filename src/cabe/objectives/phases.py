"""Composing a step of several phases from an SFT report: bytes resident in every phase (a reference model's
weights, an engine's pool) added to each of the policy's moments, and phases of their own (a reference's
forward, generation) beside them; the peak is the largest (the first of the largest, as :func:`max` picks)."""

from __future__ import annotations

from dataclasses import replace

from cabe.report import Report


def compose(policy: Report, resident: int, extra: dict[str, int], notes: tuple[str, ...] = ()) -> Report:
    """``policy`` with ``resident`` bytes beside every moment (component ``reference_weights``) and the phases of
    ``extra`` (name -> total bytes, ``resident`` included); ``phase_peaks`` has every phase, ``peak_phase`` the
    largest. A phase of ``extra`` at the peak puts what it adds above the policy's peak under ``activations``."""
    phases = {name: v + resident for name, v in policy.phase_peaks.items()}
    phases.update(extra)
    peak_phase = max(phases, key=lambda k: phases[k])
    total = phases[peak_phase]
    components = dict(policy.components)
    if resident:
        components["reference_weights"] = resident
    if peak_phase in extra:  # (the components of the policy's peak, the rest as the phase's working set)
        components["activations"] = components.get("activations", 0) + total - sum(components.values())
        if components["activations"] < 0:  # a phase below the policy's peak moment cannot be the peak
            raise AssertionError("phase below the policy's peak")
    extra_json = {**policy.extra, "peak_at": peak_phase if peak_phase in extra else policy.extra.get("peak_at")}
    return replace(
        policy,
        total_bytes=total,
        components=components,
        peak_phase=peak_phase,
        phase_peaks=phases,
        notes=policy.notes + notes,
        extra=extra_json,
    )
