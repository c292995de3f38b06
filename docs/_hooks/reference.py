"""The reference pages that are generated, so that they cannot drift from what they describe.

A MkDocs hook (``hooks:`` in mkdocs.yml): a page holding the marker ``<!-- generated: cli -->``
gets every command and flag of ``msgtable`` in its place, read from the declarations in
``msgtable/cli/flags.py`` (``COMMANDS``); ``<!-- generated: proto -->`` gets the gRPC API,
read from ``protos/msgtable/v1/messaging.proto`` and its comments. tests/unit/test_docs_reference.py
holds the two renderings to their sources.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "protos" / "msgtable" / "v1" / "messaging.proto"
CLI_MARKER = "<!-- generated: cli -->"
PROTO_MARKER = "<!-- generated: proto -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: put the generated reference where a page asks for it."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    if PROTO_MARKER in markdown:
        markdown = markdown.replace(PROTO_MARKER, proto_markdown(PROTO.read_text()))
    return markdown


# -- the command line ---------------------------------------------------------------------------
def _flags_module() -> Any:
    # This checkout's msgtable, whichever one the virtualenv was installed from.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from msgtable.cli import flags

    return flags


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag_name(flag: Any) -> str:
    if not flag.name.startswith("-"):
        name = flag.metavar or flag.name.upper()
        return f"`[{name}]`" if flag.optional else f"`{name}`"
    if flag.switch:
        return f"`{flag.name}` / `--no-{flag.name[2:]}`"
    if flag.store_true:
        return f"`{flag.name}`"
    value = flag.metavar or flag.name[2:].upper().replace("-", "_")
    if flag.choices:
        value = "{" + ",".join(flag.choices) + "}"
    return f"`{flag.name} {value}`"


def _flag_default(flag: Any) -> str:
    if flag.store_true:
        return "off"
    if flag.switch:
        return "on" if flag.default else "off"
    if flag.default is None or flag.default == "":
        return ""
    return f"`{flag.default}`"


def _usage(words: tuple[str, ...], command: Any) -> str:
    parts = ["msgtable", *words]
    for flag in command.flags:
        if flag.name.startswith("-"):
            continue
        name = flag.metavar or flag.name.upper()
        parts.append(f"[{name}]" if flag.optional else name)
    if any(f.name.startswith("-") for f in command.flags):
        parts.append("[FLAGS]")
    return " ".join(parts)


def cli_commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command that runs, with the words that name it, in the order of COMMANDS."""
    flags = _flags_module()
    for command in flags.COMMANDS:
        yield from command.leaves()


def cli_markdown() -> str:
    """Every command and flag of ``msgtable``, from msgtable.cli.flags."""
    flags = _flags_module()
    out: list[str] = []
    for words, command in cli_commands():
        out.append(f"### `msgtable {' '.join(words)}`\n")
        out.append(f"{command.description}\n")
        out.append(f"```text\n{_usage(words, command)}\n```\n")
        for flag in (*command.flags, flags.VERBOSE):
            notes = [f"env `{flag.env}`"] if flag.env else []
            default = _flag_default(flag)
            if default and "(default" not in flag.help:
                notes.append(f"default {default}")
            said = f" ({'; '.join(notes)})" if notes else ""
            out.append(f"- {_flag_name(flag)}{said}: {flag.help}")
        out.append("")
    return "\n".join(out)


# -- the gRPC API -------------------------------------------------------------------------------
@dataclass
class ProtoItem:
    """An rpc, a message's field or an enum's value, with the comment above it."""

    name: str
    text: str  # the declaration as written, without its trailing ";"
    comment: str


@dataclass
class ProtoBlock:
    """A service, message or enum, with its comment and its items."""

    kind: str  # "service", "message", "enum"
    name: str
    comment: str
    items: list[ProtoItem] = field(default_factory=list)


RPC = re.compile(r"rpc\s+(\w+)\s*\((stream\s+)?([\w.]+)\)\s*returns\s*\((stream\s+)?([\w.]+)\)")
FIELD = re.compile(r"(?:(repeated|optional)\s+)?(map<[\w.]+,\s*[\w.]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)")
ENUM_VALUE = re.compile(r"(\w+)\s*=\s*(-?\d+)")
TRAILING = re.compile(r"\s*//\s?(.*)$")


def parse_proto(text: str) -> list[ProtoBlock]:
    """The services, messages and enums of a proto file, in its order, with their comments.
    Enough of proto3 for this API: no nested messages; a ``oneof``'s fields belong to the
    message that holds it."""
    blocks: list[ProtoBlock] = []
    comment: list[str] = []
    stack: list[ProtoBlock | None] = []  # None: a oneof inside the block below it
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("//"):
            comment.append(line[2:].removeprefix(" "))
            continue
        if not line:
            comment = []
            continue
        trailing = TRAILING.search(line)
        code = line[: trailing.start()].strip() if trailing else line
        note = " ".join([*comment, trailing.group(1)] if trailing else comment)
        head = re.match(r"(service|message|enum)\s+(\w+)\s*\{(\s*\})?", code)
        if head:
            block = ProtoBlock(head.group(1), head.group(2), " ".join(comment))
            blocks.append(block)
            if not head.group(3):
                stack.append(block)
        elif code.startswith("oneof "):
            stack.append(None)
        elif code == "}":
            stack.pop()
        elif stack:
            owner = next(b for b in reversed(stack) if b is not None)
            item = _proto_item(owner.kind, code, note)
            if item:
                owner.items.append(item)
        comment = []
    return blocks


def _proto_item(kind: str, code: str, note: str) -> ProtoItem | None:
    code = code.rstrip(";").strip()
    if kind == "service":
        m = RPC.match(code)
        return ProtoItem(m.group(1), code, note) if m else None
    if kind == "enum":
        m = ENUM_VALUE.match(code)
        return ProtoItem(m.group(1), code, note) if m else None
    m = FIELD.match(code)
    return ProtoItem(m.group(3), code, note) if m else None


def _anchor(name: str) -> str:
    return name.lower()


def _link_types(text: str, names: set[str]) -> str:
    return re.sub(
        r"\b([A-Z]\w+)\b",
        lambda m: f"[{m.group(1)}](#{_anchor(m.group(1))})" if m.group(1) in names else m.group(1),
        text,
    )


def proto_markdown(text: str) -> str:
    """The gRPC API as Markdown: the service's rpcs, then each message and enum."""
    blocks = parse_proto(text)
    names = {b.name for b in blocks if b.kind != "service"}
    out: list[str] = []
    for block in blocks:
        out.append(f"### {block.name}\n")
        if block.comment:
            out.append(f"{_cell(block.comment)}\n")
        if block.kind == "service":
            out.append("| rpc | request | response | what it does |")
            out.append("|---|---|---|---|")
            for item in block.items:
                m = RPC.match(item.text)
                assert m is not None
                request = ("stream " if m.group(2) else "") + _link_types(m.group(3), names)
                response = ("stream " if m.group(4) else "") + _link_types(m.group(5), names)
                out.append(f"| `{item.name}` | {request} | {response} | {_cell(item.comment)} |")
        elif block.kind == "enum":
            out.append("| value | number | meaning |")
            out.append("|---|---|---|")
            for item in block.items:
                number = item.text.split("=")[1].strip()
                out.append(f"| `{item.name}` | {number} | {_cell(item.comment)} |")
        elif block.items:
            out.append("| field | type | number | meaning |")
            out.append("|---|---|---|---|")
            for item in block.items:
                m = FIELD.match(item.text)
                assert m is not None
                label = f"{m.group(1)} " if m.group(1) else ""
                kind = label + _link_types(m.group(2), names).replace("<", "&lt;")
                out.append(f"| `{item.name}` | {kind} | {m.group(4)} | {_cell(item.comment)} |")
        else:
            out.append("No fields.")
        out.append("")
    return "\n".join(out)
