"""The YAML a config may hold: plain values, no aliases (an alias bomb expands a few lines into
billions of items), no key written twice (YAML keeps the last one silently: a second ``train:``
would drop the first), nesting bounded."""

from __future__ import annotations

import yaml


class _ConfigLoader(yaml.SafeLoader):
    """safe_load without aliases and without repeated keys: each one ValueError naming its line."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise ValueError(
                f"YAML aliases (*{self.peek_event().anchor}) are not allowed in a config "
                f"(line {mark.line + 1}); write the value out"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: SafeLoader refuses it itself
            if key in seen:
                raise ValueError(
                    f"key {key!r} is written twice (line {key_node.start_mark.line + 1}); "
                    "YAML would keep only the last"
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def safe_yaml(text: str):
    """Parse config YAML (plain values, no aliases, no repeated keys; nesting bounded) or raise
    ValueError."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError("YAML nested too deeply") from None
