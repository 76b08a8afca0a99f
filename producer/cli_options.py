"""The radixq app and what its client commands share on the command line: the typer app
(its ``dlq`` group), and the queue, Redis and input options (producer.cli registers the
commands on it)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup, TyperOption

from wire.keys import DEFAULT_REDIS_URL, QUEUE_ENV, REDIS_URL_ENVS
from wire.routing import DEFAULT_PARTITIONS, MAX_PARTITIONS, NO_ROUTING


class FlagsUntagged(TyperGroup):
    """A command group whose help shows no type tag beside a flag that takes no value (typer
    shows ``--help <bool>`` otherwise), in its own options and its commands'."""

    def get_params(self, ctx: Any) -> list[Any]:
        return [_untagged(param) for param in super().get_params(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        for param in command.get_params(ctx) if command is not None else []:  # its help option too
            _untagged(param)
        return command


def _untagged(param: Any) -> Any:
    if isinstance(param, TyperOption) and param.is_flag:
        param.metavar = ""  # NOTE: typer's help shows a metavar when there is one, else the type
    return param


app = typer.Typer(
    cls=FlagsUntagged,
    name="radixq",
    help="Batch LLM generation on a Redis Streams queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dlq_app = typer.Typer(
    cls=FlagsUntagged, help="Dead letters: jobs delivered more than max_attempts times.", no_args_is_help=True
)
app.add_typer(dlq_app, name="dlq")

QueueOption = Annotated[str, typer.Option("--queue", "-q", envvar=QUEUE_ENV, help="Queue name.")]
RedisUrlOption = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=list(REDIS_URL_ENVS),
        help=f"Redis URL (env {' or '.join(REDIS_URL_ENVS)}; default {DEFAULT_REDIS_URL}).",
    ),
]
PartitionsOption = Annotated[
    int,
    typer.Option(
        "--partitions",
        min=NO_ROUTING,
        max=MAX_PARTITIONS,
        help=f"Partition streams of a new queue (default {DEFAULT_PARTITIONS}): jobs sharing a prefix go to "
        "one worker, which owns their partition (docs/guide.md, Routing); 0: no routing, one stream.",
    ),
]
NoRoutingOption = Annotated[
    bool, typer.Option("--no-routing", help="A new queue of one stream, not routed (--partitions 0).")
]

RetryTimeoutOption = Annotated[
    float,
    typer.Option(
        "--retry-timeout-s",
        envvar="RADIXQ_RETRY_TIMEOUT_S",
        help="Wait this long for an unavailable Redis (connection lost, LOADING, OOM, READONLY) "
        "before giving up.",
    ),
]

QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress display.")]
ProgressIntervalOption = Annotated[
    float,
    typer.Option(
        "--progress-interval",
        min=0.1,
        help="When stderr is not a terminal: seconds between plain progress lines "
        "(on a terminal the display is live).",
    ),
]


PromptColumnOption = Annotated[
    str | None, typer.Option("--prompt-column", help="Column holding the prompt text (dataset files).")
]
MessagesColumnOption = Annotated[
    str | None,
    typer.Option("--messages-column", help="Column holding the chat messages (a list, or its JSON text)."),
]
IdColumnOption = Annotated[
    str | None,
    typer.Option("--id-column", help="Column holding the job id (default: id, else derived from the row)."),
]
TemplateOption = Annotated[
    str | None,
    typer.Option(
        "--template",
        help='Prompt template filled from the row\'s columns, e.g. "Q: {question}\\nA:" '
        "(\\n: a newline, \\t: a tab, \\\\: a backslash).",
    ),
]
InputArgument = Annotated[
    str,
    typer.Argument(
        help="Input file: JSONL (.gz), Parquet or CSV; a path or a URL (https://, s3://, gs://).",
        metavar="FILE",
    ),
]
ErrorsOption = Annotated[
    str | None,
    typer.Option(
        "--errors",
        help="Write the rows rejected at enqueue to this JSONL file (OpenAI Batch error-file style) "
        "instead of as invalid_job error rows in the output.",
    ),
]


RerunChangedOption = Annotated[
    bool,
    typer.Option(
        "--rerun-changed",
        help="Run again the rows whose id has a result for other content (a changed prompt, sampling, "
        "model or metadata); their rows are replaced. Without it such rows stop the command first.",
    ),
]
