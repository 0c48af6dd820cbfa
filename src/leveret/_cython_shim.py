"""What the hot-path modules use of the `cython` module, for when Cython is not installed.

Those modules annotate their hot loops with C types (`n: cython.Py_ssize_t`) that
Cython compiles and Python ignores: with `from __future__ import annotations` no
annotation is evaluated, so only the names used at run time are needed here:
`cython.declare(type, value)` (a C constant when compiled) is the value itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

compiled = False

# Type names, as arguments of declare(); their values do not matter in Python.
int = "int"  # noqa: A001 - the name Cython gives C's int
Py_ssize_t = "Py_ssize_t"
ulonglong = "unsigned long long"
bint = "bint"


def declare(kind: object = None, value: object = None) -> object:
    return value


# Decorators of C-only helpers (`@cython.cfunc`): in Python the function stays as it is.
def cfunc(func: Callable[..., Any]) -> Callable[..., Any]:
    return func


inline = cfunc


def exceptval(*_args: object, **_kwargs: object) -> Callable[[Callable[..., Any]], Any]:
    return cfunc
