"""A tiny module with one bug, for the example evaluation config (../fix-tests.yaml)."""


def add(a: int, b: int) -> int:
    return a - b


def mul(a: int, b: int) -> int:
    return a * b
