"""stune-validate (issue 27): does a partition's software stack compute and train correctly?

- Layer 1, operator alignment (opsuite.py): seeded operators on the node's device against fp64 on the CPU
  and against the reference partition's stored outputs.
- Layer 2, convergence (trainrun.py): a seeded small training run's loss curve against the reference's.
- Layer 3, the user's own full training: a verdict recorded with `stune-validate report`.

The scripts (opsuite.py, trainrun.py, torchdev.py) are standalone, run by the node's PyTorch interpreter;
agent.py runs them inside a Slurm job, run.py submits the jobs and judges (judge.py) and stores the records
(records.py). docs/validate.md.
"""
