"""Test-wide settings: the precision probe's per-machine cache lives in a temporary
directory, so tests neither read nor write the user's ~/.cache; hypothesis examples have
no deadline (an example preempted on a busy machine is not a failure). `tiny_profile_path`:
one profile of the tiny model measured on the CPU lanes, shared by the modules that
simulate with a measured profile."""
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


# the tiny model's run on the CPU lanes, as the profile fixtures measure it
TINY_RUN = ["--model", "tiny", "--steps", "10", "--batch", "2", "--seq", "16",
            "--device-threads", "1", "--host-threads", "1", "--quiet"]


@pytest.fixture(scope="session")
def tiny_profile_path(tmp_path_factory):
    """profile.json of `python -m zfbench.run` (zero-offload) over TINY_RUN."""
    from zfbench.run.command import main as run_main

    out = tmp_path_factory.mktemp("tiny_profile")
    assert run_main(TINY_RUN + ["--strategy", "zero-offload", "--profile", "--out",
                                str(out)]) == 0
    return out / "profile.json"
