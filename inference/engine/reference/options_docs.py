"""The options tables of docs/reference-engine.md, made from the option classes' own
descriptions (`python -m inference.engine.reference.options_docs`; tests/test_docs.py checks
that the docs hold what this prints). Apart from options.py because it reads the registry,
which options.py, imported by every family, must not."""

from __future__ import annotations

from .models import FAMILIES
from .options import PRESETS, EngineOptions, field_docs


def options_table() -> str:
    """The options as the markdown tables of docs/reference-engine.md: each option's value
    under each preset on a GPU, and its description."""
    def rows(title: str, defaults, resolve) -> list[str]:
        resolved = {preset: resolve(preset) for preset in PRESETS}
        lines = [f"#### {title}", "", "| option | exact | fast | what it is |", "|---|---|---|---|"]
        for name, doc in field_docs(type(defaults)).items():
            values = [_shown(getattr(resolved[preset], name)) for preset in PRESETS]
            lines.append(f"| `{name}` | {values[0]} | {values[1]} | {doc} |")
        return lines + [""]

    engine = EngineOptions()
    lines = rows("Every family (`EngineOptions`)", engine,
                 lambda preset: engine.with_preset(preset, cuda=True, tiny=False))
    for family in FAMILIES:
        options = family.options()
        lines += rows(f"{family.title} (`{family.options.__name__}`)", options,
                      lambda preset, options=options: options.with_preset(preset, cuda=True))
    return "\n".join(lines)


def _shown(value) -> str:
    return "—" if value is None else f"`{value}`"


if __name__ == "__main__":
    print(options_table())
