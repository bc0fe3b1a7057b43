"""Shared test fixtures. The Gibson data is used in place from ../shared/data (never copied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TRAJRAG_SHARED_DATA", REPO.parent / "shared" / "data"))
GIBSON_TRAIN = SHARED_DATA / "gibson-objectnav-v1.1" / "train" / "train_info.pbz2"


@pytest.fixture(scope="session")
def gibson_train_path() -> Path:
    if not GIBSON_TRAIN.is_file():
        pytest.fail(f"Gibson semantic maps not found at {GIBSON_TRAIN}; set TRAJRAG_SHARED_DATA")
    return GIBSON_TRAIN
