"""The driver's bridge to Spark's listener bus: a streaming listener that receives each progress report as JSON,
py4j's callback server, and the wait for the bus to drain. These reach into PySpark's private API (the JVM gateway,
the JVM-side listener wrapper), so they live behind the Spark fence.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener


class JsonProgressListener(StreamingQueryListener):
    """A streaming listener whose progress reports arrive as Spark's JSON (``record``), read in one call.

    PySpark builds a report field by field (``StreamingQueryProgress.fromJObject``): a call into the JVM per field,
    per state operator and per custom metric, hundreds per report, each a round trip between the driver's JVM and
    Python on the listener's thread. One ``json()`` call carries the same report."""

    def record(self, report: dict[str, Any]) -> None:
        """One progress report, as Spark's JSON of a ``StreamingQueryProgress``."""
        raise NotImplementedError

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        # Reached only when Spark calls the Python listener itself (not through ``_jlistener``).
        self.record(json.loads(event.progress.json()))

    def onQueryTerminated(self, event: Any) -> None:
        pass

    @property
    def _jlistener(self) -> Any:
        """The JVM's handle on this listener (what ``spark.streams.addListener`` registers): PySpark's, except that
        a progress report crosses as its JSON (:class:`_ProgressAsJson`)."""
        if not hasattr(self, "_jlistener_json"):
            from pyspark import SparkContext

            self._jlistener_json = SparkContext._jvm.PythonStreamingQueryListenerWrapper(  # type: ignore[union-attr]
                _ProgressAsJson(self))
        return self._jlistener_json


class _ProgressAsJson(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener bus, with each progress report read as one JSON string."""

    pylistener: JsonProgressListener

    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.record(json.loads(jevent.progress().json()))


def start_callback_server(spark: SparkSession) -> None:
    """Start py4j's callback server (foreachBatch, listeners) now. It waits on its socket with select(), which
    cannot watch a descriptor >= 1024: started first, it keeps a low descriptor whatever the process opens later."""
    ensure_callback_server_started(spark.sparkContext._gateway)


def wait_for_listeners(spark: SparkSession, timeout_s: float) -> None:
    """Wait until Spark's listener bus has handed every queued event to its listeners (at most ``timeout_s``):
    Spark delivers progress to listeners asynchronously."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))
