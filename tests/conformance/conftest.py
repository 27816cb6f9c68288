"""tests/conformance: DeepSpeed's ZenFlow unit tests ported to zfbench (see
conformance_support.py). The two-rank jobs of the whole folder run in one spawn, started
the first time a test asks for `two_ranks` (those tests are marked slow)."""
import pytest


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory):
    from conformance_ranks import spawn_two_ranks
    return spawn_two_ranks(tmp_path_factory.mktemp("conformance-two-ranks"))
