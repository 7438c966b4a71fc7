"""The verdict's schema name and exit codes (no imports: `pdnode --help` loads this only)."""

SCHEMA = "pdnode.verify/1"
EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
