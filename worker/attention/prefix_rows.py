"""Which query rows of a prefill pass attend to a cached prefix (torch only, no FlashInfer).

A prefill pass over an FP8 KV pool attends in two parts (worker.attention.flashinfer_fp8_prefill):
every request's new tokens against its new keys, and, for the requests with ``cached_len > 0``
(radix hits, later chunks of a long prompt, decode rows riding along), those requests' rows
against their cached prefix. The second part runs over these rows alone, request by request::

    pass rows:     | r0: no prefix | r1: prefix | r2: prefix | r3: no prefix | r4: prefix |
    prefix part:                   | r1         | r2         |               | r4         |

Its rows are a slice of the pass's rows when the requests with a prefix are consecutive in the
batch (``span``: a view, no copy), else the row indices to gather (``rows_cpu``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.forward import BatchLayout


@dataclass(frozen=True)
class PrefixRows:
    """The requests of a pass that have a cached prefix, and their query rows.

    Tensors are on the CPU, one entry a request with a prefix (P of them) in batch order, but
    ``rows_cpu``, one entry a gathered row.
    """

    requests_cpu: torch.Tensor  # int64 [P]: their indices in the batch, ascending
    slots_cpu: torch.Tensor  # int32 [P]: their page_table rows
    cached_lens_cpu: torch.Tensor  # int32 [P] (all > 0)
    extend_lens_cpu: torch.Tensor  # int32 [P]: rows each contributes, in this order
    span: tuple[int, int] | None  # [start, end) of the pass's rows, when the rows are one run
    rows_cpu: torch.Tensor | None  # int64 [R]: else the pass rows to gather, in order

    @property
    def num_rows(self) -> int:
        return int(self.extend_lens_cpu.sum())

    @property
    def seq_lens_cpu(self) -> torch.Tensor:
        """int32 [P]: cached prefix plus this pass's tokens."""
        return self.cached_lens_cpu + self.extend_lens_cpu


def prefix_rows(layout: BatchLayout) -> PrefixRows | None:
    """The pass's requests with ``cached_len > 0`` and their rows; None when there are none."""
    has_prefix = layout.cached_lens_cpu > 0
    if not bool(has_prefix.any()):
        return None
    requests = has_prefix.nonzero().flatten()
    extend_lens = layout.extend_lens_cpu.to(torch.int32)
    counts = extend_lens[requests]
    # first pass row of each request: rows are laid out request by request
    starts = torch.cumsum(extend_lens, 0, dtype=torch.int64) - extend_lens
    first, last = int(requests[0]), int(requests[-1])
    span: tuple[int, int] | None = None
    rows: torch.Tensor | None = None
    if last - first + 1 == requests.numel():  # consecutive requests: their rows are one run
        start = int(starts[first])
        span = (start, start + int(counts.sum()))
    else:
        # gathered row j of request p is pass row starts[p] + (j - rows before p in the gather)
        before = torch.cumsum(counts, 0, dtype=torch.int64) - counts
        offsets = torch.repeat_interleave(starts[requests] - before, counts.long())
        rows = offsets + torch.arange(offsets.numel(), dtype=torch.int64)
    return PrefixRows(
        requests_cpu=requests,
        slots_cpu=layout.slots_cpu[requests].to(torch.int32),
        cached_lens_cpu=layout.cached_lens_cpu[requests].to(torch.int32),
        extend_lens_cpu=counts,
        span=span,
        rows_cpu=rows,
    )
