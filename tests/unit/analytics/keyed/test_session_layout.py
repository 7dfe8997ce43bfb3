"""The session layout a ``keyed_windows`` checkpoint keeps for its whole life (``analytics.keyed.layout``)."""

from __future__ import annotations

import json

import pytest

from analytics.keyed.layout import RECORD, SessionLayout, session_layout
from eventide.config import ConfigError


def test_a_new_checkpoint_shares_its_buckets_between_apps_and_records_it(tmp_path):
    checkpoint = tmp_path / "keyed_windows"
    assert session_layout(checkpoint, 64) == SessionLayout(per_app=False, buckets=64)
    assert json.loads((checkpoint / RECORD).read_text()) == {"per_app": False, "buckets": 64}
    assert session_layout(checkpoint, 64) == SessionLayout(per_app=False, buckets=64)


def test_a_checkpoint_with_batches_but_no_record_keeps_buckets_per_app(tmp_path):
    # Given a checkpoint written before the layout was recorded (it has planned batches),
    checkpoint = tmp_path / "keyed_windows"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n{}\n")
    # then its sessions stay where they are, and the layout is recorded from now on.
    assert session_layout(checkpoint, 64) == SessionLayout(per_app=True, buckets=64)
    (checkpoint / "offsets" / "0").unlink()
    assert session_layout(checkpoint, 64) == SessionLayout(per_app=True, buckets=64)


def test_another_bucket_count_than_the_checkpoint_s_is_refused_naming_the_field(tmp_path):
    checkpoint = tmp_path / "keyed_windows"
    session_layout(checkpoint, 64)
    with pytest.raises(ConfigError, match=r"stream\.session_buckets is 16, .* in 64 buckets: set it back to 64"):
        session_layout(checkpoint, 16)
