"""The YAML reader of study files, ``from:`` search-space files and ``--set`` values.

PyYAML's safe loader (the libyaml one where installed) plus what a study file must not do: repeat a key
(the last would win silently), expand aliases into a "billion laughs" bomb, be larger than 1 MiB, or
hold bytes that are not UTF-8. Every refusal is a :class:`YAMLSafetyError` with a one-line message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_FILE_BYTES = 1 << 20  # 1 MiB; the largest shipped study is under 10 KiB
MAX_ALIASES = 100  # alias uses (*name) per document
MAX_ALIAS_NODES = 100_000  # nodes that aliases may add to a document once expanded
MERGE_TAG = "tag:yaml.org,2002:merge"
_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLSafetyError(ValueError):
    """A YAML text or file was refused; the message is one line."""


class StudyLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe loader that refuses duplicate keys and alias bombs (checked before anything is built)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._checked: set[int] = set()

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        check_aliases(node)
        return self.construct_document(node)

    def flatten_mapping(self, node: MappingNode) -> None:
        if id(node) not in self._checked:  # merging (<<) rewrites node.value: check the keys as written
            self._checked.add(id(node))
            self._check_duplicates(node)
        super().flatten_mapping(node)

    def _check_duplicates(self, node: MappingNode) -> None:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE_TAG:
                continue
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the constructor says so itself
                continue
            if first is not None:
                lines = f"line {first} and line {line}" if first != line else f"twice on line {line}"
                raise YAMLSafetyError(f"duplicate key {key!r} ({lines}); a key may appear once per mapping")
            seen[key] = line


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_aliases(root: Node) -> None:
    """Refuse a recursive alias, more than ``MAX_ALIASES`` alias uses, or aliases that would add more
    than ``MAX_ALIAS_NODES`` nodes once expanded. An alias is a second reference to a composed node, so
    this walks each distinct node once (memoised sizes) and never expands anything."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    references = 0
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YAMLSafetyError(
                f"recursive alias: the node at line {node.start_mark.line + 1} contains itself"
            )
        on_path.add(key)
        children = _children(node)
        references += len(children)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children))
    aliases = references - (len(sizes) - 1)
    if aliases > MAX_ALIASES:
        raise YAMLSafetyError(f"{aliases} alias uses (*name); at most {MAX_ALIASES} per document")
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise YAMLSafetyError(
            f"aliases (*name) would expand the document by {added:,} nodes; at most {MAX_ALIAS_NODES:,} "
            f"(a YAML alias bomb?)"
        )


def describe_yaml_error(err: yaml.YAMLError) -> str:
    """A parser or constructor error as one line: what is wrong, and where."""
    if isinstance(err, yaml.MarkedYAMLError):
        parts = [p for p in (err.context, err.problem) if p]
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return " ".join(" ".join(parts).split()) + where
    return " ".join(str(err).split())


def load_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`StudyLoader`; errors become one-line YAMLSafetyErrors."""
    loader = StudyLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise YAMLSafetyError(f"not valid YAML: {describe_yaml_error(err)}") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path) -> Any:
    """A YAML file of at most ``MAX_FILE_BYTES`` (checked before reading), decoded as strict UTF-8."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise YAMLSafetyError(
                f"the file is {size:,} bytes; a study or search-space file may be at most "
                f"{MAX_FILE_BYTES:,} bytes (1 MiB)"
            )
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise YAMLSafetyError(f"cannot read the file: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise YAMLSafetyError(f"the file is over {MAX_FILE_BYTES:,} bytes (1 MiB), the most allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YAMLSafetyError(
            f"not UTF-8: byte 0x{data[err.start]:02x} at offset {err.start} cannot be decoded; "
            f"save the file as UTF-8"
        ) from None
    return load_yaml(text.removeprefix("\ufeff"))


PLAIN_TYPES = (type(None), bool, int, float, str)


def load_plain_value(text: str) -> Any:
    """A command-line value: a plain YAML scalar, list or map; no tags (``!!python/...``), anchors or
    aliases. Raises YAMLSafetyError (the caller names the option)."""
    loader = StudyLoader(text)
    try:
        while loader.check_token():
            token = loader.get_token()
            if isinstance(token, yaml.TagToken | yaml.AnchorToken | yaml.AliasToken):
                kind = {yaml.TagToken: "tags", yaml.AnchorToken: "anchors"}.get(type(token), "aliases")
                raise YAMLSafetyError(f"not a plain YAML value ({kind} are not allowed)")
    except yaml.YAMLError as err:
        raise YAMLSafetyError(f"not valid YAML: {describe_yaml_error(err)}") from None
    finally:
        loader.dispose()
    value = load_yaml(text)
    if (odd := _not_plain(value)) is not None:
        raise YAMLSafetyError(f"not a plain YAML value (it holds a {odd}; quote it to pass a string)")
    return value


def _not_plain(value: Any) -> str | None:
    """The type name of the first value that is not a plain scalar, list or map, or None."""
    if isinstance(value, list):
        return next((odd for v in value if (odd := _not_plain(v)) is not None), None)
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
        return next((odd for v in items if (odd := _not_plain(v)) is not None), None)
    return None if isinstance(value, PLAIN_TYPES) else type(value).__name__
