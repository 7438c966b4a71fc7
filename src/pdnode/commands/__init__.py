"""The command line: `pdnode` (cli.py) and each command's front (bench, plan, runbooks, ...)."""
