"""Pauses in a running (or finished) stack's output, and its query restarts, from ``pipeline_progress`` (issue 11).

For each query: micro-batches since ``--since``, how many runs they belong to (a run is one start of the query, so
runs − 1 = restarts), and the gaps between consecutive batch ends (``batch_timestamp`` + its duration: when the
batch's rows were written), max and p99, against the trigger interval. The goal of the 2-hour demo run is no gap
longer than 2 trigger intervals and no restart.

    .venv/bin/python -m bench.output_gaps --since "2026-11-23 19:40:45"
"""

from __future__ import annotations

import argparse
import json

from eventide.config import load_config
from store.client import connect

GAPS = """
SELECT query_name, count() AS batches, uniqExact(run_id) AS runs, countIf(input_rows > 0) AS with_input,
       min(ended) AS first, max(ended) AS last,
       max(gap_ms) AS max_gap_ms, quantileExact(0.99)(gap_ms) AS p99_gap_ms,
       argMax(ended, gap_ms) AS longest_gap_ended
FROM (
    SELECT query_name, run_id, input_rows, batch_timestamp + toIntervalMillisecond(duration_ms) AS ended,
           dateDiff('millisecond', lagInFrame(ended) OVER (PARTITION BY query_name ORDER BY ended
                    ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), ended) AS gap_ms,
           row_number() OVER (PARTITION BY query_name ORDER BY ended) AS n
    FROM pipeline_progress FINAL
    WHERE batch_timestamp >= parseDateTime64BestEffort({since:String}, 3, 'UTC')
)
WHERE n > 1
GROUP BY query_name
ORDER BY query_name
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--since", required=True, help="UTC time the run started, e.g. '2026-11-23 19:40:45'")
    args = parser.parse_args()
    config = load_config()
    trigger_ms = config.stream.trigger_interval_s * 1000
    with connect(config) as client:
        result = client.query(GAPS, parameters={"since": args.since})
    for row in result.named_results():
        row = {k: (str(v) if k in ("first", "last", "longest_gap_ended") else v) for k, v in row.items()}
        row["restarts"] = row["runs"] - 1
        row["gaps_over_2_triggers"] = row["max_gap_ms"] > 2 * trigger_ms
        print(json.dumps(row))


if __name__ == "__main__":
    main()
