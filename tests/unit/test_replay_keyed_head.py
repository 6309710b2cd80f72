"""replay-dead-letters re-checks an emit letter on the bytes it republishes: the keyed
record's `head` (what stage two decides on) is dropped from an emit letter, so that the
re-check and stage two both read the event's JSON, which a forged head cannot contradict."""

from __future__ import annotations

from pathlib import Path

from streams.config import Settings, load_settings
from streams.core.event import FileEvent
from streams.core.records import (
    KEYED_HEAD_HEADER,
    RawRecord,
    dead_letter_record,
    keyed_record,
)
from streams.replay import DeadLetter, Targets, dead_letter

BY_KEY, DEAD = "app.by-key", "files.dead-letter"


def settings(tmp_path: Path) -> Settings:
    config = tmp_path / "streams.toml"
    config.write_text(
        f'[stream]\napp_id = "app"\nrepartition_topic = "{BY_KEY}"\n'
        f'dead_letter_topic = "{DEAD}"\n'
        '[[instances]]\nname = "tenant-a"\nbucket = "uploads"\nsources = ["s3"]\n'
        'topic = "events-a"\n'
    )
    return load_settings(config, environ={})


def emit_letter(value_bucket: str, head_bucket: str) -> DeadLetter:
    """A letter whose value is the event in `value_bucket`, with the head (and key) of the
    same change in `head_bucket`."""

    def event(bucket: str) -> FileEvent:
        return FileEvent(id="s3:1", type="deleted", key="k", bucket=bucket, provider="s3")

    headed = keyed_record(BY_KEY, "tenant-a", event(head_bucket), None)
    valued = keyed_record(BY_KEY, "tenant-a", event(value_bucket), None)
    assert any(name == KEYED_HEAD_HEADER for name, _ in headed.headers)
    record = RawRecord(BY_KEY, valued.value or b"", dict(headed.headers))
    letter = dead_letter_record(DEAD, record, headed.key, "refused", "emit")
    return dead_letter(0, 0, letter.key, letter.value, letter.headers)


def test_a_head_that_passes_cannot_vouch_for_a_value_that_does_not(tmp_path: Path) -> None:
    targets = Targets(settings(tmp_path), DEAD)
    forged = emit_letter(value_bucket="elsewhere", head_bucket="uploads")
    assert KEYED_HEAD_HEADER not in dict(forged.headers)
    refused = targets.refusal(forged)
    assert refused is not None and refused[0] == "instance does not match", refused


def test_an_honest_emit_letter_is_replayed_without_its_head(tmp_path: Path) -> None:
    targets = Targets(settings(tmp_path), DEAD)
    honest = emit_letter(value_bucket="uploads", head_bucket="uploads")
    assert targets.refusal(honest) is None
    assert KEYED_HEAD_HEADER not in dict(honest.headers)  # what is republished
    assert "instance" in dict(honest.headers)
