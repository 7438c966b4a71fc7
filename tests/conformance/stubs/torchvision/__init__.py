"""Test-only torchvision stand-in (see _stub.py); never installed on a GPU host."""

from torchvision._stub import __version__, module_getattr

__all__ = ["__version__"]
__getattr__ = module_getattr(__name__)
