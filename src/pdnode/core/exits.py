"""The exit codes of every pdnode command, the one place: 0 ok; 1 what it examines is wrong (the
inventory; the node for verify; the placement; a request of bench); 2 it could not run (unreadable
input, or an invalid inventory where that is not what it examines). pdnode.node's programs keep their own."""

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
