"""The hardware layer: every read of a node's hardware goes through here.

- `sysfs`: the one sysfs reader, under a relocatable root.
- `nvml`: NVML through pynvml, one session per process, behind a deadline.
- `deadline`: run a probe with a deadline; a hung probe yields "did not answer" instead of hanging the hook.
- `snapshot`: capture a node's full state to one JSON snapshot, and load one back for offline checks.
- `drift`, `pciconfig`, `driftparse`: the host settings the drift checks judge (modules, IOMMU, cpufreq,
  THP, NUMA balancing, sysctls, slurmd's limits, PCI config space and ACS), and their parsers.

Reading hardware and judging it are separate: checks (slurm_tune.health) only ever see snapshot data.
"""
