"""The profile's `validate` and `scaling` sections (issue 27): accepting a partition or a software stack.

- `validate`: the layered precision checks, run as Slurm jobs through PyTorch on the node's device (layer 1,
  operator alignment; layer 2, a seeded small training run), compared with fp64 on the CPU and with the
  reference partition's stored results (docs/validate.md).
- `scaling`: the all-reduce scaling curve, within one node (devices) and across nodes (`stune-sweep scaling`,
  active/scaling.py; docs/active.md).

Loaded with the schema only (profilecheck.py).
"""

from __future__ import annotations

from .schema import Duration, Float, Int, List, Map, Nullable, Section, Str

VALIDATE = Section(
    {
        "python": Nullable(
            Str(absolute_path=True),
            doc="the interpreter with PyTorch (torch_npu on Ascend) that runs layers 1 and 2; default "
            "active.tools.python, else stune's own",
        ),
        "reference": Nullable(
            Str(),
            doc="the partition this one is compared with (layer 1's outputs, layer 2's loss curve); none: "
            "layer 1 against fp64 on the CPU, and layer 2 becomes this partition's own reference",
        ),
        "time_limit": Duration(900, doc="Slurm time limit of one validation job (both layers)"),
        "seed": Int(20240601, min=0, max=2**31 - 1, doc="the seed of every generated input and model"),
        "tolerances": Map(
            Section(
                {
                    "abs": Nullable(Float(min=0.0), doc="absolute part; empty: the built-in one"),
                    "rel": Nullable(
                        Float(min=0.0), doc="part relative to the output's scale; empty: built-in"
                    ),
                }
            ),
            doc="`<operator>.<dtype>` (e.g. matmul.bf16) -> {abs, rel}: overrides the built-in tolerance "
            "(layer 1 passes when max abs error <= abs + rel x max |fp64 output|; docs/validate.md)",
        ),
        "steps": Int(200, min=10, max=1000000, doc="layer 2: training steps"),
        "cold_steps": Int(10, min=1, max=1000, doc="layer 2: the first steps, reported apart (compilation)"),
        "band": Float(
            0.05,
            min=0.0,
            max=1.0,
            doc="layer 2: each 10-step mean of the loss may differ from the reference's by this fraction",
        ),
    }
)

SCALING = Section(
    {
        "devices": List(
            Int(min=1, max=64),
            default=(1, 2, 4, 8),
            unique=True,
            doc="device counts of the single-node curve (capped at gpu.count; gpu.count itself, the full node, "
            "is always measured)",
        ),
        "max_nodes": Nullable(
            Int(min=2),
            doc="largest node count of the multi-node curve (1, 2, 4, ... and this); default all the idle nodes "
            "(or the reservation's); `stune-sweep scaling --max-nodes` wins",
        ),
        "knee": Float(
            0.8,
            min=0.0,
            max=1.0,
            doc="efficiency below which a point is the knee: within a node against the first multi-device "
            "point's bus bandwidth, across nodes against the single-node figure",
        ),
        "time_limit": Duration(
            600, doc="Slurm time limit of one job (the single-node job runs every device count)"
        ),
        "command": Nullable(
            Str(),
            doc="single-node command ({gpus}: the point's devices); default the vendor's all-reduce check's "
            "(active.checks.<check>.command, else the catalogue's)",
        ),
        "multinode_command": Nullable(
            Str(),
            doc="multi-node command ({gpus} per node, {nodes}, {ranks} = gpus x nodes); default per vendor: "
            "srun --ntasks-per-node={gpus} all_reduce_perf ... -g 1 (NVIDIA, AMD), mpirun -n {ranks} "
            "all_reduce_test (Ascend)",
        ),
    }
)

SECTIONS = {"validate": VALIDATE, "scaling": SCALING}
