"""The radixq command line (typer): the client commands (enqueue, collect, cancel, status, dlq)
registered on one app, in the order its help lists them, and what every command shares.

The app and the shared options live in producer.cli_options, the shared helpers (staged files,
the client, one-line errors) in producer.cli_common, the commands in producer.cli_enqueue,
producer.cli_collect and producer.cli_queue (cancel, status, dlq); this module re-exports them.

The console script is radixq.cli:main (the composition root), which adds the worker-side commands (worker, run) to
this app: producer never imports worker (the layering tests check it).
"""

from __future__ import annotations

from producer.cli_collect import collect
from producer.cli_common import (
    checked_tag,
    column_mapping,
    counted,
    expected_errors,
    holds_no_known_id,
    load_input,
    open_client,
    queued_rows,
    resolve_redis_url,
    staged,
    warn,
    write_table,
)
from producer.cli_enqueue import enqueue, enqueue_file
from producer.cli_options import (
    ErrorsOption,
    FlagsUntagged,
    IdColumnOption,
    InputArgument,
    MessagesColumnOption,
    NoRoutingOption,
    PartitionsOption,
    ProgressIntervalOption,
    PromptColumnOption,
    QueueOption,
    QuietOption,
    RedisUrlOption,
    RerunChangedOption,
    RetryTimeoutOption,
    TemplateOption,
    app,
    dlq_app,
)
from producer.cli_queue import cancel, describe_cache, describe_consumer, dlq_list, dlq_requeue, status

__all__ = [
    "ErrorsOption",
    "FlagsUntagged",
    "IdColumnOption",
    "InputArgument",
    "MessagesColumnOption",
    "NoRoutingOption",
    "PartitionsOption",
    "ProgressIntervalOption",
    "PromptColumnOption",
    "QueueOption",
    "QuietOption",
    "RedisUrlOption",
    "RerunChangedOption",
    "RetryTimeoutOption",
    "TemplateOption",
    "app",
    "cancel",
    "checked_tag",
    "collect",
    "column_mapping",
    "counted",
    "describe_cache",
    "describe_consumer",
    "dlq_app",
    "dlq_list",
    "dlq_requeue",
    "enqueue",
    "enqueue_file",
    "expected_errors",
    "holds_no_known_id",
    "load_input",
    "open_client",
    "queued_rows",
    "resolve_redis_url",
    "staged",
    "status",
    "warn",
    "write_table",
]

# NOTE: the order of registration is the order of the help's command list
app.command()(enqueue)
app.command()(collect)
app.command()(cancel)
app.command()(status)
dlq_app.command("list")(dlq_list)
dlq_app.command("requeue")(dlq_requeue)


if __name__ == "__main__":
    app()
