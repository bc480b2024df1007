"""The byte-level fast path of the sacct reader (a million rows in about 1.6 us each, under a third of the
general parser's time; bench/bench_fairshare.py).

It works on the raw ASCII bytes of a `sacct -P` dump, with numpy over whole columns and no Python object per
row: the delimiters are found in C, field boundaries are index arithmetic, numbers (the summaries' decimals
too) are read digit by digit over all rows at once, and the repeated strings (user, account, partition, QOS,
state, AllocTRES) are grouped by a hash of their bytes (verified against a representative row, so a
collision can only slow it down).
Columns read whole by nobody (job ids, admin comments) stay as byte spans, decoded when a row is looked at.

It handles only what it can prove it reads exactly like the general parser (sacct.py), and returns None for
anything else: ragged or blank lines, step rows, fields too wide for its windows, unusual summaries. Per
column, values outside the plain forms (ISO times, garbage numbers) send just that column through the
general helpers. tests/test_fairshare_sacct.py holds both paths to the same results on generated dumps.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..slurm.tres import tres_count
from . import sacct as S

PAD = 24             # zero bytes after the text: every window below may read past a field's end
WINDOW = 16          # bytes read at once for numbers and short fields
_CHUNK = 1 << 18     # delimiter search in cache-sized pieces (bench: 4 MiB pieces are ~20 % slower)
_MAX_WORDS = 24      # 8-byte words hashed per row for the grouped columns (wider: the general path)
ROWS = 1 << 14       # rows per piece: all columns of a piece are read while its bytes and temporaries are cached

_WORD_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_UNKNOWN_BYTES = [word.encode() for word in S.UNKNOWN_WORDS]


class _Column(Sequence):
    """A column that materializes as a list of strings only when read whole (tolist); subclasses give one
    row (_item) and the whole list."""

    __slots__ = ()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        return self._item(i)

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other):
        return isinstance(other, (list, tuple, Sequence)) and self.tolist() == list(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"


class Texts(_Column):
    """A column of strings kept as byte spans of the dump; decoded when read (ASCII only)."""

    __slots__ = ("_buf", "_start", "_end")

    def __init__(self, buf, start: np.ndarray, end: np.ndarray):
        self._buf = buf if isinstance(buf, memoryview) else memoryview(buf)
        self._start, self._end = start, end

    def __len__(self) -> int:
        return len(self._start)

    def _item(self, i):
        return str(self._buf[int(self._start[i]):int(self._end[i])], "ascii")

    def tolist(self) -> list:
        buf = self._buf
        return [str(buf[a:b], "ascii") for a, b in zip(self._start.tolist(), self._end.tolist())]


    def take(self, keep) -> "Texts":
        return Texts(self._buf, self._start[keep], self._end[keep])


class Coded(_Column):
    """A column of few distinct strings: a code per row into `names`."""

    __slots__ = ("codes", "names")

    def __init__(self, codes: np.ndarray, names: list):
        self.codes, self.names = codes, names

    def __len__(self) -> int:
        return len(self.codes)

    def _item(self, i):
        return self.names[self.codes[i]]

    def tolist(self) -> list:
        if not len(self.codes):
            return []
        return np.array(self.names, dtype=object)[self.codes].tolist()


    def take(self, keep) -> "Coded":
        return Coded(self.codes[keep], self.names)

    def factorize(self) -> tuple[np.ndarray, list]:
        """(codes, names) with names in first-seen order, as sacct._factorize gives for the plain list."""
        if not len(self.codes):
            return np.zeros(0, dtype=np.int32), []
        present, first = np.unique(self.codes, return_index=True)
        order = present[np.argsort(first, kind="stable")]
        remap = np.zeros(len(self.names), dtype=np.int32)
        remap[order] = np.arange(len(order), dtype=np.int32)
        return remap[self.codes], [self.names[c] for c in order.tolist()]


def _in_pieces(fn, n: int) -> tuple:
    """fn(lo, hi) over pieces of ROWS rows, each giving a tuple of arrays; the tuples' arrays joined. All the
    columns of a piece are read while its bytes are in cache (one pass over the dump, not one per column)."""
    first = fn(0, min(n, ROWS))
    if n <= ROWS:
        return first
    out = tuple(np.empty((n, *a.shape[1:]), dtype=a.dtype) for a in first)
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


def _gather(buf, size: int, width: int):
    """An array over buf whose element p is the `width` bytes from p on (unaligned, overlapping): indexing it
    with row positions copies each row's bytes in one C loop. The padding makes every p <= size safe."""
    if width == 8:
        return np.ndarray((size + 1,), dtype="<u8", buffer=buf, strides=(1,))
    return np.ndarray((size + 1,), dtype=np.dtype((np.void, width)), buffer=buf, strides=(1,))


def _rows(view, at: np.ndarray, width: int) -> np.ndarray:
    """view[at] as an (n, width) uint8 matrix."""
    return view[at].view(np.uint8).reshape(len(at), width)


def _word_rows(buf, size: int, at: np.ndarray, count: int) -> np.ndarray:
    """The `count` 8-byte little-endian words from each position in `at` on, as an (n, count) matrix: one
    gather for all of them (a gather per word costs a pass over the rows' memory each)."""
    return _gather(buf, size, 8 * count)[at].view(np.uint64).reshape(len(at), count)


def _rows_any(mask: np.ndarray) -> np.ndarray:
    """mask.any(axis=1) for a C-contiguous (n, 8 or 16) bool matrix, read as 8-byte words (several times faster
    than numpy's reduction over short rows)."""
    words = mask.view(np.uint64)
    return words[:, 0] != 0 if words.shape[1] == 1 else (words[:, 0] | words[:, 1]) != 0


# Numbers are read eight ASCII digits at a time inside 64-bit words (SWAR), over all rows at once: a word holds
# the bytes of a text left to right in its bytes from low to high (little-endian), so its first byte is the
# most significant digit. Every byte of the dump is ASCII (< 0x80), which keeps the byte sums below from
# carrying into a neighbour.
_HIGH_BITS = 0x8080808080808080
_ZERO_CHARS = 0x3030303030303030         # '0' in every byte: XOR turns the digits '0'-'9' into 0-9
_DOT_XOR_ZERO = 0x1E1E1E1E1E1E1E1E       # '.' ^ '0' in every byte
_OVER_NINE = 0x7676767676767676          # added to a byte 0-0x7F: its high bit is set when it was > 9
_LOW_SEVEN = 0x7F7F7F7F7F7F7F7F
_BYTE_RANK = 0x0102030405060708          # (a one in byte j) * this: byte j + 1 in the top byte
_DOT_SECOND_TO_LAST = 0x80 << 48         # the not-a-digit bit of a word's byte 6 (its text's 7th of 8)
_ZERO_POINT_ZERO = int.from_bytes(b"\0\0\0\0\0" + b"0.0", "little")  # "0.0" at a word's end
# _TAIL[k]: the last k bytes of a word's text (its k high bytes)
_TAIL = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - k))) - 1) for k in range(9)], dtype=np.uint64)


def _eight_digits(t: np.ndarray) -> np.ndarray:
    """The integer of words holding eight digit values 0-9 (first byte most significant): pairs, then
    quads, then all eight are combined by one multiply-add each."""
    t = (t * 10 + (t >> 8)) & 0x00FF00FF00FF00FF
    t = (t * 100 + (t >> 16)) & 0x0000FFFF0000FFFF
    return (t * 10000 + (t >> 32)) & 0xFFFFFFFF


def _digit_words(words: np.ndarray, width: np.ndarray):
    """(digit values, not-a-digit bytes) of the last `width` (0-8) bytes of each word; the other bytes read
    as 0. A byte of the second result has its high bit set where the text's byte is not '0'-'9'."""
    keep = _TAIL[width]
    t = (words ^ _ZERO_CHARS) & keep
    return t, (t + _OVER_NINE) & _HIGH_BITS


def _zero_bytes(x: np.ndarray) -> np.ndarray:
    """The high bit of each byte of x that is 0 (exact: no borrow crosses bytes)."""
    return ~(((x & _LOW_SEVEN) + _LOW_SEVEN) | x) & _HIGH_BITS


def _plain_numbers(buf, size: int, start: np.ndarray, end: np.ndarray):
    """(values, plain): the fields that are 1-13 ASCII digits (plain True) read as integers, from the one or
    two 8-byte words that end at each field's end."""
    n = len(start)
    width = end - start
    values = np.zeros(n, dtype=np.int64)
    plain = (width >= 1) & (width <= 13)
    if not n or not plain.any():
        return values, plain
    two_words = int(width[plain].max()) > 8
    at = end.astype(np.int64) - (16 if two_words else 8)
    if at.min() < 0:
        return values, np.zeros(n, dtype=bool)
    width = np.minimum(width, 16)
    if two_words:
        words = _word_rows(buf, size, at, 2)
        high, low = words[:, 0], words[:, 1]
    else:
        low = _gather(buf, size, 8)[at]
    t, bad = _digit_words(low, np.minimum(width, 8))
    number = _eight_digits(t)
    if two_words:
        t, bad_high = _digit_words(high, np.clip(width - 8, 0, 8))
        bad |= bad_high
        number += _eight_digits(t) * 100_000_000
    plain &= bad == 0
    values = number.astype(np.int64)
    values[~plain] = 0
    return values, plain


def _is_word(buf, size, start: np.ndarray, width: np.ndarray, word: bytes) -> np.ndarray:
    match = width == len(word)
    if word and match.any():
        key = int.from_bytes(word, "little")
        match &= (_gather(buf, size, 8)[start] & _WORD_MASKS[len(word)]) == np.uint64(key)
    return match


def _times(buf, size, start, end):
    """Start/End: (epoch seconds or -1 for sacct's Unknown words, ok). A row not ok (an ISO time, garbage)
    sends the column to the general parser's helper. Only the rows that are not plain numbers are matched
    against the Unknown words."""
    values, plain = _plain_numbers(buf, size, start, end)
    ok = plain & (values < S._MAX_EPOCH)
    rest = np.flatnonzero(~plain)
    if len(rest):
        a = start[rest]
        width = end[rest] - a
        unknown = width == 0
        for word in _UNKNOWN_BYTES:
            unknown |= _is_word(buf, size, a, width, word)
        values[rest[unknown]] = -1
        ok[rest[unknown]] = True
    return values, ok


def _ints(buf, size, start, end):
    values, plain = _plain_numbers(buf, size, start, end)
    return values, plain & (values < S._MAX_EPOCH)


_SPAN_MASKS: dict = {}


def _span_masks(count: int) -> np.ndarray:
    """Row w: the masks of `count` words that keep the first w bytes of a span (w = 0 .. 8*count)."""
    if count not in _SPAN_MASKS:
        left = np.clip(np.arange(8 * count + 1)[:, None] - 8 * np.arange(count), 0, 8)
        _SPAN_MASKS[count] = _WORD_MASKS[left]
    return _SPAN_MASKS[count]


def _words(buf, size: int, start: np.ndarray, end: np.ndarray, out: np.ndarray) -> None:
    """The span [start, end) of every row as 8-byte little-endian words, zero past the end, into the rows of
    `out` (n, count): one gather of 8*count bytes per row, masked word by word."""
    count = out.shape[1]
    width = end - start
    room = len(buf) - 8 * count  # the last row's window may not fit in the padding: read it word by word
    if len(start) and int(start.max()) <= room:
        view = np.ndarray((room + 1,), dtype=np.dtype((np.void, 8 * count)), buffer=buf, strides=(1,))
        np.bitwise_and(view[start].view(np.uint64).reshape(len(start), count), _span_masks(count)[width],
                       out=out)
        return
    words = _gather(buf, size, 8)
    for k in range(count):
        left = np.clip(width - 8 * k, 0, 8)
        out[:, k] = words[np.minimum(start + 8 * k, size)] & _WORD_MASKS[left]


def _hash(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of the (n, k) key matrix."""
    h = np.full(len(keys), 1469598103934665603, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(keys.shape[1]):
            h ^= keys[:, k]
            h *= np.uint64(1099511628211)
            h ^= h >> np.uint64(29)
    return h


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
_KEY_MASKS = _WORD_MASKS[_KEY_LENGTHS]
_KEY_WORDS = np.array([int.from_bytes(key, "little") for key in _KEYS], dtype=np.uint64)
_POW10 = 10 ** np.arange(_TOKEN + 1, dtype=np.int64)
_POW10F = 10.0 ** np.arange(_TOKEN + 1)


def _decimals(high: np.ndarray, low: np.ndarray, length: np.ndarray):
    """The numbers that end 16-byte windows (`high`, `low`: their two words) and run `length` (1-15) bytes,
    when every one is digits with at most one '.' (else None), read by digit arithmetic exactly as strtod
    (numpy, the general parser) reads them: the digits form an integer D < 10**15 < 2**53 and the value is
    D / 10**f (f digits after the dot), one correctly rounded division of two exact doubles."""
    keep_low = np.minimum(length, 8)
    keep_high = length - keep_low
    low, bad = _digit_words(low, keep_low)
    high, bad_high = _digit_words(high, keep_high)
    # the encoder's own form first ("%.1f": the dot is the second-to-last byte, every other byte a digit)
    if not bad_high.any() and ((bad == _DOT_SECOND_TO_LAST) & ((low >> 48) & 0xFF == 0x1E)).all():
        # the dot taken out: the digits before it move one byte toward the end, across the two words
        low = ((low & 0x0000FFFFFFFFFFFF) << 8) | (low & 0xFF00000000000000) | (high >> 56)
        high = high << 8
        return (_eight_digits(high) * 100_000_000 + _eight_digits(low)).astype(np.float64) / 10.0
    dot_low = _zero_bytes(low ^ _DOT_XOR_ZERO) & _TAIL[keep_low]
    dot_high = _zero_bytes(high ^ _DOT_XOR_ZERO) & _TAIL[keep_high]
    if ((bad ^ dot_low) | (bad_high ^ dot_high)).any():  # (a dot is not a digit either)
        return None
    has_dot = (dot_low | dot_high) != 0
    # at most one dot, and a digit besides it
    if ((dot_low & (dot_low - 1)) | (dot_high & (dot_high - 1))).any() \
            or ((dot_low != 0) & (dot_high != 0)).any() or (length - has_dot < 1).any():
        return None
    low &= ~((dot_low >> 7) * 0xFF)  # the dot reads as a 0 digit
    high &= ~((dot_high >> 7) * 0xFF)
    whole = (_eight_digits(high) * 100_000_000 + _eight_digits(low)).astype(np.int64)
    # digits after the dot: the dot's byte j in the low word leaves 7 - j, in the high word 15 - j
    rank_low = (((dot_low >> 7) * _BYTE_RANK) >> 56).astype(np.int64)
    rank_high = (((dot_high >> 7) * _BYTE_RANK) >> 56).astype(np.int64)
    f = np.where(rank_low > 0, 8 - rank_low, np.where(rank_high > 0, 16 - rank_high, 0))
    # the digits left of the dot got one place too many: D = (whole // 10**(f+1)) * 10**f + rest
    scale = _POW10[f + 1]
    joined = np.where(has_dot, (whole // scale) * _POW10[f] + whole % scale, whole)
    return joined.astype(np.float64) / _POW10F[f]


def _summaries(buf, size, start, end, n):
    """sacct._summary_heads over byte spans, for heads exactly in encode()'s form
    ("stune1 held=H used=U cov=C busy=B busy_w=W|- gpus=..." with plain decimal numbers); None for anything
    else, which the general parser then reads. The five spaces that end the numbers are found at once in a
    window over each head; each number must hold only digits and one '.', and be followed by its key."""
    held, used, covered, busy, busy_w = (np.full(n, np.nan) for _ in range(5))
    has = np.zeros(n, dtype=bool)
    bad = np.zeros(n, dtype=bool)
    words = _gather(buf, size, 8)
    lead = S.SUMMARY_PREFIX.encode()
    cand = np.flatnonzero(end - start >= len(lead))
    if len(cand):
        cand = cand[(words[start[cand]] & _WORD_MASKS[len(lead)]) == np.uint64(int.from_bytes(lead, "little"))]
    if not len(cand):
        return has, bad, held, used, covered, busy, busy_w
    m = len(cand)
    at = start[cand].astype(np.int64) + len(lead)
    stop = end[cand].astype(np.int64)
    if (stop - at < 5).any() or ((words[at] & _WORD_MASKS[5]) != np.uint64(int.from_bytes(b"held=", "little"))).any():
        return None
    at += 5
    # the first five spaces after each head's first number: one window per head, searched in one call
    last = len(buf) - _HEAD
    base = np.minimum(at, last)
    if base.min() < 0:
        return None
    window = _rows(np.ndarray((last + 1,), dtype=np.dtype((np.void, _HEAD)), buffer=buf, strides=(1,)),
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
    around = _word_rows(buf, size, space.ravel() - _TOKEN, 3)
    high, low, after = around[:, 0], around[:, 1], around[:, 2]
    if ((after.reshape(m, 5) >> 8) & _KEY_MASKS != _KEY_WORDS).any():  # each followed by its key
        return None
    dash = (length[:, 4] == 1) & ((low[4::5] >> 56) == ord("-"))  # busy_w: "-" when no sample was busy
    # read as "0.0" (the encoder's form, so a batch with dashes stays on the fast form), then set to NaN
    dashed = np.flatnonzero(dash) * 5 + 4
    low[dashed] = _ZERO_POINT_ZERO
    length = length.ravel()
    length[dashed] = 3
    value = _decimals(high, low, length)
    if value is None:
        return None
    value = value.reshape(m, 5)
    value[dash, 4] = np.nan
    values = value.T
    held[cand], used[cand], covered[cand], busy[cand], busy_w[cand] = values
    has[cand] = True
    return has, bad, held, used, covered, busy, busy_w


def padded(size: int) -> np.ndarray:
    """A buffer for `size` bytes of text and the PAD zero bytes after them. Uninitialized (numpy's large
    allocations use huge pages): filling a zeroed bytearray instead costs about twice as much."""
    buf = np.empty(size + PAD, dtype=np.uint8)
    buf[size:] = 0
    return buf


_HEADER_MAX = 1 << 16  # a header line longer than this is not sacct's


def parse_bytes(buf: np.ndarray, size: int, source: str):
    """A JobTable from the `sacct -P` text in buf[:size] (a uint8 array zero padded by PAD bytes, see
    padded()), or None when the text needs the general parser (anything but ASCII with LF line ends, ...)."""
    arr = buf
    if len(arr) < size + PAD or arr.dtype != np.uint8 or arr.ndim != 1:
        return None
    lead = arr[:min(size, _HEADER_MAX)] != 10  # blank lines before the header are skipped, as the general parser does
    if not lead.any():
        return None
    at = int(lead.argmax())
    head_end = bytes(arr[at:min(size, at + _HEADER_MAX)]).find(b"\n")
    if head_end < 0:
        return None
    head_end += at
    if head_end + 1 >= size:  # (a blank line has no '|': the pipe count below sends it back)
        return None
    header = bytes(arr[at:head_end])
    if not header.isascii():
        return None
    header = header.decode("ascii").split("|")
    width = len(header)
    if width < 2 or len(set(header)) != width or any(f not in header for f in S.REQUIRED) \
            or ("AdminComment" in header and header[-1] != "AdminComment"):
        return None
    body = head_end + 1
    found = _delimiters(arr, body, size)
    if found is None:
        return None
    delims, newline = found
    if arr[size - 1] != 10:  # the last line without its '\n'
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

    def piece(lo, hi):
        # each row's key: per run of grouped columns, its width and its bytes as words
        keys = np.empty((hi - lo, len(counts) + sum(counts)), dtype=np.uint64)
        k = 0
        for (a, b), count in zip(run_spans, counts):
            a, b = a[lo:hi], b[lo:hi]
            keys[:, k] = b - a
            _words(buf, size, a, b, keys[:, k + 1:k + 1 + count])
            k += 1 + count
        out = [_hash(keys), keys]
        for (a, b), read in zip(number_spans, (_plain_numbers, _times, _times, _ints)):
            out += read(buf, size, a[lo:hi], b[lo:hi])
        if comment_span is not None:
            heads = _summaries(buf, size, comment_span[0][lo:hi], comment_span[1][lo:hi], hi - lo)
            ok = np.full(hi - lo, heads is not None)
            out += [*(heads or (np.zeros(hi - lo, dtype=bool),) * 2 + (np.zeros(hi - lo),) * 5), ok]
        return tuple(out)

    columns = list(_in_pieces(piece, n))
    h = columns[0]
    keys = columns[1]
    (id_numeric, id_plain, start, start_ok, end, end_ok, elapsed, elapsed_ok,
     *heads) = columns[2:]
    if not id_plain.all():  # an id with a '.' is a step row: the general parser joins steps to their jobs
        odd = np.flatnonzero(~id_plain)
        a, b = id_start[odd], id_end[odd]
        if ((_rows(_gather(buf, size, WINDOW), a, WINDOW) == 46) & (np.arange(WINDOW) < (b - a)[:, None])).any():
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
        _, first, inverse = np.unique(_hash(run_keys), return_index=True, return_inverse=True)
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
        heads, heads_ok = tuple(heads[:7]), heads[7]
        if not heads_ok.all():
            heads = S._summary_heads(comments.tolist(), n)
        else:
            heads = S.distrust_insane(*heads)
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
