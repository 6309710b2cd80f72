"""Cron schedules as a Kubernetes CronJob reads them, checked before they reach a cluster.

`parse(text)` accepts what the CronJob controller accepts (robfig/cron's standard parser):
five fields (minute, hour, day of month, month, day of week), each `*`, a number, a range
`a-b`, a step `*/n` or `a-b/n` or `a/n`, or a comma list of those; month and weekday names
(`jan`, `mon`); `?` as `*`; and the macros `@yearly`, `@annually`, `@monthly`, `@weekly`,
`@daily`, `@midnight`, `@hourly`. Day of month and day of week, when both are restricted,
match either (cron's rule). `TZ=` prefixes are refused: a CronJob names its zone in
`spec.timeZone`.

`longest_gap_s(text)` is the longest time between two runs of the schedule, over three years
(2027-2029: a leap year, its neighbours, every weekday of every date): what an alert waits
for before it calls a run missing (k8s/monitoring/prometheusrule.yaml).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import date, timedelta

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
FIELDS = (
    # name, lowest, highest, names (index + offset = value)
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 6, WEEKDAYS),
)
ITEM = re.compile(r"^(?P<range>\*|\?|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/(?P<step>[0-9]+))?$")


class ScheduleError(ValueError):
    """Not a schedule a CronJob runs; the message says which field and why."""


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    def runs_on(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_day or by_weekday
        return by_day and by_weekday


def _value(text: str, field: int) -> int:
    name, low, high, names = FIELDS[field]
    if text.isdigit():
        number = int(text)
        if field == 4 and number == 7:  # Sunday, as 0
            number = 0
    elif text in names:
        number = names.index(text) + low
    else:
        raise ScheduleError(f"{name}: {text!r} is not a number or a name")
    if not low <= number <= high:
        raise ScheduleError(f"{name}: {number} is outside {low}-{high}")
    return number


def _field(text: str, field: int) -> tuple[frozenset[int], bool]:
    """The values of one field, and whether it restricts them (not `*`)."""
    name, low, high, _ = FIELDS[field]
    values: set[int] = set()
    restricted = True
    for item in text.split(","):
        match = ITEM.match(item)
        if match is None:
            raise ScheduleError(f"{name}: {item!r} is not a value, range or step")
        span, step_text = match["range"], match["step"]
        step = 1 if step_text is None else int(step_text)
        if step == 0:
            raise ScheduleError(f"{name}: a step of 0")
        if span in ("*", "?"):
            first, last = low, high
            restricted = False  # robfig/cron: `*` and `*/n` leave the other day field in charge
        elif "-" in span:
            start, _, end = span.partition("-")
            first, last = _value(start, field), _value(end, field)
            if first > last:
                raise ScheduleError(f"{name}: the range {span} runs backwards")
        else:
            first = _value(span, field)
            last = high if step_text is not None else first
        values.update(range(first, last + 1, step))
    return frozenset(values), restricted


def parse(text: str) -> Schedule:
    """The schedule, or ScheduleError naming what is wrong."""
    spec = text.strip().lower()
    if spec.startswith(("tz=", "cron_tz=")):
        raise ScheduleError("a time zone prefix: the CronJob's spec.timeZone names the zone")
    if spec.startswith("@"):
        if spec not in MACROS:
            raise ScheduleError(f"{text!r}: not one of {', '.join(MACROS)}")
        spec = MACROS[spec]
    parts = spec.split()
    if len(parts) != 5:
        raise ScheduleError(
            f"{text!r}: five fields (minute hour day-of-month month day-of-week) or a macro "
            "such as @hourly"
        )
    (minutes, _), (hours, _), (days, by_day), (months, _), (weekdays, by_weekday) = (
        _field(part, index) for index, part in enumerate(parts)
    )
    schedule = Schedule(minutes, hours, days, months, weekdays, by_day, by_weekday)
    if not any(schedule.runs_on(day) for day in _days()):
        raise ScheduleError(f"{text!r} never runs (no such date)")
    return schedule


def _days() -> list[date]:
    first = date(2027, 1, 1)
    return [first + timedelta(days=offset) for offset in range(1096)]  # 2027 to 2029


def longest_gap_s(text: str) -> int:
    """The longest time between two consecutive runs, in seconds."""
    schedule = parse(text)
    times = sorted(hour * 60 + minute for hour in schedule.hours for minute in schedule.minutes)
    gap = max((later - earlier for earlier, later in itertools.pairwise(times)), default=0)
    run_days = [index for index, day in enumerate(_days()) if schedule.runs_on(day)]
    for earlier, later in itertools.pairwise(run_days):
        gap = max(gap, (later - earlier) * 1440 + times[0] - times[-1])
    if len(run_days) == 1:  # Feb 29 only: once in a leap cycle
        gap = max(gap, 4 * 365 * 1440)
    return gap * 60
