"""The compiled parts, both optional: the real workers' recorder (realrun/_records.c) and the
CPU-to-CPU cache-line probe (realrun/host/_cpuprobe.c, Linux). Where no C compiler is found
the install goes on: the workers record in Python (realrun/records.py, about 0.25 µs more per
update) and real runs report no CPU latency (realrun/host/probe.py). Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

HEADERS = ["realrun/_monotonic.h"]
setup(ext_modules=[Extension("realrun._records", ["realrun/_records.c"], depends=HEADERS,
                             optional=True),
                   Extension("realrun.host._cpuprobe", ["realrun/host/_cpuprobe.c"],
                             depends=HEADERS, optional=True)])
