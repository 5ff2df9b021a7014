"""Shared test helpers: lake states, fleet data, fakes and runners the tests build on.

No tests and no fixtures live here (fixtures stay in ``conftest.py`` files).
"""
