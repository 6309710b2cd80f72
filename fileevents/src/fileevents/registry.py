"""Handlers registered with `FileEvents.on`, and which of them an event runs."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar, cast, get_args

from fileevents.context import EventContext
from fileevents.event import FileEvent

Selector = Literal["created", "deleted", "*"]
"""What a handler is registered for: one event type, or `*` for every event."""

EventHandler = Callable[[FileEvent], Awaitable[None]]
ContextHandler = Callable[[FileEvent, EventContext], Awaitable[None]]
Handler = EventHandler | ContextHandler
H = TypeVar("H", bound=Handler)

_SELECTORS: frozenset[str] = frozenset(get_args(Selector))


@dataclass(frozen=True)
class Registered:
    """One registration: the handler, what it runs for, and how it is called."""

    selector: Selector
    handler: Handler
    name: str
    wants_context: bool
    timeout: timedelta | None = None
    """How long one run may take before it is cancelled; None: the `FileEvents` default."""

    def matches(self, event: FileEvent) -> bool:
        return self.selector == "*" or self.selector == event.type

    def __call__(self, event: FileEvent, context: EventContext) -> Awaitable[None]:
        if self.wants_context:
            return cast(ContextHandler, self.handler)(event, context)
        return cast(EventHandler, self.handler)(event)


def check_timeout(where: str, timeout: timedelta | None) -> None:
    """A timeout is a positive `timedelta` (or None): raise naming `where` otherwise."""
    if timeout is None:
        return
    if not isinstance(timeout, timedelta):
        raise TypeError(f"{where}: expected a datetime.timedelta, got {type(timeout).__name__}")
    if timeout <= timedelta(0):
        raise ValueError(f"{where}: must be positive, got {timeout}")


def handler_name(handler: Callable[..., Any]) -> str:
    """`module.qualname`, as `on_error`, the metrics and the dead-letter `handler` header
    name it; a function defined inside another is named without `<locals>`
    (`__main__.main.handle`, not `__main__.main.<locals>.handle`)."""
    module = getattr(handler, "__module__", None) or "?"
    qualname = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    return f"{module}.{qualname.replace('<locals>.', '')}"


def _is_async(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with `async def __call__`
    )


def _wants_context(handler: Callable[..., Any]) -> bool:
    """True when the handler takes a second positional argument (the context)."""
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            positional += 1
    return positional >= 2


class Registry:
    """Registrations in order; an event runs every matching one, in that order."""

    def __init__(self) -> None:
        self._registered: list[Registered] = []
        self.selectors: set[str] = set()
        """The selectors handlers are registered for (`*`, `created`, `deleted`)."""
        self._by_type: dict[str, list[Registered]] = {}
        """Per event type, the registrations it runs, in order (`for_event`, per event)."""

    def add(self, selector: str, handler: Handler, timeout: timedelta | None = None) -> Registered:
        if selector not in _SELECTORS:
            raise ValueError(f"on({selector!r}): expected one of {sorted(_SELECTORS)}")
        if not callable(handler) or not _is_async(handler):
            raise TypeError(f"{handler_name(handler)} must be an `async def` function")
        check_timeout(f"on({selector!r}, timeout=...)", timeout)
        registered = Registered(
            cast(Selector, selector),
            handler,
            handler_name(handler),
            _wants_context(handler),
            timeout,
        )
        self._registered.append(registered)
        self.selectors.add(selector)
        self._by_type = {
            kind: [r for r in self._registered if r.selector in ("*", kind)]
            for kind in _SELECTORS - {"*"}
        }
        return registered

    def for_event(self, event: FileEvent) -> list[Registered]:
        """The registrations `event` runs, in order: a list the caller must not change."""
        return self._by_type.get(event.type) or [
            registered for registered in self._registered if registered.matches(event)
        ]

    def timeouts(self) -> list[timedelta]:
        """The timeouts handlers were registered with (those that have one)."""
        return [r.timeout for r in self._registered if r.timeout is not None]

    def names(self) -> list[str]:
        """The registered handlers' names, in registration order, each once."""
        return list(dict.fromkeys(registered.name for registered in self._registered))

    def __len__(self) -> int:
        return len(self._registered)
