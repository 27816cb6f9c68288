"""Test-wide settings: the precision probe's per-machine cache lives in a temporary
directory, so tests neither read nor write the user's ~/.cache; hypothesis examples have
no deadline (an example preempted on a busy machine is not a failure)."""
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("zfbench", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zfbench")


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ZFBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("zfbench-cache")))
    yield
    mp.undo()
