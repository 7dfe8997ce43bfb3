"""The ingest SDK: instrument an app in three lines.

    from ingest.sdk import Client
    events = Client(app="checkout")
    events.counter("orders").inc(user="u-42")

``client`` (the API), ``instruments`` (counter, gauge, histogram, timer), ``buffer`` (the bounded buffer and its
overflow policies), ``sender`` (the background sender to Kafka) and ``spool`` (the offline spool).

Importing it loads no server package (FastAPI, uvicorn, protobuf, Spark, chDB, Streamlit, pandas): an app pays for
the client only (``tests/unit/ingest/test_sdk_imports.py``).
"""

from ingest.sdk.client import Client, EventHandler
from ingest.sdk.instruments import Counter, Gauge, Histogram, Timer
from ingest.sdk.sender import SdkStats

__all__ = ["Client", "Counter", "EventHandler", "Gauge", "Histogram", "SdkStats", "Timer"]
