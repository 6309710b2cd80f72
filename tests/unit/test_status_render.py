"""The pure parts of streams.status: lag, the member assignment, the metrics it reads, the
screen and the worker's progress line."""

from __future__ import annotations

from dataclasses import replace

from streams.config import InstanceConfig
from streams.status import (
    GroupStatus,
    InstanceStatus,
    Member,
    PartitionLag,
    ProgressCounts,
    Snapshot,
    WorkerStatus,
    emitted_totals,
    lag_of,
    outcome_totals,
    progress_line,
    render,
    shown_instances,
    summed_counts,
)

MEMBER = "app-emit-0fc6949e-f2cd-4a84-b5a5-2fbf8d71aa11"


def test_lag_counts_from_the_commit_or_from_the_beginning() -> None:
    assert lag_of(7, 0, 10) == 3
    assert lag_of(None, 4, 10) == 6  # never committed: auto_offset_reset=earliest
    assert lag_of(2, 4, 10) == 6  # committed before what retention kept
    assert lag_of(10, 0, 10) == 0


def test_emitted_totals_sum_per_instance() -> None:
    text = (
        "# TYPE storage_events_emitted_total counter\n"
        'storage_events_emitted_total{instance="a"} 3.0\n'
        'storage_events_emitted_total{instance="b"} 1.0\n'
        'storage_events_emitted_created{instance="a"} 1.7e9\n'
        'storage_events_duplicates_total{instance="a"} 9.0\n'
    )
    assert emitted_totals(text) == {"a": 3.0, "b": 1.0}


def snapshot() -> Snapshot:
    group = GroupStatus(
        "app-emit",
        "Stable",
        (Member(MEMBER, "app-emit", "/10.0.0.7", ("by-key[0]", "by-key[1]")),),
        (
            PartitionLag("by-key", 0, MEMBER, 5, 8, 3),
            PartitionLag("by-key", 1, None, None, 0, 0),
        ),
    )
    return Snapshot(
        "kafka:9092",
        1_800_000_100.0,
        (group,),
        {"app-seen-changelog": 12},
        (
            InstanceStatus("default", "files.events.default", 9, 1_800_000_090.0, 4.0, 2.5),
            InstanceStatus("gone", "files.events.gone", None, None, None, None),
        ),
        (
            WorkerStatus(
                "http://w:6066",
                False,
                None,
                {
                    "emit": {
                        "assigned": False,
                        "restore": {"state": "restoring", "partitions": [0, 1], "since": 1.8e9},
                    }
                },
            ),
            WorkerStatus("http://x:6066", None, "no answer (ClientConnectorError)"),
        ),
    )


def test_the_screen_shows_groups_owners_lag_restore_and_instances() -> None:
    screen = render(snapshot())
    assert "group app-emit  Stable  1 member  lag 3" in screen
    assert "member 0fc6949e app-emit on 10.0.0.7 owns by-key[0] by-key[1]" in screen
    (row0,) = [line for line in screen.splitlines() if line.strip().startswith("by-key[0]")]
    assert row0.split() == ["by-key[0]", "0fc6949e", "5", "8", "3"]
    (row1,) = [line for line in screen.splitlines() if line.strip().startswith("by-key[1]")]
    assert row1.split() == ["by-key[1]", "(none)", "-", "0", "0"]
    assert "worker http://w:6066: not ready; restore: restoring partitions [0,1] for 100.0 s" in (
        screen
    )
    assert "worker http://x:6066: no answer (ClientConnectorError)" in screen
    (default,) = [line for line in screen.splitlines() if line.strip().startswith("default ")]
    assert default.split()[:4] == ["default", "files.events.default", "2.5", "4"]
    assert default.endswith("2027-01-15T08:01:30Z (10 s ago)")
    assert "topic missing" in screen
    assert len(screen.splitlines()) < 25  # one screen


def test_the_json_carries_each_groups_lag() -> None:
    data = snapshot().to_json()
    assert data["groups"][0]["lag"] == 3
    assert data["groups"][0]["partitions"][0]["owner"] == MEMBER


def test_the_progress_line_covers_the_time_since_the_previous_one() -> None:
    before = ProgressCounts(100.0, {"normalize": 10.0, "emit": 4.0}, 1.0)
    after = ProgressCounts(160.0, {"normalize": 130.0, "emit": 64.0}, 3.0)
    line = progress_line(before, after, {"normalize": 0, "emit": None})
    assert line == (
        "progress over 60 s: normalize 2.0 records/s, lag 0; emit 1.0 records/s, lag ?; "
        "dead letters 3 (+2)"
    )


def test_a_kip_848_member_is_shown_by_its_client_or_instance_id() -> None:
    """KIP-848 member ids are random (no client id in them): the name shown is the client id,
    or the group instance id of a static member, as the status command's describe gives it."""
    kip848 = "Wg9e+fpfSpOhVlYfULX8nQ"
    group = GroupStatus(
        "app-emit",
        "Stable",
        (Member(kip848, "worker-0-emit", "/10.0.0.7", ("by-key[0]",)),),
        (PartitionLag("by-key", 0, kip848, 5, 5, 0),),
    )
    screen = render(Snapshot("kafka:9092", 1_800_000_100.0, (group,), {}, (), ()))
    # Its tag is the id's first 8 characters, as a classic member's is 8 hex digits.
    assert "member Wg9e+fpf worker-0-emit on 10.0.0.7 owns by-key[0]" in screen


def test_with_thousands_of_instances_the_view_lists_those_that_emitted_most() -> None:
    """Issue 33: each listed instance costs a read of its output topic: at most 50."""
    instances = [InstanceConfig(name=f"tenant-{n}") for n in range(10_000)]
    totals = {"tenant-9000": 5.0, "tenant-3": 9.0, "tenant-7": 1.0}
    shown = [instance.name for instance in shown_instances(instances, totals, most=3)]
    assert shown == ["tenant-3", "tenant-7", "tenant-9000"]  # configuration order
    assert len(shown_instances(instances, None)) == 50
    assert [i.name for i in shown_instances(instances[:2], None)] == ["tenant-0", "tenant-1"]
    snap = replace(snapshot(), more_instances=9_950)
    assert "... and 9,950 more instance(s): those that emitted most are listed" in render(snap)


def test_duplicates_stale_events_and_dead_letters_are_counted() -> None:
    """Issue 35, item 3: after a duplicate and a dead letter, the view says so."""
    text = (
        'storage_events_duplicates_total{instance="default"} 1.0\n'
        'storage_events_stale_total{instance="default"} 2.0\n'
        'storage_events_dead_lettered_total{stage="normalize"} 1.0\n'
        'storage_events_dead_lettered_total{stage="emit"} 0.0\n'
        'storage_events_emitted_total{instance="default"} 3.0\n'
    )
    counts = outcome_totals(text)
    assert counts == {
        "duplicates": {"default": 1.0},
        "stale": {"default": 2.0},
        "dead_letters": {"normalize": 1.0, "emit": 0.0},
    }
    two = [WorkerStatus("http://a", True, None, {}, counts)] * 2
    assert summed_counts(two) == {
        "duplicates": {"default": 2.0},
        "stale": {"default": 4.0},
        "dead_letters": {"normalize": 2.0, "emit": 0.0},
    }
    assert summed_counts([WorkerStatus("http://b", None, "no answer")]) is None
    snap = snapshot()
    default = replace(snap.instances[0], duplicates=1.0, stale=0.0)
    screen = render(replace(snap, instances=(default, *snap.instances[1:]), dead_letters=1.0))
    (row,) = [line for line in screen.splitlines() if line.strip().startswith("default ")]
    assert row.split()[:6] == ["default", "files.events.default", "2.5", "4", "1", "0"]
    assert "dead letters: 1 to files.dead-letter" in screen
    assert "`make dead-letters` shows each with its reason" in screen
    assert "dead letters: ? to" in render(snap)  # no worker's metrics: not known
    assert snap.to_json()["instances"][0]["duplicates"] is None
