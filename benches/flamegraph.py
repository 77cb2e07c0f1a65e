# SPDX-License-Identifier: Apache-2.0
"""Collapsed stacks (py-spy's `--format raw`) to a flame graph SVG, plus the share of Python frames.

Why our own renderer: py-spy writes either raw stacks or an SVG per recording, and the e2e bench
needs both from one profiled round (the raw stacks feed its bucket table). This draws the classic
layout (root at the bottom, width = samples) with a tooltip per frame, no script, no dependency.

Usage: `python benches/flamegraph.py profile.raw out.svg [--title TEXT] [--drop-startup]`.
"""

from __future__ import annotations

import argparse
import html
import zlib
from dataclasses import dataclass, field
from pathlib import Path

WIDTH = 1600
ROW = 16
FONT = 11
MIN_PX = 0.4  # frames narrower than this are not drawn (they stay in their parent's width)

#: A stack whose frames include one of these is start-up (imports, CLI, connect), not steady state
#: (the same markers as the e2e bench's start-up bucket).
STARTUP_MARKERS = (
    "_find_and_load",
    "build_parser",
    "ensure_topology",
    "establish_topology",
    "connect (",
    "start_probes",
)


@dataclass
class Node:
    name: str
    samples: int = 0
    children: dict[str, Node] = field(default_factory=dict)


def parse_collapsed(text: str, *, drop_startup: bool = False) -> tuple[Node, int, int]:
    """The frame tree, the samples kept and the samples dropped as start-up."""
    root = Node("all")
    dropped = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if drop_startup and any(m in f for f in frames for m in STARTUP_MARKERS):
            dropped += count
            continue
        root.samples += count
        node = root
        for frame in frames:
            node = node.children.setdefault(frame, Node(frame))
            node.samples += count
    return root, root.samples, dropped


def python_share(root: Node) -> float:
    """Share of samples whose innermost frame is Python code (not a native/extension frame)."""
    python = 0

    def walk(node: Node) -> None:
        nonlocal python
        own = node.samples - sum(c.samples for c in node.children.values())
        if own > 0 and node is not root and is_python_frame(node.name):
            python += own
        for child in node.children.values():
            walk(child)

    walk(root)
    return python / root.samples if root.samples else 0.0


def _has_native_frames(root: Node) -> bool:
    """Whether the profile was recorded with native frames (`py-spy record --native`)."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        if _is_native_symbol(node.name):
            return True
        stack.extend(node.children.values())
    return False


def _is_native_symbol(name: str) -> bool:
    """py-spy's `--native` frames name a shared object (`sym (libpython3.11.so)`)."""
    where = name.rpartition(" (")[2]
    return ".so" in where or "[kernel" in where


def is_python_frame(name: str) -> bool:
    """py-spy names Python frames `func (file.py:line)`; native ones `sym (lib.so)` or a bare address."""
    where = name.rpartition(" (")[2]
    return ".py" in where or "<frozen" in where


def _colour(name: str) -> str:
    h = zlib.crc32(name.encode()) & 0xFFFF
    if not is_python_frame(name):
        return f"rgb({200 + h % 55},{90 + h % 60},{40 + h % 30})"  # native: orange-red
    return f"rgb({60 + h % 40},{130 + h % 70},{190 + h % 50})"  # Python: blue


def render(root: Node, title: str) -> str:
    depth = _depth(root)
    height = (depth + 3) * ROW
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">',
        f'<rect width="{WIDTH}" height="{height}" fill="#fdfdf6"/>',
        f'<text x="8" y="{ROW}" font-size="{FONT + 2}">{html.escape(title)}</text>',
    ]
    scale = WIDTH / root.samples if root.samples else 0.0

    def draw(node: Node, x: float, level: int) -> None:
        w = node.samples * scale
        if w < MIN_PX:
            return
        y = height - (level + 1) * ROW
        pct = 100.0 * node.samples / root.samples
        label = html.escape(node.name)
        out.append(
            f"<g><title>{label} ({node.samples} samples, {pct:.1f}%)</title>"
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 1}" fill="{_colour(node.name)}"/>'
        )
        chars = int(w / (FONT * 0.6))
        if chars >= 4:
            text = node.name if len(node.name) <= chars else node.name[: chars - 2] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + ROW - 4}">{html.escape(text)}</text>')
        out.append("</g>")
        cx = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, cx, level + 1)
            cx += child.samples * scale

    draw(root, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _depth(node: Node) -> int:
    return 1 + max((_depth(c) for c in node.children.values()), default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("raw", type=Path)
    parser.add_argument("svg", type=Path)
    parser.add_argument("--title", default="")
    parser.add_argument("--drop-startup", action="store_true", help="leave out start-up stacks (steady state only)")
    args = parser.parse_args(argv)
    root, kept, dropped = parse_collapsed(args.raw.read_text(errors="replace"), drop_startup=args.drop_startup)
    native = _has_native_frames(root)
    if native:
        where = f"innermost frame in Python {100 * python_share(root):.1f}%"
    else:
        where = "no native frames recorded: native calls count in their Python callers"
    title = f"{args.title} - {kept} samples, {where}"
    if dropped:
        title += f" (start-up: {dropped} samples left out)"
    args.svg.write_text(render(root, title))
    print(f"{args.svg}: {kept} samples, {where}, start-up dropped {dropped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
