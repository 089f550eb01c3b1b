"""From tracker events to a :class:`~cabe.trace.result.TraceResult`: the peak of the last step, its
split into components, the phase peaks, the largest live allocations, the timeline and the caching
allocator's replay (reserved bytes, segments)."""

from __future__ import annotations

from typing import Any

from cabe.trace.result import TraceResult

TIMELINE_POINTS = 1500
TOP_ALLOCATIONS = 15


def analyse(tracker: Any, steps: int, step_starts: list[int]) -> TraceResult:
    from cabe.trace.tracker import PHASES

    curve = tracker.curve()
    n = len(curve)
    peak, peak_i, phase_peaks = _last_step_peak(tracker, curve, step_starts)
    # step 1 peak, for comparison
    first_end = step_starts[1] if len(step_starts) > 1 else n
    first_peak = max(curve[step_starts[0] : first_end], default=0)

    live = tracker.replay(peak_i) if peak_i >= 0 else set()
    live -= tracker.ignored
    comps = _components(tracker, live)
    assert sum(comps.values()) == peak, (sum(comps.values()), peak)
    peak_phase = PHASES[tracker.event_phase[peak_i]] if peak_i >= 0 else "setup"
    if peak_phase == "setup":
        peak_phase = "forward"
    sizes, events, st, st_exp = _allocator(tracker)
    return TraceResult(
        peak_bytes=peak,
        peak_phase=peak_phase,
        components=comps,
        phase_peaks=phase_peaks,
        timeline=_timeline(curve, tracker.event_phase),
        reserved_bytes=st.peak_reserved_bytes,
        reserved_bytes_expandable=st_exp.peak_reserved_bytes,
        allocator_allocated_bytes=st.peak_allocated_bytes,
        segments=st.peak_segments,
        paged_bytes=sum(tracker.raw_size[a] for a in tracker.paged),
        first_step_peak_bytes=first_peak,
        host_bytes=tracker.host.peak(tracker.step) if tracker.host is not None else 0,
        events=n,
        peak_event=peak_i,
        step_starts=step_starts,
        top_allocations=_top_allocations(tracker, live),
        alloc_sizes=sizes,
        alloc_events=events,
    )


def _last_step_peak(tracker: Any, curve: list[int], step_starts: list[int]) -> tuple[int, int, dict[str, int]]:
    """(peak, its event index, the peak of each phase) over the last step, from the level it starts at."""
    from cabe.trace.tracker import PHASES

    last_start = step_starts[-1]
    # the level when the last step begins, then every event of the last step
    peak = curve[last_start - 1] if last_start > 0 else 0
    peak_i = last_start - 1
    phase_peaks = dict.fromkeys(("forward", "backward", "optimizer"), 0)
    ev_phase = tracker.event_phase
    if any(PHASES[ev_phase[i]] == "reference" for i in range(last_start, len(curve))):
        phase_peaks = {"reference": 0, **phase_peaks}  # GRPO's no-grad passes (cabe.trace.grpo)
    for i in range(last_start, len(curve)):
        v = curve[i]
        if v > peak:
            peak = v
            peak_i = i
        ph = PHASES[ev_phase[i]]
        if ph != "setup" and v > phase_peaks.get(ph, 0):  # (reference: a preference step's, cabe.trace.preference)
            phase_peaks[ph] = v
    return peak, peak_i, phase_peaks


def _components(tracker: Any, live: set[int]) -> dict[str, int]:
    from cabe.trace.tracker import COMPONENTS

    comps = dict.fromkeys(COMPONENTS, 0)
    size = tracker.size
    for aid in live:
        comps[tracker.classify(aid)] += size[aid]
    return comps


def _top_allocations(tracker: Any, live: set[int]) -> list[dict[str, Any]]:
    from cabe.trace.tracker import PHASES

    size = tracker.size
    top = sorted(live, key=lambda a: -size[a])[:TOP_ALLOCATIONS]
    return [
        {
            "bytes": size[a],
            "component": tracker.classify(a),
            "op": tracker.op_of[a],
            "phase": PHASES[tracker.phase_of[a]],
            "step": tracker.step_of[a],
        }
        for a in top
    ]


def _timeline(curve: list[int], ev_phase: Any) -> list[tuple[int, str, int]]:
    """At most :data:`TIMELINE_POINTS` samples, each the max of its bucket."""
    from cabe.trace.tracker import PHASES

    n = len(curve)
    timeline: list[tuple[int, str, int]] = []
    if n:
        bucket = max(1, -(-n // TIMELINE_POINTS))
        for s in range(0, n, bucket):
            j = max(range(s, min(n, s + bucket)), key=lambda k: curve[k])
            timeline.append((j, PHASES[ev_phase[j]], curve[j]))
    return timeline


def _allocator(tracker: Any) -> tuple[list[int], list[int], Any, Any]:
    """The events the caching allocator sees (paged and ignored ones left out), replayed with and
    without expandable segments: (sizes, events, replay, replay with expandable segments)."""
    from cabe.trace.allocator import replay

    events = [
        e
        for e in tracker.events
        if (e if e > 0 else -e) - 1 not in tracker.paged and (e if e > 0 else -e) - 1 not in tracker.ignored
    ]
    sizes = list(tracker.size)
    return sizes, events, replay(sizes, events), replay(sizes, events, expandable_segments=True)
