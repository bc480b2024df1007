"""The byte-level fast path of the sacct reader (a million rows in about 1.1 us each, under the time of a
plain Python str.split aggregation of the same rows and a third of the general parser's; bench/bench_fairshare.py).

It works on the raw ASCII bytes of a `sacct -P` dump, with numpy over whole columns and no Python object per
row: the delimiters are found in C, field boundaries are index arithmetic, numbers (the summaries' decimals
too) are read eight digits at a time inside 64-bit words over all rows at once, and the repeated strings
(user, account, partition, QOS, state, AllocTRES) are grouped by a hash of their bytes (verified against a
representative row, so a collision can only slow it down).
Columns read whole by nobody (job ids, admin comments) stay as byte spans, decoded when a row is looked at.

It handles only what it can prove it reads exactly like the general parser (sacct.py), and returns None for
anything else: bytes outside ASCII, CRs, ragged or blank lines, step rows, fields too wide for its windows,
unusual summaries. Per column, values outside the plain forms (ISO times, garbage numbers) send just that
column through the general helpers. tests/test_fairshare_sacct.py holds both paths to the same results on
generated dumps, and each word reader to int()/float() on generated fields.
"""
from __future__ import annotations

import numpy as np

from ..slurm.tres import tres_count
from . import sacct as S
from .columns import Coded, Texts
from . import words as W

PAD = 24             # zero bytes after the text: every window below may read past a field's end
WINDOW = 16          # bytes read at once for numbers and short fields
_CHUNK = 1 << 18     # delimiter search in cache-sized pieces (bench: 4 MiB pieces are ~20 % slower)
_MAX_WORDS = 24      # 8-byte words hashed per row for the grouped columns (wider: the general path)
ROWS = 1 << 14       # rows per piece: all columns of a piece are read while its bytes and temporaries are cached

_UNKNOWN_BYTES = [word.encode() for word in S.UNKNOWN_WORDS]


def _in_pieces(fn, n: int) -> tuple:
    """fn(lo, hi) over pieces of ROWS rows, each giving a tuple of arrays; the tuples' arrays joined. All the
    columns of a piece are read while its bytes are in cache (one pass over the dump, not one per column)."""
    first = fn(0, min(n, ROWS))
    if n <= ROWS:
        return first
    out = tuple(np.empty(n, dtype=a.dtype) for a in first)
    for column, part in zip(out, first):
        column[:ROWS] = part
    for lo in range(ROWS, n, ROWS):
        hi = min(n, lo + ROWS)
        for column, part in zip(out, fn(lo, hi)):
            column[lo:hi] = part
    return out


def _delimiters(arr: np.ndarray, start: int, stop: int):
    """(positions of every '|' and '\\n' in arr[start:stop], which of them are '\\n'), found in cache-sized
    pieces with the same masks reused (a fresh temporary per piece costs page faults); None when the text
    has a byte outside ASCII or a CR (the general parser decodes and normalizes those)."""
    dtype = np.int32 if stop < (1 << 31) else np.int64
    pipe, newline = np.empty(_CHUNK, dtype=bool), np.empty(_CHUNK, dtype=bool)
    parts, kinds = [], []
    for at in range(start, stop, _CHUNK):
        piece = arr[at:min(stop, at + _CHUNK)]
        k = len(piece)
        if piece.max() > 127 or np.equal(piece, 13, out=pipe[:k]).any():
            return None
        np.equal(piece, 124, out=pipe[:k])
        np.equal(piece, 10, out=newline[:k])
        np.logical_or(pipe[:k], newline[:k], out=pipe[:k])
        found = np.flatnonzero(pipe[:k])
        kinds.append(newline[found])  # (while the piece's mask is still in cache)
        found = found.astype(dtype)
        found += dtype(at)
        parts.append(found)
    if not parts:
        return np.zeros(0, dtype=dtype), np.zeros(0, dtype=bool)
    return np.concatenate(parts), np.concatenate(kinds)


def _times(buf, size, start, end):
    """Start/End: (epoch seconds or -1 for sacct's Unknown words, ok). A row not ok (an ISO time, garbage)
    sends the column to the general parser's helper. Only the rows that are not plain numbers are matched
    against the Unknown words."""
    values, plain = W.plain_numbers(buf, size, start, end)
    ok = plain & (values < S._MAX_EPOCH)
    rest = np.flatnonzero(~plain)
    if len(rest):
        a = start[rest]
        width = end[rest] - a
        unknown = width == 0
        for word in _UNKNOWN_BYTES:
            unknown |= W.is_word(buf, size, a, width, word)
        values[rest[unknown]] = -1
        ok[rest[unknown]] = True
    return values, ok


def _ints(buf, size, start, end):
    values, plain = W.plain_numbers(buf, size, start, end)
    return values, plain & (values < S._MAX_EPOCH)


def _group(h: np.ndarray, keys: np.ndarray, n: int):
    """(group of each row, first row of each group) with groups in first-seen order, for rows with equal
    hashes; None when two rows of one group differ in their keys (a hash collision: the general path).

    Hashes are placed in a table by their low bits (no sort of a million values); the few hashes that land in
    a slot another hash took are grouped apart."""
    slots = 1 << max(10, min(20, (n * 2).bit_length()))
    slot = (h & np.uint64(slots - 1)).astype(np.intp)
    owner = np.zeros(slots, dtype=np.uint64)
    owner[slot] = h
    other = np.flatnonzero(owner[slot] != h)
    key = slot
    if len(other):
        extra, extra_key = np.unique(h[other], return_inverse=True)
        key = slot.copy()
        key[other] = slots + extra_key.ravel()
        slots += len(extra)
    first = np.full(slots, n, dtype=np.intp)
    np.minimum.at(first, key, np.arange(n))
    used = np.flatnonzero(first < n)
    reps = first[used]
    order = np.argsort(reps, kind="stable")
    rank = np.empty(slots, dtype=np.intp)
    rank[used[order]] = np.arange(len(used))
    group, reps = rank[key], reps[order]
    rep_of_row = reps[group]
    for lo in range(0, n, ROWS):  # (in pieces: a gather of all rows' keys at once would be n x k words)
        if not (keys[lo:lo + ROWS] == keys[rep_of_row[lo:lo + ROWS]]).all():
            return None
    return group, reps


_KEYS = (b"used=", b"cov=", b"busy=", b"busy_w=", b"gpus=")  # the key after each of the five numbers
_TOKEN = 16                      # a number and its space fit in this many bytes (longer: the general path)
_HEAD = 128                      # the five numbers of a head end within this many bytes (wider: general path)
_KEY_LENGTHS = np.array([len(key) for key in _KEYS])
_ZERO_POINT_ZERO = int.from_bytes(b"\0\0\0\0\0" + b"0.0", "little")  # "0.0" at a word's end
_KEY_MASKS = W.WORD_MASKS[_KEY_LENGTHS]
_KEY_WORDS = np.array([int.from_bytes(key, "little") for key in _KEYS], dtype=np.uint64)


def _head_columns(n: int) -> tuple:
    """(has, bad, held, used, covered, busy, busy_w) for n rows without a summary."""
    return (np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), *(np.full(n, np.nan) for _ in range(5)))


def _summaries(buf, size, start, end, n, out: tuple | None = None):
    """sacct._summary_heads over byte spans, for heads exactly in encode()'s form
    ("stune1 held=H used=U cov=C busy=B busy_w=W|- gpus=..." with plain decimal numbers), into `out` (from
    _head_columns(n), or new); None for anything else, which the general parser then reads. The five spaces
    that end the numbers are found at once in a window over each head; each number must hold only digits and
    one '.', and be followed by its key."""
    has, bad, held, used, covered, busy, busy_w = _head_columns(n) if out is None else out
    words = W.gather(buf, size, 8)
    lead = S.SUMMARY_PREFIX.encode()
    cand = np.flatnonzero(end - start >= len(lead))
    if len(cand):
        cand = cand[(words[start[cand]] & W.WORD_MASKS[len(lead)]) == np.uint64(int.from_bytes(lead, "little"))]
    if not len(cand):
        return has, bad, held, used, covered, busy, busy_w
    m = len(cand)
    at = start[cand].astype(np.int64) + len(lead)
    stop = end[cand].astype(np.int64)
    if (stop - at < 5).any() or ((words[at] & W.WORD_MASKS[5]) != np.uint64(int.from_bytes(b"held=", "little"))).any():
        return None
    at += 5
    # the first five spaces after each head's first number: one window per head, searched in one call
    last = len(buf) - _HEAD
    base = np.minimum(at, last)
    if base.min() < 0:
        return None
    window = W.byte_rows(np.ndarray((last + 1,), dtype=np.dtype((np.void, _HEAD)), buffer=buf, strides=(1,)),
                         base, _HEAD)
    found = np.flatnonzero(window == 32)
    row_at = np.arange(m, dtype=np.int64) * _HEAD
    first = np.searchsorted(found, row_at + (at - base))
    if (first + 4 >= len(found)).any() or (found[np.minimum(first + 4, len(found) - 1)] >= row_at + _HEAD).any():
        return None
    # the five numbers of every head at once: each ends at its space and starts after the previous key
    space = found[first[:, None] + np.arange(5)] - (row_at - base)[:, None]  # positions in buf, (m, 5)
    begin = np.empty_like(space)
    begin[:, 0] = at
    begin[:, 1:] = space[:, :4] + 1 + _KEY_LENGTHS[:4]
    length = space - begin
    if (length < 1).any() or (length >= _TOKEN).any() or (space.min() < _TOKEN) \
            or (space + 1 + _KEY_LENGTHS > stop[:, None]).any():
        return None
    # each number's 16-byte window (right-aligned at its space) and the 8 bytes from the space on, at once
    around = W.word_rows(buf, size, space.ravel() - _TOKEN, 3)
    high, low, after = around[:, 0], around[:, 1], around[:, 2]
    if ((after.reshape(m, 5) >> 8) & _KEY_MASKS != _KEY_WORDS).any():  # each followed by its key
        return None
    dash = (length[:, 4] == 1) & ((low[4::5] >> 56) == ord("-"))  # busy_w: "-" when no sample was busy
    # read as "0.0" (the encoder's form, so a batch with dashes stays on the fast form), then set to NaN
    dashed = np.flatnonzero(dash) * 5 + 4
    low[dashed] = _ZERO_POINT_ZERO
    length = length.ravel()
    length[dashed] = 3
    value = W.decimals(high, low, length)
    if value is None:
        return None
    value = value.reshape(m, 5)
    value[dash, 4] = np.nan
    values = value.T
    held[cand], used[cand], covered[cand], busy[cand], busy_w[cand] = values
    has[cand] = True
    return has, bad, held, used, covered, busy, busy_w


def padded(size: int, data: bytes | None = None) -> np.ndarray:
    """A buffer for `size` bytes of text (a copy of `data` when given) and the PAD zero bytes after them.
    Uninitialized otherwise (numpy's large allocations use huge pages): filling a zeroed bytearray instead
    costs about twice as much."""
    buf = np.empty(size + PAD, dtype=np.uint8)
    if data is not None:
        buf[:size] = np.frombuffer(data, dtype=np.uint8, count=size)
    buf[size:] = 0
    return buf


_HEADER_MAX = 1 << 16  # a header line longer than this is not sacct's


def parse_bytes(buf: np.ndarray, size: int, source: str):
    """A JobTable from the `sacct -P` text in buf[:size] (a uint8 array zero padded by PAD bytes, see
    padded()), or None when the text needs the general parser (anything but ASCII with LF line ends, ...)."""
    if len(buf) < size + PAD or buf.dtype != np.uint8 or buf.ndim != 1:
        return None
    lead = buf[:min(size, _HEADER_MAX)] != 10  # blank lines before the header: skipped, as the general parser does
    if not lead.any():
        return None
    at = int(lead.argmax())
    head_end = bytes(buf[at:min(size, at + _HEADER_MAX)]).find(b"\n")
    if head_end < 0:
        return None
    head_end += at
    if head_end + 1 >= size:  # (a blank line has no '|': the pipe count below sends it back)
        return None
    header = bytes(buf[at:head_end])
    if not header.isascii():
        return None
    header = header.decode("ascii").split("|")
    width = len(header)
    if width < 2 or len(set(header)) != width or any(f not in header for f in S.REQUIRED) \
            or ("AdminComment" in header and header[-1] != "AdminComment"):
        return None
    body = head_end + 1
    found = _delimiters(buf, body, size)
    if found is None:
        return None
    delims, newline = found
    if buf[size - 1] != 10:  # the last line without its '\n'
        delims = np.append(delims, delims.dtype.type(size))
        newline = np.append(newline, True)
    ends_at = np.flatnonzero(newline)
    n = len(ends_at)
    pipes = np.diff(ends_at, prepend=-1) - 1
    if not n or pipes.min() != width - 1 or pipes.max() != width - 1:
        # a cut line, or a '|' inside a free-text field (or in place of a newline): which row a field belongs
        # to is then the general parser's call, so it reads the whole dump
        return None
    bounds = delims.reshape(n, width)
    line_start = np.empty(n, dtype=delims.dtype)
    line_start[0] = body
    line_start[1:] = bounds[:-1, width - 1] + 1
    col = {name: k for k, name in enumerate(header)}

    def span(name):
        k = col[name]
        return (line_start if k == 0 else bounds[:, k - 1] + 1), bounds[:, k]

    id_start, id_end = span("JobIDRaw")
    if int((id_end - id_start).max()) > WINDOW:
        return None
    ids = Texts(buf, id_start, id_end)

    # the repeated strings (user, account, ...) are grouped by a hash of their bytes; consecutive columns
    # are hashed as one span (no field but the last holds a '|', so equal spans mean equal fields)
    grouped = [name for name in ("User", "Account", "Partition", "QOS", "State", "AllocTRES") if name in col]
    runs: list[list[int]] = []
    for k in sorted(col[name] for name in grouped):
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    run_spans, counts = [], []
    for run in runs:
        a = line_start if run[0] == 0 else bounds[:, run[0] - 1] + 1
        b = bounds[:, run[-1]]
        run_spans.append((a, b))
        counts.append((int((b - a).max()) + 7) // 8)
    if sum(counts) > _MAX_WORDS:
        return None
    number_spans = [span(name) for name in ("JobIDRaw", "Start", "End", "ElapsedRaw")]
    comment_span = span("AdminComment") if "AdminComment" in col else None

    # each row's key: per run of grouped columns, its width and its bytes as words (written in place)
    keys = np.empty((n, len(counts) + sum(counts)), dtype=np.uint64)

    def piece(lo, hi):
        piece_keys = keys[lo:hi]
        k = 0
        for (a, b), count in zip(run_spans, counts):
            a, b = a[lo:hi], b[lo:hi]
            piece_keys[:, k] = b - a
            W.span_words(buf, size, a, b, piece_keys[:, k + 1:k + 1 + count])
            k += 1 + count
        out = [W.hash_rows(piece_keys)]
        for (a, b), read in zip(number_spans, (W.plain_numbers, _times, _times, _ints)):
            out += read(buf, size, a[lo:hi], b[lo:hi])
        if comment_span is not None:  # written in place
            if _summaries(buf, size, comment_span[0][lo:hi], comment_span[1][lo:hi], hi - lo,
                          tuple(column[lo:hi] for column in head_columns)) is None:
                heads_ok[0] = False
        return tuple(out)

    head_columns, heads_ok = _head_columns(n), [True]
    columns = list(_in_pieces(piece, n))
    h = columns[0]
    id_numeric, id_plain, start, start_ok, end, end_ok, elapsed, elapsed_ok = columns[1:]
    if not id_plain.all():  # an id with a '.' is a step row: the general parser joins steps to their jobs
        odd = np.flatnonzero(~id_plain)
        a, b = id_start[odd], id_end[odd]
        if ((W.byte_rows(W.gather(buf, size, WINDOW), a, WINDOW) == 46) & (np.arange(WINDOW) < (b - a)[:, None])).any():
            return None
    grouping = _group(h, keys, n)
    if grouping is None:
        return None
    group, reps = grouping
    del h, columns
    # each group's strings: the distinct values of each run of columns among the groups (far fewer: users x
    # states, a handful of AllocTRES shapes) decoded once from a row holding them and split at the pipes
    view = memoryview(buf)
    rep_keys = keys[reps]
    del keys
    fields_of: dict[int, list] = {}
    k = 0
    for run, (a, b), count in zip(runs, run_spans, counts):
        run_keys = rep_keys[:, k:k + 1 + count]
        k += 1 + count
        _, first, inverse = np.unique(W.hash_rows(run_keys), return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        if not (run_keys[first][inverse] == run_keys).all():  # two values with one hash: decode every group's
            first, inverse = np.arange(len(reps)), np.arange(len(reps))
        rows = reps[first]
        texts = [str(view[x:y], "ascii").split("|") for x, y in zip(a[rows].tolist(), b[rows].tolist())]
        inverse = inverse.tolist()
        for at, column in enumerate(run):
            values = [fields[at] for fields in texts]
            fields_of[column] = [values[i] for i in inverse]
    names_of: dict[str, tuple[np.ndarray, list]] = {}
    for name in grouped:
        codes, names = S._factorize(fields_of[col[name]])  # groups in first-seen order: names are too
        names_of[name] = (codes[group], names, codes)

    def coded(name):
        if name in names_of:
            return Coded(names_of[name][0], names_of[name][1])
        return Coded(np.zeros(n, dtype=np.int32), [""])

    # (account, user) pairs: sacct._factorize_pairs over the groups
    acc_codes, acc_names = names_of["Account"][2], names_of["Account"][1]
    usr_codes, usr_names = names_of["User"][2], names_of["User"][1]
    combined = acc_codes.astype(np.int64) * len(usr_names) + usr_codes
    distinct, pair_of_group = np.unique(combined, return_inverse=True)
    assoc = pair_of_group.ravel().astype(np.int32)[group]
    assoc_keys = [(acc_names[c // len(usr_names)], usr_names[c % len(usr_names)]) for c in distinct.tolist()]
    qos = coded("QOS")
    tres_names = names_of["AllocTRES"][1]
    tres_codes = names_of["AllocTRES"][0]
    billing = np.array([tres_count(t, "billing") for t in tres_names] or [0.0])[tres_codes]
    gpus = np.array([tres_count(t, "gres/gpu") for t in tres_names] or [0.0])[tres_codes]

    # a column with any value in another form is read by the general parser's helper, whole
    if not start_ok.all():
        start = S._times(Texts(buf, *span("Start")).tolist(), source)
    if not end_ok.all():
        end = S._times(Texts(buf, *span("End")).tolist(), source)
    if not elapsed_ok.all():
        elapsed = S._ints(Texts(buf, *span("ElapsedRaw")).tolist())
    if comment_span is not None:
        comments = Texts(buf, *comment_span)
        if not heads_ok[0]:
            heads = S._summary_heads(comments.tolist(), n)
        else:
            heads = S.distrust_insane(*head_columns)
    else:
        comments = Coded(np.zeros(n, dtype=np.int32), [""])
        heads = S._summary_heads([], n)
    has_summary, bad_summary, held, used, covered, busy, busy_w = heads
    if "JobID" in col:
        job_id = Texts(buf, *span("JobID"))
    else:
        job_id = ids
    table = S.JobTable(
        job_id_raw=ids, job_id=job_id, assoc=assoc, assoc_keys=assoc_keys, partition=coded("Partition"),
        qos=qos.codes, qos_names=qos.names, state_raw=coded("State"), start=start, end=end,
        elapsed=elapsed, billing=billing, gpus=gpus, has_summary=has_summary, held_s=held, used_s=used,
        covered_s=covered, busy_s=busy, busy_w=busy_w, admin_comment=comments,
        gpuutil=np.full(n, np.nan), gpuutil_cover=np.zeros(n), bad_summary=bad_summary)
    keep = (start != S.BAD_TIME) & (end != S.BAD_TIME)
    bad_rows = np.flatnonzero(~keep)[:5].tolist()
    table.skip_reasons = []
    if bad_rows:
        starts, ends = Texts(buf, *span("Start")), Texts(buf, *span("End"))
        table.skip_reasons = [f"{source}: job {ids[i]}: unreadable Start/End ({starts[i]!r}, {ends[i]!r})"
                              for i in bad_rows]
    return S._without_unusable_rows(table, keep, table.n - int(keep.sum()), ids, start, end, elapsed,
                                    numeric=id_numeric if id_plain.all() else None)
