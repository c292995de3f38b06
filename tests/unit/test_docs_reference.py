"""The site's generated reference pages name everything they are generated from: every command
and flag of msgtable/cli/flags.py, every rpc, message, field and enum value of the proto
(docs/_hooks/reference.py renders them when the site is built)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from msgtable.cli import flags

ROOT = Path(__file__).parents[2]
PROTO = (ROOT / "protos" / "msgtable" / "v1" / "messaging.proto").read_text()


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs/_hooks/reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_has_every_command_with_every_flag_and_its_variable():
    page = reference().cli_markdown()
    sections = re.split(r"^### ", page, flags=re.MULTILINE)[1:]
    by_title = {s.split("\n", 1)[0]: s for s in sections}
    leaves = [leaf for command in flags.COMMANDS for leaf in command.leaves()]
    assert list(by_title) == [f"`msgtable {' '.join(words)}`" for words, _ in leaves]
    for words, command in leaves:
        section = by_title[f"`msgtable {' '.join(words)}`"]
        assert command.description in section
        for flag in (*command.flags, flags.VERBOSE):
            shown = flag.name if flag.name.startswith("-") else (flag.metavar or flag.name.upper())
            if flag.optional:
                shown = f"[{shown}]"
            assert f"`{shown}" in section, (words, flag.name)
            assert flag.help in section, (words, flag.name)
            if flag.env:
                assert f"`{flag.env}`" in section, (words, flag.env)


def test_the_grpc_page_has_every_rpc_message_field_and_enum_value_of_the_proto():
    page = reference().proto_markdown(PROTO)
    rpcs = re.findall(r"^\s*rpc\s+(\w+)\s*\(", PROTO, re.MULTILINE)
    types = re.findall(r"^(?:message|enum|service)\s+(\w+)", PROTO, re.MULTILINE)
    assert len(rpcs) >= 10 and len(types) >= 30
    for rpc in rpcs:
        assert f"| `{rpc}` |" in page, rpc
    for name in types:
        assert f"### {name}\n" in page, name
    for block in re.finditer(r"^(message|enum)\s+(\w+)\s*\{(?!\})(.*?)^\}", PROTO, re.M | re.S):
        body = re.sub(r"//[^\n]*", "", block.group(3))
        section = page.split(f"### {block.group(2)}\n", 1)[1].split("\n### ", 1)[0]
        if block.group(1) == "enum":
            names = re.findall(r"^\s*(\w+)\s*=", body, re.M)
        else:
            names = re.findall(r"(\w+)\s*=\s*\d+\s*;", body)
        for name in names:
            assert f"| `{name}` |" in section, (block.group(2), name)


def test_the_comments_of_the_proto_reach_the_page():
    page = reference().proto_markdown(PROTO)
    assert "Subscribes to one message table." in page  # an rpc's
    assert "The subscriber's window: at most this many" in page  # a field's
    assert "SQL NULL." in page  # a oneof's field's
