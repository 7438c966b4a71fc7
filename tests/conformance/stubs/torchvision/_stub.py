"""Shared machinery of the test-only torchvision stand-in.

PyPI's torchvision wheels are built against CUDA torch and do not load beside the
CPU torch of the SGLang validator environment, yet SGLang imports torchvision at
module level while it resolves server arguments. Nothing in argument validation
transforms an image, so this stand-in only has to import: every name exists, and
using one raises at once instead of computing a wrong answer.

This package is put on sys.path only inside the validator env (~/.cache/pdnode/sglang-validator, a .pth file
written by scripts/sglang-validator); it never reaches a GPU host.
"""

from __future__ import annotations

import enum
import types

__version__ = "0.0.0+pdnode.stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class Unavailable:
    """Any torchvision name: importable, attribute-chainable, never usable."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> "Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name}: this is the test-only torchvision stand-in of the "
            "SGLang validator environment; it cannot process images"
        )

    def __mro_entries__(self, bases):
        # `class X(torchvision.something):` at module level
        return (object,)

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


def module_getattr(module_name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{module_name}.{attr}")

    return __getattr__


def is_stub(module: types.ModuleType) -> bool:
    return getattr(module, "__version__", "") == __version__
