"""pytest configuration shared by every test under tests/."""


def pytest_configure(config):
    # `tools/run_tests.py --fast` deselects these with -m "not slow"; CI runs them.
    config.addinivalue_line("markers", "slow: a longer test (larger hypothesis runs, multi-process); skipped by --fast")
