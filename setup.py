"""The one compiled part: the real workers' recorder (realrun/_records.c). It is optional: where
no C compiler is found the install goes on and the workers record in Python
(realrun/records.py), about 0.25 µs more per update. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("realrun._records", ["realrun/_records.c"], optional=True)])
