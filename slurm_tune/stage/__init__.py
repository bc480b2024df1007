"""The node-local cache staging tier (`stune-stage`). Submodules are imported on demand: `spec` and
`jobenv` sit on the stune-sbatch and TaskProlog paths and stay light."""
