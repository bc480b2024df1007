"""ASCII fields of a padded byte buffer read inside 64-bit words, over all rows at once (numpy, no Python object
per row): the sacct fast path's (sacct_fast.py) number and span readers.

A word holds eight bytes of the text, left to right in its bytes from low to high (little-endian), so its first
byte is a number's most significant digit. Every byte is ASCII (< 0x80: the fast path declines anything else),
which keeps the byte sums below from carrying into a neighbour. Readers never look before a window's start
and may read up to a window past a field's end: the buffer's zero padding (sacct_fast.PAD) makes that safe.
"""
from __future__ import annotations

import numpy as np

WORD_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)  # first k bytes
_TOKEN = 16                               # a decimal's window: two words
_POW10 = 10 ** np.arange(_TOKEN + 1, dtype=np.int64)
_POW10F = 10.0 ** np.arange(_TOKEN + 1)


def gather(buf, size: int, width: int):
    """An array over buf whose element p is the `width` bytes from p on (unaligned, overlapping): indexing it
    with row positions copies each row's bytes in one C loop. The padding makes every p <= size safe."""
    if width == 8:
        return np.ndarray((size + 1,), dtype="<u8", buffer=buf, strides=(1,))
    return np.ndarray((size + 1,), dtype=np.dtype((np.void, width)), buffer=buf, strides=(1,))


def byte_rows(view, at: np.ndarray, width: int) -> np.ndarray:
    """view[at] as an (n, width) uint8 matrix."""
    return view[at].view(np.uint8).reshape(len(at), width)


def word_rows(buf, size: int, at: np.ndarray, count: int) -> np.ndarray:
    """The `count` 8-byte little-endian words from each position in `at` on, as an (n, count) matrix: one
    gather for all of them (a gather per word costs a pass over the rows' memory each)."""
    return gather(buf, size, 8 * count)[at].view(np.uint64).reshape(len(at), count)


# Numbers: eight digits at a time inside a word (SWAR).
_HIGH_BITS = 0x8080808080808080
_ZERO_CHARS = 0x3030303030303030         # '0' in every byte: XOR turns the digits '0'-'9' into 0-9
_DOT_XOR_ZERO = 0x1E1E1E1E1E1E1E1E       # '.' ^ '0' in every byte
_OVER_NINE = 0x7676767676767676          # added to a byte 0-0x7F: its high bit is set when it was > 9
_LOW_SEVEN = 0x7F7F7F7F7F7F7F7F
_BYTE_RANK = 0x0102030405060708          # (a one in byte j) * this: byte j + 1 in the top byte
_DOT_SECOND_TO_LAST = 0x80 << 48         # the not-a-digit bit of a word's byte 6 (its text's 7th of 8)
# TAIL[k]: the last k bytes of a word's text (its k high bytes)
TAIL = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - k))) - 1) for k in range(9)], dtype=np.uint64)


def eight_digits(t: np.ndarray) -> np.ndarray:
    """The integer of words holding eight digit values 0-9 (first byte most significant): pairs, then
    quads, then all eight are combined by one multiply-add each."""
    t = (t * 10 + (t >> 8)) & 0x00FF00FF00FF00FF
    t = (t * 100 + (t >> 16)) & 0x0000FFFF0000FFFF
    return (t * 10000 + (t >> 32)) & 0xFFFFFFFF


def digit_words(words: np.ndarray, width: np.ndarray):
    """(digit values, not-a-digit bytes) of the last `width` (0-8) bytes of each word; the other bytes read
    as 0. A byte of the second result has its high bit set where the text's byte is not '0'-'9'."""
    keep = TAIL[width]
    t = (words ^ _ZERO_CHARS) & keep
    return t, (t + _OVER_NINE) & _HIGH_BITS


def zero_bytes(x: np.ndarray) -> np.ndarray:
    """The high bit of each byte of x that is 0 (exact: no borrow crosses bytes)."""
    return ~(((x & _LOW_SEVEN) + _LOW_SEVEN) | x) & _HIGH_BITS


def plain_numbers(buf, size: int, start: np.ndarray, end: np.ndarray):
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
        words = word_rows(buf, size, at, 2)
        high, low = words[:, 0], words[:, 1]
    else:
        low = gather(buf, size, 8)[at]
    t, bad = digit_words(low, np.minimum(width, 8))
    number = eight_digits(t)
    if two_words:
        t, bad_high = digit_words(high, np.clip(width - 8, 0, 8))
        bad |= bad_high
        number += eight_digits(t) * 100_000_000
    plain &= bad == 0
    values = number.astype(np.int64)
    values[~plain] = 0
    return values, plain


def is_word(buf, size, start: np.ndarray, width: np.ndarray, word: bytes) -> np.ndarray:
    match = width == len(word)
    if word and match.any():
        key = int.from_bytes(word, "little")
        match &= (gather(buf, size, 8)[start] & WORD_MASKS[len(word)]) == np.uint64(key)
    return match


_SPAN_MASKS: dict = {}


def span_masks(count: int) -> np.ndarray:
    """Row w: the masks of `count` words that keep the first w bytes of a span (w = 0 .. 8*count)."""
    if count not in _SPAN_MASKS:
        left = np.clip(np.arange(8 * count + 1)[:, None] - 8 * np.arange(count), 0, 8)
        _SPAN_MASKS[count] = WORD_MASKS[left]
    return _SPAN_MASKS[count]


def span_words(buf, size: int, start: np.ndarray, end: np.ndarray, out: np.ndarray) -> None:
    """The span [start, end) of every row as 8-byte little-endian words, zero past the end, into the rows of
    `out` (n, count): one gather of 8*count bytes per row, masked word by word."""
    count = out.shape[1]
    width = end - start
    room = len(buf) - 8 * count  # the last row's window may not fit in the padding: read it word by word
    if len(start) and int(start.max()) <= room:
        view = np.ndarray((room + 1,), dtype=np.dtype((np.void, 8 * count)), buffer=buf, strides=(1,))
        np.bitwise_and(view[start].view(np.uint64).reshape(len(start), count), span_masks(count)[width],
                       out=out)
        return
    words, masks = gather(buf, size, 8), span_masks(count)[width]
    for k in range(count):
        out[:, k] = words[np.minimum(start + 8 * k, size)] & masks[:, k]


def hash_rows(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of the (n, k) key matrix."""
    h = np.full(len(keys), 1469598103934665603, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(keys.shape[1]):
            h ^= keys[:, k]
            h *= np.uint64(1099511628211)
            h ^= h >> np.uint64(29)
    return h


def decimals(high: np.ndarray, low: np.ndarray, length: np.ndarray):
    """The numbers that end 16-byte windows (`high`, `low`: their two words) and run `length` (1-15) bytes,
    when every one is digits with at most one '.' (else None), read by digit arithmetic exactly as strtod
    (numpy, the general parser) reads them: the digits form an integer D < 10**15 < 2**53 and the value is
    D / 10**f (f digits after the dot), one correctly rounded division of two exact doubles."""
    keep_low = np.minimum(length, 8)
    keep_high = length - keep_low
    low, bad = digit_words(low, keep_low)
    high, bad_high = digit_words(high, keep_high)
    # the encoder's own form first ("%.1f": the dot is the second-to-last byte, every other byte a digit)
    if not bad_high.any() and ((bad == _DOT_SECOND_TO_LAST) & ((low >> 48) & 0xFF == 0x1E)).all():
        # the dot taken out: the digits before it move one byte toward the end, across the two words
        low = ((low & 0x0000FFFFFFFFFFFF) << 8) | (low & 0xFF00000000000000) | (high >> 56)
        high = high << 8
        return (eight_digits(high) * 100_000_000 + eight_digits(low)).astype(np.float64) / 10.0
    dot_low = zero_bytes(low ^ _DOT_XOR_ZERO) & TAIL[keep_low]
    dot_high = zero_bytes(high ^ _DOT_XOR_ZERO) & TAIL[keep_high]
    if ((bad ^ dot_low) | (bad_high ^ dot_high)).any():  # (a dot is not a digit either)
        return None
    has_dot = (dot_low | dot_high) != 0
    # at most one dot, and a digit besides it
    if ((dot_low & (dot_low - 1)) | (dot_high & (dot_high - 1))).any() \
            or ((dot_low != 0) & (dot_high != 0)).any() or (length - has_dot < 1).any():
        return None
    low &= ~((dot_low >> 7) * 0xFF)  # the dot reads as a 0 digit
    high &= ~((dot_high >> 7) * 0xFF)
    whole = (eight_digits(high) * 100_000_000 + eight_digits(low)).astype(np.int64)
    # digits after the dot: the dot's byte j in the low word leaves 7 - j, in the high word 15 - j
    rank_low = (((dot_low >> 7) * _BYTE_RANK) >> 56).astype(np.int64)
    rank_high = (((dot_high >> 7) * _BYTE_RANK) >> 56).astype(np.int64)
    f = np.where(rank_low > 0, 8 - rank_low, np.where(rank_high > 0, 16 - rank_high, 0))
    # the digits left of the dot got one place too many: D = (whole // 10**(f+1)) * 10**f + rest
    scale = _POW10[f + 1]
    joined = np.where(has_dot, (whole // scale) * _POW10[f] + whole % scale, whole)
    return joined.astype(np.float64) / _POW10F[f]
