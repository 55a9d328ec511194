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
NODE_W = 124
NODE_H = 34
DIAGRAM_W = 940
#: Left and right margin of the top row (box centres).
MARGIN_X = 80
#: Vertical centre of each row: the happy path, the detours, the end.
ROWS_Y = (70, 200, 330)
#: The happy path, left to right on the top row. Layouts name states (not ``State`` members) so a
#: state this version does not have is skipped and one it adds but the layout lacks gets a slot.
TOP_ROW = ("INIT", "ENSURE_GROUP", "RESUMING_OWN", "RECLAIMING", "READING")
#: The other states: (row, x as a fraction of the width, or the top-row state to sit under).
BELOW: dict[str, tuple[int, float | str]] = {
    "BACKOFF": (1, "ENSURE_GROUP"),
    "ISOLATING": (1, "RESUMING_OWN"),
    "PAUSED": (1, 0.70),
    "STOPPING": (2, 0.47),
    "STOPPED": (2, "READING"),
}
#: Instance ids written above a marked state before the rest are summarised as "+N".
SHOWN_IDS = 2
#: How far a curved edge bows out when two states have edges both ways.
BOW = 18.0
#: A trigger leading to one state from at least this many states is drawn once, as a fan-in
#: arrow listing its sources (six separate ``stop_requested`` arrows would hide the rest).
FAN_IN_MIN = 3


def positions() -> dict[State, tuple[float, float]]:
    """Every state's box centre: TOP_ROW spread evenly, BELOW placed, anything else on an extra row."""
    names = {s.name: s for s in State}
    top = [names[n] for n in TOP_ROW if n in names]
    step = (DIAGRAM_W - 2 * MARGIN_X) / max(1, len(top) - 1)
    out = {state: (MARGIN_X + i * step, float(ROWS_Y[0])) for i, state in enumerate(top)}
    for name, (row, where) in BELOW.items():
        if name not in names:
            continue
        if isinstance(where, str):
            anchor = names.get(where)
            x = out[anchor][0] if anchor in out else DIAGRAM_W / 2
        else:
            x = where * DIAGRAM_W
        out[names[name]] = (x, float(ROWS_Y[row]))
    for i, state in enumerate(s for s in State if s not in out):
        out[state] = (MARGIN_X + i * 200, ROWS_Y[-1] + 130.0)
    return out


def _clip(cx: float, cy: float, dx: float, dy: float) -> tuple[float, float]:
    """The point where a ray from a box centre along (dx, dy) leaves the box (plus a gap)."""
    length = math.hypot(dx, dy) or 1.0
    ux, uy = dx / length, dy / length
    tx = (NODE_W / 2 + 4) / abs(ux) if ux else math.inf
    ty = (NODE_H / 2 + 4) / abs(uy) if uy else math.inf
    t = min(tx, ty)
    return cx + ux * t, cy + uy * t


def _label(trigger: str, condition: str | None) -> str:
    return f"{trigger} [{condition}]" if condition else trigger


def split_edges() -> tuple[dict[tuple[State, State], list[str]], dict[tuple[str, State], list[State]]]:
    """(single edges: labels per (source, dest); fan-ins: sources per (label, dest)).

    Internal no-ops (dest None) are not drawn: they change nothing on the diagram.
    """
    sources: dict[tuple[str, State], list[State]] = {}
    for src, trigger, dest, cond in edges():
        if dest is not None:
            sources.setdefault((_label(trigger, cond), dest), []).append(src)
    singles: dict[tuple[State, State], list[str]] = {}
    fan_ins: dict[tuple[str, State], list[State]] = {}
    for (label, dest), srcs in sources.items():
        if len(srcs) >= FAN_IN_MIN:
            fan_ins[(label, dest)] = srcs
        else:
            for src in srcs:
                singles.setdefault((src, dest), []).append(label)
    return singles, fan_ins


def _edge(src: State, dest: State, labels: list[str], bowed: bool, pos: Mapping[State, tuple[float, float]]) -> str:
    (x1, y1), (x2, y2) = pos[src], pos[dest]
    mx, my = (x1 + x2) / 2, (y1 + y2) / 2
    if bowed:  # the reverse edge exists: bend both to the right of their direction
        length = math.hypot(x2 - x1, y2 - y1) or 1.0
        mx, my = mx + BOW * (y2 - y1) / length, my - BOW * (x2 - x1) / length
    sx, sy = _clip(x1, y1, mx - x1, my - y1)
    ex, ey = _clip(x2, y2, mx - x2, my - y2)
    upright = abs(x2 - x1) < abs(y2 - y1)
    tx, ty, anchor = (mx - 6, my, "end") if upright else (mx, my - 4 if my <= (y1 + y2) / 2 else my + 11, "middle")
    return (
        f'<g class="edge" data-edge="{src.name}->{dest.name}">'
        f'<path d="M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}" marker-end="url(#arrow)"/>'
        f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}">{escape(", ".join(labels))}</text></g>'
    )


def _fan_in(label: str, dest: State, srcs: list[State], pos: Mapping[State, tuple[float, float]]) -> str:
    """One arrow into ``dest`` from below, captioned with the trigger and every source state."""
    x, y = pos[dest]
    bottom = y + NODE_H / 2
    names = " ".join(s.name for s in srcs)
    return (
        f'<g class="edge fan-in" data-fan-in="{dest.name}" data-trigger="{escape(label)}" data-sources="{names}">'
        f'<path d="M{x:.1f},{bottom + 30:.1f} L{x:.1f},{bottom + 4:.1f}" marker-end="url(#arrow)"/>'
        f'<text x="{x:.1f}" y="{bottom + 42:.1f}" text-anchor="middle">{escape(label)}'
        f'<tspan x="{x:.1f}" dy="12">from {escape(", ".join(s.name for s in srcs))}</tspan></text></g>'
    )


def _node(state: State, x: float, y: float, instances: Sequence[str]) -> str:
    marked = " marked" if instances else ""
    top = y - NODE_H / 2
    parts = [
        f'<g class="state state-{state.name.lower()}{marked}" data-state="{state.name}" data-count="{len(instances)}">',
        f"<title>{escape(state.name)}: {escape(', '.join(instances) or 'no worker')}</title>",
        f'<rect x="{x - NODE_W / 2:.1f}" y="{top:.1f}" width="{NODE_W}" height="{NODE_H}" rx="8"/>',
        f'<text class="name" x="{x:.1f}" y="{y + 4:.1f}">{state.name}</text>',
    ]
    if instances:
        bx = x + NODE_W / 2
        parts.append(f'<circle class="badge" cx="{bx:.1f}" cy="{top:.1f}" r="10"/>')
        parts.append(f'<text class="badge" x="{bx:.1f}" y="{top + 4:.1f}">{len(instances)}</text>')
        shown = [str(escape(i)) for i in instances[:SHOWN_IDS]]
        more = len(instances) - len(shown)
        names = ", ".join(shown) + (f" +{more}" if more else "")
        parts.append(f'<text class="who" x="{x:.1f}" y="{top - 6:.1f}">{names}</text>')
    parts.append("</g>")
    return "".join(parts)


def lifecycle_svg(workers_by_state: Mapping[str, Sequence[str]]) -> Markup:
    """The lifecycle diagram; each state lists the instance ids of the workers in it."""
    pos = positions()
    height = max(y for _x, y in pos.values()) + NODE_H / 2 + 66
    singles, fan_ins = split_edges()
    out = [
        f'<svg class="lifecycle" viewBox="0 0 {DIAGRAM_W} {height:.0f}" role="img" '
        'aria-label="worker lifecycle with each worker on its current state">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
    ]
    for (src, dest), labels in singles.items():
        out.append(_edge(src, dest, labels, (dest, src) in singles, pos))
    for (label, dest), srcs in fan_ins.items():
        out.append(_fan_in(label, dest, srcs, pos))
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
    start_s = now_s - window_s
    shown = [(t, r) for t, r in points if t >= start_s]
    top = max([1.0, *(r for _t, r in shown if r is not None)])
    runs: list[list[str]] = [[]]
    for t, rate in shown:
        if rate is None:
            runs.append([])
            continue
        x = (t - start_s) / window_s * width
        y = height - pad - rate / top * (height - 2 * pad)
        runs[-1].append(f"{x:.1f},{y:.1f}")
    lines = "".join(f'<polyline points="{" ".join(run)}"/>' for run in runs if run)
    return Markup(
        f'<svg class="throughput" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="completions per second, last {window_s:.0f} s" data-top="{top:.2f}">'
        f'<line class="axis" x1="0" y1="{height - pad}" x2="{width}" y2="{height - pad}"/>'
        f'<text class="top" x="4" y="14">{top:.0f}/s</text>{lines}</svg>'
    )
