"""Node-side settings for a task: what only the node itself can tell.

- `detect`: the ACTIVE fabric HCA ports, the RoCE v2 GID index, the socket interface that is up (pure
  functions over the hardware layer's Sysfs reader, so they run the same against a fixture tree);
- `taskenv`: the `export` lines stune-task-prolog and stune-env print for a task;
- `binding`: the CPUs and NUMA node of a task's GPU, for stune-bind.

These run before every task: only `os` and the hardware layer at import time.
"""
