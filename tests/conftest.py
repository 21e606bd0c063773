from pathlib import Path

import pytest
from lexiflow.flows import prefect_env

from tests.backends import backend, moto_s3, store_url  # noqa: F401  storage backends: local, S3 on loopback

prefect_env.apply()  # quiet, offline Prefect for every test, as the CLI runs it

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EWT = SHARED_DATA / "ud-english-ewt"
WIKITEXT_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        raise FileNotFoundError(f"{SHARED_DATA} is missing: tests read the project's shared data beside the checkout")
    return SHARED_DATA
