"""A rewrite step drawn as two pictures, the subgraph it matched and the one put in its place (inline SVG): a box
per node named by its ONNX op, a pill per value entering or leaving, an arrow per value between them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from xflow.cli.html.layout import Box, layout

CHAR_W = 7.4  # width of one character of the 12px labels, near enough for sizing boxes
NAME_CHARS = 22  # a value or node name longer than this is cut in the picture (its full text in the tooltip)
OP_H, PILL_H = 38.0, 22.0
PAD = 10.0


def short(text: str, chars: int = NAME_CHARS) -> str:
    """``text`` cut to ``chars`` characters in the middle, the cut shown by an ellipsis (an exporter's names differ
    at their ends: ``encoder.layer.0/output/MatMul``)."""
    if len(text) <= chars:
        return text
    tail = (chars - 1) * 3 // 5
    return text[:chars - 1 - tail] + "…" + text[len(text) - tail:]


def interface(step: Mapping[str, Any]) -> list[str]:
    """The values a step's subgraphs hand on (the same in both pictures): what the matched nodes make that none
    of them reads, that the target takes over, or that becomes another value."""
    before, after, aliases = step.get("before", []), step.get("after", []), step.get("aliases", {})
    read = {i for n in before for i in n["inputs"]}
    made_after = {o for n in after for o in n["outputs"]}
    return [o for n in before for o in n["outputs"] if o not in read or o in aliases or o in made_after]


def subgraph_svg(nodes: Sequence[Mapping[str, Any]], outputs: Sequence[str], aliases: Mapping[str, str],
                 kind: str) -> str:
    """One picture: ``nodes`` (report records), the ``outputs`` handed on, each either made by a node or, through
    ``aliases``, another value (drawn dashed); ``kind`` ("before" / "after") colours the boxes."""
    made = {o: f"n{k}" for k, n in enumerate(nodes) for o in n["outputs"]}
    boxes: list[Box] = []
    edges: list[tuple[str, str]] = []
    dashed: set[tuple[str, str]] = set()
    labels: dict[str, tuple[str, str, str]] = {}  # id -> (class, main text, tooltip)
    pills: dict[str, str] = {}

    def pill(value: str) -> str:
        if value not in pills:
            pid = pills[value] = f"v{len(pills)}"
            text = short(value)
            boxes.append(Box(pid, max(44.0, CHAR_W * len(text) + 18), PILL_H))
            labels[pid] = ("value", text, value)
        return pills[value]

    for node in nodes:
        for value in node["inputs"]:
            if value not in made:
                pill(value)
    for k, node in enumerate(nodes):
        nid = f"n{k}"
        name = short(node.get("name") or "")
        boxes.append(Box(nid, max(64.0, CHAR_W * max(len(node["op"]) + 1, len(name)) + 20), OP_H))
        attrs = "".join(f"\n{key} = {value}" for key, value in node.get("attrs", {}).items())
        tip = (f"{node['op']}{' ' + node['name'] if node.get('name') else ''}\nin: {', '.join(node['inputs'])}"
               f"\nout: {', '.join(node['outputs'])}{attrs}")
        labels[nid] = (f"op {kind}", node["op"], tip)
        for value in node["inputs"]:
            edges.append((made.get(value) or pills[value], nid))
    for value in outputs:
        source = made.get(value)
        oid = f"o{len([b for b in boxes if b.id.startswith('o')])}"
        text = short(value)
        boxes.append(Box(oid, max(44.0, CHAR_W * len(text) + 18), PILL_H))
        labels[oid] = ("value out", text, value)
        if source is None and value in aliases:
            other = aliases[value]
            source = made.get(other) or pill(other)
            labels[oid] = ("value out", text, f"{value} is now {other}")
            dashed.add((source, oid))
        if source is not None:
            edges.append((source, oid))
    placed = layout(boxes, edges)
    width, height = placed.width + 2 * PAD, placed.height + 2 * PAD
    parts = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
             f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{kind}">']
    for a, b, path in placed.edges:
        parts.append(f'<path class="edge{" alias" if (a, b) in dashed else ""}" d="{_curve(path)}" '
                     'marker-end="url(#arrow)"/>')
    size = {b.id: b for b in boxes}
    for vid, (x, y) in placed.centres.items():
        cls, text, tip = labels[vid]
        box = size[vid]
        left, top = x - box.width / 2 + PAD, y - box.height / 2 + PAD
        radius = box.height / 2 if cls.startswith("value") else 6
        parts.append(f'<g class="{cls}"><title>{escape(tip)}</title>'
                     f'<rect x="{left:.1f}" y="{top:.1f}" width="{box.width:.1f}" height="{box.height:.1f}" '
                     f'rx="{radius:.0f}"/>')
        if cls.startswith("op"):
            name = short(str(nodes[int(vid[1:])].get("name") or ""))
            parts.append(f'<text x="{x + PAD:.1f}" y="{y + PAD - (3 if name else -4):.1f}" class="opname">'
                         f'{escape(text)}</text>')
            if name:
                parts.append(f'<text x="{x + PAD:.1f}" y="{y + PAD + 12:.1f}" class="nodename">{escape(name)}</text>')
        else:
            parts.append(f'<text x="{x + PAD:.1f}" y="{y + PAD + 4:.1f}">{escape(text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _curve(points: Sequence[tuple[float, float]]) -> str:
    """An SVG path through ``points`` (offset by the padding), smooth: vertical tangents at each point."""
    (x0, y0), rest = points[0], points[1:]
    d = [f"M{x0 + PAD:.1f},{y0 + PAD:.1f}"]
    px, py = x0, y0
    for x, y in rest:
        mid = (py + y) / 2
        d.append(f"C{px + PAD:.1f},{mid + PAD:.1f} {x + PAD:.1f},{mid + PAD:.1f} {x + PAD:.1f},{y + PAD:.1f}")
        px, py = x, y
    return " ".join(d)


def step_figure(step: Mapping[str, Any]) -> str:
    """A step's two pictures side by side, before -> after."""
    outputs = interface(step)
    before = subgraph_svg(step.get("before", []), outputs, {}, "before")
    aliases = step.get("aliases", {})
    after = subgraph_svg(step.get("after", []), outputs, aliases, "after")
    caption = "put in its place" if step.get("after") else "put in its place: no node"
    became = "".join(f"<li><code>{escape(short(a))}</code> is now <code>{escape(short(b))}</code></li>"
                     for a, b in aliases.items())
    notes = f'<ul class="aliases">{became}</ul>' if became else ""
    return (f'<div class="pair"><figure><figcaption>matched</figcaption>{before}</figure>'
            f'<div class="arrow" aria-hidden="true">&#8594;</div>'
            f'<figure><figcaption>{caption}</figcaption>{after}{notes}</figure></div>')


#: The arrowhead the pictures' edges end in (defined once per page).
ARROW_DEFS = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
              '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
              'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs></svg>')
