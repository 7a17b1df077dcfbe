"""chongming-task: owned business and scheduled tasks with a persisted state machine,
cooperative stop / pause / resume, and one control plane shared by several nodes.

Core import needs no third-party package. ``PostgresTaskStore`` is imported on first
access; it needs ``pip install "chongming-task[postgres]"``.
"""

from __future__ import annotations

from .clock import Clock as Clock
from .clock import SystemClock as SystemClock
from .current import CurrentTask as CurrentTask
from .current import current as current
from .definitions import TaskDefinition as TaskDefinition
from .definitions import define as define
from .errors import ChongmingTaskError as ChongmingTaskError
from .errors import ConcurrencyConflict as ConcurrencyConflict
from .errors import ConfigurationError as ConfigurationError
from .errors import ControllerClosed as ControllerClosed
from .errors import IllegalTransition as IllegalTransition
from .errors import InvalidValue as InvalidValue
from .errors import Retry as Retry
from .errors import StopRequested as StopRequested
from .errors import StoreError as StoreError
from .errors import StoreUnavailable as StoreUnavailable
from .errors import TaskAlreadyExists as TaskAlreadyExists
from .errors import TaskDesynced as TaskDesynced
from .errors import TaskNotFound as TaskNotFound
from .errors import TaskUnsuccessful as TaskUnsuccessful
from .errors import UnknownTask as UnknownTask
from .errors import WaitTimeout as WaitTimeout
from .model import Command as Command
from .model import CommandAction as CommandAction
from .model import ControlOutcome as ControlOutcome
from .model import ControlReceipt as ControlReceipt
from .model import Failure as Failure
from .model import FailureKind as FailureKind
from .model import Progress as Progress
from .model import TaskQuery as TaskQuery
from .model import TaskSnapshot as TaskSnapshot
from .model import TaskStatus as TaskStatus
from .model import Transition as Transition
from .node.controller import Controller as Controller
from .node.supervision import ReconcileReport as ReconcileReport
from .pipelines import Pipeline as Pipeline
from .pipelines import PipelineNode as PipelineNode
from .pipelines import PipelineRun as PipelineRun
from .policies import BucketPolicy as BucketPolicy
from .policies import RetryPolicy as RetryPolicy
from .run.handle import TaskRun as TaskRun
from .run.stored import StoredTask as StoredTask
from .run.token import CancellationToken as CancellationToken
from .schedules import CronTrigger as CronTrigger
from .schedules import IntervalTrigger as IntervalTrigger
from .schedules import Schedule as Schedule
from .stores import InMemoryTaskStore as InMemoryTaskStore
from .stores import SqliteTaskStore as SqliteTaskStore
from .stores import TaskStore as TaskStore
from .tasks import ConfiguredTask as ConfiguredTask
from .tasks import Task as Task
from .tasks import task as task

__version__ = "0.1.0"

__all__ = [
    "BucketPolicy",
    "CancellationToken",
    "ChongmingTaskError",
    "Clock",
    "Command",
    "CommandAction",
    "ConcurrencyConflict",
    "ConfigurationError",
    "ConfiguredTask",
    "ControlOutcome",
    "ControlReceipt",
    "Controller",
    "ControllerClosed",
    "CronTrigger",
    "CurrentTask",
    "Failure",
    "FailureKind",
    "IllegalTransition",
    "InMemoryTaskStore",
    "IntervalTrigger",
    "InvalidValue",
    "Pipeline",
    "PipelineNode",
    "PipelineRun",
    "PostgresTaskStore",
    "Progress",
    "ReconcileReport",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "SqliteTaskStore",
    "StopRequested",
    "StoreError",
    "StoreUnavailable",
    "StoredTask",
    "SystemClock",
    "Task",
    "TaskAlreadyExists",
    "TaskDefinition",
    "TaskDesynced",
    "TaskNotFound",
    "TaskQuery",
    "TaskRun",
    "TaskSnapshot",
    "TaskStatus",
    "TaskStore",
    "TaskUnsuccessful",
    "Transition",
    "UnknownTask",
    "WaitTimeout",
    "current",
    "define",
    "task",
]


def __getattr__(name: str) -> object:
    if name == "PostgresTaskStore":  # lazy: keeps the driver optional
        from .stores.postgres.store import PostgresTaskStore

        return PostgresTaskStore
    raise AttributeError(f"module 'chongming_task' has no attribute {name!r}")
