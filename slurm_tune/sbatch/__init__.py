"""stune-sbatch: a drop-in sbatch that sets the partition's NCCL, binding, placement and recovery settings.

- `options`: sbatch's built-in option table (probed from Slurm 22.05's sbatch), and a getopt_long-compatible
  reader for the command line and `#SBATCH` directives;
- `optable`: the `sbatch --help` reader, and the installed sbatch's option table learned from it, cached per
  release and plugin stack;
- `request`: what the user asked (command line, script, directives, options in effect), read once;
- `plan`: what stune adds for a job, each setting with the profile key or rule it came from (the NCCL, gloo
  and rendezvous variables from the one rule table, nodeenv/envrules.py);
- `setting`: a Setting and its kinds; `staging`: what `--stage` adds;
- `export`: sbatch's --export/--export-file rules: the job's environment, and whose value wins;
- `history`: the per-user record of submissions, `history` and `history diff`;
- `submit`: the orchestration behind the command;
- `dryrun`: `--dry-run`'s explanation of a plan (text or JSON), imported by a dry run only.

Everything here is on the submission path: the hot-path import rule applies (docs/speed.md).
"""

PROG = "stune-sbatch"  # the command's name in its messages (submit.py and dryrun.py import it from here)
