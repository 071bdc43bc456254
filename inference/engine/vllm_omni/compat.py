"""Which vllm-omni releases this engine runs on, and where their APIs differ.

vLLM pins torch exactly and each vllm-omni release is built against the vLLM release of the
same number, so the torch already on a GPU host picks the pair to install (README, "GPU").
The engine reads `vllm_omni.__version__` once at start and calls the API that release has.

What differs between the supported releases, as read from their published wheels:

| | 0.26 | 0.28 | 0.30 |
| --- | --- | --- | --- |
| torch (through vllm) | 2.11 | 2.13 | 2.13 |
| `AsyncOmni.abort(request_id, *, timeout=None)` | no `timeout` | no `timeout` | yes |
| `AsyncOmni.generate(..., session_id=None)` | no | no | yes, unused |
| `OmniRequestOutput` | wraps a vLLM `RequestOutput` (`request_output`) | is one | is one |

`generate`'s `session_id` is not passed even where it exists: 0.30 accepts it only to match
vLLM's EngineClient protocol and keeps nothing per session. The two shapes of
`OmniRequestOutput` read the same through the properties 0.26 has (`outputs`,
`prompt_token_ids`, `multimodal_output`), so outputs.py needs no gate.
"""

from __future__ import annotations

from dataclasses import dataclass

# vllm-omni release (major, minor) -> the torch its vLLM pins
SUPPORTED = {(0, 26): "2.11", (0, 28): "2.13", (0, 30): "2.13"}
OLDEST, NEWEST = min(SUPPORTED), max(SUPPORTED)


def release(version: str) -> tuple[int, int]:
    """`"0.26.0"`, `"0.30.1rc2"`, `"0.30.0+cu130"` → (0, 26), (0, 30), (0, 30)."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or "x")
    except ValueError:
        raise ValueError(f"cannot read the vllm-omni version {version!r}") from None


def _name(r: tuple[int, int]) -> str:
    return f"{r[0]}.{r[1]}"


@dataclass(frozen=True)
class Api:
    """The calls that differ between supported releases."""

    version: str
    abort_takes_timeout: bool

    @classmethod
    def of(cls, version: str) -> "Api":
        """The API of vllm-omni `version`; refuses releases older than the oldest supported."""
        r = release(version)
        if r < OLDEST:
            raise RuntimeError(
                f"vllm-omni {version} is older than {_name(OLDEST)}, the oldest release this engine "
                f"supports ({', '.join(_name(s) for s in sorted(SUPPORTED))})")
        return cls(version=version, abort_takes_timeout=r >= (0, 30))

    @property
    def tested(self) -> bool:
        """False for releases newer than the newest supported (they may work; nobody checked)."""
        return release(self.version) in SUPPORTED
