"""The ``code-fix`` suite's repositories: each a few files with a pytest suite that fails — a bug
to fix or a small feature to add — and the one edit that makes it pass (``fix``: the tests
check both states, tests/unit/test_sweep_code_fix.py; the edit is never shown to the model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["REPOS", "Repo"]


@dataclass(frozen=True)
class Repo:
    name: str
    task: str  # what the model is asked, besides "make the tests pass"
    files: dict[str, str]
    fix: tuple[str, str, str]  # (path, old text, new text): the edit that makes it pass


REPOS: Final[tuple[Repo, ...]] = (
    Repo(
        "slugify",
        "slugify() must lower-case its result.",
        {
            "text_tools.py": (
                "import re\n\n\n"
                "def slugify(text):\n"
                '    words = re.findall(r"[A-Za-z0-9]+", text)\n'
                '    return "-".join(words)\n'
            ),
            "test_text_tools.py": (
                "from text_tools import slugify\n\n\n"
                "def test_lower_case():\n"
                '    assert slugify("Hello World") == "hello-world"\n\n\n'
                "def test_punctuation():\n"
                '    assert slugify("a, b; c!") == "a-b-c"\n'
            ),
        },
        ("text_tools.py", 'return "-".join(words)', 'return "-".join(words).lower()'),
    ),
    Repo(
        "stack",
        "Add a peek() method to Stack: the top item without removing it (IndexError when empty).",
        {
            "stack.py": (
                "class Stack:\n"
                "    def __init__(self):\n"
                "        self._items = []\n\n"
                "    def push(self, item):\n"
                "        self._items.append(item)\n\n"
                "    def pop(self):\n"
                "        return self._items.pop()\n"
            ),
            "test_stack.py": (
                "import pytest\n\nfrom stack import Stack\n\n\n"
                "def test_peek_keeps_the_item():\n"
                "    s = Stack()\n    s.push(1)\n    s.push(2)\n"
                "    assert s.peek() == 2\n    assert s.pop() == 2\n\n\n"
                "def test_peek_empty():\n"
                "    with pytest.raises(IndexError):\n        Stack().peek()\n"
            ),
        },
        (
            "stack.py",
            "    def pop(self):\n",
            "    def peek(self):\n        return self._items[-1]\n\n    def pop(self):\n",
        ),
    ),
    Repo(
        "roman",
        "to_roman() writes 4 as IIII and 9 as VIIII: use subtractive notation.",
        {
            "roman.py": (
                "NUMERALS = [(1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'),\n"
                "            (1, 'I')]\n\n\n"
                "def to_roman(n):\n"
                "    out = ''\n"
                "    for value, letters in NUMERALS:\n"
                "        while n >= value:\n"
                "            out += letters\n"
                "            n -= value\n"
                "    return out\n"
            ),
            "test_roman.py": (
                "from roman import to_roman\n\n\n"
                "def test_simple():\n    assert to_roman(8) == 'VIII'\n\n\n"
                "def test_subtractive():\n"
                "    assert to_roman(4) == 'IV'\n    assert to_roman(1994) == 'MCMXCIV'\n"
            ),
        },
        (
            "roman.py",
            "NUMERALS = [(1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'),\n"
            "            (1, 'I')]",
            "NUMERALS = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'),\n"
            "            (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'),\n"
            "            (4, 'IV'), (1, 'I')]",
        ),
    ),
    Repo(
        "fizzbuzz",
        "fizzbuzz(n) must return the words for 1 through n inclusive.",
        {
            "fizz.py": (
                "def fizzbuzz(n):\n"
                "    out = []\n"
                "    for i in range(1, n):\n"
                "        if i % 15 == 0:\n            out.append('FizzBuzz')\n"
                "        elif i % 3 == 0:\n            out.append('Fizz')\n"
                "        elif i % 5 == 0:\n            out.append('Buzz')\n"
                "        else:\n            out.append(str(i))\n"
                "    return out\n"
            ),
            "test_fizz.py": (
                "from fizz import fizzbuzz\n\n\n"
                "def test_length():\n    assert len(fizzbuzz(15)) == 15\n\n\n"
                "def test_last():\n    assert fizzbuzz(15)[-1] == 'FizzBuzz'\n"
            ),
        },
        ("fizz.py", "range(1, n)", "range(1, n + 1)"),
    ),
    Repo(
        "wordcount",
        "count_words() miscounts text with several spaces or newlines between words.",
        {
            "counting.py": ("def count_words(text):\n    return len(text.split(' '))\n"),
            "test_counting.py": (
                "from counting import count_words\n\n\n"
                "def test_spaces():\n    assert count_words('a  b   c') == 3\n\n\n"
                "def test_lines():\n    assert count_words('one\\ntwo\\n') == 2\n\n\n"
                "def test_empty():\n    assert count_words('') == 0\n"
            ),
        },
        ("counting.py", "text.split(' ')", "text.split()"),
    ),
    Repo(
        "temperature",
        "celsius_to_fahrenheit() gives wrong values.",
        {
            "units.py": ("def celsius_to_fahrenheit(c):\n    return c * 5 / 9 + 32\n"),
            "test_units.py": (
                "from units import celsius_to_fahrenheit\n\n\n"
                "def test_boiling():\n    assert celsius_to_fahrenheit(100) == 212\n\n\n"
                "def test_freezing():\n    assert celsius_to_fahrenheit(0) == 32\n"
            ),
        },
        ("units.py", "c * 5 / 9 + 32", "c * 9 / 5 + 32"),
    ),
    Repo(
        "median",
        "median() is wrong for lists of even length.",
        {
            "stats.py": (
                "def median(values):\n"
                "    ordered = sorted(values)\n"
                "    return ordered[len(ordered) // 2]\n"
            ),
            "test_stats.py": (
                "from stats import median\n\n\n"
                "def test_odd():\n    assert median([3, 1, 2]) == 2\n\n\n"
                "def test_even():\n    assert median([4, 1, 3, 2]) == 2.5\n"
            ),
        },
        (
            "stats.py",
            "    return ordered[len(ordered) // 2]\n",
            "    mid = len(ordered) // 2\n"
            "    if len(ordered) % 2:\n        return ordered[mid]\n"
            "    return (ordered[mid - 1] + ordered[mid]) / 2\n",
        ),
    ),
    Repo(
        "dedupe",
        "dedupe() must keep the first occurrence of each item, in the original order.",
        {
            "lists.py": ("def dedupe(items):\n    return list(set(items))\n"),
            "test_lists.py": (
                "from lists import dedupe\n\n\n"
                "def test_order():\n    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]\n\n\n"
                "def test_strings():\n    assert dedupe(['b', 'a', 'b']) == ['b', 'a']\n"
            ),
        },
        ("lists.py", "list(set(items))", "list(dict.fromkeys(items))"),
    ),
    Repo(
        "duration",
        "parse_duration() must also accept seconds, e.g. '1m30s' is 90.",
        {
            "durations.py": (
                "import re\n\n"
                "UNITS = {'h': 3600, 'm': 60}\n\n\n"
                "def parse_duration(text):\n"
                "    total = 0\n"
                "    for number, unit in re.findall(r'(\\d+)([a-z])', text):\n"
                "        if unit not in UNITS:\n"
                "            raise ValueError(f'unknown unit {unit}')\n"
                "        total += int(number) * UNITS[unit]\n"
                "    return total\n"
            ),
            "test_durations.py": (
                "from durations import parse_duration\n\n\n"
                "def test_hours_minutes():\n    assert parse_duration('1h30m') == 5400\n\n\n"
                "def test_seconds():\n    assert parse_duration('1m30s') == 90\n"
            ),
        },
        ("durations.py", "UNITS = {'h': 3600, 'm': 60}", "UNITS = {'h': 3600, 'm': 60, 's': 1}"),
    ),
    Repo(
        "account",
        "Account.withdraw() must refuse to overdraw: raise ValueError and leave the balance.",
        {
            "bank.py": (
                "class Account:\n"
                "    def __init__(self, balance=0):\n"
                "        self.balance = balance\n\n"
                "    def withdraw(self, amount):\n"
                "        self.balance -= amount\n"
                "        return self.balance\n"
            ),
            "test_bank.py": (
                "import pytest\n\nfrom bank import Account\n\n\n"
                "def test_withdraw():\n    assert Account(10).withdraw(3) == 7\n\n\n"
                "def test_overdraw():\n"
                "    account = Account(5)\n"
                "    with pytest.raises(ValueError):\n        account.withdraw(6)\n"
                "    assert account.balance == 5\n"
            ),
        },
        (
            "bank.py",
            "        self.balance -= amount\n",
            "        if amount > self.balance:\n"
            "            raise ValueError('insufficient funds')\n"
            "        self.balance -= amount\n",
        ),
    ),
    Repo(
        "transpose",
        "transpose() fails on matrices that are not square.",
        {
            "matrix.py": (
                "def transpose(rows):\n"
                "    n = len(rows)\n"
                "    return [[rows[j][i] for j in range(n)] for i in range(n)]\n"
            ),
            "test_matrix.py": (
                "from matrix import transpose\n\n\n"
                "def test_square():\n"
                "    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]\n\n\n"
                "def test_wide():\n"
                "    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]\n"
            ),
        },
        (
            "matrix.py",
            "    n = len(rows)\n    return [[rows[j][i] for j in range(n)] for i in range(n)]\n",
            "    return [list(column) for column in zip(*rows)]\n",
        ),
    ),
    Repo(
        "csv_total",
        "total() must skip the CSV's header line and sum the amount column.",
        {
            "ledger.py": (
                "def total(text):\n"
                "    result = 0.0\n"
                "    for line in text.strip().splitlines():\n"
                "        name, amount = line.split(',')\n"
                "        result += float(amount)\n"
                "    return result\n"
            ),
            "test_ledger.py": (
                "from ledger import total\n\n\n"
                "def test_total():\n"
                "    assert total('name,amount\\nrent,500\\nfood,120.5\\n') == 620.5\n"
            ),
        },
        (
            "ledger.py",
            "    for line in text.strip().splitlines():\n",
            "    for line in text.strip().splitlines()[1:]:\n",
        ),
    ),
)
