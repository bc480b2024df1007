"""A training script's step records (`$STUNE_STEPS_FILE`), summarised: samples/s and the data-loader's share.

The file (docs/steps.md) is JSON lines written by rank 0, one object per step:

    {"step": 812, "samples": 1024, "step_s": 0.5591, "data_s": 0.0342}      ("t": unix time, optional)

`samples` is what the whole job processed in that step (the global batch); `step_s` the step's wall time from
the end of the step before, the wait for its batch included; `data_s` that wait. The epilog reads the file as
root and hands its bytes here: a bounded head and tail, so they may be cut mid-line, be two pieces of a longer
file joined, or be anything at all. parse() never raises: a line that is not a step is counted in `bad` and
skipped, and bytes with no step in them are "no steps", never a failure.

Warm-up (WARMUP_STEPS): the first 10 records of a run are reported apart (compilation, cuDNN autotuning,
the loader's workers starting and its first batches), and never more than half of a run's records, so a
short job keeps a steady part. A run starts at the first record and again at any record whose step number is
not above the one before (the script restarted, from step 0 or from a checkpoint). A tail joined to a head
goes on at a higher step number, so it is not a new run.

The summary, over the steady (non-warm-up) steps: samples/s per step (samples / step_s) median, p10 and p90,
and the overall rate (their samples over their time: stalls that the median skips show here); the data-wait
share (data_s / step_s) p50 and p90. Percentiles interpolate linearly between the sorted values (numpy's
default). Cost: one pass over the lines (json's C scanner per line) and a C sort of two float arrays
(bench/bench_steps.py: ~50 MB/s, ~10x a plain str.split loop over the same bytes, linear in the size). Memory
beside the input: the lines of one 1 MiB chunk at a time (~3 MB), two doubles per steady step, and while
sorting one list of floats: below the size of the bytes read plus 3 MB (tests/test_steps.py measures it).

In the job's AdminComment line (key=value tokens, usage/summary.py) the summary is four tokens, numbers without
spaces, '-' for none, e.g.

    sps=1830.2/1790.4/1871.5/1822.9 dwait=6.1/9.3 steps=1180/20/0/1 warm=95.2/905.1

- sps:   samples/s over the steady steps: p50/p10/p90/overall
- dwait: the data-wait share of a step, percent: p50/p90
- steps: steady steps/warm-up steps/bad lines/runs
- warm:  the warm-up's seconds/its samples/s (its samples over its time)

Plain typed Python, json imported where it is used: `stune-sbatch history` (historyview.py) reads the tokens,
and its module is reachable from stune-sbatch's entry point (docs/speed.md, tests/test_imports.py).
"""

from __future__ import annotations

from array import array

TYPE_CHECKING = False  # (typing's constant, without importing typing: see the module's last paragraph)
if TYPE_CHECKING:
    from typing import Any

WARMUP_STEPS = 10  # the first records of a run reported apart; at most half of the run's records
MAX_LINE = 4096  # a longer line is no step record (a step record is ~100 bytes): counted bad unparsed
MAX_SAMPLES = 10**15  # beyond this a `samples` is no count of samples (and would overflow a float division)
MAX_STEP = 2**63 - 1
MIN_STEP_S = 1e-6  # a shorter "step" is a wrong unit (and would make samples/s overflow)
MAX_STEP_S = 1e7  # ~4 months: a longer "step" is a wrong unit
DATA_S_SLACK = 1e-6  # data_s may exceed step_s by float rounding between two clock reads
CHUNK = 1 << 20  # bytes decoded at a time
KEYS = ("sps", "dwait", "steps", "warm")  # the AdminComment keys this module owns


class StepStats:
    """The summary of one steps file. Counts: `steps` (steady), `warmup`, `bad` (lines that are not a step
    record: cut, garbled, wrong types), `runs` (restarts + 1; 0 with no step). Steady-state rates in samples/s
    (`sps_p50`, `sps_p10`, `sps_p90`; `sps_all` = their samples over their seconds) and data-wait shares as
    fractions 0..1 (`dwait_p50`, `dwait_p90`): None without a steady step. `warm_s`: the warm-up's seconds,
    `warm_sps` its samples/s (None without warm-up). `first_bad`: "line N: why" of the first bad line, for a
    message (not stored in the tokens). A plain class: see the module's last paragraph."""

    __slots__ = (
        "steps",
        "warmup",
        "bad",
        "runs",
        "sps_p50",
        "sps_p10",
        "sps_p90",
        "sps_all",
        "dwait_p50",
        "dwait_p90",
        "warm_s",
        "warm_sps",
        "first_bad",
    )
    __hash__ = None  # type: ignore[assignment]  # compared, never hashed

    def __init__(
        self,
        steps: int = 0,
        warmup: int = 0,
        bad: int = 0,
        runs: int = 0,
        sps_p50: float | None = None,
        sps_p10: float | None = None,
        sps_p90: float | None = None,
        sps_all: float | None = None,
        dwait_p50: float | None = None,
        dwait_p90: float | None = None,
        warm_s: float = 0.0,
        warm_sps: float | None = None,
        first_bad: str | None = None,
    ):
        self.steps, self.warmup, self.bad, self.runs = steps, warmup, bad, runs
        self.sps_p50, self.sps_p10, self.sps_p90, self.sps_all = sps_p50, sps_p10, sps_p90, sps_all
        self.dwait_p50, self.dwait_p90 = dwait_p50, dwait_p90
        self.warm_s, self.warm_sps, self.first_bad = warm_s, warm_sps, first_bad

    @property
    def has_steps(self) -> bool:
        """Whether any step record was read (steady or warm-up)."""
        return self.steps + self.warmup > 0

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other):
        return isinstance(other, StepStats) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "StepStats(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"

    def tokens(self) -> str:
        """The AdminComment tokens (module docstring); '' when the file held no line at all."""
        if not (self.has_steps or self.bad):
            return ""
        return (
            f"sps={_join((self.sps_p50, self.sps_p10, self.sps_p90, self.sps_all), _short)} "
            f"dwait={_join((_percent(self.dwait_p50), _percent(self.dwait_p90)), _pct)} "
            f"steps={self.steps}/{self.warmup}/{self.bad}/{self.runs} "
            f"warm={_pct(self.warm_s)}/{_short(self.warm_sps)}"
        )


def parse_tokens(fields: dict[str, str]) -> StepStats | None:
    """The summary from an AdminComment line's fields (key -> value), as tokens() wrote it; None when the line
    holds none, or holds something unreadable (never raises)."""
    try:
        counts = fields["steps"].split("/")
        sps = _numbers(fields.get("sps", "-/-/-/-"), 4)
        dwait = _numbers(fields.get("dwait", "-/-"), 2)
        warm = _numbers(fields.get("warm", "0/-"), 2)
        if len(counts) != 4 or not all(c.isascii() and c.isdigit() and len(c) <= 19 for c in counts):
            return None
        if sps is None or dwait is None or warm is None:
            return None
        warm_s, share = warm[0], [None if d is None else d / 100.0 for d in dwait]
        if warm_s is None or any(d is not None and d > 1.0 for d in share):
            return None
        steps, warmup, bad, runs = (int(c) for c in counts)
        if (steps == 0) != (sps[0] is None) or (steps + warmup > 0) != (runs > 0):
            return None
        return StepStats(
            steps, warmup, bad, runs, sps[0], sps[1], sps[2], sps[3], share[0], share[1], warm_s, warm[1]
        )
    except (KeyError, AttributeError, ValueError):
        return None


def parse(data: bytes, warmup_steps: int = WARMUP_STEPS) -> StepStats:
    """The summary of a steps file's bytes (module docstring). Never raises: an internal error gives an
    empty summary whose `first_bad` says so (a bug here must not fail the epilog)."""
    try:
        return _parse(data, warmup_steps)
    except Exception as exc:  # garbage and bugs alike are "unknown", never a failed epilog
        return StepStats(first_bad=f"internal error: {type(exc).__name__}: {exc}"[:200])


def _parse(data, warmup_steps: int) -> StepStats:
    import json

    decode = json.JSONDecoder().raw_decode
    rates, shares = array("d"), array("d")  # the steady steps'
    head: list[tuple[int, float, float]] = []  # the current run's first 2 x warm-up records, to split them
    totals = [0, 0.0, 0, 0, 0.0]  # steady samples, steady s, warm-up steps, warm-up samples, warm-up s
    bad, runs, in_run, last_step, first_bad = 0, 0, 0, -1, None
    record: Any = None
    step: Any = None
    samples: Any = None
    step_s: Any = None
    data_s: Any = None

    def steady(samples: int, step_s: float, data_s: float) -> None:
        rates.append(samples / step_s)
        shares.append(data_s / step_s if data_s < step_s else 1.0)
        totals[0] += samples
        totals[1] += step_s

    def settle() -> None:
        """Split the run's buffered head into its warm-up (WARMUP_STEPS, at most half) and steady steps."""
        cut = min(warmup_steps, len(head) // 2)
        for samples, step_s, _ in head[:cut]:
            totals[2] += 1
            totals[3] += samples
            totals[4] += step_s
        for record in head[cut:]:
            steady(*record)
        head.clear()

    slack = 1 + DATA_S_SLACK
    for lineno, line in _lines(data):
        if not line or line.isspace():
            continue
        why = None
        if len(line) > MAX_LINE:
            why = f"longer than {MAX_LINE} characters"
        else:
            if line[0] in " \t\r\f\v":
                line = line.strip()
            try:
                record, end = decode(line)
            except (ValueError, RecursionError):
                why = "not JSON (cut, or garbled)"
            else:
                if end != len(line) and not line[end:].isspace():
                    why = "text after the JSON object"
                elif type(record) is not dict:
                    why = "not a JSON object"
                else:
                    step, samples = record.get("step"), record.get("samples")
                    step_s, data_s = record.get("step_s"), record.get("data_s")
                    # the record as the snippet writes it, checked inline (the hot path); else _problem
                    if not (
                        type(step) is int
                        and type(samples) is int
                        and type(step_s) is float
                        and type(data_s) is float
                        and 0 <= step <= MAX_STEP
                        and 0 < samples <= MAX_SAMPLES
                        and MIN_STEP_S <= step_s <= MAX_STEP_S
                        and 0 <= data_s <= step_s * slack + DATA_S_SLACK
                    ):
                        why = _problem(record)
                        if why is None:  # right, with whole numbers of seconds
                            step_s, data_s = float(step_s), float(data_s)
        if why is not None:
            bad += 1
            if first_bad is None:
                first_bad = f"line {lineno}: {why}"
            continue
        if step <= last_step or runs == 0:  # a run starts: the first record, or the step number went back
            settle()
            runs, in_run = runs + 1, 0
        last_step = step
        in_run += 1
        if in_run <= 2 * warmup_steps:
            head.append((samples, step_s, data_s))
            continue
        if head:  # a long run: its warm-up is exactly warmup_steps
            settle()
        rates.append(samples / step_s)
        shares.append(data_s / step_s if data_s < step_s else 1.0)
        totals[0] += samples
        totals[1] += step_s
    settle()
    return _summary(rates, shares, totals, bad, runs, first_bad)


def _lines(data):
    """(line number, text) of each line, decoded a chunk of about CHUNK bytes at a time (cut at a newline):
    the memory taken beside the input is one chunk's lines, not the whole file's."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    elif not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    view = memoryview(data)
    lineno, pos, size = 0, 0, len(view)
    while pos < size:
        cut = data.find(b"\n", pos + CHUNK) if pos + CHUNK < size else -1
        end = size if cut < 0 else cut + 1
        for line in str(view[pos:end], "utf-8", "replace").split("\n"):
            lineno += 1
            yield lineno, line
        lineno -= 1  # the text after a chunk's last newline: '' (the next chunk starts a line)
        pos = end


def _problem(record: Any) -> str | None:
    """Why a decoded line is no step record, or None."""
    if type(record) is not dict:
        return "not a JSON object"
    step: Any = record.get("step")
    samples: Any = record.get("samples")
    step_s: Any = record.get("step_s")
    data_s: Any = record.get("data_s")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return "step: not a whole number >= 0"
    if type(samples) is not int or not 0 < samples <= MAX_SAMPLES:
        return "samples: not a whole number > 0"
    # comparisons, not math.isfinite: NaN compares false, and a huge int does not overflow a comparison
    if type(step_s) not in (float, int) or not MIN_STEP_S <= step_s <= MAX_STEP_S:
        return f"step_s: not a number of seconds in [{MIN_STEP_S:g}, {MAX_STEP_S:g}]"
    if type(data_s) not in (float, int) or not data_s >= 0:
        return "data_s: not a number of seconds >= 0"
    if data_s > step_s * (1 + DATA_S_SLACK) + DATA_S_SLACK:
        return "data_s is longer than step_s (step_s must include the wait for data)"
    return None


def _summary(rates, shares, totals, bad: int, runs: int, first_bad) -> StepStats:
    steady_samples, steady_s, warm_steps, warm_samples, warm_s = totals
    n = len(rates)
    ordered = sorted(rates)  # one sorted copy at a time: the peak is the arrays and one list
    sps = (percentile(ordered, 50), percentile(ordered, 10), percentile(ordered, 90))
    ordered = sorted(shares)
    dwait = (percentile(ordered, 50), percentile(ordered, 90))
    del ordered
    return StepStats(
        n,
        warm_steps,
        bad,
        runs,
        *sps,
        steady_samples / steady_s if steady_s > 0 else None,
        *dwait,
        warm_s=warm_s,
        warm_sps=warm_samples / warm_s if warm_s > 0 else None,
        first_bad=first_bad,
    )


def percentile(ordered, q: float) -> float | None:
    """The q-th percentile (0-100) of sorted values, linear between neighbours (numpy's default); None when
    there are none."""
    if not ordered:
        return None
    at = (len(ordered) - 1) * q / 100.0
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _percent(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _join(values, fmt) -> str:
    return "/".join(fmt(v) for v in values)


def _numbers(text: str, n: int) -> list[float | None] | None:
    """n '/'-separated numbers >= 0 ('-': None), or None when the text is not that."""
    parts = text.split("/")
    if len(parts) != n:
        return None
    out: list[float | None] = []
    for part in parts:
        if part == "-":
            out.append(None)
            continue
        if not part or len(part) > 32 or not part.isascii():
            return None
        value = float(part)
        if not (value >= 0 and value != float("inf")):  # also refuses nan
            return None
        out.append(value)
    return out
