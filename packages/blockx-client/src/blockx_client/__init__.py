"""blockx_client: run tasks and functions on a BlockX deployment.

    from blockx_client import Client, Task

    async with Client(coordinator="127.0.0.1:8080") as client:
        result = await client.run(Task.call_list("hello_world", [["ct2"], ["blockx"]]))
        print(result.state, result.outputs())

``SyncClient`` offers the same operations for scripts and notebooks. With
``PROXY_SOCKET_PATH`` set, every RPC goes through the blockx-proxy Unix socket.
``TaskState`` is the Worker's own (``blockx_core.task.TaskState``), re-exported; a
task a worker does not know reads as ``TaskState.NOT_FOUND``. The drivers that run
block ranges through the clusters (backfill, follow) are the ``blockx_drive``
package's: ``blockx_drive.backfill(client, ...)``.
"""

from importlib.metadata import version

from blockx_client._options import GrpcTls
from blockx_client._placement import PlacementListener, SlotWait, listen_to_placement
from blockx_client.backoff import Backoff, RetryPolicy
from blockx_client.client import Client
from blockx_client.cluster_tasks import Registry, TaskFilter
from blockx_client.errors import (
    BlockxError,
    ChainNotServedError,
    ClusterBusyError,
    ConnectError,
    CoordinatorUnreachableError,
    FunctionError,
    InvalidRequestError,
    NoSlotError,
    ResultTypeError,
    SlotInvalidError,
    SlotUncertainError,
    SlotWaitTimeoutError,
    SubmitUncertainError,
    TaskNotFoundError,
    UnavailableError,
)
from blockx_client.functions import FunctionHandle
from blockx_client.models import (
    CallFailureSummary,
    CallProgress,
    CallRecord,
    CallsWaiting,
    Cancellation,
    CancelOutcome,
    Cluster,
    ClusterTasks,
    Durations,
    ExecutorState,
    Invocation,
    IoTrace,
    ListedTask,
    LoadPoint,
    PlacementReport,
    PluginConfig,
    PluginOutput,
    Precheck,
    ProgressCallback,
    Reservation,
    RunningCall,
    RunningTask,
    SubmitAnswer,
    Task,
    TaskHolders,
    TaskInputDiffersError,
    TaskPhase,
    TaskResult,
    TaskState,
    TaskUpdate,
    UnreachableWorker,
    WorkerDescription,
    WorkerEligibility,
)
from blockx_client.registry import EtcdAccess, RegisteredWorker, list_workers
from blockx_client.routing import route
from blockx_client.sync import SyncClient
from blockx_client.task_file import TaskFileError, load_task_file, task_from_dict
from blockx_core.failures import ClientFailureCode, FailureCode

__version__ = version("blockx-client")

__all__ = [
    "Backoff",
    "BlockxError",
    "CallFailureSummary",
    "CallProgress",
    "CallRecord",
    "CallsWaiting",
    "CancelOutcome",
    "Cancellation",
    "ChainNotServedError",
    "Client",
    "ClientFailureCode",
    "Cluster",
    "ClusterBusyError",
    "ClusterTasks",
    "ConnectError",
    "CoordinatorUnreachableError",
    "Durations",
    "EtcdAccess",
    "ExecutorState",
    "FailureCode",
    "FunctionError",
    "FunctionHandle",
    "GrpcTls",
    "InvalidRequestError",
    "Invocation",
    "IoTrace",
    "ListedTask",
    "LoadPoint",
    "NoSlotError",
    "PlacementListener",
    "PlacementReport",
    "PluginConfig",
    "PluginOutput",
    "Precheck",
    "ProgressCallback",
    "RegisteredWorker",
    "Registry",
    "Reservation",
    "ResultTypeError",
    "RetryPolicy",
    "RunningCall",
    "RunningTask",
    "SlotInvalidError",
    "SlotUncertainError",
    "SlotWait",
    "SlotWaitTimeoutError",
    "SubmitAnswer",
    "SubmitUncertainError",
    "SyncClient",
    "Task",
    "TaskFileError",
    "TaskFilter",
    "TaskHolders",
    "TaskInputDiffersError",
    "TaskNotFoundError",
    "TaskPhase",
    "TaskResult",
    "TaskState",
    "TaskUpdate",
    "UnavailableError",
    "UnreachableWorker",
    "WorkerDescription",
    "WorkerEligibility",
    "__version__",
    "list_workers",
    "listen_to_placement",
    "load_task_file",
    "route",
    "task_from_dict",
]
