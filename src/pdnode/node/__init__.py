"""Programs that run on the hosts: standard library only, nothing else of pdnode (docs/architecture.md)."""
