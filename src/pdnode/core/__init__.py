"""The controller's computation: inventory -> plan, and what is computed from it (docs/architecture.md)."""
