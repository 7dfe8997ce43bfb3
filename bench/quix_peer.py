"""The peer of ``bench.pipeline``: Quix Streams computing 1-s tumbling count + mean per series over the events topic.

Its idiomatic form: JSON values, the job's corrected event time as the message time, ``group_by`` the series
(Quix keys windows by the message key, which is the device here, so it repartitions through a topic of its own),
a 1-s tumbling window with count and mean that takes events up to ``--grace-ms`` late (the job's allowed lateness,
as ``bench.pipeline`` passes it: the same rule for late events on both sides), RocksDB state, results produced to an
output topic. Malformed records are skipped. Timed from its first record to its last window result (after
``--events`` source records); prints one JSON line.

    .venv/bin/python -m bench.quix_peer --bootstrap 127.0.0.1:19092 --topic eventide.events --events 500000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from typing import Any

from quixstreams import Application
from quixstreams.dataframe.windows import Count, Mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--state-dir", default="quix-state")
    parser.add_argument("--grace-ms", type=int, default=0,
                        help="how late an event may be for its window (Quix drops, and logs, later ones)")
    args = parser.parse_args()

    read = {"source": 0, "results": 0}
    started, last_result = [0.0], [0.0]

    def on_processed(topic: str, partition: int, offset: int) -> None:
        if topic == args.topic:
            if not read["source"]:
                started[0] = time.perf_counter()
            read["source"] += 1

    def skip(exc: Exception, *_: Any) -> bool:
        return True      # malformed records: ignored, as the job dead-letters them

    app = Application(broker_address=args.bootstrap, consumer_group=f"quix-peer-{time.time_ns()}",
                      auto_offset_reset="earliest", state_dir=args.state_dir, loglevel=logging.WARNING,
                      on_message_processed=on_processed,
                      on_consumer_error=skip, on_processing_error=skip)

    def corrected_event_time(value: Any, headers: Any, timestamp: int, kind: Any) -> int:
        """Event time as the job corrects it: event_time + (receive time - sent_time)."""
        try:
            return int(value["event_time"] + timestamp - value["sent_time"])
        except (TypeError, KeyError):
            return timestamp

    events = app.dataframe(app.topic(args.topic, value_deserializer="json",
                                     timestamp_extractor=corrected_event_time))
    events = events.filter(lambda e: isinstance(e, dict) and e.get("kind") == "metric"
                           and isinstance(e.get("value"), int | float))
    events = events.group_by(lambda e: f"{e['app']}|{e['kind']}|{e['name']}", name="series")
    windows = (events.tumbling_window(duration_ms=1000, grace_ms=args.grace_ms)
               .agg(count=Count(), mean=Mean(column="value")).current())

    def count_result(_: Any) -> None:
        read["results"] += 1
        last_result[0] = time.perf_counter()

    windows = windows.update(count_result)
    windows.to_topic(app.topic(f"{args.topic}.quix-windows", value_serializer="json"))

    def stop_when_done() -> None:
        # Done when every source record was read and the repartitioned ones stopped producing results.
        while read["source"] < args.events or time.perf_counter() - last_result[0] < 3:
            time.sleep(0.05)
        app.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    cpu = time.process_time()
    app.run()
    seconds = last_result[0] - started[0]
    print(json.dumps({"engine": "quixstreams", "records": read["source"], "window_updates": read["results"],
                      "seconds": round(seconds, 2), "events_per_s": round(read["source"] / seconds),
                      "cpu_us_per_event": round((time.process_time() - cpu) * 1e6 / read["source"], 1),
                      "grace_ms": args.grace_ms,
                      "pid": os.getpid()}))


if __name__ == "__main__":
    main()
