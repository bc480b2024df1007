"""Tiny text helpers shared by parsers of Slurm and kernel output."""


def is_digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and other Unicode digits that int() rejects."""
    return text.isascii() and text.isdigit()
