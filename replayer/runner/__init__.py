"""Running a replay: one process's replay, and the worker processes and Ray actors that
run it side by side under one supervisor. See docs/scale-out.md."""
