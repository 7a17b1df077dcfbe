"""``TaskDefinition``: a node-owned function plus its defaults; ``define`` builds one and
``Definitions`` holds a node's, by name."""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from .errors import ConfigurationError, InvalidValue, UnknownTask
from .limits import MAX_TASK_NAME
from .policies import ExceptionClasses, RetryPolicy, exception_classes
from .values import ValueRules, check_tags, check_text

if TYPE_CHECKING:
    from .tasks import Task

__all__ = [
    "Definitions",
    "TaskDefinition",
    "TaskFunction",
    "TaskRef",
    "check_arguments",
    "define",
]

TaskFunction = Callable[..., Any]
"""Called as ``func(token, *args, **kwargs)``; returns a JSON-serializable result."""

Carrier = Literal["thread", "process"]
"""What runs a task's function: a worker thread of the node (an ``async def`` one: its
event loop), or one of the node's worker processes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDefinition:
    """What a node knows how to run. Definitions never leave the node that owns them: the
    store holds states, not recipes, so no other node can run (or re-run) this task.
    """

    name: str
    func: TaskFunction
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    timeout_grace: float = 5.0
    tags: frozenset[str] = frozenset()
    max_per_key: int | None = None
    """At most this many of its runs sharing one ``concurrency_key`` run at once on this
    node; the others wait ``queued`` (``None``: no limit)."""
    carrier: Carrier = "thread"
    """``"process"``: the function runs in one of the node's worker processes
    (docs/design.md, "Process carriers"): a core of its own, and a stop or timeout that
    ends it for certain. Its tasks carry the tag ``process`` (``ps --carrier process``)."""
    suspend: bool = False
    """A process task that reaches no checkpoint within ``timeout_grace`` of a pause is
    suspended where it stands (its worker process stopped) until resumed. Off by
    default: a suspended process still holds its locks and connections."""
    is_async: bool = field(init=False, default=False)
    """An ``async def`` function: it runs on the node's event loop, not a worker thread.
    Its tasks carry the tag ``async`` (``show`` says it, ``ps --tag async`` finds them)."""
    off_workers: bool = field(init=False, default=False, repr=False, compare=False)
    """Its attempts are carried off the node's worker threads: on its event loop (an
    ``async def`` function) or in a worker process (``carrier="process"``)."""
    arity: int | None = field(init=False, default=None, repr=False, compare=False)
    """How many arguments a submit passes when the function takes exactly that many
    positional ones and nothing else (the common case ``check_arguments`` answers with
    one comparison); ``None`` otherwise."""
    signature: inspect.Signature | None = field(init=False, default=None, repr=False, compare=False)
    """The function's signature, where Python can tell it (``check_arguments``)."""

    def __post_init__(self) -> None:
        if inspect.iscoroutinefunction(self.func):
            object.__setattr__(self, "is_async", True)
            object.__setattr__(self, "tags", self.tags | {"async"})
        if self.is_async or self.carrier == "process":
            object.__setattr__(self, "off_workers", True)
        try:
            signature = inspect.signature(self.func)
        except (TypeError, ValueError):  # a builtin without one: not checked at submit
            signature = None
        if signature is not None:
            object.__setattr__(self, "signature", signature)
            plain = all(
                p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
                for p in signature.parameters.values()
            )
            if plain and signature.parameters:
                object.__setattr__(self, "arity", len(signature.parameters) - 1)
        if not self.name:
            raise ConfigurationError("a task definition needs a non-empty name")
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"task {self.name}: timeout must be > 0, got {self.timeout}")
        if self.timeout_grace < 0:
            raise ConfigurationError(f"task {self.name}: timeout_grace must be >= 0")
        limit = self.max_per_key
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ConfigurationError(f"task {self.name}: max_per_key must be an int, got {limit!r}")
        if limit is not None and limit < 1:
            raise ConfigurationError(f"task {self.name}: max_per_key must be >= 1, got {limit}")
        if self.carrier not in ("thread", "process"):
            raise ConfigurationError(
                f"task {self.name}: carrier must be 'thread' or 'process', got {self.carrier!r}"
            )
        if self.carrier == "process":
            _check_by_reference(self.name, self.func, is_async=self.is_async)
            object.__setattr__(self, "tags", self.tags | {"process"})
        elif self.suspend:
            raise ConfigurationError(
                f"task {self.name}: suspend=True needs carrier='process' (a thread cannot "
                "be suspended)"
            )


def _check_by_reference(name: str, func: TaskFunction, *, is_async: bool) -> None:
    """A process task's function is found in a worker process by its module and name:
    refuse, where it is defined, one that could not be found so."""
    if is_async:
        raise ConfigurationError(
            f"task {name}: an async def function runs on the node's event loop; "
            "carrier='process' takes a plain function"
        )
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", "")
    why = None
    hint = " (define it at the top level of an importable module)"
    if not module or not qualname:
        why = "it has no module and name to be found by" + hint
    elif "<lambda>" in qualname:
        why = "a lambda has no name to be found by" + hint
    elif "<locals>" in qualname:
        why = f"{qualname} is defined inside a function" + hint
    elif module == "__main__":
        why = _main_refused()
    if why is not None:
        raise InvalidValue(
            f"task {name}: carrier='process' needs a function a worker process can import by "
            f"its module and name: {why}"
        )


def main_module() -> tuple[str, str] | None:
    """Where a worker process finds the program's ``__main__``, as ``multiprocessing``
    does: ``("name", module)`` for ``python -m module``, ``("path", script)`` for a
    script file; ``None`` where it cannot (an interactive session, ``python -c``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__" and not name.endswith(".__main__"):
        return ("name", name)
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and os.path.isfile(path):
        return ("path", os.path.abspath(path))
    return None


def _main_refused() -> str | None:
    """Why a worker process cannot find a function defined in the program's
    ``__main__``, or ``None`` if it can: it imports the script (or the module ``python
    -m`` ran) to find it, which runs everything at its top level again there, so the
    program's own work must sit under ``if __name__ == "__main__":``."""
    where = main_module()
    if where is None:
        return (
            "it is defined in the program's __main__, which a worker process cannot import "
            "(an interactive session, python -c or standard input: a script file or "
            "python -m can be); define it at the top level of an importable module"
        )
    path = where[1]
    if where[0] == "name":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        path = getattr(spec, "origin", None) or ""
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None  # unreadable here: the worker's import will say what it finds
    if any(_is_main_guard(node) for node in tree.body):
        return None
    return (
        f"it is defined in the script {path}, which each worker process imports to find it, "
        "and that would run the script's top level there too; put the script's own work "
        '(making the node, submitting) under `if __name__ == "__main__":`, or define the '
        "function in a module of its own"
    )


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side for side in sides if isinstance(side, ast.Name) and side.id == "__name__"]
    texts = [side for side in sides if isinstance(side, ast.Constant) and side.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


def check_arguments(
    definition: TaskDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Refuse, at submit, arguments the task's function could not be called with
    (``func(token, *args, **kwargs)``): a ``TypeError`` naming the task and what is
    wrong, before anything is stored, instead of a failure in a worker after every
    retry. The common case (positional arguments only, a function of that many) is one
    comparison; the rest is ``Signature.bind``."""
    if not kwargs and len(args) == definition.arity:
        return
    signature = definition.signature
    if signature is None:
        return
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"task {definition.name}: {exc} (it is called as "
            f"{getattr(definition.func, '__name__', 'func')}(token, *args, **kwargs))"
            f"{_as_options(signature, kwargs)}; nothing was submitted"
        ) from None


def check_crossing(
    definition: TaskDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A process task's arguments cross into its worker process pickled, and its
    function is found there by name: refuse, at submit, what could not cross
    (``InvalidValue``, nothing stored)."""
    try:
        pickle.dumps((args, kwargs))
    except Exception as exc:
        raise InvalidValue(
            f"task {definition.name}: its arguments cannot cross into a worker process "
            f"(carrier='process' pickles them): {type(exc).__name__}: {exc}"
        ) from None
    found = _importable.get(definition.func)
    if found is None:
        from .run.child import locate  # once a function: its first submit

        func = definition.func
        try:
            at = locate(func.__module__, func.__qualname__)
        except Exception as exc:
            raise InvalidValue(
                f"task {definition.name}: a worker process could not find its function "
                f"{func.__module__}.{func.__qualname__}: {type(exc).__name__}: {exc}"
            ) from None
        found = at is func or getattr(at, "definition", None) is not None
        if not found:
            raise InvalidValue(
                f"task {definition.name}: {func.__module__}.{func.__qualname__} is another "
                "object than its function in a worker process"
            )
        _importable[func] = True


_importable: dict[TaskFunction, bool] = {}
"""Process tasks' functions found by their module and name once (checked at submit)."""


def _as_options(signature: inspect.Signature, kwargs: dict[str, Any]) -> str:
    """Where the keywords the function does not take are submit options: how to give
    them (``task.configure(bucket_key=...)``), as the refusal's last words."""
    from dataclasses import fields

    from .options import SubmitOptions, celery_hint  # the error path only: no import cycle

    celery = [celery_hint(k, option=True) for k in sorted(kwargs) if k not in signature.parameters]
    if any(celery):
        return "".join(celery)
    options = {f.name for f in fields(SubmitOptions)}
    named = sorted(k for k in kwargs if k in options and k not in signature.parameters)
    if not named:
        return ""
    given = ", ".join(f"{k}=..." for k in named)
    what = "is an option" if len(named) == 1 else "are options"
    return f": {', '.join(named)} {what}, given as task.configure({given}).submit(...)"


TaskRef: TypeAlias = "Task[Any] | TaskDefinition | TaskFunction | str"
"""What ``node.submit``, ``node.schedule`` and ``Pipeline.add`` take: a ``Task``, a
definition, a plain function (defined on first use with the defaults), or the name of a
task defined on the node."""


def default_name(func: TaskFunction) -> str:
    """``module.qualname``; just the qualname for a script's own functions (``__main__``
    is no name a user would search for: ``ps --name ingest`` finds ``ingest``)."""
    module = getattr(func, "__module__", None)
    qualname = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    return qualname if module in (None, "__main__") else f"{module}.{qualname}"


def define(
    func: TaskFunction,
    *,
    name: str | None = None,
    retries: int | None = None,
    backoff: RetryPolicy | None = None,
    retry_on: ExceptionClasses | None = None,
    give_up_on: ExceptionClasses | None = None,
    timeout: float | None = None,
    timeout_grace: float = 5.0,
    tags: Iterable[str] = (),
    max_per_key: int | None = None,
    carrier: Carrier = "thread",
    suspend: bool = False,
) -> TaskDefinition:
    """Build a ``TaskDefinition``. ``backoff`` shapes the delays and may count the
    retries; ``retries`` counts them. Given both, they must agree, unless the policy
    counts none of its own (``RetryPolicy(base_delay=2)``: the shape alone): a policy of
    5 retries beside ``retries=2`` is a ``ConfigurationError``, never silently one or
    the other."""
    if isinstance(getattr(func, "definition", None), TaskDefinition):
        raise ConfigurationError(
            f"{func!r} is a task already: submit it (.submit, .configure(...).submit), or "
            "register it on a node (node.register(task))"
        )
    policy = backoff or RetryPolicy()
    if retries is not None and backoff is not None and backoff.retries not in (0, retries):
        raise ConfigurationError(
            f"task {name or default_name(func)}: retries={retries} disagrees with "
            f"backoff=RetryPolicy(retries={backoff.retries}, ...): give the count once"
        )
    if retries is not None and retries != policy.retries:
        policy = replace(policy, retries=retries)
    if retry_on is not None:
        policy = replace(policy, retry_on=exception_classes("retry_on", retry_on))
    if give_up_on is not None:
        policy = replace(policy, give_up_on=exception_classes("give_up_on", give_up_on))
    return TaskDefinition(
        name=name or default_name(func),
        func=func,
        retry=policy,
        timeout=timeout,
        timeout_grace=timeout_grace,
        tags=frozenset(tags),
        max_per_key=max_per_key,
        carrier=carrier,
        suspend=suspend,
    )


class Definitions:
    """The task definitions one node owns, by name. A definition's name and tags are
    checked against the node's store once, when it is registered."""

    def __init__(self, owner: str, rules: ValueRules) -> None:
        self._owner = owner
        self._rules = rules
        self._lock = threading.Lock()
        self._func_lock = threading.Lock()
        self._by_func: dict[TaskFunction, TaskDefinition] = {}  # plain functions submitted
        self._by_name: dict[str, TaskDefinition] = {}

    def register(self, definition: TaskDefinition) -> TaskDefinition:
        if self._by_name.get(definition.name) is definition:
            return definition  # every submit passes here: no lock once registered
        check_text(definition.name, "task name", self._rules, MAX_TASK_NAME)
        check_tags(definition.tags, f"tag of task {definition.name!r}", self._rules)
        with self._lock:
            existing = self._by_name.get(definition.name)
            if existing is not None and existing == definition:
                return existing  # the same function with the same settings, defined again
            if existing is not None:
                raise ConfigurationError(f"a task named {definition.name!r} is already defined")
            self._by_name[definition.name] = definition
        # The plain function submitted later means this definition (the first made of
        # it), not a second one with the default name; setdefault is atomic on its own.
        self._by_func.setdefault(definition.func, definition)
        return definition

    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str) -> TaskDefinition:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} is defined on node {self._owner}") from None

    def resolve(self, task: TaskRef) -> TaskDefinition:
        """A name must be defined here; a definition, or a plain function (defined with
        the defaults, named by ``default_name``), is registered on first use."""
        if isinstance(task, str):
            return self.get(task)
        if isinstance(task, TaskDefinition):
            if self._by_name.get(task.name) is task:
                return task  # every submit passes here: registered already
            return self.register(task)
        defined = getattr(task, "definition", None)  # a Task: its definition
        if isinstance(defined, TaskDefinition):
            return self.resolve(defined)
        if not callable(task):
            raise ConfigurationError(
                f"not a task: {task!r} (give a function, a TaskDefinition or a task name)"
            )
        found = self._by_func.get(task)
        if found is None:
            with self._func_lock:
                found = self._by_func.get(task)
                if found is None:
                    found = self._by_func[task] = self.register(define(task))
        return found
