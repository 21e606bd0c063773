import logging
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from lexiflow.flows import prefect_env

from tests.backends import backend, moto_s3, store_url  # noqa: F401  storage backends: local, S3 on loopback

prefect_env.apply()  # quiet, offline Prefect for every test, as the CLI runs it

# Property tests draw the same examples on every run and machine (a seed fixed per test), so a clean CI run
# cannot fail on an example no earlier run drew; HYPOTHESIS_PROFILE=explore draws new ones while developing.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture(autouse=True)
def prefect_console_on_a_live_stream():
    """Prefect's console handler (on the `prefect` and `lexiflow` loggers) keeps the stream it was made with: one
    made while a test captured stderr (capsys) would write every later log line to that closed capture, and a
    test reading its own stderr would read the logging error instead. Such a handler is pointed back at stderr."""
    yield
    for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values()):
        for handler in getattr(logger, "handlers", ()):
            console = getattr(handler, "console", None)
            if console is not None and getattr(console.file, "closed", False):
                console.file = sys.__stderr__


@pytest.fixture(scope="module", autouse=True)
def cpu_unless_a_cuda_test(request):
    """The suite's known answers are CPU fp32 numbers (exact resumes, bit-equal reloads), so on a machine with a
    GPU `device="auto"` still picks the CPU, for a module's own fixtures too; tests/test_cuda.py holds the CUDA
    paths to what their precision allows."""
    if request.module.__name__ == "tests.test_cuda" or not torch.cuda.is_available():
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        yield


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EWT = SHARED_DATA / "ud-english-ewt"
WIKITEXT_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        raise FileNotFoundError(f"{SHARED_DATA} is missing: tests read the project's shared data beside the checkout")
    return SHARED_DATA
