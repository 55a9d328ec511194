"""Inline SVG drawn on the server: the lifecycle diagram with workers marked, and the throughput chart.

Drawn here rather than by Mermaid or Graphviz in the browser because the dashboard ships no
JavaScript build and loads nothing from a CDN. Every text that comes from Redis (instance
ids) is escaped with markupsafe before it enters the markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

from plaita.fsm import State
from plaita.fsm.table import edges

#: Size of one state box, in SVG user units.
NODE_W = 128
NODE_H = 34
#: Fixed positions (box centres) of the states: the happy path on top, detours below.
POSITIONS: dict[State, tuple[float, float]] = {
    State.INIT: (75, 45),
    State.ENSURE_GROUP: (265, 45),
    State.RECLAIMING: (470, 45),
    State.READING: (675, 45),
    State.BACKOFF: (265, 175),
    State.PAUSED: (570, 175),
    State.STOPPING: (370, 300),
    State.STOPPED: (675, 300),
}
DIAGRAM_W = 760
DIAGRAM_H = 360
#: Instance ids written under a marked state before the rest are summarised as "+N".
SHOWN_IDS = 2
#: How far a curved edge bows out when two states have edges both ways.
BOW = 22.0


def positions() -> dict[State, tuple[float, float]]:
    """Every state's centre; a state missing from POSITIONS gets a slot on an extra row."""
    out = dict(POSITIONS)
    extra = [s for s in State if s not in out]
    for i, state in enumerate(extra):
        out[state] = (75 + i * 190, DIAGRAM_H + 40)
    return out


def _clip(cx: float, cy: float, dx: float, dy: float) -> tuple[float, float]:
    """The point where a ray from a box centre along (dx, dy) leaves the box (plus a gap)."""
    length = math.hypot(dx, dy) or 1.0
    ux, uy = dx / length, dy / length
    tx = (NODE_W / 2 + 4) / abs(ux) if ux else math.inf
    ty = (NODE_H / 2 + 4) / abs(uy) if uy else math.inf
    t = min(tx, ty)
    return cx + ux * t, cy + uy * t


def _grouped_edges() -> dict[tuple[State, State], list[str]]:
    """Triggers per (source, dest) pair; internal no-ops (dest None) are not drawn."""
    grouped: dict[tuple[State, State], list[str]] = {}
    for src, trigger, dest, _cond in edges():
        if dest is not None and trigger not in grouped.setdefault((src, dest), []):
            grouped[(src, dest)].append(trigger)
    return grouped


def _edge(src: State, dest: State, triggers: list[str], bowed: bool, pos: Mapping[State, tuple[float, float]]) -> str:
    (x1, y1), (x2, y2) = pos[src], pos[dest]
    mx, my = (x1 + x2) / 2, (y1 + y2) / 2
    if bowed:  # the reverse edge exists: bend both to the right of their direction
        length = math.hypot(x2 - x1, y2 - y1) or 1.0
        mx, my = mx + BOW * (y2 - y1) / length, my - BOW * (x2 - x1) / length
    sx, sy = _clip(x1, y1, mx - x1, my - y1)
    ex, ey = _clip(x2, y2, mx - x2, my - y2)
    label = escape(", ".join(triggers))
    return (
        f'<g class="edge" data-edge="{src.name}->{dest.name}">'
        f'<path d="M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}" marker-end="url(#arrow)"/>'
        f'<text x="{mx:.1f}" y="{my - 3:.1f}">{label}</text></g>'
    )


def _node(state: State, x: float, y: float, instances: Sequence[str]) -> str:
    marked = " marked" if instances else ""
    parts = [
        f'<g class="state state-{state.name.lower()}{marked}" data-state="{state.name}" data-count="{len(instances)}">',
        f"<title>{escape(state.name)}: {escape(', '.join(instances) or 'no worker')}</title>",
        f'<rect x="{x - NODE_W / 2:.1f}" y="{y - NODE_H / 2:.1f}" width="{NODE_W}" height="{NODE_H}" rx="8"/>',
        f'<text class="name" x="{x:.1f}" y="{y + 4:.1f}">{state.name}</text>',
    ]
    if instances:
        parts.append(f'<circle class="badge" cx="{x + NODE_W / 2:.1f}" cy="{y - NODE_H / 2:.1f}" r="10"/>')
        bx, by = x + NODE_W / 2, y - NODE_H / 2
        parts.append(f'<text class="badge" x="{bx:.1f}" y="{by + 4:.1f}">{len(instances)}</text>')
        shown = [escape(i) for i in instances[:SHOWN_IDS]]
        more = len(instances) - len(shown)
        names = ", ".join(str(s) for s in shown) + (f" +{more}" if more else "")
        parts.append(f'<text class="who" x="{x:.1f}" y="{y + NODE_H / 2 + 13:.1f}">{names}</text>')
    parts.append("</g>")
    return "".join(parts)


def lifecycle_svg(workers_by_state: Mapping[str, Sequence[str]]) -> Markup:
    """The lifecycle diagram; each state lists the instance ids of the workers in it."""
    pos = positions()
    height = max(y for _x, y in pos.values()) + 60
    grouped = _grouped_edges()
    out = [
        f'<svg class="lifecycle" viewBox="0 0 {DIAGRAM_W} {height:.0f}" role="img" '
        'aria-label="worker lifecycle with each worker on its current state">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
    ]
    for (src, dest), triggers in grouped.items():
        out.append(_edge(src, dest, triggers, (dest, src) in grouped, pos))
    for state in State:
        x, y = pos[state]
        out.append(_node(state, x, y, list(workers_by_state.get(state.name, ()))))
    out.append("</svg>")
    return Markup("".join(out))


def throughput_svg(points: Sequence[tuple[float, float | None]], now_s: float, window_s: float) -> Markup:
    """Completions per second over the last ``window_s``: a line per unbroken run of samples.

    ``points`` are (epoch seconds, rate); a rate of None (Redis unavailable) breaks the line.
    """
    width, height, pad = 600.0, 120.0, 4.0
    rates = [r for _t, r in points if r is not None]
    top = max([1.0, *rates])
    runs: list[list[str]] = [[]]
    for t, rate in points:
        if rate is None:
            runs.append([])
            continue
        x = (t - (now_s - window_s)) / window_s * width
        y = height - pad - rate / top * (height - 2 * pad)
        if x >= 0:
            runs[-1].append(f"{x:.1f},{y:.1f}")
    lines = "".join(f'<polyline points="{" ".join(run)}"/>' for run in runs if run)
    return Markup(
        f'<svg class="throughput" viewBox="0 0 {width:.0f} {height:.0f}" preserveAspectRatio="none" role="img" '
        f'aria-label="completions per second, last {window_s / 60:.0f} minutes" data-top="{top:.2f}">'
        f'<line class="axis" x1="0" y1="{height - pad}" x2="{width}" y2="{height - pad}"/>{lines}</svg>'
    )
