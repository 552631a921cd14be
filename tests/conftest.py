"""pytest configuration shared by every test under tests/."""
from hypothesis import settings

# The suite's property tests draw the same examples on every run and machine (as the notebooks' do): a run that fails
# fails again. To explore new examples, run them with `--hypothesis-profile explore`.
settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("suite")


def pytest_configure(config):
    # `tools/run_tests.py --fast` deselects these with -m "not slow"; CI runs them.
    config.addinivalue_line("markers", "slow: a longer test (larger hypothesis runs, multi-process); skipped by --fast")
