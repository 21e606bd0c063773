import os
from pathlib import Path

import pytest

from tests.backends import backend, moto_s3, store_url  # noqa: F401  storage backends: local, S3 on loopback

# Quiet, offline Prefect for every test (the Makefile sets the same for `make test`).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EWT = SHARED_DATA / "ud-english-ewt"
WIKITEXT_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        raise FileNotFoundError(f"{SHARED_DATA} is missing: tests read the project's shared data beside the checkout")
    return SHARED_DATA
